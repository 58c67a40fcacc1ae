"""Fixtures of the reliability suite (its helpers are in helpers.py): one torch thread per case, one small prepared
run (prepare, teacher, peers, capture complete) and one finished tiny run, each built once per session (for all
pytest workers) and copied into each case's own folder with shutil.copytree."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers import built_once, run_cli
from tests.reliability.helpers import (
    BASE_CONFIG,
    BASE_STAGES,
    CONFIG_NAME,
    FINISHED,
    ONE_THREAD,
    Run,
    cli,
    one_torch_thread,
)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def base_run(tmp_path_factory):
    """prepare, teacher and capture of the `rel` config, complete (built once)."""
    config = tmp_path_factory.mktemp("rel-base") / f"{CONFIG_NAME}.yaml"
    config.write_text(BASE_CONFIG)

    def build(runs_dir):
        with one_torch_thread():
            for stage in BASE_STAGES:
                result = cli("run", str(config), "--only", stage, "--runs-dir", str(runs_dir))
                if result.returncode != 0:
                    break
        return result

    runs_dir, result = built_once(tmp_path_factory, "rel_base_run", build)
    assert result.returncode == 0, result.stderr[-4000:]
    return Run(runs_dir, str(config))


@pytest.fixture
def run_copy(base_run, tmp_path) -> Run:
    """This test's own copy of the base run (runs dir with mlflow.db included)."""
    runs_dir = tmp_path / "runs"
    shutil.copytree(base_run.runs_dir, runs_dir)
    return Run(runs_dir, base_run.config)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """The tiny config run to the end (helpers.FINISHED: no ExecuTorch programs), built once for both workers: each
    worker used to build the main suite's tiny run, .pte lowering included, about a minute each."""
    runs_dir, result = built_once(
        tmp_path_factory, "rel_finished_run", lambda folder: run_cli("run", *FINISHED, runs_dir=folder, env=ONE_THREAD)
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return {"runs_dir": runs_dir, "run_dir": runs_dir / "tiny"}


@pytest.fixture(scope="session", autouse=True)
def _second_worker_builds_the_finished_run_first(request, worker_id):
    """Two workers, two shared runs: the first worker's first test builds base_run (about 30 s) while the second
    builds finished_run (about 35 s) at once, instead of waiting for base_run under its lock and building
    finished_run later while the first worker waits for it. Only where the selected tests read runs: the unit tier
    makes none."""
    if worker_id == "gw1" and any(item.get_closest_marker("pipeline") for item in request.session.items):
        request.getfixturevalue("finished_run")
