"""The capture stage's levers (issue 30): the teacher over the run's training examples as the stage runs it
(``stages.capture.capture_shard``: the run's target plan and cache layout, batches of similar length, autocast in the
run's precision), with one setting changed at a time, in examples per second.

    python bench/capture_levers.py runs/bert_small [--examples 1024] [--out bench/results/capture_levers_bert_small.md]

Settings: capture.batch_size 16 / 32 / 64 (the default) / 128 / 256; batches in data order instead of by length;
``torch.inference_mode`` around the stage instead of the ``no_grad`` the teacher call already has; fp32 instead of
bf16 autocast; 1 torch thread instead of one per core. The same ``--examples`` training examples (a seeded sample)
for every setting; each timed twice after an untimed pass, the faster kept. The stage's own figure (its manifest's
wall time over the examples it labelled) is printed alongside: it also holds loading, writing shards and hashing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, emit  # (also puts the repository on the import path)

from pipeline.config import PipelineConfig
from pipeline.models import load_classifier
from pipeline.splits import TrainingData, pad_id
from stages.capture import cache_layouts, capture_shard


class Sample:
    """``count`` seeded training examples of ``data``, in the index space capture_shard reads (lengths, batch)."""

    def __init__(self, data: TrainingData, count: int, seed: int, by_length: bool):
        picked = np.sort(
            np.random.default_rng(seed).choice(data.relational, size=min(count, data.relational), replace=False)
        )
        self.data, self.ids = data, picked
        # capture_shard orders by length; "data order" gives every example the same length key, so the stable sort
        # keeps the sampled order
        self.lengths = data.lengths[picked] if by_length else np.zeros(len(picked), dtype=data.lengths.dtype)

    def batch(self, local_ids, pad, device):
        return self.data.batch(self.ids[local_ids], pad, device)


class Context:
    def __init__(self, bf16: bool):
        self.device, self.bf16 = torch.device("cpu"), bf16

    def autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()


def examples_per_second(
    teacher, sample: Sample, plan, layout, batch_size: int, pad: int, ctx: Context, inference_mode: bool, threads: int
) -> float:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        times = []
        for timed in (False, True, True):
            start = time.perf_counter()
            with torch.inference_mode() if inference_mode else contextlib.nullcontext():
                capture_shard(teacher, sample, 0, len(sample.ids), plan, layout, batch_size, pad, ctx)
            if timed:
                times.append(time.perf_counter() - start)
        return len(sample.ids) / min(times)
    finally:
        torch.set_num_threads(previous)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder with complete prepare, teacher and capture stages")
    parser.add_argument("--examples", type=int, default=1024, help="training examples labelled per setting")
    parser.add_argument("--out", type=Path, help="also write the report here (bench/results/...)")
    args = parser.parse_args()
    config = PipelineConfig.model_validate(yaml.safe_load((args.run / "config.yaml").read_text()))
    teacher = load_classifier(str(args.run / "teacher" / "model")).eval()
    prepare = args.run / "prepare"
    data = TrainingData(prepare, args.run / "capture")
    plan, layout, _ = cache_layouts(config, teacher.config, data)
    pad, cores = pad_id(prepare), torch.get_num_threads()
    bf16 = config.precision == "bf16"
    default = {
        "batch_size": config.capture.batch_size,
        "by_length": True,
        "inference_mode": False,
        "bf16": bf16,
        "threads": cores,
    }
    settings = [("the stage's settings", {})]
    settings += [
        (f"capture.batch_size {b}", {"batch_size": b}) for b in (16, 32, 64, 128, 256) if b != default["batch_size"]
    ]
    settings += [
        ("batches in data order (not by length)", {"by_length": False}),
        ("torch.inference_mode", {"inference_mode": True}),
        ("1 torch thread", {"threads": 1}),
    ]
    if bf16:
        settings.append(("fp32 (no bf16 autocast)", {"bf16": False}))
    rows = []
    for label, change in settings:
        s = {**default, **change}
        sample = Sample(data, args.examples, config.seed, s["by_length"])
        rate = examples_per_second(
            teacher, sample, plan, layout, s["batch_size"], pad, Context(s["bf16"]), s["inference_mode"], s["threads"]
        )
        rows.append((label, rate))
        print(f"{label}: {rate:.1f} examples/s", file=sys.stderr, flush=True)
    base = rows[0][1]
    manifest = json.loads((args.run / "capture" / "manifest.json").read_text())
    summary = json.loads((args.run / "capture" / "capture.json").read_text())
    lines = [
        f"# Capture levers: {args.run}",
        "",
        f"The teacher over {min(args.examples, data.relational)} of the run's {data.relational} training examples "
        f"(terms {', '.join(plan.terms)}, teacher layers {sorted({t for _, t in plan.pairs})}), precision "
        f"{config.precision}, capture.batch_size {default['batch_size']}, {cores} torch threads unless a row says "
        "otherwise.",
        "",
        "| setting | examples/s | vs the stage's settings |",
        "|---|---:|---:|",
    ]
    lines += [f"| {label} | {rate:.1f} | {rate / base:.2f}x |" for label, rate in rows]
    lines += [
        "",
        f"The stage itself (manifest): {summary['examples']} examples in {manifest['duration_s']:.1f} s, "
        f"{summary['examples'] / manifest['duration_s']:.1f} examples/s with loading, shards and hashing "
        "(augmented rows are logits only, so they run faster than the rows timed here).",
    ]
    emit(lines, args.out, command=command_line("bench/capture_levers.py"))


if __name__ == "__main__":
    main()
