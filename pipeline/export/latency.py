"""Batch-1 latency of every model side by side: the teacher and the student in PyTorch, ONNX (fp32, int8) and
ExecuTorch, timed interleaved in this process (timing.interleaved), and the shipped student against the int8
teacher with the targets of export.targets."""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from .. import timing
from ..models import load_classifier
from . import executorch_program
from .files import package_version
from .onnx_graph import OUTPUT_NAMES, SEGMENT_INPUT, ort_session
from .tokenizer import tokenizer_facts
from .variants import Inputs, Int8, Shipped, Teacher, latency_name

log = logging.getLogger("pipeline")


def side_by_side(
    seed: int,
    inputs: Inputs,
    shipped: Shipped,
    int8: Int8 | None,
    static: Int8 | None,
    pte: dict,
    teacher: Teacher,
    cfg,
) -> dict:
    """Batch-1 latency of the teacher and the student, PyTorch and ONNX (and int8), measured together (measure_latency)."""
    teacher_pt = load_classifier(str(inputs.teacher / "model")).eval()  # default attention backend, as users run it
    student_pt = load_classifier(str(inputs.student)).eval()
    full_facts = tokenizer_facts(
        inputs.student / "tokenizer.json"
    )  # roles from the student's tokenizer_config.json  # the original vocabulary (the teacher's)
    sample = np.random.default_rng(seed).permutation(len(shipped.test))[: cfg.latency_sentences]
    full_ids, shipped_ids = (
        [list(inputs.test.input_ids[i]) for i in sample],
        [list(shipped.test.input_ids[i]) for i in sample],
    )
    full_types = shipped_types = None
    if inputs.segments:  # sentence pairs: each sentence's own segment ids
        assert inputs.test.token_type_ids is not None  # a pair split carries them
        full_types = [list(inputs.test.token_type_ids[i]) for i in sample]
        shipped_types = [list(shipped.test.token_type_ids[i]) for i in sample]
    models = {
        "teacher PyTorch fp32": model_entry(
            "pytorch", lambda t: torch_runner(teacher_pt, t), full_facts, teacher_pt.config
        ),
        "teacher ONNX fp32": model_entry(
            "onnxruntime", lambda t: ort_runner(teacher.onnx, t), full_facts, teacher_pt.config
        ),
        "student PyTorch fp32": model_entry(
            "pytorch", lambda t: torch_runner(student_pt, t), full_facts, student_pt.config
        ),
        "student ONNX fp32": model_entry(
            "onnxruntime", lambda t: ort_runner(shipped.fp32_path, t), shipped.facts, shipped.model.config
        ),
    }
    sentence_ids = {name: full_ids for name in models}
    sentence_ids["student ONNX fp32"] = shipped_ids
    if int8:
        teacher_int8 = teacher.int8
        assert teacher_int8 is not None, "the int8 student is timed against the int8 teacher, built with it"
        models["teacher ONNX int8"] = model_entry(
            "onnxruntime", lambda t: ort_runner(teacher_int8, t), full_facts, teacher_pt.config
        )
        models["student ONNX int8"] = model_entry(
            "onnxruntime", lambda t: ort_runner(int8.path, t), shipped.facts, shipped.model.config
        )
        sentence_ids["teacher ONNX int8"], sentence_ids["student ONNX int8"] = full_ids, shipped_ids
    if static:
        models["student ONNX int8 static"] = model_entry(
            "onnxruntime", lambda t: ort_runner(static.path, t), shipped.facts, shipped.model.config
        )
        sentence_ids["student ONNX int8 static"] = shipped_ids
    for name, info in (pte.get("variants") or {}).items():
        path = shipped.fp32_path.parent / info["file"]
        models[f"student ExecuTorch {name}"] = model_entry(
            "executorch", lambda t, path=path: executorch_program.runner(path, t), shipped.facts, shipped.model.config
        )
        sentence_ids[f"student ExecuTorch {name}"] = shipped_ids
    sentence_types = None
    if inputs.segments:
        sentence_types = {name: shipped_types if sentence_ids[name] is shipped_ids else full_types for name in models}
    return measure_latency(cfg, models, sentence_ids, sentence_types)


# Timed at the fixed lengths but not on the real sentences when the int8 teacher is there to compare with.
REFERENCE_ONLY = ("teacher PyTorch fp32", "teacher ONNX fp32", "student PyTorch fp32")


def model_entry(runtime, factory, facts, model_config) -> tuple:
    """A measure_latency model entry."""
    roles, legacy = facts["special_tokens"], facts["special_token_ids"]
    cls = roles["cls"]["id"] if "cls" in roles else legacy.get("[CLS]", 101)
    sep = roles["sep"]["id"] if "sep" in roles else legacy.get("[SEP]", 102)
    return (runtime, factory, facts["vocab_size"], cls, sep, model_config.max_position_embeddings)


def measure_latency(cfg, models: dict, sentence_ids: dict, sentence_types: dict | None = None) -> dict:
    """Batch-1 latency rows, every model measured side by side (interleaved) in this process.

    ``models[name] = (runtime, runner factory(threads), vocab size, [CLS] id, [SEP] id, position embeddings)``;
    ``sentence_ids[name]``: real test sentences in that model's own vocabulary; ``sentence_types[name]`` their
    token_type_ids for sentence-pair models (the fixed-length inputs are then pairs of two equal halves too).
    Inputs: one sequence of exactly L tokens per configured length (lengths
    beyond a model's position table are skipped), and the real sentences (REFERENCE_ONLY models left out there).
    Returns the rows, the lengths skipped, the machine's load before and after, and the machine in words.
    """
    load_before = os.getloadavg()[0]
    positions = min(m[5] for m in models.values())
    rows, skipped = [], []
    settings = []
    for length in cfg.latency_lengths:
        if length > positions:
            skipped.append({"length": length, "why": f"above the models' {positions} position embeddings"})
            continue
        settings.append(
            (
                f"L={length}",
                length,
                {
                    name: [latency_inputs(length, m[2], m[3], m[4], segments=sentence_types is not None)]
                    for name, m in models.items()
                },
            )
        )
    reference = "teacher ONNX int8" if "teacher ONNX int8" in models else None
    if cfg.latency_sentences:
        # Real sentences: the int8 teacher and what the student ships as (ONNX, ExecuTorch). The PyTorch models and the
        # fp32 teacher, three times the int8 teacher's cost per call, are timed at the fixed lengths only.
        timed_on_sentences = [name for name in models if reference is None or name not in REFERENCE_ONLY]
        feeds = {
            name: [
                {
                    "input_ids": np.asarray([ids], dtype=np.int64),
                    "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
                }
                for ids in sentence_ids[name]
            ]
            for name in timed_on_sentences
        }
        if sentence_types is not None:
            for name in timed_on_sentences:
                for feed, types in zip(feeds[name], sentence_types[name]):
                    feed[SEGMENT_INPUT] = np.asarray([types], dtype=np.int64)
        mean_tokens = float(np.mean([len(ids) for ids in next(iter(sentence_ids.values()))]))
        settings.append(("sentences", round(mean_tokens, 1), feeds))
    for label, length, inputs in settings:
        for threads in cfg.latency_threads:
            runners = {name: m[1](threads) for name, m in models.items() if name in inputs}
            # One fixed-length input is called latency_runs times over the first latency_rounds rounds; each real
            # sentence once per round. Rounds are added until every speed-up's interval is narrow (timing.interleaved).
            repeat = max(1, math.ceil(cfg.latency_runs / cfg.latency_rounds)) if label != "sentences" else 1
            # the rounds stop on the student's variants: the speed-ups the bundle claims
            # (minutes per setting for a base-size teacher on two cores: say what is being timed, and when it ends)
            log.info(
                "[export] timing %d models, %s, %d thread(s): %d-%d interleaved rounds",
                len(runners),
                f"{length} tokens" if label != "sentences" else f"{len(next(iter(inputs.values())))} real sentences",
                threads,
                cfg.latency_rounds,
                cfg.latency_max_rounds,
            )
            started = time.perf_counter()
            timed = timing.interleaved(
                runners,
                inputs,
                repeat=repeat,
                warmup=cfg.latency_warmup if label != "sentences" else 1,
                min_rounds=cfg.latency_rounds,
                max_rounds=cfg.latency_max_rounds,
                reference=reference,
                max_spread=cfg.latency_max_spread,
                watch=[name for name in runners if name.startswith(("student ONNX", "student ExecuTorch"))],
            )
            log.info(
                "[export] timed in %.0f s, %d rounds",
                time.perf_counter() - started,
                max(figures["rounds"] for figures in timed.values()),
            )
            for name, figures in timed.items():
                paired = {
                    f"speedup_vs_teacher_int8{suffix}": figures.pop(f"speedup{suffix}", None)
                    for suffix in ("", "_low", "_high", "_spread")
                }
                rows.append(
                    {
                        "model": name,
                        "runtime": models[name][0],
                        "batch": 1,
                        "input": label,
                        "length": length,
                        "threads": threads,
                        **({"sentences": len(inputs[name])} if label == "sentences" else {}),
                        **figures,
                        **paired,
                    }
                )
            runners.clear()  # release this setting's sessions and programs before the next is loaded
    add_speedups(rows, {"teacher_pytorch": "teacher PyTorch fp32"})
    for row in rows:
        for key in ("median_ms", "min_ms", "max_ms", "p25_ms", "p75_ms"):
            row[key] = round(row[key], 4)
        for key in (
            "speedup_vs_teacher_int8",
            "speedup_vs_teacher_int8_low",
            "speedup_vs_teacher_int8_high",
            "speedup_vs_teacher_int8_spread",
        ):
            if row.get(key) is not None:
                row[key] = round(row[key], 3)
    load = {
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "cpu_count": os.cpu_count(),
    }
    machine = f"{platform.machine()}, {platform.processor() or 'cpu'}, onnxruntime {package_version('onnxruntime')}"
    return {"rows": rows, "skipped": skipped, "load": load, "machine": machine}


def latency_inputs(
    length: int, vocab_size: int, cls_id: int, sep_id: int, seed: int = 0, segments: bool = False
) -> dict:
    """One sequence of exactly ``length`` tokens (cls ... sep: [CLS] ... [SEP], <s> ... </s>), batch 1, int64.

    ``segments``: a sentence pair of two equal halves, [CLS] a [SEP] b [SEP], with token_type_ids 0 then 1.
    """
    rng = np.random.default_rng(seed)
    low = 1000 if vocab_size > 2000 else 1  # skip BERT's unused/special block when the vocabulary is large
    ids = rng.integers(low, vocab_size, size=(1, length), dtype=np.int64)
    ids[0, 0], ids[0, -1] = cls_id, sep_id
    feeds = {"input_ids": ids, "attention_mask": np.ones((1, length), dtype=np.int64)}
    if segments:
        middle = length // 2
        ids[0, middle - 1] = sep_id
        feeds[SEGMENT_INPUT] = (np.arange(length) >= middle).astype(np.int64)[None, :]
    return feeds


def ort_runner(path: Path, threads: int):
    """A zero-argument-per-input callable: one batch-1 run of the ONNX graph at ``path``."""
    session = ort_session(path, threads)
    return lambda inputs: session.run(OUTPUT_NAMES, inputs)


def torch_runner(model, threads: int):
    def run(inputs):
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with torch.inference_mode():
                model(**{name: torch.from_numpy(value) for name, value in inputs.items()})
        finally:
            torch.set_num_threads(previous)

    return run


def add_speedups(rows: list[dict], references: dict[str, str]) -> None:
    """``speedup_vs_<key>``: the reference model's median / the row's median, on the same input and threads."""
    for key, reference in references.items():
        base = {(r["input"], r["threads"]): r["median_ms"] for r in rows if r["model"] == reference}
        for row in rows:
            ref = base.get((row["input"], row["threads"]))
            row[f"speedup_vs_{key}"] = round(ref / row["median_ms"], 3) if ref else None


def latency_markdown(rows: list[dict], machine: str, load: dict | None = None) -> str:
    busy = ""
    if (
        load
        and load.get("cpu_count")
        and max(load["load_average_1m_before"], load["load_average_1m_after"]) > 0.75 * load["cpu_count"]
    ):
        busy = (
            f" The machine was busy while measuring (1-minute load {load['load_average_1m_before']:.1f} -> "
            f"{load['load_average_1m_after']:.1f} on {load['cpu_count']} cores): multi-thread rows especially are "
            "pessimistic; compare rows measured together, and rerun the export on an idle machine for absolute figures."
        )
    lines = [
        "# Latency (batch 1)",
        "",
        f"Measured on the export machine ({machine}); all models of one input and thread count were timed side by side, "
        "interleaved round by round. `L=n`: one sequence of exactly n tokens; `sentences`: real test sentences one at a "
        "time, ms per sentence (length = their mean token count). ms: the median over rounds of a round's mean per call; "
        "middle half: the 25th-75th percentile of single calls. Speed-up vs the int8 teacher: the median of per-round "
        "ratios (each round times both) with its 95% interval; rounds are added until every interval is within "
        "export.latency_max_spread of its median, and a target is met only at the interval's lower bound. "
        f"Phones differ: use this table for ratios, not absolute figures.{busy}",
        "",
        "| model | runtime | input | tokens | threads | median ms | middle half, ms | rounds | speed-up vs teacher int8 "
        "(95% interval) | vs teacher PyTorch |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def speed(value):
        return f"{value:.2f}x" if value else "-"

    def paired(r):
        if not r.get("speedup_vs_teacher_int8"):
            return "-"
        low, high = r.get("speedup_vs_teacher_int8_low"), r.get("speedup_vs_teacher_int8_high")
        return f"{r['speedup_vs_teacher_int8']:.2f}x" + (f" ({low:.2f}-{high:.2f})" if low is not None else "")

    for r in rows:
        lines.append(
            f"| {r['model']} | {r['runtime']} | {r['input']} | {r['length']} | {r['threads']} | {r['median_ms']:.3f} | "
            f"{r['p25_ms']:.3f}-{r['p75_ms']:.3f} | {r['rounds']} | {paired(r)} | "
            f"{speed(r.get('speedup_vs_teacher_pytorch'))} |"
        )
    return "\n".join(lines) + "\n"


def compare_with_int8_teacher(
    cfg, teacher_dir: Path, baseline: dict | None, variants: dict, recommended: str, rows: list[dict]
) -> dict | None:
    """The recommended variant against the int8 teacher (baseline_comparison), logged; None without a baseline."""
    if not baseline:
        return None
    chosen = variants[f"onnx_{recommended}"]
    shipped = {"variant": recommended, "accuracy": chosen["accuracy"], "file_mb": chosen["file_mb"]}
    teacher_accuracy = json.loads((teacher_dir / "metrics.json").read_text())["test_accuracy"]
    comparison = baseline_comparison(cfg, teacher_accuracy, baseline, shipped, rows)
    for line in comparison_lines(comparison):
        log.info("[export] %s", line)
    return comparison


def baseline_comparison(cfg, teacher_accuracy: float, baseline: dict, shipped: dict, rows: list[dict]) -> dict:
    """The shipped student against what a user would ship without distillation: the int8 teacher.

    Three ratios (accuracy kept, speed-up, size) with the targets of export.targets, each marked met or not.
    """
    shipped_name = latency_name(shipped["variant"])
    threads = min(cfg.latency_threads)  # the headline is single-threaded where measured (phones run one model per core)
    mine = [
        r for r in rows if r["model"] == shipped_name and r["threads"] == threads and r.get("speedup_vs_teacher_int8")
    ]
    speedups = {r["input"]: r["speedup_vs_teacher_int8"] for r in mine}
    intervals = {r["input"]: [r["speedup_vs_teacher_int8_low"], r["speedup_vs_teacher_int8_high"]] for r in mine}
    t = cfg.targets
    ratios = {
        "accuracy_kept": shipped["accuracy"] / teacher_accuracy,
        "accuracy_kept_vs_int8_teacher": shipped["accuracy"] / baseline["accuracy"],
        "speedup_vs_int8_teacher": speedups,
        "speedup_vs_int8_teacher_interval": intervals,  # 95% interval of the median paired ratio (timing.interleaved)
        "size_vs_int8_teacher": shipped["file_mb"] / baseline["file_mb"],
    }
    checks = {
        "accuracy_kept": ratios["accuracy_kept"] >= t.min_accuracy_kept,
        "size": ratios["size_vs_int8_teacher"] <= t.max_size_ratio,
    }
    # a speed-up counts as met only when its interval's lower bound reaches the target
    checks.update({f"speedup {name}": intervals[name][0] >= t.min_speedup for name in speedups})
    if not speedups:  # nothing timed (no lengths within the position table, no sentences): cannot count as met
        checks["speedup"] = False
    return {
        "baseline": baseline,
        "teacher_fp32_accuracy": teacher_accuracy,
        "shipped": shipped,
        "threads": threads,
        **ratios,
        "targets": t.model_dump(),
        "meets": checks,
        "all_met": all(checks.values()),
    }


def comparison_lines(comparison: dict) -> list[str]:
    """Plain-text lines: the shipped student against the int8 teacher (summary, logs, README)."""
    b, s = comparison["baseline"], comparison["shipped"]
    t = comparison["targets"]
    mark = {True: "met", False: "NOT met"}
    intervals = comparison.get("speedup_vs_int8_teacher_interval") or {}
    speed = (
        ", ".join(
            f"{v:.2f}x at {k}"
            + (f" (95% interval {intervals[k][0]:.2f}-{intervals[k][1]:.2f})" if k in intervals else "")
            for k, v in comparison["speedup_vs_int8_teacher"].items()
        )
        or "not measured"
    )
    meets = comparison["meets"]
    speed_ok = (
        all(v for k, v in meets.items() if k.startswith("speedup")) if comparison["speedup_vs_int8_teacher"] else False
    )
    return [
        f"baseline (no distillation): teacher ONNX int8, accuracy {b['accuracy']:.4f}, {b['file_mb']:.1f} MB",
        f"shipped student ({s['variant']}): accuracy {s['accuracy']:.4f}, {s['file_mb']:.1f} MB",
        f"accuracy kept {comparison['accuracy_kept']:.3f} of the fp32 teacher's {comparison['teacher_fp32_accuracy']:.4f} "
        f"(target >= {t['min_accuracy_kept']}: {mark[meets['accuracy_kept']]})",
        f"speed-up vs int8 teacher (batch 1, {comparison.get('threads', 1)} thread{'s' if comparison.get('threads', 1) > 1 else ''}): "
        f"{speed} (target >= {t['min_speedup']}x at the interval's lower bound: {mark[speed_ok]})",
        f"size vs int8 teacher: {comparison['size_vs_int8_teacher']:.2f} (target <= {t['max_size_ratio']}: {mark[meets['size']]})",
    ]
