"""One data-parallel job over two "nodes" on this machine: two launchers with --num_machines 2 on 127.0.0.1 and one
shared runs folder, each started the way docs/cluster/distill.sbatch (Slurm) or docs/cluster/pytorchjob.yaml
(Kubeflow) starts it, against one process; a node that dies or freezes, and a runs folder the nodes do not share.

Node 1's process is global rank 1 but LOCAL rank 0: anything that confused the two would make it write outputs or
MLflow runs next to rank 0's, which the folder listing and the MLflow store comparisons below would show.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.helpers import (
    NO_DROPOUT,
    ONE_THREAD,
    ROOT,
    free_port,
    read_json,
    student_difference,
)

pytestmark = pytest.mark.pipeline

SBATCH = ROOT / "docs" / "cluster" / "distill.sbatch"
PYTORCHJOB = ROOT / "docs" / "cluster" / "pytorchjob.yaml"
# Files other ranks write into the shared folder by design and keep there: the capture shards they compute (shard i
# is computed by rank i % world). Their RNG state in each training checkpoint goes with the checkpoints when the stage
# completes.
OTHER_RANK_FILES = re.compile(r"shard-\d*[13579]\.(bin|json)")


def stand_ins(folder: Path) -> Path:
    """srun, scontrol and make as this machine plays a 2-node allocation; returns the folder to put first on PATH.

    make: the real one, but it must never (re)install the environment the tests run in (the venv's stamp is older
    than a freshly checked-out Makefile), so the stamp is treated as up to date (-o).
    """
    folder.mkdir(parents=True, exist_ok=True)
    scripts = {
        # srun --opts CMD...: one task per node, SLURM_NODEID 0..SLURM_NNODES-1, each with its own log; fails if any
        # fails. Nodes other than 0 run under umask 077: a file they create in the shared folder is mode 0600.
        "srun": """#!/bin/bash
while [[ "$1" == -* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
  ( if ((i > 0)); then umask 077; else umask 022; fi
    SLURM_NODEID=$i SLURM_PROCID=$i exec "$@" > "$NODE_LOGS/node$i.log" 2>&1 ) &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
exit $rc
""",
        "scontrol": """#!/bin/bash
[[ "$1 $2" == "show hostnames" ]] || { echo "scontrol stand-in: only 'show hostnames'" >&2; exit 2; }
for ((i = 0; i < SLURM_NNODES; i++)); do echo 127.0.0.1; done
""",
        "make": f"""#!/bin/bash
exec {subprocess.run(["bash", "-c", "type -P make"], capture_output=True, text=True).stdout.strip() or "make"} -o .venv/.installed "$@"
""",
    }
    for name, text in scripts.items():
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def _store(runs_dir: Path) -> list[tuple[str, str, str, str | None]]:
    with sqlite3.connect(runs_dir / "mlflow.db") as db:
        return db.execute(
            "SELECT r.run_uuid, r.name, r.status, t.value FROM runs r LEFT JOIN tags t "
            "ON t.run_uuid = r.run_uuid AND t.key = 'mlflow.parentRunId'"
        ).fetchall()


def mlflow_runs(runs_dir: Path) -> list[tuple[str, str | None, str]]:
    """(run name, parent run name, status) of every run in the folder's MLflow store, sorted."""
    rows = _store(runs_dir)
    names = {uuid: name for uuid, name, _, _ in rows}
    return sorted((name, names.get(parent), status) for _, name, status, parent in rows)


def private_files(runs_dir: Path) -> set[str]:
    """Files without group/other read bits: what node 1 created or replaced under its umask 077, and what is made
    private whoever writes it (safetensors writes 0600 files, so this cannot tell who wrote those)."""
    return {str(p.relative_to(runs_dir)) for p in runs_dir.rglob("*") if p.is_file() and not p.stat().st_mode & 0o044}


def listing(runs_dir: Path) -> set[str]:
    """Every file under the runs folder, MLflow run ids (artifact folders) replaced by the run's name."""
    names = {uuid: f"<{name}>" for uuid, name, _, _ in _store(runs_dir)}
    return {
        "/".join(names.get(part, part) for part in p.relative_to(runs_dir).parts)
        for p in runs_dir.rglob("*")
        if p.is_file()
    }


def check_same_job(one: Path, two: Path, evaluated: bool) -> None:
    run1, run2 = one / "tiny", two / "tiny"
    assert read_json(run2 / "distill" / "manifest.json")["summary"]["world_size"] == 2
    max_diff, mean_diff = student_difference(run1, run2)
    print(f"student weights, 1 process vs 2 nodes: max |diff| {max_diff:.3e}, mean |diff| {mean_diff:.3e}")
    if evaluated:
        m1, m2 = read_json(run1 / "evaluate" / "metrics.json"), read_json(run2 / "evaluate" / "metrics.json")
        assert m1["student"]["accuracy"] == m2["student"]["accuracy"]
        print(f"student test accuracy: {m2['student']['accuracy']:.4f} (both)")


def test_sbatch_two_nodes_match_one_process(tmp_path, one_process_run):
    """docs/cluster/distill.sbatch as Slurm would run it on 2 nodes: one job, one student, one writer."""
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0
    assert "#SBATCH --nodes=2" in SBATCH.read_text()
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {
        **os.environ,
        **ONE_THREAD,
        "PATH": f"{stand_ins(tmp_path / 'bin')}:{os.environ['PATH']}",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "node[0-1]",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "NODE_LOGS": str(logs),
        "CONFIG": "tiny",
        "ARGS": " ".join([*NO_DROPOUT, "--to", "evaluate"]),
        "RUNS_DIR": str(tmp_path / "two"),
        "MASTER_PORT": str(free_port()),
    }
    started = time.monotonic()
    result = subprocess.run(["bash", str(SBATCH)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    node_logs = [(logs / f"node{i}.log").read_text() for i in (0, 1)]
    assert result.returncode == 0, "\n".join(log[-3000:] for log in node_logs) + result.stderr[-2000:]
    print(f"two nodes (sbatch): {wall:.1f} s wall")
    for rank, text in enumerate(node_logs):  # each node launched its own share of one 2-machine job
        assert f"--num_machines 2 --num_processes 2 --machine_rank {rank} --main_process_ip 127.0.0.1" in text
    assert "[rank 0]" in node_logs[0] and "[rank 1]" not in "".join(node_logs)  # rank 1 is quiet unless it fails
    check_same_job(one_process_run, tmp_path / "two", evaluated=True)
    # Only rank 0 writes: the shared folder holds what one process writes, plus the other rank's capture shards (that
    # rank 1 trained shows in distill's world_size of 2, checked above: a rank that did not would hang the all-reduce).
    extra = listing(tmp_path / "two") - listing(one_process_run)
    assert all(OTHER_RANK_FILES.fullmatch(Path(p).name) for p in extra), sorted(extra)
    assert listing(one_process_run) - listing(tmp_path / "two") == set()
    # The files both runs have, but written by node 1 (e.g. a stage output it also wrote): caught by their mode.
    by_node1 = private_files(tmp_path / "two") - private_files(one_process_run)
    assert all(OTHER_RANK_FILES.fullmatch(Path(p).name) for p in by_node1), sorted(by_node1)
    assert any(Path(p).name.startswith("shard-") for p in by_node1), "node 1 computed no capture shard"
    # One pipeline run with its stage runs, exactly as one process records them.
    runs = mlflow_runs(tmp_path / "two")
    assert runs == mlflow_runs(one_process_run)
    assert [r for r in runs if r[1] is None] == [("tiny-pipeline", None, "FINISHED")]


def test_pytorchjob_two_pods_match_one_process(tmp_path, one_process_run):
    """docs/cluster/pytorchjob.yaml: its container command, with the environment the Kubeflow operator sets."""
    job = yaml.safe_load(PYTORCHJOB.read_text())
    assert job["kind"] == "PyTorchJob" and job["apiVersion"] == "kubeflow.org/v1"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"} and replicas["Master"]["replicas"] == 1
    pods = [("Master", 0)] + [("Worker", i) for i in range(replicas["Worker"]["replicas"])]
    nnodes, nproc, port = len(pods), job["spec"]["nprocPerNode"], free_port()
    assert nnodes == 2
    # Written once, before any pod starts: rewriting a script while a pod execs it fails with ETXTBSY.
    bin_dir = stand_ins(tmp_path / "bin")
    procs = []
    for node_rank, (kind, _index) in enumerate(pods):
        container = replicas[kind]["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch"  # the operator injects its environment into this container only
        assert container["command"] == replicas["Master"]["template"]["spec"]["containers"][0]["command"]
        operator = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PET_NNODES": str(nnodes),
            "PET_NODE_RANK": str(node_rank),
            "PET_NPROC_PER_NODE": nproc,
            "WORLD_SIZE": str(nnodes * int(nproc)),
            "RANK": str(node_rank),
            "PYTHONUNBUFFERED": "0",
        }
        declared = {e["name"]: e["value"] for e in container["env"]}
        assert set(declared) >= {"CONFIG", "ARGS", "RUNS_DIR", "PIPELINE_DIST_TIMEOUT"}
        ours = {"CONFIG": "tiny", "ARGS": " ".join([*NO_DROPOUT, "--to", "distill"]), "RUNS_DIR": str(tmp_path / "two")}
        env = {
            **os.environ,
            **ONE_THREAD,
            **declared,
            **ours,
            **operator,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
        }
        log = open(tmp_path / f"pod{node_rank}.log", "w")
        procs.append(subprocess.Popen(container["command"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=600) for p in procs]
    logs = [(tmp_path / f"pod{i}.log").read_text() for i in range(nnodes)]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    check_same_job(one_process_run, tmp_path / "two", evaluated=False)


def test_torchrun_c10d_two_nodes_match_one_process(tmp_path, one_process_run):
    """The documented torchrun line (c10d rendezvous: ranks by arrival, so either node may hold rank 0)."""
    port, procs = free_port(), []
    for node_rank in (0, 1):
        command = [
            str(Path(sys.executable).parent / "torchrun"),
            "--nnodes",
            "2",
            "--nproc_per_node",
            "1",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"127.0.0.1:{port}",
            "--rdzv_id",
            "distill-test",
            "-m",
            "pipeline",
            "run",
            "tiny",
            *NO_DROPOUT,
            "--to",
            "distill",
            "--runs-dir",
            str(tmp_path / "two"),
        ]
        log = open(tmp_path / f"node{node_rank}.log", "w")
        procs.append(
            subprocess.Popen(command, cwd=ROOT, env={**os.environ, **ONE_THREAD}, stdout=log, stderr=subprocess.STDOUT)
        )
    codes = [p.wait(timeout=600) for p in procs]
    logs = [(tmp_path / f"node{i}.log").read_text() for i in (0, 1)]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert sum("[rank 0] [distill] done" in log for log in logs) == 1
    check_same_job(one_process_run, tmp_path / "two", evaluated=False)


# ---------------------------------------------------------------- failures


def start_node(
    rank: int, runs_dir: Path, port: int, log: Path, *extra: str, env: dict | None = None
) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "pipeline.launch",
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--",
        "tiny",
        *NO_DROPOUT,
        *extra,
        "--runs-dir",
        str(runs_dir),
    ]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **ONE_THREAD, **(env or {})},
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )


def wait_for(log: Path, text: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{text!r} never appeared:\n{log.read_text()[-3000:]}"
        time.sleep(0.3)


def node_processes(launcher: subprocess.Popen) -> list[psutil.Process]:
    """A node's launcher and its workers (torch's launcher starts each worker in a session of its own)."""
    root = psutil.Process(launcher.pid)
    return [root, *root.children(recursive=True)]


def reap(*nodes: subprocess.Popen) -> None:
    for node in nodes:
        if node.poll() is None:
            for process in node_processes(node):
                process.kill()
            node.wait(timeout=30)


# Long enough that distill is still running when a node is stopped (tiny trains 2 epochs in ~2 s).
LONG_DISTILL = ["distill.epochs=60", "--to", "distill"]


def finished_up_to_distill(one_process_run: Path, tmp_path: Path) -> Path:
    """A copy of the one-process run: the nodes find prepare, teacher and capture complete (the same fingerprints)
    and start distilling at once, where these tests stop a node."""
    runs = tmp_path / "runs"
    shutil.copytree(one_process_run, runs)
    return runs


def test_crashed_node_stops_both_with_a_message(tmp_path, one_process_run):
    """Node 1's training process dies (e.g. the OOM killer): both nodes exit non-zero within seconds, each saying so."""
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    port, runs = free_port(), finished_up_to_distill(one_process_run, tmp_path)
    nodes = [start_node(rank, runs, port, logs[rank], *LONG_DISTILL) for rank in (0, 1)]
    try:
        wait_for(logs[0], "[distill] epoch 1/")
        worker = node_processes(nodes[1])[-1]
        assert "pipeline" in " ".join(worker.cmdline())
        worker.kill()
        killed = time.monotonic()
        codes = [node.wait(timeout=120) for node in nodes]
        took = time.monotonic() - killed
    finally:
        reap(*nodes)
    print(f"a crashed node: both exited {took:.1f} s after the kill")
    assert all(code != 0 for code in codes), codes
    assert took < 60, took
    assert "Lost contact with another process of this distributed job during the distill stage" in logs[0].read_text()
    assert "ChildFailedError" in logs[1].read_text() and "exitcode  : -9" in logs[1].read_text()


def test_frozen_node_fails_the_job_after_the_timeout(tmp_path, one_process_run):
    """Node 1 stops answering (SIGSTOP: a hung machine keeps its connections open): node 0 gives up after
    PIPELINE_DIST_TIMEOUT seconds with a message naming it, instead of waiting forever."""
    timeout_s = 15
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    port, runs = free_port(), finished_up_to_distill(one_process_run, tmp_path)
    env = {"PIPELINE_DIST_TIMEOUT": str(timeout_s)}
    nodes = [start_node(rank, runs, port, logs[rank], *LONG_DISTILL, env=env) for rank in (0, 1)]
    try:
        wait_for(logs[0], "[distill] epoch 1/")
        frozen = node_processes(nodes[1])
        for process in frozen:
            process.suspend()
        stopped = time.monotonic()
        code = nodes[0].wait(timeout=timeout_s + 90)
        took = time.monotonic() - stopped
    finally:
        reap(*nodes)
    print(f"a frozen node: node 0 exited {took:.1f} s after the freeze (timeout {timeout_s} s)")
    assert code != 0
    assert timeout_s - 1 < took < timeout_s + 45, took
    text = logs[0].read_text()
    assert "Lost contact with another process" in text and f"PIPELINE_DIST_TIMEOUT seconds ({timeout_s} here)" in text


def test_runs_folder_not_shared_is_refused_on_every_node(tmp_path):
    """Two nodes given different runs folders (no shared filesystem): both stop before any stage, saying why."""
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    port = free_port()
    env = {"PIPELINE_SHARED_FOLDER_WAIT": "2"}  # the file never appears here: 20 s of looking would prove nothing more
    nodes = [
        start_node(rank, tmp_path / f"runs{rank}", port, logs[rank], "--to", "prepare", env=env) for rank in (0, 1)
    ]
    try:
        codes = [node.wait(timeout=180) for node in nodes]
    finally:
        reap(*nodes)
    assert codes[0] != 0 and codes[1] != 0
    for log in logs:
        assert "is not shared between the machines of this job: rank 1 on" in log.read_text()
    assert not (tmp_path / "runs0" / "tiny" / "prepare").exists()
    assert not (tmp_path / "runs0" / "mlflow.db").exists()
