"""Micro-benchmarks: the cost of one distillation step, and of capturing teacher targets.

    python bench/micro.py                       # bert_small sizes (about 1-2 minutes on 2 CPU cores)
    python bench/micro.py --quick               # tiny config, minimal repeats (smoke test)
    python bench/micro.py --json out.json       # also write the raw figures
    python bench/micro.py --precision config    # keep the config's bf16 even where bf16 is emulated (slow)

Training cost: samples/s of one optimizer step of the configured student
(bert_small: 2 layers copied from the packaged MiniLM-L6-H384, random
classifier head; throughput does not depend on training) in three forms,
measured side by side on the same batches:

  plain    cross-entropy fine-tuning step (what the teacher stage does per batch)
  cached   distillation step, teacher targets read from a teacher cache
           (``TeacherCache.batch``) written by the pipeline's capture code
  online   distillation step with the teacher run inside it (``teacher_targets``)

The measured code is the product's: batches come from
``pipeline.inference.TrainingData`` (the distill stage's batching, over an Arrow
split saved as the prepare stage saves it), each optimizer is set up by
``pipeline.training.build_trainer`` (fit's parameter groups, schedule and
Accelerate prepare, with the config's distill settings) and each step is
``pipeline.training.train_step``: loss under the Accelerator's autocast (the
config's precision), finiteness noted on the device (read every 10 steps), backward, gradient
clipping, AdamW and schedule step, zero_grad. The distillation losses are
``pipeline.objective.DistillObjective`` with the config's loss weights. The
variants are interleaved within each repeat (rotating order) so load changes on
a shared machine hit all three alike; ratios are taken per repeat.

Capture: examples/s of the teacher alone (``pipeline.inference.predict_logits``:
length-sorted batches, forward, logits to host) against capture's shard loop
(batches of similar length, ``teacher_targets`` + ``flatten_targets`` into
per-example records + logits to host, back in example order), interleaved.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import spread  # (also puts the repository on the path)

FULL = {"config": "bert_small", "examples": 256, "warmup": 2, "repeats": 7, "steps": 4, "capture_repeats": 5}
QUICK = {"config": "tiny", "examples": 64, "warmup": 1, "repeats": 2, "steps": 1, "capture_repeats": 2}
GOAL_CACHED_VS_PLAIN = 0.8


def bf16_check() -> dict:
    """Is bf16 native here? Times one [512,384]x[384,384] matmul in fp32 and bf16 (min of 8).

    CPUs without AVX512-BF16 / AMX run bf16 matmuls through a slow emulated path
    (tens of times slower than fp32), which turns bf16 autocast into a slowdown.
    """
    import torch

    if torch.cuda.is_available():
        return {"device": "cuda", "native": True}
    a, b = torch.randn(512, 384), torch.randn(384, 384)

    def best_ms(dtype):
        x, y = a.to(dtype), b.to(dtype)
        x @ y
        times = []
        for _ in range(8):
            start = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - start)
        return min(times) * 1000

    fp32, bf16 = best_ms(torch.float32), best_ms(torch.bfloat16)
    return {
        "device": "cpu",
        "fp32_matmul_ms": fp32,
        "bf16_matmul_ms": bf16,
        "bf16_slowdown": bf16 / fp32,
        "native": bf16 <= 2 * fp32,
        "threads": torch.get_num_threads(),
    }


def resolve_precision(configured: str, mode: str = "auto") -> dict:
    """The precision to measure with: ``mode`` auto keeps the config's, except bf16 where bf16 is not native (then fp32)."""
    if mode != "auto":
        used = configured if mode == "config" else mode
        return {
            "configured": configured,
            "used": used,
            "mode": mode,
            "why": "as configured" if used == configured else f"--precision {mode}",
        }
    if configured == "auto":  # the pipeline resolves it per machine; the bench passes it on unchanged
        from pipeline.runner import resolve_precision as resolve_auto

        resolved = resolve_auto("auto")
        return {
            "configured": configured,
            "used": configured,
            "resolved": resolved,
            "mode": mode,
            "why": "auto resolves to bf16 here (native bf16: AVX512-BF16 / AMX or a CUDA GPU)"
            if resolved == "bf16"
            else "auto resolves to fp32 here (no native bf16 on this CPU)",
        }
    if configured != "bf16":
        return {"configured": configured, "used": configured, "mode": mode, "why": "as configured"}
    check = bf16_check()
    if check["native"]:
        return {
            "configured": configured,
            "used": "bf16",
            "mode": mode,
            "why": "as configured (bf16 is native here)",
            "check": check,
        }
    return {
        "configured": configured,
        "used": "fp32",
        "mode": mode,
        "check": check,
        "why": (
            f"this CPU has no native bf16: a bf16 matmul took {check['bf16_slowdown']:.0f}x the fp32 time "
            f"({check['bf16_matmul_ms']:.2f} vs {check['fp32_matmul_ms']:.2f} ms), so the configured bf16 "
            "autocast would make every step several times slower; measured in fp32 instead "
            "(--precision config keeps bf16)"
        ),
    }


# ---------------------------------------------------------------- set-up


def load_examples(config, examples: int):
    """The first ``examples`` train-split sentences of the config's data, tokenized as the prepare stage does."""
    from pipeline.data import load_frame, split_frame, tokenize_split
    from pipeline.models import load_tokenizer, tokenizer_reference

    frame, _ = load_frame(config.data)
    train = split_frame(frame, config.data, config.seed)["train"]
    label_names = sorted(train["label"].unique())
    part = train.iloc[:examples]
    tokenizer = load_tokenizer(tokenizer_reference(config), config.teacher.trust_remote_code)
    ids, _ = tokenize_split(tokenizer, part["text"].tolist(), None, config.data.max_length)
    labels = [label_names.index(name) for name in part["label"]]
    return ids, labels, label_names, tokenizer


def training_data(folder: Path, ids, labels):
    """``ids`` / ``labels`` as the distill and capture stages read them: ``pipeline.inference.TrainingData``
    over a train split saved as the prepare stage saves it (Arrow under ``folder/tokenized/train``)."""
    import datasets

    from pipeline.splits import TrainingData

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a bar for a few hundred rows is only noise in the bench's output
    try:
        datasets.Dataset.from_dict({"input_ids": ids, "label": labels}).save_to_disk(
            str(folder / "tokenized" / "train")
        )
    finally:
        if shown:
            datasets.enable_progress_bars()
    return TrainingData(folder)


def write_cache(folder: Path, teacher, plan, config, data, pad, dist) -> dict:
    """A teacher cache for ``data`` (TrainingData), written as stages/capture.py writes it: its layout choice,
    shard ranges, shard loop (``capture_shard``), ``write_shard`` and ``write_index``."""
    from pipeline.cache import CacheLayout, choose_stores, estimate_bytes, shard_ranges, write_index, write_shard
    from stages.capture import capture_shard

    lengths = data.lengths
    hidden = teacher.config.hidden_size
    layout = CacheLayout(
        plan,
        teacher.config.num_labels,
        hidden,
        choose_stores(plan, lengths, hidden, config.capture.store),
        config.capture.dtype,
    )
    folder.mkdir(parents=True, exist_ok=True)
    ranges = shard_ranges(len(data), config.capture.shard_size)
    for shard, (first, last) in enumerate(ranges):
        records, logits = capture_shard(teacher, data, first, last, plan, layout, config.capture.batch_size, pad, dist)
        write_shard(folder, shard, records, logits, [int(n) for n in lengths[first:last]], first)
    write_index(folder, len(ranges), len(data), layout)
    total = sum((folder / f"shard-{i:05d}.bin").stat().st_size for i in range(len(ranges)))
    return {
        "examples": len(data),
        "cache_bytes": total,
        "bytes_per_example": total / len(data),
        "estimated_bytes": estimate_bytes(layout, lengths),
        "stores": layout.stores,
        "dtype": layout.dtype,
        "layout": layout,
        "ranges": ranges,
    }


def training_job(kind: str, model, teacher, plan, cache, config, dist, num_examples: int, settings, tag: str):
    """(trainer, loss_fn) for training ``model`` as a stage would: ``plain`` is the teacher stage's cross-entropy
    fine-tuning, ``cached`` / ``online`` the distill stage's loss with targets from ``cache`` or from ``teacher``
    run inside the step; the trainer is ``build_trainer``'s, with ``settings`` (config.teacher or config.distill)."""
    from pipeline.objective import DistillObjective
    from pipeline.terms import some_parameters_may_get_no_gradient
    from pipeline.training import build_trainer, cross_entropy_loss

    if kind == "plain":
        modules, loss_fn = {"model": model}, cross_entropy_loss
    else:
        objective = DistillObjective(config, plan, teacher.config.hidden_size, model.config.hidden_size).to(dist.device)
        modules = objective.trained_modules(model)
        loss_fn = objective.loss_fn(cache=None if kind == "online" else cache, teacher=teacher)
    trainer = build_trainer(
        dist,
        modules,
        settings,
        num_examples,
        tag=tag,
        find_unused_parameters=kind != "plain" and some_parameters_may_get_no_gradient(config.distill.loss),
    )
    for m in trainer.modules.values():
        m.train()
    return trainer, loss_fn


def step_function(kind: str, base_student, teacher, plan, cache, config, dist, num_examples: int):
    """One optimizer step of ``kind`` (plain / cached / online) of the student on a batch:
    ``pipeline.training.train_step`` with the trainer and loss of ``training_job``."""
    from pipeline.training import train_step

    student = copy.deepcopy(base_student).to(dist.device)
    trainer, loss_fn = training_job(
        kind, student, teacher, plan, cache, config, dist, num_examples, config.distill, tag=f"micro-{kind}"
    )
    steps = 0

    def step(batch):
        nonlocal steps
        steps += 1
        train_step(trainer, batch, loss_fn, step=steps)

    return step


# ---------------------------------------------------------------- measurements


def measure_training(step_fns: dict, batches: list, warmup: int, repeats: int, steps: int) -> dict:
    """samples/s of each step function over the same batches, interleaved with a rotating order; per-repeat ratios."""
    kinds = list(step_fns)
    cursor = 0
    for _ in range(warmup):
        for kind in kinds:
            step_fns[kind](batches[cursor % len(batches)])
        cursor += 1
    rates = {kind: [] for kind in kinds}
    for r in range(repeats):
        chosen = [batches[(cursor + s) % len(batches)] for s in range(steps)]
        cursor += steps
        samples = sum(len(b["indices"]) for b in chosen)
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:  # rotate who goes first
            gc.collect()
            start = time.perf_counter()
            for batch in chosen:
                step_fns[kind](batch)
            rates[kind].append(samples / (time.perf_counter() - start))
    ratio = {f"{k}_vs_plain": [a / b for a, b in zip(rates[k], rates["plain"])] for k in ("cached", "online")}
    ratio["cached_vs_online"] = [a / b for a, b in zip(rates["cached"], rates["online"])]
    return {
        "variants": {
            "plain": {
                "what": "CE fine-tuning step of the student (no teacher)",
                "samples_per_s": spread(rates["plain"]),
            },
            "cached": {
                "what": "distillation step, targets from TeacherCache.batch",
                "samples_per_s": spread(rates["cached"]),
            },
            "online": {
                "what": "distillation step, teacher_targets inside the step",
                "samples_per_s": spread(rates["online"]),
            },
        },
        "ratios": {k: spread(v) for k, v in ratio.items()},
        "goal": {
            "cached_vs_plain_at_least": GOAL_CACHED_VS_PLAIN,
            "met": statistics.median(ratio["cached_vs_plain"]) >= GOAL_CACHED_VS_PLAIN,
        },
        "raw_samples_per_s": rates,
    }


def measure_capture(passes: dict, examples: int, repeats: int) -> dict:
    """examples/s of each capture pass (one warm-up each), alternating which goes first."""
    for fn in passes.values():  # warm-up
        fn()
    rates = {k: [] for k in passes}
    for r in range(repeats):
        for kind in list(passes) if r % 2 == 0 else list(passes)[::-1]:
            gc.collect()
            start = time.perf_counter()
            passes[kind]()
            rates[kind].append(examples / (time.perf_counter() - start))
    return rates


def run(
    config_name: str | None = None,
    quick: bool = False,
    examples: int | None = None,
    batch_size: int | None = None,
    warmup: int | None = None,
    repeats: int | None = None,
    steps: int | None = None,
    capture_repeats: int | None = None,
    work_dir: Path | None = None,
    overrides: list[str] | None = None,
    threads: int | None = None,
    log=print,
) -> dict:
    """Both micro-benchmarks; returns the raw figures (JSON-ready). ``threads``: torch threads (default: torch's)."""
    import torch
    from transformers import set_seed

    from pipeline.cache import TeacherCache
    from pipeline.config import load_config
    from pipeline.data import global_batches, padding_efficiency
    from pipeline.inference import predict_logits
    from pipeline.models import build_student, build_teacher_for_finetune, count_parameters
    from pipeline.objective import target_plan
    from pipeline.runner import Distributed
    from stages.capture import capture_shard
    from stages.distill import teacher_importance

    if threads:
        torch.set_num_threads(threads)
    preset = QUICK if quick else FULL
    config = load_config(config_name or preset["config"], overrides or [])
    examples = examples or preset["examples"]
    warmup = preset["warmup"] if warmup is None else warmup
    repeats = repeats or preset["repeats"]
    steps = steps or preset["steps"]
    capture_repeats = capture_repeats or preset["capture_repeats"]
    batch_size = batch_size or config.distill.batch_size
    set_seed(config.seed)
    dist = Distributed(config)

    ids, labels, label_names, tokenizer = load_examples(config, examples)
    if len(ids) < batch_size:
        raise SystemExit(f"micro: {len(ids)} examples is fewer than one batch of {batch_size}")
    pad = tokenizer.pad_token_id
    # Teacher: the configured model (packaged MiniLM for bert_small) with a random classifier head.
    teacher = build_teacher_for_finetune(config, label_names, len(tokenizer)).to(dist.device).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    plan = target_plan(config, teacher.config)

    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        data = training_data(Path(tmp) / "prepare", ids, labels)
        lengths = data.lengths
        # The student as the distill stage builds it (FFN neurons, heads and width kept by the teacher's importance).
        ffn_scores, width_scores = teacher_importance(teacher, data, config, config.seed, pad, dist.device)
        base_student = build_student(config, teacher, ffn_scores, width_scores)
        # The batches training sees (grouped by length when the config says so), full ones only.
        chosen = [
            b
            for b in global_batches(
                len(data), batch_size, config.seed, 0, lengths=lengths if config.distill.group_by_length else None
            )
            if len(b) == batch_size
        ]
        batches = [data.batch(b, pad, dist.device) for b in chosen]
        log(
            f"[micro] {config.name}: {len(data)} examples, {len(batches)} batches of {batch_size}, precision "
            f"{config.precision}; writing the teacher cache"
        )
        cache_info = write_cache(Path(tmp) / "cache", teacher, plan, config, data, pad, dist)
        layout, ranges = cache_info.pop("layout"), cache_info.pop("ranges")
        cache = TeacherCache(Path(tmp) / "cache")  # verifies checksums, memory-maps the shards

        log(f"[micro] training steps: {warmup} warm-up + {repeats} x {steps} per variant")
        step_fns = {
            kind: step_function(kind, base_student, teacher, plan, cache, config, dist, len(data))
            for kind in ("plain", "cached", "online")
        }
        training = measure_training(step_fns, batches, warmup, repeats, steps)
        del step_fns
        dist.accelerator.free_memory()  # drops the prepared students and optimizers (also collects garbage)

        def inference_pass():
            predict_logits(teacher, data, config.capture.batch_size, dist, pad)

        def capture_pass():
            for first, last in ranges:
                capture_shard(teacher, data, first, last, plan, layout, config.capture.batch_size, pad, dist)

        log(f"[micro] capture: 1 warm-up + {capture_repeats} passes per variant")
        capture_rates = measure_capture(
            {"inference": inference_pass, "capture": capture_pass}, len(data), capture_repeats
        )
        capture_ratio = [a / b for a, b in zip(capture_rates["capture"], capture_rates["inference"])]
        capture = {
            "variants": {
                "inference": {
                    "what": "teacher forward (predict_logits), logits to host",
                    "examples_per_s": spread(capture_rates["inference"]),
                },
                "capture": {
                    "what": "capture's shard loop: teacher_targets + flatten_targets into records, logits to host",
                    "examples_per_s": spread(capture_rates["capture"]),
                },
            },
            "ratios": {"capture_vs_inference": spread(capture_ratio)},
            "batch_size": config.capture.batch_size,
            "cache": cache_info,
            "raw_examples_per_s": capture_rates,
        }

    setup = {
        "config": config.name,
        "overrides": overrides or [],
        "quick": quick,
        "precision": dist.precision,
        "device": str(dist.device),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "examples": len(ids),
        "batch_size": batch_size,
        "batches": len(batches),
        "max_length": config.data.max_length,
        "mean_tokens_per_example": float(lengths.mean()),
        "padding_efficiency": padding_efficiency(chosen, lengths),
        "warmup_steps": warmup,
        "repeats": repeats,
        "steps_per_repeat": steps,
        "capture_repeats": capture_repeats,
        "teacher": f"{config.teacher.model} ({teacher.config.num_hidden_layers} layers, hidden {teacher.config.hidden_size}, "
        f"{count_parameters(teacher) / 1e6:.1f}M parameters, random classifier head)",
        "student": f"{base_student.config.num_hidden_layers} layers ({config.student.init} {config.student.teacher_layers}), "
        f"{count_parameters(base_student) / 1e6:.1f}M parameters",
        "loss_weights": config.distill.loss.model_dump(),
        "layer_pairs": plan.pairs,
        "relation_heads": plan.relation_heads,
        "data": f"first {len(ids)} train-split sentences of {config.data.source}, tokenized to max_length {config.data.max_length}",
    }
    log(
        f"[micro] plain {training['variants']['plain']['samples_per_s']['median']:.1f}, cached "
        f"{training['variants']['cached']['samples_per_s']['median']:.1f}, online "
        f"{training['variants']['online']['samples_per_s']['median']:.1f} samples/s; capture/inference "
        f"{capture['ratios']['capture_vs_inference']['median']:.2f}"
    )
    return {"setup": setup, "training": training, "capture": capture}


# ---------------------------------------------------------------- report


def _s(d: dict, fmt: str = "{:.1f}") -> str:
    return " / ".join(fmt.format(d[k]) for k in ("min", "median", "max"))


def markdown(result: dict) -> str:
    setup, training = result["setup"], result["training"]
    lines = [
        f"Config `{setup['config']}`{' with ' + ' '.join(setup['overrides']) if setup.get('overrides') else ''}, "
        f"precision {setup['precision']}{' (Accelerate autocast)' if setup['precision'] != 'fp32' else ''}, {setup['device']}, "
        f"{setup['torch_threads']} torch threads. Teacher: {setup['teacher']}. Student: {setup['student']}. "
        f"Data: {setup['data']} (mean {setup['mean_tokens_per_example']:.1f} tokens; batches padded to their longest, "
        f"padding efficiency {setup['padding_efficiency']:.2f}). Batch {setup['batch_size']}; "
        f"{setup['warmup_steps']} warm-up step(s) per variant, then {setup['repeats']} repeat(s) of "
        f"{setup['steps_per_repeat']} step(s) per variant, variants interleaved. Loss weights "
        f"{', '.join(f'{k} {v:g}' for k, v in setup['loss_weights'].items())}; layer pairs {setup['layer_pairs']}.",
        "",
        "| step | samples/s min / median / max | vs plain CE (median of per-repeat ratios, min-max) |",
        "|---|---:|---:|",
    ]
    for kind in ("plain", "cached", "online"):
        v = training["variants"][kind]
        if kind == "plain":
            rel = "1.00"
        else:
            r = training["ratios"][f"{kind}_vs_plain"]
            rel = f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"
        lines.append(f"| {kind}: {v['what']} | {_s(v['samples_per_s'])} | {rel} |")
    goal = training["goal"]
    cached_online = training["ratios"]["cached_vs_online"]
    lines += [
        "",
        f"- Goal cached >= {goal['cached_vs_plain_at_least']}x plain: **{'met' if goal['met'] else 'NOT met'}** "
        f"(median {training['ratios']['cached_vs_plain']['median']:.2f}x).",
        f"- Cached vs online teacher: {cached_online['median']:.2f}x "
        f"({cached_online['min']:.2f}-{cached_online['max']:.2f}).",
        "",
    ]
    return "\n".join(lines)


def capture_markdown(result: dict) -> str:
    capture, setup = result["capture"], result["setup"]
    cache = capture["cache"]
    lines = [
        f"Teacher {setup['teacher']}, {cache['examples']} examples, capture batch {capture['batch_size']}, "
        f"precision {setup['precision']}; one warm-up pass, then {setup['capture_repeats']} passes per variant, interleaved.",
        "",
        "| pass | examples/s min / median / max | vs teacher inference (median, min-max) |",
        "|---|---:|---:|",
    ]
    for kind in ("inference", "capture"):
        v = capture["variants"][kind]
        if kind == "inference":
            rel = "1.00"
        else:
            r = capture["ratios"]["capture_vs_inference"]
            rel = f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"
        lines.append(f"| {kind}: {v['what']} | {_s(v['examples_per_s'])} | {rel} |")
    lines += [
        "",
        f"The cache written for these {cache['examples']} examples by the capture code: "
        f"{cache['bytes_per_example']:.0f} bytes per example (stores {cache['stores']}, {cache['dtype']}).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny config, 64 examples, minimal repeats")
    parser.add_argument("--config", help="config name (default bert_small; tiny with --quick)")
    parser.add_argument("--examples", type=int)
    parser.add_argument("--batch-size", type=int, help="default: the config's distill.batch_size")
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--steps", type=int, help="optimizer steps per variant per repeat")
    parser.add_argument("--capture-repeats", type=int)
    parser.add_argument(
        "--precision",
        choices=["auto", "config", "bf16", "fp32"],
        default="auto",
        help="auto (default): the config's precision, but fp32 where bf16 is not native (CPUs without "
        "AVX512-BF16/AMX); config: always the config's",
    )
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's default, one per core)")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--md", type=Path, help="write the tables here, headed by command, date and machine")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, as for the pipeline")
    args = parser.parse_args(argv)
    from pipeline.config import load_config

    name = args.config or (QUICK if args.quick else FULL)["config"]
    precision = resolve_precision(load_config(name, args.overrides).precision, args.precision)
    overrides = list(args.overrides)
    if precision["used"] != precision["configured"]:
        overrides.append(f"precision={precision['used']}")
        print(f"[micro] precision {precision['used']}: {precision['why']}", file=sys.stderr)
    result = run(
        name,
        args.quick,
        args.examples,
        args.batch_size,
        args.warmup,
        args.repeats,
        args.steps,
        args.capture_repeats,
        overrides=overrides,
        threads=args.threads,
        log=lambda m: print(m, file=sys.stderr),
    )
    result["setup"]["precision_choice"] = precision
    from common import command_line, emit

    emit(
        ["## Training cost", "", markdown(result), "## Capture", "", capture_markdown(result)],
        args.md,
        command=command_line("bench/micro.py", argv) if args.md else None,
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
