"""Failures while running: a second pipeline on the same folder, a full disk, a
corrupted cache shard, a non-finite loss, an unreachable MLflow server, Ctrl-C.
Each: non-zero exit, one message naming what happened and what to do, no
traceback, complete stages kept; where the fix is "rerun", the rerun finishes."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.helpers import ROOT
from tests.reliability.helpers import (
    CONFIG_NAME,
    FINISHED,
    ONE_THREAD,
    assert_complete_stages_untouched,
    assert_resumable_interrupt,
    cli,
    error_message,
    expect_error,
    nothing_written,
    stop,
)


def args(run, *overrides, only=None):
    extra = ("--only", only) if only else ()
    return ("run", run.config, *overrides, *extra, "--runs-dir", str(run.runs_dir))


def mlflow_runs(runs_dir: Path):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(CONFIG_NAME)
    return client, client.search_runs([experiment.experiment_id])


# ------------------------------------------------------------------ the run lock


def hold_lock(run_dir: Path) -> subprocess.Popen:
    code = (
        "import sys, time; from pathlib import Path; from pipeline.runner import run_lock\n"
        "with run_lock(Path(sys.argv[1])):\n    print('locked', flush=True); time.sleep(300)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_second_pipeline_on_the_same_folder_is_refused(run_copy):
    before = run_copy.snapshot()
    holder = hold_lock(run_copy.run_dir)
    try:
        result = expect_error(
            *args(run_copy, only="distill"),
            code=1,
            phrases=(
                f"run folder {run_copy.run_dir} is in use by another pipeline",
                f"pid {holder.pid} on",
                "wait for it to finish",
            ),
        )
        assert holder.poll() is None, "the first pipeline must keep running"
        assert f"pid {holder.pid}" in (run_copy.run_dir / ".lock").read_text()  # its lock record is intact
        assert not (run_copy.run_dir / "distill.partial").exists(), result.stderr
    finally:
        holder.terminate()
        holder.wait()
    assert_complete_stages_untouched(before, run_copy.run_dir)
    # Once the holder is gone the folder is free again.
    assert (
        cli(
            *args(
                run_copy,
                only="prepare",
            )
        ).returncode
        == 0
    )


# ------------------------------------------------------------------ disk full


def _mount(*options: str, target: Path) -> bool:
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(target)], capture_output=True
        ).returncode
        == 0
    )


@contextlib.contextmanager
def run_dir_on_small_disk(run, room: int):
    """Move the run folder onto a tmpfs with only `room` bytes free; yields a function that makes space."""
    original = run.run_dir.with_name(CONFIG_NAME + ".src")
    os.replace(run.run_dir, original)
    run.run_dir.mkdir()
    if os.geteuid() != 0 or not _mount("size=256m", target=run.run_dir):
        os.rmdir(run.run_dir)
        os.replace(original, run.run_dir)
        pytest.skip("needs root to mount a tmpfs (a real full disk)")
    try:
        shutil.copytree(original, run.run_dir, dirs_exist_ok=True)
        stat = os.statvfs(run.run_dir)
        used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
        assert subprocess.run(["mount", "-o", f"remount,size={used + room}", str(run.run_dir)]).returncode == 0

        def make_room():
            assert subprocess.run(["mount", "-o", "remount,size=256m", str(run.run_dir)]).returncode == 0

        yield make_room
    finally:
        subprocess.run(["umount", "-l", str(run.run_dir)])
        shutil.rmtree(original, ignore_errors=True)


def test_disk_full_while_writing_the_cache(run_copy):
    cache = run_copy.run_dir / "capture" / "cache"
    shard = (cache / "shard-00000.bin").stat().st_size
    before = run_copy.snapshot()
    with run_dir_on_small_disk(run_copy, room=shard + 48 * 1024) as make_room:
        result = expect_error(
            *args(run_copy, only="capture"),
            code=1,
            phrases=(
                "disk full: the capture stage could not write",
                f"{run_copy.run_dir}/capture.partial",
                "rerun the same command",
            ),
        )
        assert_complete_stages_untouched(before, run_copy.run_dir)
        partial = run_copy.run_dir / "capture.partial" / "cache"
        assert (partial / "shard-00000.json").is_file(), "the shard finished before the disk filled is kept"
        assert "Traceback" not in result.stderr
        make_room()
        rerun = cli(*args(run_copy, only="capture"))
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "1 shard(s) already complete and verified" in rerun.stderr
        from pipeline.cache import TeacherCache

        TeacherCache(run_copy.run_dir / "capture" / "cache")  # every shard verifies


# export with 6 MB: the fp32 graph fits, and the disk fills where onnx's shape inference (inside onnxruntime's quantizer)
# writes model-inferred.onnx with a C++ writer that reports nothing; it used to end in "DecodeError: Wire format was
# corrupt" from reading the truncated file back (pipeline.export.quantize.room_for_shape_inference)
@pytest.mark.parametrize("stage, room", [("evaluate", 160 * 1024), ("export", 6 * 1024 * 1024)])
def test_disk_full_with_mlflow_on_that_disk_is_one_paragraph(finished_run, tmp_path, stage, room):
    """The runs folder (MLflow's database included) on a disk that fills while evaluate writes its plots or the export
    its graphs: one paragraph naming the stage's folder, no library traceback (MLflow logs each failed write with
    one), no SQL; a subprocess, so MLflow's own stderr handler is what the user sees (issue 29)."""
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    if os.geteuid() != 0 or not _mount("size=1g", target=runs_dir):
        pytest.skip("needs root to mount a tmpfs (a real full disk)")
    try:
        shutil.copytree(finished_run["runs_dir"], runs_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns(stage))
        stat = os.statvfs(runs_dir)
        used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
        assert subprocess.run(["mount", "-o", f"remount,size={used + room}", str(runs_dir)]).returncode == 0
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "run",
                *FINISHED,
                "--only",
                stage,
                "--force",
                "--runs-dir",
                str(runs_dir),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **ONE_THREAD},
        )
        assert result.returncode == 1, result.stderr[-3000:]
        assert "Traceback" not in result.stderr and "[SQL:" not in result.stderr, result.stderr[-3000:]
        message = error_message(result.stderr)
        assert message.startswith(f"Disk full: the {stage} stage could not write"), message
        assert str(runs_dir / "tiny" / f"{stage}.partial") in message and "rerun the same command" in message.lower()
        named = Path(re.search(r"could not write (\S+)", message).group(1))  # the file, not only the stage's folder
        assert named.is_relative_to(runs_dir / "tiny" / f"{stage}.partial") and named.suffix, message
        if stage == "export":
            assert named.name == "model-inferred.onnx" and "DecodeError" not in message, message
        assert len(result.stderr) < 6000, result.stderr  # a few log lines and the paragraph, not pages of tracebacks
        assert (runs_dir / "tiny" / "distill" / "manifest.json").is_file()  # complete stages stay complete
    finally:
        subprocess.run(["umount", "-l", str(runs_dir)])


@pytest.mark.parametrize(
    "stage, overrides",
    [("prepare", ()), ("teacher", ()), ("peers", ("peers.enabled=true", "peers.fasttext.buckets=1000"))],
    ids=["prepare", "teacher", "peers"],
)
def test_disk_full_in_the_other_writing_stages_is_one_paragraph(run_copy, stage, overrides):
    """With 64 KB left, each stage's first sizable write fails: the paragraph names the stage, the disk and the rerun,
    nothing complete is touched, and with room again the same command completes (capture, distill and export have
    their own cases above and below)."""
    before = run_copy.snapshot()
    with run_dir_on_small_disk(run_copy, room=64 * 1024) as make_room:
        result = expect_error(
            *args(run_copy, *overrides, "--force", only=stage),
            code=1,
            phrases=(f"disk full: the {stage} stage could not write", "rerun the same command"),
        )
        assert "Traceback" not in result.stderr
        assert_complete_stages_untouched(before, run_copy.run_dir)  # the forced stage's old output too
        make_room()
        assert cli(*args(run_copy, *overrides, "--force", only=stage)).returncode == 0


def test_disk_full_while_writing_a_checkpoint(run_copy):
    """The second checkpoint does not fit: torch.save fails with a bare RuntimeError."""
    # A checkpoint is about 3x the student's weights (weights + two AdamW moments); the
    # student (one of the two teacher layers + all embeddings) is about the teacher's size.
    weights = (run_copy.run_dir / "teacher" / "model" / "model.safetensors").stat().st_size
    full_table = "distill.used_embedding_rows=false"  # every checkpoint holds the whole embedding table, as sized here
    before = run_copy.snapshot()
    with run_dir_on_small_disk(run_copy, room=int(4.5 * weights)) as make_room:
        result = expect_error(
            *args(run_copy, full_table, only="distill"),
            code=1,
            phrases=("disk full: the distill stage could not write", "rerun the same command", "last checkpoint"),
        )
        assert_complete_stages_untouched(before, run_copy.run_dir)
        checkpoints = run_copy.run_dir / "distill.partial" / "checkpoints-distill"
        done = sorted(p.name for p in checkpoints.glob("step-*") if not p.name.endswith(".tmp"))
        assert done == ["step-00000002-e0b2"], (done, result.stderr[-2000:])
        make_room()
        rerun = cli(*args(run_copy, full_table, only="distill"))
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "resuming from checkpoint step-00000002-e0b2" in rerun.stderr
        assert (run_copy.run_dir / "distill" / "manifest.json").is_file()


# ------------------------------------------------------------------ cache, loss, tracking


def test_corrupted_cache_shard(run_copy):
    shard = run_copy.run_dir / "capture" / "cache" / "shard-00001.bin"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    before = run_copy.snapshot()
    # The capture manifest's digests catch it before distill reads anything...
    expect_error(
        *args(run_copy, only="distill"),
        code=1,
        phrases=(
            "needs the output of 'capture', which is damaged",
            "cache/shard-00001.bin was modified",
            "capture reruns first",
        ),
    )
    assert_complete_stages_untouched(before, run_copy.run_dir)
    # ...and the cache's own checksums (what online readers rely on) as well.
    from pipeline.cache import TeacherCache
    from pipeline.errors import CacheError

    with pytest.raises(CacheError, match=f"shard {shard} is corrupted.*checksum.*--from capture"):
        TeacherCache(run_copy.run_dir / "capture" / "cache")
    # The fix: recompute the cache.
    assert cli(*args(run_copy, only="capture")).returncode == 0
    TeacherCache(run_copy.run_dir / "capture" / "cache")


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(run_copy):
    """A NaN teacher logit in the 4th batch: the run stops at step 4 naming the term."""
    from pipeline.config import load_config
    from pipeline.data import global_batches
    from pipeline.integrity import output_listing
    from pipeline.splits import TrainingData

    config = load_config(run_copy.config)
    train = TrainingData(run_copy.run_dir / "prepare")
    batches = global_batches(len(train), config.distill.batch_size, config.seed, 0, lengths=train.lengths)
    example = int(batches[3][0])
    meta_path = run_copy.run_dir / "capture" / "cache" / f"shard-{example // config.capture.shard_size:05d}.json"
    meta = json.loads(meta_path.read_text())
    meta["logits"][example - meta["first"]] = [math.nan] * len(meta["logits"][0])
    meta_path.write_text(json.dumps(meta))
    manifest_path = run_copy.run_dir / "capture" / "manifest.json"  # as if the teacher itself had produced the NaN
    manifest = json.loads(manifest_path.read_text())
    manifest["outputs"] = output_listing(run_copy.run_dir / "capture")
    manifest_path.write_text(json.dumps(manifest))
    before = run_copy.snapshot()
    expect_error(
        *args(run_copy, only="distill"),
        code=1,
        phrases=(
            "distill: the loss became non-finite at optimizer step 4",
            "term(s): kd",
            "last good checkpoint is kept",
            "lower the learning rate",
        ),
    )
    assert_complete_stages_untouched(before, run_copy.run_dir)
    assert not (run_copy.run_dir / "distill").exists()
    checkpoints = run_copy.run_dir / "distill.partial" / "checkpoints-distill"
    kept = sorted(p for p in checkpoints.glob("step-*") if not p.name.endswith(".tmp"))
    assert [p.name for p in kept] == ["step-00000002-e0b2"]
    weights = load_file(kept[-1] / "model.safetensors")
    assert all(v.float().isfinite().all() for v in weights.values())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_mlflow_server_fails_fast(run_copy):
    before = nothing_written(run_copy.run_dir)
    uri = f"http://127.0.0.1:{closed_port()}"
    started = time.time()
    result = cli(*args(run_copy, "distill.epochs=2"), env={"MLFLOW_TRACKING_URI": uri})
    elapsed = time.time() - started
    assert result.returncode == 1 and "Traceback" not in result.stderr
    message = error_message(result.stderr)
    assert f"MLflow tracking store {uri} is unreachable" in message and "Nothing was run" in message
    assert elapsed < 30, f"took {elapsed:.1f} s"
    assert "running" not in result.stderr  # no stage started
    assert nothing_written(run_copy.run_dir) == before
    assert not list(run_copy.run_dir.glob("*.partial"))


def test_unreachable_mlflow_server_never_shows_the_password(run_copy):
    uri = f"http://alice:s3cr3t-pass@127.0.0.1:{closed_port()}"
    result = expect_error(
        *args(run_copy), code=1, phrases=("http://***@127.0.0.1", "unreachable"), env={"MLFLOW_TRACKING_URI": uri}
    )
    assert "s3cr3t-pass" not in result.stderr
    debug = cli(*args(run_copy), "--debug", env={"MLFLOW_TRACKING_URI": uri})
    assert "Traceback" in debug.stderr and "s3cr3t-pass" not in debug.stderr


# ------------------------------------------------------------------ other run errors


def test_only_a_stage_whose_inputs_are_missing(run_copy):
    shutil.rmtree(run_copy.run_dir / "prepare")
    before = run_copy.snapshot()
    expect_error(
        *args(run_copy, only="teacher"),
        code=1,
        phrases=("stage 'teacher' needs the output of 'prepare', which is not complete", "run without --only first"),
    )
    assert_complete_stages_untouched(before, run_copy.run_dir)


def test_only_a_stage_whose_input_is_stale_is_recorded_stale(run_copy):
    """--only distill after a capture setting changed: the student is trained on the old capture, so it must not be
    recorded as current (its fingerprint is taken from the capture it read, not from the config's capture)."""
    before = run_copy.snapshot()
    result = cli(*args(run_copy, "capture.shard_size=16", only="distill"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[distill] reads the stale output of capture (--only leaves it as it is)" in result.stderr
    assert_complete_stages_untouched(before, run_copy.run_dir)  # capture stays as it was

    def states(*overrides):
        shown = cli("status", run_copy.config, *overrides, "--runs-dir", str(run_copy.runs_dir))
        return {line.split()[0]: line.split()[1] for line in shown.stdout.splitlines()[2:] if line.strip()}

    assert (states("capture.shard_size=16")["capture"], states("capture.shard_size=16")["distill"]) == ("stale",) * 2
    assert states()["distill"] == "done", states()  # current for the settings it was really made with


def test_checkpoint_at_an_already_saved_position(tmp_path):
    """Ctrl-C right after a checkpoint saves the same position again: no error, same folder."""
    from types import SimpleNamespace

    import torch

    from pipeline.training import Checkpoints, Progress

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    dist = SimpleNamespace(
        accelerator=SimpleNamespace(unwrap_model=lambda m: m, scaler=None), rank=0, is_main=True, barrier=lambda: None
    )
    checkpoints = Checkpoints(tmp_path, keep=2)
    progress = Progress(epoch=0, batches_done=2, global_step=2)
    first = checkpoints.save(dist, {"model": model}, optimizer, scheduler, progress)
    again = checkpoints.save(dist, {"model": model}, optimizer, scheduler, progress)
    assert first == again == checkpoints.latest()


def test_cache_too_large_points_to_online_mode(run_copy):
    before = run_copy.snapshot()
    expect_error(
        *args(run_copy, "capture.max_cache_gb=0.00001", only="capture"),
        code=1,
        phrases=("above capture.max_cache_gb=1e-05", "set capture.mode=online"),
    )
    assert_complete_stages_untouched(before, run_copy.run_dir)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="fp16 is valid with a GPU")
def test_fp16_without_a_gpu(run_copy):
    before = nothing_written(run_copy.run_dir)
    expect_error(*args(run_copy, "precision=fp16"), code=1, phrases=("fp16 needs a cuda gpu", "use precision: bf16"))
    assert nothing_written(run_copy.run_dir) == before


# ------------------------------------------------------------------ Ctrl-C


def test_sigint_during_distill_then_rerun_resumes(run_copy):
    """A real `python -m pipeline` process: while it trains, a second pipeline is
    refused (naming it) and it is not disturbed; Ctrl-C then stops it with exit
    130 and a resume hint; the same command resumes from its checkpoint."""
    # Enough epochs that the run is still training when the second pipeline and
    # the SIGINT arrive (a fp32 epoch of this copy takes ~0.3 s).
    EPOCHS = "distill.epochs=40"
    before = run_copy.snapshot()
    command = [sys.executable, "-m", "pipeline", *args(run_copy, EPOCHS, only="distill")]
    # A test runner started in the background (`make test &`) inherits SIGINT as
    # ignored and so would the child: restore the default so Ctrl-C is delivered.
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **ONE_THREAD},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    checkpoints = run_copy.run_dir / "distill.partial" / "checkpoints-distill"
    try:
        deadline = time.time() + 240
        while process.poll() is None and time.time() < deadline:
            if any(not p.name.endswith(".tmp") for p in checkpoints.glob("step-*")):
                break
            time.sleep(0.05)
        assert process.poll() is None, "distill ended before it could be interrupted"
        racer = cli(*args(run_copy, EPOCHS, only="distill"))
        assert racer.returncode == 1 and f"pid {process.pid} on" in error_message(racer.stderr)
        assert process.poll() is None
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        stop(process)
    assert_resumable_interrupt(process, stderr)
    assert not (run_copy.run_dir / "distill").exists()
    assert_complete_stages_untouched(before, run_copy.run_dir)
    client, runs = mlflow_runs(run_copy.runs_dir)
    distill_runs = [r for r in runs if r.info.run_name == "distill"]
    assert [r.info.status for r in distill_runs] == ["KILLED"]
    resumed = cli(*args(run_copy, EPOCHS, only="distill"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from checkpoint" in resumed.stderr
    assert json.loads((run_copy.run_dir / "distill" / "manifest.json").read_text())["stage"] == "distill"


# ------------------------------------------------------------------ where things are written


def test_mlflow_artifacts_stay_under_the_runs_dir(base_run):
    """Artifacts of the local store go to RUNS_DIR/mlartifacts, never ./mlruns of the working directory."""
    client, runs = mlflow_runs(base_run.runs_dir)
    experiment = client.get_experiment_by_name(CONFIG_NAME)
    assert experiment.artifact_location == (base_run.runs_dir.resolve() / "mlartifacts").as_uri()
    prepare = next(r for r in runs if r.info.run_name == "prepare")
    assert [a.path for a in client.list_artifacts(prepare.info.run_id)] == ["stats.json"]
    assert (base_run.runs_dir / "mlartifacts").is_dir()


def test_disk_full_is_recognised_in_every_form(tmp_path):
    import errno

    from pipeline.errors import DiskFullError, disk_full_error

    cases = [
        OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.bin")),  # Python / Arrow writes
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        Exception("Error while serializing: I/O error: No space left on device (os error 28)"),  # safetensors
        RuntimeError("(sqlite3.OperationalError) database or disk is full"),  # MLflow's sqlite store
    ]
    for exc in cases:
        error = disk_full_error(exc, tmp_path / "distill.partial", "the distill stage")
        assert isinstance(error, DiskFullError), exc
        assert str(error).startswith("Disk full: the distill stage could not write")
    assert str(tmp_path / "x.bin") in str(disk_full_error(cases[0], tmp_path, "the capture stage"))
    # Unrelated errors on a disk with room stay what they are.
    assert disk_full_error(RuntimeError("shape mismatch"), tmp_path, "the distill stage") is None
    assert disk_full_error(OSError(errno.EACCES, "Permission denied"), tmp_path, "x") is None
