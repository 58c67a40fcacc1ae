"""Bad input on the surfaces added since the first reliability pass (issue 42): the multi-node launcher, the bundle's
--verify and damaged model files, the static student's config, optional ExecuTorch, the baselines stage's library
errors and its fastText workers. Each case: one paragraph naming the bad value and what is expected, the documented
exit code, no traceback, no process left behind.

Most cases need no pipeline run: the launcher runs with --dry-run, the bundle cases use a small bundle written here
(a two-input ONNX graph, a word-level tokenizer and metadata.json as the export writes it), the config cases only
validate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT


# ---------------------------------------------------------------- launcher


def launch(capsys, *args: str) -> tuple[int, str, str]:
    """``python -m pipeline.launch ARGS`` in this process (always with --dry-run: nothing is started)."""
    from pipeline.launch import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args, says", [
    (["--node-rank", "1"], "NODE_RANK=1 was given with NNODES=1"),
    (["--node-rank", "1", "--master-addr", "10.0.0.1"], "NODE_RANK=1 and MASTER_ADDR=10.0.0.1 were given with NNODES=1"),
    (["--master-addr", "10.0.0.1"], "MASTER_ADDR=10.0.0.1 was given with NNODES=1"),
    (["--nproc", "2", "--master-addr", "node0.cluster.example"], "MASTER_ADDR=node0.cluster.example was given"),
], ids=["rank", "rank-and-address", "address", "address-several-processes"])
def test_node_settings_without_several_nodes_are_refused(capsys, args, says):
    """The node that forgot NNODES=2 used to run a whole single-node job of its own."""
    code, out, err = launch(capsys, "--nnodes", "1", *args, "--dry-run", "--", "tiny")
    assert code == 2, err
    assert says in err and "give NNODES=<nodes> on every node" in err
    assert err.strip().startswith("error:") and err.strip().count("\n") == 0  # one paragraph
    assert "launch:" not in err and not out  # nothing started


def test_one_node_naming_itself_is_a_plain_run(capsys):
    """A one-node Slurm allocation or Kubernetes job exports MASTER_ADDR naming the node itself: that is consistent."""
    import socket

    for address in ("localhost", "127.0.0.1", socket.gethostname()):
        code, _, err = launch(capsys, "--master-addr", address, "--dry-run", "--", "tiny", "--runs-dir", "r")
        assert code == 0, err
        assert err.strip().endswith("-m pipeline run tiny --runs-dir r"), err
        assert "accelerate" not in err  # one process: the plain run `make distill` starts


@pytest.mark.pipeline  # runs `make -n` (a subprocess; nothing is built or run)
def test_make_distill_sends_node_settings_to_the_launcher():
    """`make distill NODE_RANK=1 MASTER_ADDR=...` with NNODES left at 1 used to bypass the launcher's checks."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MASTER_ADDR",
                                                            "NODE_RANK", "NNODES", "NPROC")}

    def dry(*settings):
        result = subprocess.run(["make", "-n", "-o", ".venv/.installed", "distill", "CONFIG=tiny", *settings], cwd=ROOT,
                                env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return " ".join(result.stdout.replace("\\\n", " ").split())

    assert "pipeline.launch" not in dry()
    assert '-m pipeline.launch --nproc "1" --nnodes "1" --node-rank "1"' in dry("NODE_RANK=1")
    assert '--master-addr "10.0.0.1"' in dry("MASTER_ADDR=10.0.0.1")
