"""The test tiers, as pytest hooks (tests/conftest.py takes them from here).

``unit``: no pipeline run, no stage, no process of its own (`make test-fast`; enforced: tests/test_tiers.py);
``process``: starts a process (the CLI, ``make -n``, a script) but makes no pipeline run; ``pipeline``: reads or makes
a pipeline run; ``external``: needs a tool outside Python (Docker, PostgreSQL, Chromium, Node.js). A test that uses a pipeline-run fixture is marked
``pipeline`` here; tests that start a run or a process themselves carry the marker. Unmarked tests are ``unit``.

An ``external`` test may skip where its tool is missing, but not where ``REQUIRE_EXTERNAL=1`` (CI sets it): there
the skip is reported as a failure naming what is missing. ``docker_or_skip`` is that skip for the Docker engine and
Compose.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import multiprocessing.process
import os
import shutil
import subprocess
import sys

import pytest

# The Compose command the docs give (docker/README.md): Debian's Compose 1.29, which works offline from apt.
COMPOSE = ["docker-compose"]

# Fixtures that make or copy a pipeline run: a test using one (directly or through another fixture) is `pipeline`.
RUN_FIXTURES = {
    "tiny_run",
    "static_tiny_run",
    "base_run",
    "finished_run",
    "pair_run",
    "family_runs",
    "generated",
    "one_process_run",
}
SESSION_RUNS = {"tiny_run", "static_tiny_run"}  # of those, the session-wide runs of tests/conftest.py
# Fixtures that start a process (a script, the CLI) but make no pipeline run: a test using one is `process`.
PROCESS_FIXTURES = {"smoke"}


# tryfirst: pytest-xdist's own hook turns the xdist_group marks into the node ids its scheduler groups by, so the
# marks must be there before it runs (without this, every test was its own group and each module fixture was built
# on both workers).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if RUN_FIXTURES & set(item.fixturenames) and not item.get_closest_marker("pipeline"):
            item.add_marker(pytest.mark.pipeline)
        if PROCESS_FIXTURES & set(item.fixturenames) and not item.get_closest_marker("process"):
            item.add_marker(pytest.mark.process)
        if not any(item.get_closest_marker(tier) for tier in ("pipeline", "process", "external")):
            item.add_marker(pytest.mark.unit)
    # pytest-xdist's loadgroup (make test): a module's tests on one worker, so its module fixtures are built once, and
    # every module that reads a session tiny run (tiny_run, static_tiny_run) on the same worker, so each of those runs
    # is built once a session, not once per worker (about a minute each).
    modules = {item.nodeid.split("::")[0] for item in items if SESSION_RUNS & set(item.fixturenames)}
    for item in items:
        module = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group("tiny_runs" if module in modules else module))
    # make test-reliability deals out whole files in this order (--dist loadfile --no-loadscope-reorder): longest
    # first, so the two workers end together (longest-processing-time first; pytest-xdist's own order, by number of
    # tests, started the two longest files last, one after the other on one worker: 179 s against 2 x 127 s of work).
    items.sort(key=lambda item: LONGEST_FIRST.get(item.nodeid.split("::")[0], len(LONGEST_FIRST)))


# tests/reliability's files, their seconds on one worker measured on 2026-12-05 (2-core AVX2, quiet): 72, 68, 46, 40, 16,
# then under 5 each. The sort is stable: the other files (and the tests within a file) keep their order.
LONGEST_FIRST = {
    f"tests/reliability/{name}.py": rank
    for rank, name in enumerate(
        [
            "test_running_errors",
            "test_integrity",
            "test_surface_errors",
            "test_predict_errors",
            "test_data_hygiene",
            "test_config_errors",
            "test_data_errors",
            "test_model_errors",
            "test_security",
        ]
    )
}


class TierBreach(RuntimeError):
    """A ``unit`` test started a process, a stage or a pipeline run."""


def _refuse(what: str):
    def refuse(*_args, **_kwargs):
        raise TierBreach(
            f"a unit-tier test {what}: `make test-fast` promises none. Mark the test (or its module) "
            "`pipeline` (pytest.mark.pipeline) if it must, or test the function without it."
        )

    return refuse


@contextlib.contextmanager
def _guarded(item):
    """The unit tier's promise, enforced around a ``unit`` test's setup (its fixtures, module-wide ones included) and
    call: starting a subprocess, a multiprocessing process, a pipeline run or any stage's ``run`` raises TierBreach."""
    if not item.get_closest_marker("unit"):
        yield
        return
    # Imported here, not at the top: tests/test_tiers.py loads this plugin alone (-p tests.tiers) in suites that
    # have no pipeline on their path.
    import pipeline.runner as runner

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", _refuse("started a subprocess"))
        patch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("started a multiprocessing process"))
        patch.setattr(runner, "run_pipeline", _refuse("ran the pipeline"))
        # the stage modules imported so far, and through an import hook those imported during the test: importing all
        # seven here would cost a pytest run that never uses them seconds of torch and transformers imports
        for stage in runner.STAGES:
            if (module := sys.modules.get(f"stages.{stage}")) is not None:
                patch.setattr(module, "run", _refuse(f"ran the {stage} stage"))
        patch.setattr(sys, "meta_path", [_StagesOnImport(patch), *sys.meta_path])
        yield


class _StagesOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An import hook for a guarded test: a stage module (``stages.<name>``) it imports gets the refusing ``run``."""

    def __init__(self, patch: pytest.MonkeyPatch):
        self.patch, self.loaders = patch, {}

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("stages.") or name.count(".") != 1:
            return None
        others = [finder for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec")]
        spec = next((s for f in others if (s := f.find_spec(name, path, target)) is not None), None)
        if spec is None or spec.loader is None:
            return spec
        self.loaders[name], spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.loaders[spec.name].create_module(spec)

    def exec_module(self, module):
        self.loaders[module.__name__].exec_module(module)
        if hasattr(module, "run"):
            self.patch.setattr(module, "run", _refuse(f"ran the {module.__name__.split('.')[1]} stage"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _guarded(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _guarded(item):
        yield


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
        pytest.skip(
            "no 'docker' command: install Docker (Debian: apt-get install docker.io) and start dockerd; "
            ".ci/run does both"
        )
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60
        )
        problem = None if info.returncode == 0 else (info.stderr or info.stdout).strip()[-400:]
    except subprocess.TimeoutExpired:
        problem = "no answer in 60 s"
    if problem:
        pytest.skip(
            f"the Docker daemon does not answer ('docker info': {problem}); start it (dockerd, or "
            "systemctl start docker) and make sure this user may use its socket"
        )
    if compose and shutil.which(COMPOSE[0]) is None:
        pytest.skip(
            f"no '{COMPOSE[0]}' command: install Compose (Debian: apt-get install docker-compose); .ci/run does"
        )
