"""Two real CPU processes (gloo) against one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import NO_DROPOUT, ONE_THREAD, ROOT, free_port, student_difference

pytestmark = pytest.mark.pipeline
# One process stops after evaluate (its export is the shared tiny run's); two processes run the export too (rank 0
# builds the bundle while the other waits), without the .pte lowering (~20 s, checked on the shared tiny run).


def launch(runs_dir, nproc: int):
    command = [
        os.path.join(os.path.dirname(sys.executable), "accelerate"),
        "launch",
        "--multi_gpu",
        "--num_machines",
        "1",
        "--num_processes",
        str(nproc),
        "--main_process_port",
        str(free_port()),  # not Accelerate's default 29500: another worker of the suite may be using it
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "pipeline",
        "run",
        "tiny",
        *NO_DROPOUT,
        "export.executorch=off",
        "--runs-dir",
        str(runs_dir),
    ]
    result = subprocess.run(
        command, cwd=ROOT, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_two_processes_match_one(tmp_path, one_process_run):
    two = launch(tmp_path / "two", 2)
    assert "[rank 0]" in two.stderr
    assert (
        tmp_path / "two" / "tiny" / "export" / "bundle" / "metadata.json"
    ).is_file()  # rank 0 exported, rank 1 waited
    run1, run2 = one_process_run / "tiny", tmp_path / "two" / "tiny"
    # World size as seen by Accelerate's process group, recorded by the distill stage.
    assert json.loads((run2 / "distill" / "manifest.json").read_text())["summary"]["world_size"] == 2
    assert json.loads((run1 / "distill" / "manifest.json").read_text())["summary"]["world_size"] == 1
    # Same cache (the capture shards were split between ranks).
    index1 = json.loads((run1 / "capture" / "cache" / "index.json").read_text())
    index2 = json.loads((run2 / "capture" / "cache" / "index.json").read_text())
    assert index1 == index2
    for shard in sorted((run1 / "capture" / "cache").glob("shard-*.bin")):
        a, b = shard.read_bytes(), (run2 / "capture" / "cache" / shard.name).read_bytes()
        assert len(a) == len(b)
    max_diff, mean_diff = student_difference(run1, run2)  # same student within the data-parallel tolerance
    m1 = json.loads((run1 / "evaluate" / "metrics.json").read_text())
    m2 = json.loads((run2 / "evaluate" / "metrics.json").read_text())
    assert m1["student"]["accuracy"] == m2["student"]["accuracy"]
    assert m1["teacher"]["accuracy"] == m2["teacher"]["accuracy"]
    print(f"student weights, 1 vs 2 processes: max |diff| {max_diff:.3e}, mean |diff| {mean_diff:.3e}")
