"""The tiers (tests/tiers.py): unmarked tests are `unit`, a pipeline-run fixture makes a test `pipeline`, and with
REQUIRE_EXTERNAL=1 (CI) an `external` test that skips fails instead. The unit tier keeps its promise: a unit test that
starts a process, a pipeline run or a stage fails with TierBreach, so `make test-fast` cannot quietly grow slow."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.tiers import TierBreach

pytestmark = pytest.mark.process  # pytest in a subprocess, but for the unit-tier guard's own tests below

CASES = """
import pytest

@pytest.fixture
def tiny_run():
    return None

def test_plain():
    pass

def test_reads_a_run(tiny_run):
    pass

@pytest.mark.external
def test_needs_a_tool():
    pytest.skip("no such tool here")
"""


def pytest_in(folder, *args, env=None):
    """pytest on ``folder`` with only the tiers plugin (not this suite's conftest)."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "tests.tiers",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(folder),
        "-o",
        "markers=unit\nprocess\npipeline\nexternal",
        *args,
        str(folder),
    ]
    return subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_unmarked_is_unit_and_a_run_fixture_makes_pipeline(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    unit = pytest_in(tmp_path, "-m", "unit", "--collect-only")
    pipeline = pytest_in(tmp_path, "-m", "pipeline", "--collect-only")
    assert (
        "test_plain" in unit.stdout and "test_reads_a_run" not in unit.stdout and "test_needs_a_tool" not in unit.stdout
    )
    assert "test_reads_a_run" in pipeline.stdout and "test_plain" not in pipeline.stdout


def test_an_external_skip_fails_only_where_external_tools_are_required(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    local = pytest_in(tmp_path, "-rs", env={"REQUIRE_EXTERNAL": "0"})
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout
    ci = pytest_in(tmp_path, env={"REQUIRE_EXTERNAL": "1"})
    assert ci.returncode == 1 and "1 failed" in ci.stdout, ci.stdout
    assert (
        "REQUIRE_EXTERNAL=1: this test needs a tool that is missing here" in ci.stdout
        and "no such tool here" in ci.stdout
    )


DOCKER_CASE = """
import pytest
from tests.tiers import docker_or_skip

@pytest.mark.external
def test_needs_docker():
    docker_or_skip(compose=True)
"""


def test_a_missing_docker_skips_with_the_reason_and_fails_in_ci(tmp_path):
    (tmp_path / "test_docker_case.py").write_text(DOCKER_CASE)
    no_tools = {"PATH": str(tmp_path / "empty-bin")}  # no docker on PATH (pytest runs from sys.executable)
    local = pytest_in(tmp_path, "-rs", env={"REQUIRE_EXTERNAL": "0", **no_tools})
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout + local.stderr
    assert "no 'docker' command: install Docker" in local.stdout
    ci = pytest_in(tmp_path, env={"REQUIRE_EXTERNAL": "1", **no_tools})
    assert ci.returncode == 1 and "1 failed" in ci.stdout and "no 'docker' command" in ci.stdout, ci.stdout


@pytest.mark.unit
def test_a_unit_test_cannot_start_a_subprocess():
    with pytest.raises(TierBreach, match="subprocess"):
        subprocess.run([sys.executable, "-c", "pass"])


@pytest.mark.unit
def test_a_unit_test_cannot_start_a_process():
    with pytest.raises(TierBreach, match="multiprocessing"):
        multiprocessing.get_context("spawn").Process(target=print).start()


@pytest.mark.unit
def test_a_unit_test_cannot_run_a_stage_or_the_pipeline():
    import pipeline.runner as runner
    import stages.prepare

    with pytest.raises(TierBreach, match="prepare stage"):
        stages.prepare.run(None)
    with pytest.raises(TierBreach, match="ran the pipeline"):
        runner.run_pipeline(None, None)


@pytest.mark.unit
def test_a_stage_imported_during_a_unit_test_cannot_run_either(monkeypatch):
    """The guard patches the stage modules already imported, and those a test imports itself through an import hook
    (it does not import the seven itself)."""
    import stages  # here, not at the top: the module's other tests must not pay torch's import
    import stages.evaluate as imported

    monkeypatch.delitem(sys.modules, "stages.evaluate")
    monkeypatch.setattr(stages, "evaluate", imported)  # restored after the test, whatever the import below sets
    fresh = importlib.import_module("stages.evaluate")
    assert fresh is not imported
    with pytest.raises(TierBreach, match="ran the evaluate stage"):
        fresh.run(None)


def test_other_tiers_may():  # process tier (the module's mark)
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


SESSION_RUN_CONFTEST = """
import os
import pytest

def _record(what):
    with open(os.environ["BUILDS"], "a") as f:
        f.write(what + " " + os.environ.get("PYTEST_XDIST_WORKER", "none") + "\\n")

@pytest.fixture(scope="session")
def tiny_run():
    _record("tiny_run")
    return {}

@pytest.fixture(scope="module")
def module_setup(request):
    _record(request.module.__name__)
    return {}
"""
READS_THE_RUN = """
import pytest

@pytest.mark.parametrize("i", range(3))
def test_a(tiny_run, i):
    pass

def test_b():
    pass
"""
HAS_A_MODULE_FIXTURE = """
import pytest

@pytest.mark.parametrize("i", range(4))
def test_c(module_setup, i):
    pass
"""


def test_two_workers_build_each_module_fixture_and_the_session_tiny_run_once(tmp_path):
    """Every module's tests are one xdist group and every module reading a session tiny run is in one group "tiny_runs"
    (tests/tiers.py), so `make test`'s two workers build each module fixture once and the tiny run once (about a
    minute each). 32 tests: without the groups (pytest-xdist 3.8 on pytest 9.2, or the tiers hook after xdist's)
    they are dealt out one by one and the fixtures are built on both workers."""
    (tmp_path / "conftest.py").write_text(SESSION_RUN_CONFTEST)
    for name in ("one", "two", "three", "four"):
        (tmp_path / f"test_run_{name}.py").write_text(READS_THE_RUN)
        (tmp_path / f"test_own_{name}.py").write_text(HAS_A_MODULE_FIXTURE)
    builds = tmp_path / "builds.txt"
    result = pytest_in(tmp_path, "-n", "2", "--dist", "loadgroup", env={"BUILDS": str(builds)})
    assert result.returncode == 0 and "32 passed" in result.stdout, result.stdout + result.stderr
    built = sorted(line.split()[0] for line in builds.read_text().splitlines())
    assert built == ["test_own_four", "test_own_one", "test_own_three", "test_own_two", "tiny_run"], builds.read_text()
