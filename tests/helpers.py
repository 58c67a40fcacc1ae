"""Helpers the test modules share (fixtures live in conftest.py): the command line as users run it, small
random BERTs and batches, a teacher cache written as the capture stage writes it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification

from pipeline.cache import flatten_targets, write_index, write_shard
from pipeline.data import pad_batch

ROOT = Path(__file__).resolve().parent.parent

def run_cli(*args: str, runs_dir: Path | None = None, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `python -m pipeline ...` as users do; returns the completed process."""
    command = [sys.executable, "-m", "pipeline", *args]
    if runs_dir is not None:
        command += ["--runs-dir", str(runs_dir)]
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(command, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)

def read_json(path: Path):
    return json.loads(Path(path).read_text())


# ---------------------------------------------------------------- small models and batches


def bert(hidden, heads, layers, seed):
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=100, hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                     intermediate_size=2 * hidden, max_position_embeddings=64, num_labels=3,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
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
    return {"input_ids": input_ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 2, 1][: len(lengths)]),
            "indices": np.arange(len(lengths))}


def write_cache(folder, targets, batch, layout) -> None:
    """The batch's teacher ``targets`` written the way the capture stage writes them: one shard and the index."""
    lengths = [int(n) for n in batch["attention_mask"].sum(1)]
    write_shard(folder, 0, flatten_targets(targets, layout, lengths, batch["attention_mask"]), targets["logits"].numpy(),
                lengths, first=0)
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
