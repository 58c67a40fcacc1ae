"""Results follow their inputs; outputs are verified; MLflow store problems, unexpected
exceptions, SIGTERM and killed processes each end in one clear paragraph and a
consistent state."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import ROOT
from tests.reliability.helpers import (
    CONFIG_NAME,
    FINISHED,
    NO_PTE,
    ONE_THREAD,
    assert_resumable_interrupt,
    cli,
    error_message,
    expect_error,
    nothing_written,
    planned,
    stop,
    write_config,
)


def args(run, *overrides, only=None, to=None):
    extra = (("--only", only) if only else ()) + (("--to", to) if to else ())
    return ("run", run.config, *overrides, *extra, "--runs-dir", str(run.runs_dir))


def manifest(run_dir: Path, stage: str) -> dict:
    return json.loads((run_dir / stage / "manifest.json").read_text())


# ------------------------------------------------------------------ results follow their inputs


def test_edited_data_file_makes_prepare_and_everything_after_stale(run_copy, tmp_path):
    data = tmp_path / "reviews.csv"
    rows = [
        {"text": f"review {i} was {'good' if i % 2 else 'bad'} overall", "label": "pos" if i % 2 else "neg"}
        for i in range(60)
    ]
    pd.DataFrame(rows).to_csv(data, index=False)
    overrides = ("data.source=csv", f"data.path={data}", "data.group_column=null")
    assert cli(*args(run_copy, *overrides, only="prepare")).returncode == 0
    assert "prepare" not in planned(run_copy.config, run_copy.runs_dir, *overrides)
    pd.DataFrame(rows + [{"text": "one more review, a new one", "label": "pos"}]).to_csv(data, index=False)
    assert planned(run_copy.config, run_copy.runs_dir, *overrides) == [
        "prepare",
        "teacher",
        "peers",
        "capture",
        "distill",
        "evaluate",
        "export",
    ]
    status = cli("status", run_copy.config, *overrides, "--runs-dir", str(run_copy.runs_dir))
    assert "prepare    stale" in status.stdout


def test_local_teacher_folder_contents_are_part_of_the_fingerprint(finished_run, tmp_path):
    from pipeline.config import load_config
    from pipeline.runner import fingerprints

    teacher = tmp_path / "teacher"
    shutil.copytree(finished_run["run_dir"] / "teacher" / "model", teacher)
    config = load_config("tiny", [f"teacher.model={teacher}", "teacher.random=null"])
    before = fingerprints(config)
    (teacher / "config.json").write_text((teacher / "config.json").read_text().replace("{", '{"edited": 1, ', 1))
    after = fingerprints(config)
    assert before["prepare"] != after["prepare"] and before["teacher"] != after["teacher"]


def test_manifests_list_every_output_with_its_digest(finished_run):
    from pipeline.integrity import sha256_file
    from pipeline.runner import STAGES

    for stage in STAGES:
        folder = finished_run["run_dir"] / stage
        outputs = manifest(finished_run["run_dir"], stage)["outputs"]
        on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"manifest.json"}
        assert set(outputs) == on_disk, stage
        for name, entry in outputs.items():
            assert entry["bytes"] == (folder / name).stat().st_size
            assert entry["sha256"] == sha256_file(folder / name)


def test_truncated_output_reruns_that_stage_and_what_read_it(run_copy):
    weights = run_copy.run_dir / "teacher" / "model" / "model.safetensors"
    size = weights.stat().st_size
    prepare_before = manifest(run_copy.run_dir, "prepare")
    capture_before = manifest(run_copy.run_dir, "capture")
    with open(weights, "r+b") as fh:
        fh.truncate(size // 2)
    status = cli("status", run_copy.config, "--runs-dir", str(run_copy.runs_dir))
    assert "teacher    damaged" in status.stdout and "capture    done" in status.stdout
    assert f"teacher/model/model.safetensors has {size // 2} bytes, {size} were written" in status.stdout
    result = cli(*args(run_copy, to="capture"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[teacher] output damaged (teacher/model/model.safetensors has" in result.stderr
    assert "rerunning teacher, peers, capture, distill, evaluate, export" in result.stderr
    assert manifest(run_copy.run_dir, "prepare") == prepare_before  # upstream untouched
    assert manifest(run_copy.run_dir, "capture")["mlflow_run_id"] != capture_before["mlflow_run_id"]  # capture reran
    assert "[capture] running" in result.stderr
    assert weights.stat().st_size == size


def test_damaged_files_of_a_finished_run_plan_exactly_their_dependents(finished_run, tmp_path):
    runs_dir = tmp_path / "runs"
    shutil.copytree(finished_run["runs_dir"], runs_dir)
    run_dir = runs_dir / "tiny"
    assert planned("tiny", runs_dir, NO_PTE) == []
    student = run_dir / "distill" / "student" / "model.safetensors"
    with open(student, "r+b") as fh:
        fh.truncate(100)
    assert planned("tiny", runs_dir, NO_PTE) == ["distill", "evaluate", "export"]
    shutil.copy2(finished_run["run_dir"] / "distill" / "student" / "model.safetensors", student)
    assert planned("tiny", runs_dir, NO_PTE) == []
    metrics = run_dir / "evaluate" / "metrics.json"
    metrics.write_text(metrics.read_text()[:-20])  # corrupt, same folder
    assert planned("tiny", runs_dir, NO_PTE) == ["evaluate"]
    # Same size, new content: caught by the digest once the modification time moved.
    labels = run_dir / "export" / "bundle" / "labels.json"
    labels.write_text(labels.read_text().swapcase())
    assert planned("tiny", runs_dir, NO_PTE) == ["evaluate", "export"]
    import contextlib
    import io

    from pipeline.summary import print_summary

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_summary(run_dir, [])
    assert f"warning: {metrics} is unreadable" in out.getvalue()


# ------------------------------------------------------------------ one paragraph for every failure


def test_unexpected_exception_names_the_stage_and_hides_secrets(run_copy, monkeypatch):
    import stages.distill

    secret = "tok-4c1d-very-secret"

    def broken(ctx):
        raise ValueError(f"something odd with {secret}")

    monkeypatch.setattr(stages.distill, "run", broken)
    env = {"FAKE_API_TOKEN": secret}
    result = expect_error(
        *args(run_copy, only="distill"),
        code=1,
        env=env,
        phrases=("unexpected error in the distill stage", "ValueError", "--debug", "***"),
    )
    assert secret not in result.stderr
    debug = cli(*args(run_copy, only="distill"), "--debug", env=env)
    assert "Traceback" in debug.stderr and secret not in debug.stderr


def test_permission_denied_is_explained(run_copy, monkeypatch):
    import contextlib

    import pipeline.runner

    @contextlib.contextmanager
    def read_only(run_dir):
        raise PermissionError(13, "Permission denied", str(run_dir / ".lock"))
        yield

    monkeypatch.setattr(pipeline.runner, "run_lock", read_only)
    expect_error(
        *args(run_copy, only="prepare"),
        code=1,
        phrases=("permission denied", str(run_copy.run_dir / ".lock"), "--runs-dir"),
    )


def test_runs_dir_that_is_a_file(run_copy, tmp_path):
    path = tmp_path / "a-file"
    path.write_text("x")
    expect_error("run", run_copy.config, "--runs-dir", str(path), code=2, phrases=(f"--runs-dir {path} is a file",))


# ------------------------------------------------------------------ the MLflow store


def test_damaged_mlflow_database(run_copy):
    db = run_copy.runs_dir / "mlflow.db"
    db.write_bytes(b"not a database " * 400)
    before = nothing_written(run_copy.run_dir)
    expect_error(
        *args(run_copy, only="distill"),
        code=1,
        phrases=("is not a readable sqlite database", f"mv {db} {db}.bad", "Nothing was run"),
    )
    assert nothing_written(run_copy.run_dir) == before


def test_locked_mlflow_database(run_copy, monkeypatch):
    monkeypatch.setattr("pipeline.tracking.LOCK_WAIT_S", 1.0)  # the same error after 1 s of waiting, not 30
    db = run_copy.runs_dir / "mlflow.db"
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        result = cli(*args(run_copy, only="distill"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "is locked by another process" in error_message(result.stderr)


@pytest.mark.parametrize(
    "uri, phrases",
    [
        ("htp://alice:pa55-w0rd-x@localhost:5000", ("htp://***@localhost:5000", "scheme, 'htp'")),
        (
            "postgresql://alice:pa55-w0rd-x@localhost:5432/mlflow",
            ("postgresql://***@localhost", "driver", "pip install"),
        ),
    ],
    ids=["scheme-typo", "postgres-without-driver"],
)
def test_tracking_uri_problems_never_show_the_password(run_copy, uri, phrases):
    env = {"MLFLOW_TRACKING_URI": uri}
    result = expect_error(*args(run_copy, only="distill"), code=1, phrases=phrases, env=env)
    debug = cli(*args(run_copy, only="distill"), "--debug", env=env)
    assert "pa55-w0rd-x" not in result.stderr + result.stdout + debug.stderr + debug.stdout


@pytest.mark.pipeline  # two real processes preparing at once
def test_two_configs_start_at_once_on_a_fresh_runs_folder(tmp_path):
    runs_dir = tmp_path / "runs"
    configs = [
        write_config(tmp_path, name, f"extends: {ROOT / 'configs' / 'tiny.yaml'}\ndata:\n  max_examples: 60\n")
        for name in ("first", "second")
    ]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "pipeline", "run", str(c), "--only", "prepare", "--runs-dir", str(runs_dir)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **ONE_THREAD},
        )
        for c in configs
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]
    assert all((runs_dir / name / "prepare" / "manifest.json").is_file() for name in ("first", "second"))


def test_artifacts_follow_a_moved_runs_folder(run_copy, base_run):
    """run_copy is base_run's runs folder copied elsewhere: its store still names the old folder until a run."""
    import mlflow

    result = cli(*args(run_copy, only="prepare"), "--force")
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{run_copy.runs_dir / 'mlflow.db'}")
    here = (run_copy.runs_dir.resolve() / "mlartifacts").as_uri()
    assert client.get_experiment_by_name(CONFIG_NAME).artifact_location == here
    runs = client.search_runs([client.get_experiment_by_name(CONFIG_NAME).experiment_id])
    assert runs and all(r.info.artifact_uri.startswith(here + "/") for r in runs)
    first_prepare = min((r for r in runs if r.info.run_name == "prepare"), key=lambda r: r.info.start_time)
    assert [a.path for a in client.list_artifacts(first_prepare.info.run_id)] == ["stats.json"]


# ------------------------------------------------------------------ signals and orphaned runs


def start_distill(run) -> subprocess.Popen:
    command = [sys.executable, "-m", "pipeline", *args(run, "distill.epochs=40", only="distill")]
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **ONE_THREAD}
    )


def wait_for_checkpoint(process: subprocess.Popen, run, newer_than: float = 0.0) -> None:
    checkpoints = run.run_dir / "distill.partial" / "checkpoints-distill"
    deadline = time.time() + 240
    while process.poll() is None and time.time() < deadline:
        if any(not p.name.endswith(".tmp") and p.stat().st_mtime > newer_than for p in checkpoints.glob("step-*")):
            return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint (exit {process.poll()})")


def test_kill9_leaves_no_running_run_and_sigterm_acts_like_ctrl_c(run_copy):
    import mlflow

    process = start_distill(run_copy)
    try:
        wait_for_checkpoint(process, run_copy)
        process.kill()  # kill -9: no handler runs, MLflow is left with RUNNING runs
        process.wait()
        client = mlflow.MlflowClient(f"sqlite:///{run_copy.runs_dir / 'mlflow.db'}")
        experiment = client.get_experiment_by_name(CONFIG_NAME).experiment_id
        killed = {r.info.run_id for r in client.search_runs([experiment], "attributes.status = 'RUNNING'")}
        assert len(killed) == 2  # the pipeline's parent run and the distill stage run
        started = time.time()
        process = start_distill(run_copy)
        wait_for_checkpoint(process, run_copy, newer_than=started)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        stop(process)
    assert_resumable_interrupt(process, stderr)
    assert "was left RUNNING by a process that died; marked KILLED" in stderr
    distill_runs = [r for r in client.search_runs([experiment]) if r.info.run_name == "distill"]
    assert sorted(r.info.status for r in distill_runs) == ["KILLED", "KILLED"]
    assert not client.search_runs([experiment], "attributes.status = 'RUNNING'")


def test_summary_leaves_out_figures_of_an_outdated_stage(finished_run, tmp_path):
    runs_dir = tmp_path / "runs"
    shutil.copytree(finished_run["runs_dir"], runs_dir)
    current = cli("run", *FINISHED, "--runs-dir", str(runs_dir))
    assert current.returncode == 0 and "student ONNX int8" in current.stdout
    outdated = cli("run", *FINISHED, "export.latency_runs=3", "--to", "evaluate", "--runs-dir", str(runs_dir))
    assert outdated.returncode == 0, outdated.stderr[-3000:]
    assert "note: export figures are left out: its output is stale" in outdated.stdout
    assert "student ONNX int8" not in outdated.stdout and "student (PyTorch)" in outdated.stdout


def test_a_stage_rerun_with_new_output_makes_its_readers_stale(finished_run, tmp_path):
    """Downstream manifests record what they read: a rerun upstream stage whose output changed reruns them
    too, on any later run (not only the run that noticed the damage)."""
    from pipeline.integrity import output_listing

    runs_dir = tmp_path / "runs"
    shutil.copytree(finished_run["runs_dir"], runs_dir)
    distill = runs_dir / "tiny" / "distill"
    (distill / "history.json").write_text((distill / "history.json").read_text() + "\n")
    record = json.loads((distill / "manifest.json").read_text())
    record["outputs"] = output_listing(distill)  # as if distill had been rerun and written this
    (distill / "manifest.json").write_text(json.dumps(record))
    assert planned("tiny", runs_dir, NO_PTE) == ["evaluate", "export"]
    status = cli("status", *FINISHED, "--runs-dir", str(runs_dir))
    assert "evaluate   stale" in status.stdout and "distill was rerun with a different output" in status.stdout


def test_only_refuses_to_read_a_damaged_input(finished_run, tmp_path):
    runs_dir = tmp_path / "runs"
    shutil.copytree(finished_run["runs_dir"], runs_dir)
    with open(runs_dir / "tiny" / "distill" / "student" / "model.safetensors", "r+b") as fh:
        fh.truncate(10)
    expect_error(
        "run",
        "tiny",
        "--only",
        "evaluate",
        "--runs-dir",
        str(runs_dir),
        code=1,
        phrases=("needs the output of 'distill', which is damaged", "student/model.safetensors has 10 bytes"),
    )


def test_out_of_memory_is_explained(tmp_path):
    from pipeline.cli import explain

    error = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    error.pipeline_stage = "distill"
    message = str(explain(error, tmp_path))
    assert message.startswith("Out of memory in the distill stage") and "batch_size" in message


def test_a_run_with_nothing_to_do_also_ends_orphaned_runs(finished_run, tmp_path):
    import socket

    import mlflow

    from pipeline.tracking import RUN_FOLDER_TAG

    runs_dir = tmp_path / "runs"
    shutil.copytree(finished_run["runs_dir"], runs_dir)
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny").experiment_id
    folder = f"{socket.gethostname()}:{(runs_dir / 'tiny').resolve()}"
    orphan = client.create_run(experiment, run_name="export", tags={RUN_FOLDER_TAG: folder}).info.run_id
    other = client.create_run(experiment, run_name="export", tags={RUN_FOLDER_TAG: "elsewhere:/x"}).info.run_id
    result = cli("run", *FINISHED, "--runs-dir", str(runs_dir))
    assert result.returncode == 0 and "nothing to do" in result.stderr
    assert client.get_run(orphan).info.status == "KILLED"
    assert client.get_run(other).info.status == "RUNNING"  # another folder's run is not ours to end
