"""Training against this machine's own speed (issue 30): the matmul rate, a bare training step of the teacher and of
the student (forward, backward and AdamW on one batch of the run's shape, nothing else), and the pipeline's own
seconds per step from a completed run folder, side by side.

    python bench/roofline.py runs/bert_small [--out bench/results/roofline_bert_small.md]

- matmul rate: a square fp32 matmul (and bf16 where this CPU computes it natively) on every torch thread;
- bare steps: the run's fine-tuned teacher and its distilled student, in fp32 and in the run's precision (bf16
  autocast when the run trained in bf16), batch = the stage's batch size, padded lengths of 12 training batches as
  the pipeline forms them (length pools), ids drawn from those the training data uses, the mean step; FLOPs counted
  by torch's FlopCounterMode over forward and backward (AdamW not counted); the student also with only its used
  embedding rows trained (distill.used_embedding_rows);
- pipeline steps: a stage's wall time (manifest) over its optimizer steps (epochs x batches of the training rows;
  distill's rows include the augmented copies): an upper bound per step, since validation and saving are inside.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, emit  # noqa: E402  (also puts the repository on the import path)
from pipeline.data import global_batches  # noqa: E402
from pipeline.inference import TokenizedSplit, TrainingData, pad_id  # noqa: E402
from pipeline.models import load_classifier, train_used_rows_only  # noqa: E402


def matmul_rate(dtype: torch.dtype, n: int = 2048, repeat: int = 10) -> float:
    """GFLOP/s of an n x n matmul on every torch thread (median of ``repeat``)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / statistics.median(times) / 1e9


def batch_lengths(prepare: Path, batch_size: int, seed: int, count: int = 12) -> list[int]:
    """Padded lengths of ``count`` training batches as the pipeline forms them (global_batches with length pools:
    similar lengths meet, so padding is small), the longest first, then a seeded sample of the others."""
    lengths = np.asarray(TokenizedSplit(prepare, "train").lengths)
    batches = global_batches(len(lengths), batch_size, seed, 0, lengths=lengths)
    picked = np.random.default_rng(seed).permutation(len(batches))[:count]
    return [int(lengths[batches[i]].max()) for i in picked]


def used_ids(prepare: Path, capture: Path) -> torch.Tensor:
    """The token ids distillation trains on (train, unlabeled, augmented, validation): distill.used_embedding_rows."""
    parts = [*TrainingData(prepare, capture).parts, TokenizedSplit(prepare, "validation")]
    return torch.as_tensor(np.union1d(np.concatenate([part.input_ids.distinct() for part in parts]), [pad_id(prepare)]))


def bare_step(model, batch: int, lengths: list[int], bf16: bool, pool: torch.Tensor, rounds: int = 2) -> dict:
    """Mean seconds of one forward + backward + AdamW step over batches of the given padded ``lengths`` (each timed
    ``rounds`` times after one untimed pass) of ids drawn from ``pool``, and their mean FLOPs of forward and backward."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    generator = torch.Generator().manual_seed(0)
    feeds = []
    for length in lengths:
        ids = pool[torch.randint(0, len(pool), (batch, length), generator=generator)]
        feeds.append((ids, torch.ones_like(ids), torch.randint(0, model.config.num_labels, (batch,), generator=generator)))

    def step(ids, mask, labels):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(model(input_ids=ids, attention_mask=mask).logits.float(), labels)
        loss.backward()
        optimizer.step()

    flops = []
    for feed in feeds:  # the untimed pass: counts FLOPs and warms up
        with FlopCounterMode(display=False) as counter:
            step(*feed)
        flops.append(counter.get_total_flops())
    times = []
    for _ in range(rounds):
        for feed in feeds:
            start = time.perf_counter()
            step(*feed)
            times.append(time.perf_counter() - start)
    seconds, mean_flops = statistics.mean(times), statistics.mean(flops)
    return {"seconds": seconds, "flops": mean_flops, "gflops": mean_flops / seconds / 1e9}


def pipeline_step(run: Path, stage: str, rows: int, epochs: int, batch: int) -> float | None:
    manifest = run / stage / "manifest.json"
    if not manifest.is_file():
        return None
    return json.loads(manifest.read_text())["duration_s"] / (epochs * math.ceil(rows / batch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a completed run folder (runs/<config>)")
    parser.add_argument("--out", type=Path, help="also write the report here (bench/results/...)")
    args = parser.parse_args()
    run = args.run
    config = yaml.safe_load((run / "config.yaml").read_text())
    bf16 = config["precision"] == "bf16"
    train = json.loads((run / "prepare" / "stats.json").read_text())["splits"]["train"]["examples"]
    copies = ((config.get("capture") or {}).get("augment") or {}).get("copies", 0) or 0
    threads = torch.get_num_threads()
    rates = {"fp32": matmul_rate(torch.float32)}
    if bf16:
        rates["bf16"] = matmul_rate(torch.bfloat16)
    pool = used_ids(run / "prepare", run / "capture")
    used_rows = (config.get("distill") or {}).get("used_embedding_rows", False)  # runs before the lever had full tables
    distill = ("distill", run / "distill" / "student", config["distill"]["batch_size"], config["distill"]["epochs"],
               train * (1 + copies))
    models = {  # name: (stage, model folder, batch, epochs, rows, the run's own form of that step)
        "teacher": ("teacher", run / "teacher" / "model", config["teacher"]["batch_size"], config["teacher"]["epochs"], train,
                    True),
        "student": (*distill, not used_rows),
        f"student, {len(pool)} used embedding rows": (*distill, used_rows),
    }
    lines = [f"# Roofline: bare training steps against the pipeline's ({run.name})", "",
             f"{threads} torch threads; matmul rate (2048 x 2048): " + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in rates.items())
             + f". The run trained in {config['precision']}.", "",
             "| model | batch x tokens | precision | bare step ms | GFLOP/s | of the matmul rate | pipeline s per step "
             "(stage / steps) | pipeline / bare |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for name, (stage, folder, batch, epochs, rows, as_run) in models.items():
        model = load_classifier(str(folder))
        if "used embedding rows" in name:
            train_used_rows_only(model, pool)
        lengths = batch_lengths(run / "prepare", batch, config["seed"])
        length = f"{min(lengths)}-{max(lengths)} (mean {statistics.mean(lengths):.0f})"
        per_step = pipeline_step(run, stage, rows, epochs, batch) if as_run else None
        for precision in (["fp32", "bf16"] if bf16 else ["fp32"]):
            bare = bare_step(model, batch, lengths, precision == "bf16", pool)
            share = bare["gflops"] / rates[precision]
            ratio = per_step / bare["seconds"] if per_step and precision == config["precision"] else None
            lines.append(f"| {name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters) | {batch} x {length} "
                         f"| {precision} | {bare['seconds'] * 1e3:.0f} | {bare['gflops']:.0f} | {share:.0%} | "
                         f"{per_step:.3f} | {f'{ratio:.2f}x' if ratio else '-'} |" if per_step else
                         f"| {name} | {batch} x {length} | {precision} | {bare['seconds'] * 1e3:.0f} | {bare['gflops']:.0f} | "
                         f"{share:.0%} | - | - |")
    lines += ["", f"Pipeline steps: the stage's wall time over epochs x ceil(rows / batch) (teacher: {train} training "
              f"rows; distill: {train} x {1 + copies} with the augmented copies); validation, checkpoints and saving "
              "are inside, so the ratio is an upper bound. Targets (issue 30): the loops within 1.2x of the bare "
              "step, the student's step at 50% or more of the matmul rate."]
    emit(lines, args.out, command_line("bench/roofline.py"))


if __name__ == "__main__":
    main()
