"""Shared fixtures: offline hub settings, a CLI runner, one session-wide tiny pipeline run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Nothing may reach a model or dataset hub from the tests.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.pop("MLFLOW_TRACKING_URI", None)

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, runs_dir: Path | None = None, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `python -m pipeline ...` as users do; returns the completed process."""
    command = [sys.executable, "-m", "pipeline", *args]
    if runs_dir is not None:
        command += ["--runs-dir", str(runs_dir)]
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(command, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


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


def read_json(path: Path):
    return json.loads(Path(path).read_text())
