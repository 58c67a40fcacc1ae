"""The test tiers, as pytest hooks (tests/conftest.py takes them from here).

``unit``: no pipeline run (`make test-fast`); ``pipeline``: reads or makes a pipeline run; ``external``: needs a tool
outside Python (Docker, PostgreSQL, Chromium, Node.js). A test that uses a pipeline-run fixture is marked
``pipeline`` here; tests that start a run themselves carry the marker in their module. Unmarked tests are ``unit``.

An ``external`` test may skip where its tool is missing, but not where ``REQUIRE_EXTERNAL=1`` (CI sets it): there
the skip is reported as a failure naming what is missing. ``docker_or_skip`` is that skip for the Docker engine and
Compose.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

# The Compose command the docs give (docker/README.md): Debian's Compose 1.29, which works offline from apt.
COMPOSE = ["docker-compose"]

# Fixtures that make or copy a pipeline run: a test using one (directly or through another fixture) is `pipeline`.
RUN_FIXTURES = {"tiny_run", "static_tiny_run", "base_run", "pair_run", "family_runs"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if RUN_FIXTURES & set(item.fixturenames) and not item.get_closest_marker("pipeline"):
            item.add_marker(pytest.mark.pipeline)
        if not item.get_closest_marker("pipeline") and not item.get_closest_marker("external"):
            item.add_marker(pytest.mark.unit)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker("external") and os.environ.get("REQUIRE_EXTERNAL") == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"REQUIRE_EXTERNAL=1: this test needs a tool that is missing here and may not skip ({reason})"


def docker_or_skip(compose: bool = False) -> None:
    """Skip, with what to install, unless a Docker daemon answers (and, with ``compose``, docker-compose is there)."""
    if shutil.which("docker") is None:
        pytest.skip("no 'docker' command: install Docker (Debian: apt-get install docker.io) and start dockerd; "
                    ".ci/run does both")
    try:
        info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=60)
        problem = None if info.returncode == 0 else (info.stderr or info.stdout).strip()[-400:]
    except subprocess.TimeoutExpired:
        problem = "no answer in 60 s"
    if problem:
        pytest.skip(f"the Docker daemon does not answer ('docker info': {problem}); start it (dockerd, or "
                    "systemctl start docker) and make sure this user may use its socket")
    if compose and shutil.which(COMPOSE[0]) is None:
        pytest.skip(f"no '{COMPOSE[0]}' command: install Compose (Debian: apt-get install docker-compose); .ci/run does")
