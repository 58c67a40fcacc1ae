"""Shared fixtures: offline hub settings, the session-wide tiny pipeline runs; the test tiers' hooks (tests/tiers.py).
Helpers shared by modules are in tests/helpers.py."""

from __future__ import annotations

import os

import pytest

# Nothing may reach a model or dataset hub from the tests (set before anything imports transformers).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.pop("MLFLOW_TRACKING_URI", None)

from tests.helpers import run_cli  # noqa: E402  (after the offline settings)
from tests.tiers import pytest_collection_modifyitems, pytest_runtest_makereport  # noqa: E402,F401  (hooks)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One complete run of the `tiny` config, shared by the tests that only read it."""
    runs_dir = tmp_path_factory.mktemp("runs")
    result = run_cli("run", "tiny", runs_dir=runs_dir)
    assert result.returncode == 0, result.stderr[-4000:]
    return {"runs_dir": runs_dir, "run_dir": runs_dir / "tiny", "first": result}


# The tiny run with a static student (student.kind: static) and the peers on: the bundle checks and the peer
# figures run on it too.
STATIC_TINY = ["student.kind=static", "student.static.dim=16", "distill.loss.attention=0", "distill.loss.value_relation=0",
               "baselines.enabled=true", "baselines.fasttext.buckets=20000", "baselines.fasttext.epochs=[5, 10]"]


@pytest.fixture(scope="session")
def static_tiny_run(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("static_runs")
    result = run_cli("run", "tiny", *STATIC_TINY, runs_dir=runs_dir)
    assert result.returncode == 0, result.stderr[-4000:]
    return {"runs_dir": runs_dir, "run_dir": runs_dir / "tiny", "first": result, "stdout": result.stdout}


