"""Helpers the test modules share (fixtures live in conftest.py): the command line as users run it, small
random BERTs and batches, a teacher cache written as the capture stage writes it."""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock
from transformers import BertConfig, BertForSequenceClassification

from pipeline.cache import flatten_targets, write_index, write_shard
from pipeline.data import pad_batch

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "tests" / "node"  # the Node.js check of a bundle: predict.mjs and its pinned packages


def run_cli(
    *args: str, runs_dir: Path | None = None, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """Run `python -m pipeline ...` as users do; returns the completed process."""
    command = [sys.executable, "-m", "pipeline", *args]
    if runs_dir is not None:
        command += ["--runs-dir", str(runs_dir)]
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(command, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def run_bench(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `python bench/<script> ...` from the repository root, as its docstring says; returns the completed process."""
    command = [sys.executable, str(ROOT / "bench" / script), *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], Any]):
    """A session fixture's pipeline run, built once for all pytest-xdist workers of this session: the first worker
    to ask builds it under a file lock into the session's shared temporary folder, the others wait and reuse it (each
    worker used to build its own, about a minute each). Returns (folder, the build's completed process); a failed
    build is recorded and reported to every worker, not retried."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # pytest-N/: the workers' own folders (popen-gwK/) are inside it
    folder, record = root / f"shared-{name}", root / f"shared-{name}.json"
    with FileLock(str(root / f"shared-{name}.lock")):
        if not record.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build interrupted before it recorded anything
            done = build(folder)
            record.write_text(json.dumps([done.returncode, done.stdout, done.stderr]))
    returncode, stdout, stderr = json.loads(record.read_text())
    return folder, subprocess.CompletedProcess([], returncode, stdout, stderr)


def free_port() -> int:
    """A TCP port free now on 127.0.0.1: tests that start servers or process groups on two pytest workers at once
    must not share a fixed port (Accelerate's default 29500, PostgreSQL's 5432)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_json(path: Path):
    return json.loads(Path(path).read_text())


# ---------------------------------------------------------------- several processes (tests/test_multiprocess.py,
# tests/test_multinode.py)

# Dropout off so a distributed run and one process differ only by where each global batch is split; data
# order, batch composition and loss weighting are identical by construction.
NO_DROPOUT = ["teacher.random.dropout=0", "student.dropout=0", "precision=fp32"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # several processes share 2 cores: no thread oversubscription


def run_one_process(runs_dir: Path, *extra: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """The reference: tiny without dropout in one process, through evaluate (``extra``: more overrides/options)."""
    command = [
        sys.executable,
        "-m",
        "pipeline",
        "run",
        "tiny",
        *NO_DROPOUT,
        "--to",
        "evaluate",
        *extra,
        "--runs-dir",
        str(runs_dir),
    ]
    result = subprocess.run(
        command, cwd=ROOT, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def student_difference(run_a: Path, run_b: Path) -> tuple[float, float]:
    """(max, mean) |difference| of two runs' distilled students, asserted within the data-parallel tolerance.

    The global batches, their order and the loss weighting are identical; only the float summation order differs
    (half-batch gradients + allreduce vs one sum), ~1e-7 per step. Adam divides by sqrt(v): for weights whose
    gradient is ~0 that noise becomes an update of order lr (1e-3 in tiny), so single weights may differ by ~lr
    (measured 1.4e-3 in fp32) while the typical weight and every prediction agree.
    """
    from safetensors.torch import load_file

    s1 = load_file(Path(run_a) / "distill" / "student" / "model.safetensors")
    s2 = load_file(Path(run_b) / "distill" / "student" / "model.safetensors")
    assert s1.keys() == s2.keys()
    max_diff = max((s1[k] - s2[k]).abs().max().item() for k in s1)
    mean_diff = sum((s1[k] - s2[k]).abs().sum().item() for k in s1) / sum(v.numel() for v in s1.values())
    assert max_diff < 1e-2, max_diff
    assert mean_diff < 1e-4, mean_diff
    return max_diff, mean_diff


# ---------------------------------------------------------------- small models and batches


def bert(hidden, heads, layers, seed):
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=100,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_hidden_layers=layers,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertForSequenceClassification(copy.deepcopy(cfg))
    model.set_attn_implementation("sdpa")
    return model.eval()


def fake_config(weights, temperature=2.0, chunk=3):
    distill = types.SimpleNamespace(loss=weights, temperature=temperature, attention_chunk=chunk)
    return types.SimpleNamespace(distill=distill)


def batch_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    ids = [list(rng.integers(5, 100, n)) for n in lengths]
    input_ids, mask = pad_batch(ids, 0)
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "labels": torch.tensor([0, 1, 2, 1][: len(lengths)]),
        "indices": np.arange(len(lengths)),
    }


def write_cache(folder, targets, batch, layout) -> None:
    """The batch's teacher ``targets`` written the way the capture stage writes them: one shard and the index."""
    lengths = [int(n) for n in batch["attention_mask"].sum(1)]
    write_shard(
        folder,
        0,
        flatten_targets(targets, layout, lengths, batch["attention_mask"]),
        targets["logits"].numpy(),
        lengths,
        first=0,
    )
    write_index(folder, 1, len(lengths), layout)


def padded_batch(lengths=(10, 7, 3), n=10, vocab=64, seed=1, lowest_id=1):
    """Random ids in [lowest_id, vocab) right-padded with 0 to ``n``, and the mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(lowest_id, vocab, (len(lengths), n), generator=g)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    return ids * mask, mask  # pad id 0 on padded positions


def max_diff_valid_rows(a, b, mask):
    rows = mask.bool()[:, None, :, None].expand_as(a)
    return (a - b).abs()[rows].max().item()


def answers_health(base: str) -> bool:
    """Whether an MLflow server at ``base`` (http://host:port) answers its /health endpoint with 200 now."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
