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
if os.environ.get("PYTEST_XDIST_WORKER"):  # two pytest workers share the 2 cores: one torch thread each, and in
    # every pipeline process they start (more threads than cores make torch's OpenMP threads wait on each other)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

from tests.helpers import NODE_DIR, built_once, run_cli, run_one_process  # noqa: E402  (after the offline settings)
from tests.tiers import (  # noqa: E402,F401  (hooks)
    pytest_collection_modifyitems,
    pytest_runtest_call,
    pytest_runtest_makereport,
    pytest_runtest_setup,
)


@pytest.fixture(autouse=True)
def _tracking_uri_stays_with_its_test():
    """mlflow.set_tracking_uri (a Tracker made in the test's own process) exports MLFLOW_TRACKING_URI: left set, every
    later CLI run on the same pytest worker would inherit it and log to that test's store, not its own --runs-dir."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One complete run of the `tiny` config, shared by the tests that only read it (built once a session: under
    pytest-xdist every module that uses it runs on one worker, tests/tiers.py)."""
    runs_dir = tmp_path_factory.mktemp("runs")
    result = run_cli("run", "tiny", runs_dir=runs_dir)
    assert result.returncode == 0, result.stderr[-4000:]
    return {"runs_dir": runs_dir, "run_dir": runs_dir / "tiny", "first": result}


# The tiny run with a static student (student.kind: static, with hashed token bigrams) and the peers on: the bundle
# checks (ids-in and text-in models, int8, predict.py, Node) and the peer figures run on it too.
STATIC_TINY = [
    "export.executorch=off",  # its lowering is tested on the tiny run; torch.export of the static student in test_static_student
    "student.kind=static",
    "student.static.dim=16",
    "student.static.bigram_buckets=64",
    "distill.loss.attention=0",
    "distill.loss.value_relation=0",
    "peers.enabled=true",
    "peers.fasttext.buckets=20000",
    "peers.fasttext.epochs=[5, 10]",
]


# Made-up words: two twice (they join the table), one once (left out at min_count 2), one of another source (left out)
STATIC_WORD_CORPUS = (
    "text,source\nQuorblax and Vintheral: frumiously,imdb\nQuorblax without Vintheral,imdb\n"
    "Zanzibarian Zanzibarian,other\n"
)


@pytest.fixture(scope="session")
def static_tiny_run(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("static_runs")
    corpus = runs_dir.parent / "static_word_corpus.csv"  # words for the word model's table (export.word_corpus)
    corpus.write_text(STATIC_WORD_CORPUS, encoding="utf-8")
    words = f"export.word_corpus={{path: {corpus}, where: {{source: imdb}}, min_count: 2}}"
    result = run_cli("run", "tiny", *STATIC_TINY, words, runs_dir=runs_dir)
    assert result.returncode == 0, result.stderr[-4000:]
    return {"runs_dir": runs_dir, "run_dir": runs_dir / "tiny", "first": result, "stdout": result.stdout}


# The images of docker/ (CPU pipeline, PostgreSQL, MLflow), built once per session by the Makefile target users and
# .ci/run call; a second build reuses every layer (seconds). Where Docker Hub and the PyTorch index are blocked,
# set DOCKER_LOCAL=1 (.ci/run does on such a machine): the local Debian base and torch wheel are used.
DOCKER_BUILD_TIMEOUT_S = 3600


@pytest.fixture(scope="session")
def docker_images(tmp_path_factory):
    import subprocess

    from tests.helpers import ROOT
    from tests.tiers import docker_or_skip

    docker_or_skip()
    log = tmp_path_factory.mktemp("docker") / "make-docker-images.log"
    with open(log, "w") as out:
        res = subprocess.run(
            ["make", "docker-images"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=DOCKER_BUILD_TIMEOUT_S
        )
    if res.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        pytest.fail(
            f"`make docker-images` failed (rc={res.returncode}; without Docker Hub or the PyTorch index, "
            f"set DOCKER_LOCAL=1):\n{tail}"
        )
    return {"cpu": "attention-distill:cpu", "postgres": "attention-distill/postgres:latest"}


@pytest.fixture(scope="session")
def node():
    """The node executable with tests/node's packages installed (npm ci from package-lock.json when missing)."""
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed: the bundle's Node.js check (onnxruntime-node) cannot run here")
    if not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir():
        npm = shutil.which("npm")
        assert npm, "node is installed but npm is not: install npm, then `cd tests/node && npm ci --ignore-scripts`"
        proc = subprocess.run(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, f"npm ci in tests/node failed:\n{proc.stderr[-2000:]}"
    return node


@pytest.fixture(scope="session")
def one_process_run(tmp_path_factory):
    """The reference of the multi-process and multi-node tests (tests.helpers.run_one_process: tiny without dropout,
    one process, through evaluate), built once for both workers; its runs folder, to read or copy, never to write."""
    runs, _ = built_once(tmp_path_factory, "one_process_run", run_one_process)
    return runs
