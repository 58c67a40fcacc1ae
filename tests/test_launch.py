"""`make distill NPROC/NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT` (pipeline/launch.py), the distributed timeout and
the lost-peer message, without starting a job (tests/test_multinode.py runs the jobs)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from pipeline.cli import explain, lost_peer
from pipeline.errors import ConfigError
from pipeline.launch import accelerate_command
from pipeline.runner import DEFAULT_DIST_TIMEOUT_S, dist_timeout_seconds, shared_folder_wait_seconds
from tests.helpers import ROOT


def launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.launch", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["--nnodes", "2"], "NNODES=2 needs MASTER_ADDR"),
        (
            ["--nnodes", "2", "--node-rank", "2", "--master-addr", "10.0.0.1"],
            "NODE_RANK=2 is out of range for NNODES=2",
        ),
        (
            ["--nnodes", "2", "--node-rank", "-1", "--master-addr", "10.0.0.1"],
            "NODE_RANK='-1' is not a whole number >= 0",
        ),
        (["--nproc", "0"], "NPROC='0' is not a whole number >= 1"),
        (["--nnodes", "two", "--master-addr", "h"], "NNODES='two' is not a whole number"),
        (["--nnodes", "2", "--master-addr", "h", "--master-port", "70000"], "MASTER_PORT=70000 is not a TCP port"),
    ],
)
@pytest.mark.process
def test_bad_launch_settings_are_one_paragraph_errors(args, says):
    result = launch(*args, "--dry-run", "--", "tiny")
    assert result.returncode == 2
    assert says in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error:") and result.stderr.strip().count("\n") == 0


def test_each_node_gets_its_share_of_one_job():
    command = accelerate_command("4", "2", "1", "node0.cluster", "", ["tiny", "seed=3", "--runs-dir", "r"])
    joined = shlex.join(command[1:])
    assert joined == (
        "launch --multi_gpu --num_machines 2 --num_processes 8 --machine_rank 1 --main_process_ip "
        "node0.cluster --main_process_port 29500 -m pipeline run tiny seed=3 --runs-dir r"
    )
    # one node: no rendezvous address, and accelerate's own port unless one is asked for
    assert "--main_process_port" not in accelerate_command("2", "1", "0", "", "", ["tiny"])
    assert "--main_process_ip" not in accelerate_command("2", "1", "0", "", "", ["tiny"])


@pytest.mark.process
def test_make_distill_passes_the_node_settings():
    """`make distill` with node settings runs the launcher with them; NPROC=1 on one node stays a plain run."""

    def dry(*settings):
        result = subprocess.run(
            ["make", "-n", "-o", ".venv/.installed", "distill", "CONFIG=tiny", *settings],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return " ".join(result.stdout.replace("\\\n", " ").split())

    line = dry("NNODES=2", "NODE_RANK=1", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29511", "NPROC=2")
    assert (
        '-m pipeline.launch --nproc "2" --nnodes "2" --node-rank "1" --master-addr "10.0.0.1" '
        '--master-port "29511" -- tiny --runs-dir runs'
    ) in line
    assert "pipeline.launch" not in dry() and "-m pipeline run tiny" in dry()
    assert "pipeline.launch" in dry("NPROC=2")


def test_dist_timeout_setting(monkeypatch):
    monkeypatch.delenv("PIPELINE_DIST_TIMEOUT", raising=False)
    assert dist_timeout_seconds() == DEFAULT_DIST_TIMEOUT_S == 1800
    monkeypatch.setenv("PIPELINE_DIST_TIMEOUT", "90")
    assert dist_timeout_seconds() == 90
    for bad in ("0", "-5", "ten", "nan"):
        monkeypatch.setenv("PIPELINE_DIST_TIMEOUT", bad)
        with pytest.raises(ConfigError, match="is not a positive number of seconds"):
            dist_timeout_seconds()


def test_shared_folder_wait_setting(monkeypatch):
    monkeypatch.delenv("PIPELINE_SHARED_FOLDER_WAIT", raising=False)
    assert shared_folder_wait_seconds() == 20
    monkeypatch.setenv("PIPELINE_SHARED_FOLDER_WAIT", "2.5")
    assert shared_folder_wait_seconds() == 2.5
    monkeypatch.setenv("PIPELINE_SHARED_FOLDER_WAIT", "soon")
    with pytest.raises(ConfigError, match=r"PIPELINE_SHARED_FOLDER_WAIT='soon' is not a positive number of seconds"):
        shared_folder_wait_seconds()


# What gloo said in tests/test_multinode.py's runs (and on a killed machine, measured by hand).
GLOO_RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:24471: "
    "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application. "
    "Check the logs of the remote worker before reporting an error. GLHF!"
)
GLOO_TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
    "20000ms for recv operation to complete"
)


def test_a_lost_peer_is_explained(monkeypatch):
    monkeypatch.delenv("PIPELINE_DIST_TIMEOUT", raising=False)
    assert lost_peer([RuntimeError(GLOO_RESET)]) == "Read error [127.0.0.1]:24471: Connection reset by peer"
    assert lost_peer([RuntimeError(GLOO_TIMEOUT)]) == "Timed out waiting 20000ms for recv operation to complete"
    assert lost_peer([RuntimeError("Timed out reading the config")]) is None  # not a collective
    error = RuntimeError(GLOO_RESET)
    error.pipeline_stage = "distill"
    text = str(explain(error, ROOT / "runs"))
    assert text.startswith("Lost contact with another process of this distributed job during the distill stage")
    assert "PIPELINE_DIST_TIMEOUT seconds (1800 here)" in text and "most likely a bug" not in text


def test_other_ranks_wait_for_a_stage_output_their_filesystem_shows_late(tmp_path, monkeypatch):
    """On another machine, rank 0's completed stage may show up late (NFS attribute caching): ranks other than 0
    look again for a while; rank 0 (and a single process) report a missing input at once."""
    import threading
    import time
    import types

    import pipeline.runner as runner
    from pipeline.integrity import output_listing

    def complete(folder):
        folder.mkdir(parents=True)
        (folder / "labels.json").write_text("{}")
        runner.write_json(folder / "manifest.json", {"fingerprint": "f", "outputs": output_listing(folder)})

    def context(rank):
        dist = types.SimpleNamespace(world=2, rank=rank, is_main=rank == 0)
        return runner.StageContext(
            config=None, name="export", run_dir=tmp_path, out=tmp_path / "export.partial", tracker=None, dist=dist
        )

    monkeypatch.setattr(runner, "SHARED_FOLDER_PATIENCE_S", 20)
    later = threading.Timer(1.5, complete, [tmp_path / "prepare"])
    started = time.monotonic()
    with pytest.raises(runner.PipelineError, match="needs the output of 'prepare', which is not complete"):
        context(0).input("prepare")
    assert time.monotonic() - started < 1
    later.start()
    assert context(1).input("prepare") == tmp_path / "prepare"
    assert 1.4 < time.monotonic() - started < 10
    monkeypatch.setattr(runner, "SHARED_FOLDER_PATIENCE_S", 1)
    with pytest.raises(runner.PipelineError, match="needs the output of 'peers', which is not complete"):
        context(1).input("peers")
