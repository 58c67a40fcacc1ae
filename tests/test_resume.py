"""kill -9 during distillation, in epoch 0 and in epoch 1, then the same command:
the final student is bit-identical to an uninterrupted run (CPU)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.helpers import ROOT, run_cli

CHECKPOINT = re.compile(r"step-\d+-e(\d+)b(\d+)$")


def copy_upstream(source_run: Path, target_run: Path) -> None:
    """Reuse the completed prepare/teacher/capture stages so only distill differs."""
    target_run.mkdir(parents=True)
    for stage in ("prepare", "teacher", "peers", "capture"):
        shutil.copytree(source_run / stage, target_run / stage)


def kill_when(runs_dir: Path, want_epoch: int, min_batch: int) -> bool:
    """Start the pipeline and kill -9 it right after a checkpoint at (epoch, >= batch) appears.

    Returns True if the process was still running when killed.
    """
    command = [sys.executable, "-m", "pipeline", "run", "tiny", "--to", "distill", "--runs-dir", str(runs_dir)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = runs_dir / "tiny" / "distill.partial" / "checkpoints-distill"
    deadline = time.time() + 300
    try:
        while time.time() < deadline and process.poll() is None:
            names = [p.name for p in folder.glob("step-*")] if folder.exists() else []
            hits = [m for m in map(CHECKPOINT.match, names) if m and int(m[1]) == want_epoch and int(m[2]) >= min_batch]
            if hits:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
                return True
            time.sleep(0.02)
        return False
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("epoch,batch", [(0, 5), (1, 3)], ids=["kill-in-epoch-0", "kill-in-epoch-1"])
def test_kill9_then_rerun_gives_identical_student(tiny_run, tmp_path, epoch, batch):
    runs_dir = tmp_path / "runs"
    copy_upstream(tiny_run["run_dir"], runs_dir / "tiny")
    assert kill_when(runs_dir, epoch, batch), "the run finished before it could be killed"
    assert not (runs_dir / "tiny" / "distill").exists()  # an interrupted stage never looks done
    resumed = run_cli("run", "tiny", "--to", "distill", runs_dir=runs_dir)  # the student is the point
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from checkpoint" in resumed.stderr
    expected = load_file(tiny_run["run_dir"] / "distill" / "student" / "model.safetensors")
    actual = load_file(runs_dir / "tiny" / "distill" / "student" / "model.safetensors")
    assert expected.keys() == actual.keys()
    max_diff = max((expected[k].float() - actual[k].float()).abs().max().item() for k in expected)
    assert max_diff == 0.0, f"resumed student differs by {max_diff}"


def test_half_written_checkpoint_is_never_loaded(tiny_run, tmp_path):
    """A checkpoint folder still named *.tmp (crash while writing) is ignored."""
    from pipeline.training import Checkpoints

    root = tmp_path / "ck"
    (root / "step-00000005-e0b5").mkdir(parents=True)
    (root / "step-00000010-e0b10.tmp").mkdir()
    assert Checkpoints(root, keep=2).latest().name == "step-00000005-e0b5"


def test_a_completed_stage_keeps_no_resume_checkpoints(tiny_run):
    """Checkpoints only resume a partial stage: the runner deletes them on completion and lists none as outputs."""
    for stage in ("teacher", "distill"):
        folder = tiny_run["run_dir"] / stage
        assert (folder / "manifest.json").is_file() and not list(folder.glob("checkpoints-*")), stage
        outputs = json.loads((folder / "manifest.json").read_text())["outputs"]
        assert outputs and not [name for name in outputs if name.startswith("checkpoints-")], stage


def test_an_older_manifest_listing_checkpoints_is_not_damaged_without_them(tiny_run, tmp_path):
    """Runs made before completion deleted the checkpoints list them; deleting them by hand (disk space) reruns nothing,
    while a missing output still does."""
    runs_dir = tmp_path / "runs"
    shutil.copytree(tiny_run["run_dir"], runs_dir / "tiny")
    manifest_path = runs_dir / "tiny" / "distill" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["outputs"]["checkpoints-distill/step-00000004-e1b0/model.safetensors"] = {
        "bytes": 10,
        "sha256": "0" * 64,
        "mtime_ns": 1,
    }
    manifest_path.write_text(json.dumps(manifest))
    up_to_date = run_cli("run", "tiny", "--to", "distill", runs_dir=runs_dir)
    assert up_to_date.returncode == 0, up_to_date.stderr[-3000:]
    assert "nothing to do" in up_to_date.stderr and "damaged" not in up_to_date.stderr

    (runs_dir / "tiny" / "distill" / "student" / "model.safetensors").unlink()
    rerun = run_cli("run", "tiny", "--to", "distill", runs_dir=runs_dir)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "[distill] output damaged (distill/student/model.safetensors is missing)" in rerun.stderr
