"""The test tiers, as pytest hooks (tests/conftest.py takes them from here).

``unit``: no pipeline run (`make test-fast`); ``pipeline``: reads or makes a pipeline run; ``external``: needs a tool
outside Python (Docker, PostgreSQL, Chromium, Node.js). A test that uses a pipeline-run fixture is marked
``pipeline`` here; tests that start a run themselves carry the marker in their module. Unmarked tests are ``unit``.

An ``external`` test may skip where its tool is missing, but not where ``REQUIRE_EXTERNAL=1`` (CI sets it): there
the skip is reported as a failure naming what is missing.
"""

from __future__ import annotations

import os

import pytest

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
