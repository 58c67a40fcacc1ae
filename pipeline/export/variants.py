"""The variants the bundle can ship, built and measured one text per call: the fp32 graph (vocabulary trimmed or
not), dynamic int8, static QDQ int8, and the rule that picks the recommended one."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PipelineError
from ..integrity import sha256_file
from ..metrics import classification_report
from ..models import count_parameters, load_classifier
from ..splits import TokenizedSplit
from .files import package_version
from .onnx_graph import (
    LogitsOnly,
    batch_invariance,
    export_onnx,
    onnx_logits,
    split_feeds,
    strip_node_metadata,
    torch_logits,
    variant_metrics,
)
from .quantize import int8_teacher_baseline, quantization_ladder, quantize_static_int8, quantize_with_budget
from .tokenizer import IdSplit, tokenize_texts, tokenizer_facts, trimmed_student

log = logging.getLogger("pipeline")


def latency_name(variant: str) -> str:
    """The latency table's name of a shipped variant ("int8_static" -> "student ONNX int8 static")."""
    return f"student ONNX {variant.replace('_', ' ')}"


@dataclass
class Inputs:
    """What the export reads from the earlier stages."""

    prepare: Path
    teacher: Path  # the teacher stage's folder (model/, metrics.json)
    student: Path  # the distilled student's folder (weights, tokenizer.json)
    names: list[str]  # label names, by index
    labels: dict  # {"0": name, ...}: labels.json and metadata.json
    pad: int  # [PAD] id of the original vocabulary
    max_length: int
    test: TokenizedSplit  # the test split in the original vocabulary (the teacher's)
    test_records: list[dict]  # the same split as prepare wrote it ({"text", "label"[, "text_pair"]}), read once

    @property
    def text_pairs(self) -> bool:
        """Sentence pairs (with or without segment ids): predict.py refuses a pair for a single-text model."""
        return bool(self.test_records) and "text_pair" in self.test_records[0]

    @property
    def segments(self) -> bool:
        """Sentence pairs with token_type_ids (prepare stored them): every graph takes them as a third input."""
        return self.test.token_type_ids is not None


@dataclass
class Student:
    """The PyTorch student as it will ship (student_to_ship): vocabulary trimmed or not, with its test split."""

    model: Any  # a transformers classifier, eager attention
    test: Any  # the test split in the student's own vocabulary (TokenizedSplit or tokenizer.IdSplit)
    pad: int
    tokenizer_json: Path
    own_logits: np.ndarray  # ``model``'s logits on ``test``: what its graphs and programs must reproduce
    reference: np.ndarray  # the trained student's logits, which every variant's accuracy is compared with
    trim: dict | None = None  # vocab_trim facts (trimmed_student's) when export.trim_vocab
    trained: Any = None  # the trained, untrimmed model when trimmed: the "before" figures (before_trimming)
    role_tokens: dict | None = None  # when trimmed: {role: token} of the trained tokenizer, which name the cut one's


@dataclass
class Shipped:
    """The student as shipped: model, tokenizer and test split in its own (maybe trimmed) vocabulary, and its fp32 graph."""

    model: Any  # a transformers classifier (its .config is read)
    test: Any  # the test split in the shipped vocabulary (TokenizedSplit or tokenizer.IdSplit)
    pad: int
    tokenizer_json: Path
    facts: dict  # tokenizer.tokenizer_facts of tokenizer_json
    fp32_path: Path
    fp32_logits: np.ndarray
    fp32: dict  # the fp32 graph's test metrics (variant_metrics)
    reference: np.ndarray  # logits of the trained PyTorch student, which every variant is compared with
    own_logits: np.ndarray  # logits of ``model`` itself (the trimmed student when trimmed): what parity compares with
    parity: dict  # the fp32 graph against its own PyTorch model
    ladder: list  # int8 settings to try (read from the exporter's node scopes)
    trim: dict | None = None  # vocab_trim facts when export.trim_vocab


@dataclass
class Int8:
    """The shipped int8 graph: the setting chosen on the ladder, every attempt, its test metrics and logits."""

    path: Path
    setting: dict
    attempts: list
    metrics: dict
    logits: np.ndarray


@dataclass
class Teacher:
    """The teacher graphs, measured and never shipped, and the int8 baseline's test figures."""

    onnx: Path
    int8: Path | None
    baseline: dict | None


def read_records(prepare: Path, split: str = "test") -> list[dict]:
    """A split's records ({"text", "label"[, "text_pair"]}) as prepare wrote them."""
    with open(prepare / f"{split}.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def student_to_ship(inputs: Inputs, cfg, work: Path) -> Student:
    """The trained student and, with export.trim_vocab, the same cut to the tokens the training text uses (a smaller
    embedding table; test re-tokenized with the cut vocabulary), with the logits every later check compares with."""
    model = load_classifier(str(inputs.student), attn_implementation="eager").eval()
    reference = torch_logits(model, inputs.test, inputs.pad)  # the PyTorch student every variant is compared with
    own = reference
    if hasattr(model, "fold_classifier"):  # the static student: its head moved into its tables (static_model.py)
        model.fold_classifier()
        own = torch_logits(model, inputs.test, inputs.pad)
        log.info(
            "[export] static student: head folded into the tables (%d columns), logits within %.1e of the trained model",
            model.embeddings.embedding_dim,
            float(np.abs(own - reference).max()),
        )
    tokenizer_json = inputs.student / "tokenizer.json"
    facts = tokenizer_facts(tokenizer_json)
    untrimmed = Student(model, inputs.test, inputs.pad, tokenizer_json, own, reference)
    if not cfg.trim_vocab:
        return untrimmed
    if not trim_supported(facts):
        reason = (
            f"vocabulary trimming supports WordPiece, BPE and Unigram tokenizers; this tokenizer is "
            f"{facts['type']}, so the full vocabulary is shipped"
        )
        log.info("[export] export.trim_vocab skipped: %s", reason)
        untrimmed.trim = {
            "enabled": False,
            "requested": True,
            "applied": False,
            "reason": reason,
            "tokenizer_model": facts["type"],
        }
        return untrimmed
    trimmed, test, trimmed_json, trim = trimmed_student(
        model,
        inputs.prepare,
        inputs.test_records,
        tokenizer_json,
        work,
        inputs.test,
        inputs.max_length,
        facts,
        unlabeled_min_count=cfg.trim_unlabeled_min_count,
    )
    pad = trim["pad_id"]
    own = torch_logits(trimmed, test, pad)
    roles = {role: entry["token"] for role, entry in facts["special_tokens"].items()}
    return Student(trimmed, test, pad, trimmed_json, own, reference, trim, trained=model, role_tokens=roles)


def export_student(student: Student, inputs: Inputs, cfg, out: Path, work: Path) -> Shipped:
    """The student as fp32 ONNX (model.onnx), parity-checked; when trimmed, the figures before trimming too."""
    shipped = export_fp32(
        student.model,
        student.test,
        student.pad,
        student.tokenizer_json,
        out / "model.onnx",
        student.own_logits,
        student.reference,
        inputs.names,
        cfg,
        student.role_tokens,
    )
    if student.trained is None:
        shipped.trim = student.trim
        return shipped
    trim = dict(student.trim or {})
    before, after = before_trimming(student, shipped, inputs.names), shipped.fp32
    # texts whose pieces all survive: the same ids, so the same predictions (up to float noise of a smaller table)
    surviving = trim.pop("surviving_rows")
    if surviving:
        trim["surviving_max_abs_logit_diff"] = float(
            np.abs(student.reference[surviving] - student.own_logits[surviving]).max()
        )
        trim["surviving_prediction_agreement"] = float(
            (student.reference[surviving].argmax(-1) == student.own_logits[surviving].argmax(-1)).mean()
        )
    shipped.trim = {**trim, "before": before, "after": _brief(after)}
    rare = trim["unlabeled_min_count"]
    log.info(
        "[export] vocabulary trimmed to %d tokens%s: fp32 %.1f -> %.1f MB, test accuracy %.4f -> %.4f",
        trim["kept_tokens"],
        f" (unlabelled-only tokens used under {rare} times dropped)" if rare > 1 else "",
        before["file_mb"],
        after["file_mb"],
        before["accuracy"],
        after["accuracy"],
    )
    return shipped


def before_trimming(student: Student, shipped: Shipped, names) -> dict:
    """The trained student's figures before its vocabulary was cut, without exporting a second graph: accuracy from
    its PyTorch logits (the reference every variant is compared with), and its fp32 graph's size as the shipped
    graph's plus the cut rows, 4 bytes a value (the rest of the graph is the same; within 0.1% on the tiny run,
    tests/test_export.py)."""
    parameters = count_parameters(student.trained)
    cut = parameters - count_parameters(student.model)
    report = classification_report(shipped.test.labels, student.reference.argmax(-1), names)
    return {
        "accuracy": report["accuracy"],
        "macro_f1": report["macro_f1"],
        "file_mb": shipped.fp32["file_mb"] + cut * 4 / 1e6,
        "parameters": parameters,
        "figures_from": "the trained PyTorch student; file_mb: model.onnx plus the cut embedding rows (fp32)",
    }


def trim_supported(facts: dict) -> bool:
    """export.trim_vocab cuts WordPiece, BPE and Unigram vocabularies (tokenizer.trim_vocabulary)."""
    return facts.get("type") in ("WordPiece", "BPE", "Unigram")


def export_fp32(model, test, pad, tokenizer_json, path, own_logits, reference, names, cfg, role_tokens=None) -> Shipped:
    """``model`` as fp32 ONNX at ``path``: parity against ``own_logits`` (its PyTorch logits), metrics against ``reference``.

    ``role_tokens`` ({role: token}) names the special tokens when ``tokenizer_json`` has no tokenizer_config.json beside it."""
    logits, parity, ladder = export_checked(model, path, test, pad, own_logits, cfg)
    fp32 = variant_metrics(logits, reference, test.labels, names, path, count_parameters(model))
    fp32["batch_invariance"] = batch_invariance(path, test, pad, logits)
    facts = tokenizer_facts(tokenizer_json, role_tokens)
    return Shipped(
        model=model,
        test=test,
        pad=pad,
        tokenizer_json=tokenizer_json,
        facts=facts,
        fp32_path=path,
        fp32_logits=logits,
        fp32=fp32,
        reference=reference,
        own_logits=own_logits,
        parity=parity,
        ladder=ladder,
    )


def export_checked(student, path, split, pad, reference, cfg):
    """Export ``student`` to ``path``, strip exporter metadata, and fail loudly unless ONNX matches PyTorch on ``split``."""
    export_onnx(LogitsOnly(student), path, cfg.opset, segments=getattr(split, "token_type_ids", None) is not None)
    ladder = quantization_ladder(path, student.config.num_hidden_layers)  # needs the exporter's node scopes
    strip_node_metadata(path)
    logits = onnx_logits(path, split, pad)
    max_diff = float(np.abs(reference - logits).max())
    agreement = float((reference.argmax(-1) == logits.argmax(-1)).mean())
    if max_diff > cfg.parity_tolerance:
        raise PipelineError(
            f"ONNX parity check failed: max |logit difference| {max_diff:.2e} on the test split is above "
            f"export.parity_tolerance={cfg.parity_tolerance} (prediction agreement {agreement:.4f}). "
            f"The exported graph does not compute what the PyTorch student computes; nothing was shipped."
        )
    return logits, {"max_abs_logit_diff": max_diff, "prediction_agreement": agreement}, ladder


def quantize_dynamic(shipped: Shipped, names, cfg, out: Path, work: Path) -> Int8 | None:
    """int8 with an accuracy budget (quantize_with_budget); None when export.quantize is off."""
    if not cfg.quantize:
        return None
    path = out / "model.int8.onnx"
    setting, attempts, logits = quantize_with_budget(
        shipped.ladder,
        shipped.fp32_path,
        path,
        work,
        shipped.test,
        shipped.pad,
        shipped.fp32["accuracy"],
        cfg.max_int8_drop,
    )
    metrics = variant_metrics(logits, shipped.reference, shipped.test.labels, names, path, shipped.fp32["parameters"])
    metrics["drop_points"] = setting["drop_points"]
    metrics["batch_invariance"] = batch_invariance(path, shipped.test, shipped.pad, logits)
    log.info(
        "[export] dynamic int8 in batches of 64: %d of %d test predictions change (activation scales per batch)",
        metrics["batch_invariance"]["predictions_changed"],
        len(shipped.test),
    )
    return Int8(path=path, setting=setting, attempts=attempts, metrics=metrics, logits=logits)


def quantize_static(shipped: Shipped, inputs: Inputs, cfg, seed: int, out: Path, work: Path) -> Int8 | None:
    """Static QDQ int8 (quantize.quantize_static_int8), activation scales from a seeded sample of training texts in
    the shipped vocabulary; under the same accuracy budget, keeping the head, then the edge layers, in fp32 if
    needed. None when export.quantize or export.static_int8 is off."""
    if not (cfg.quantize and cfg.static_int8):
        return None
    records = read_records(inputs.prepare, "train")
    chosen = np.random.default_rng([seed, 11]).permutation(len(records))[: cfg.calibration_examples]
    texts = [records[i]["text"] for i in chosen]
    pairs = [records[i]["text_pair"] for i in chosen] if inputs.segments else None
    encoded = tokenize_texts(shipped.tokenizer_json, texts, inputs.max_length, pairs, segments=inputs.segments)
    ids, types = encoded if inputs.segments else (encoded, None)
    sample = IdSplit(ids, np.zeros(len(ids), dtype=np.int64), types)
    calibration = [split_feeds(sample, [i], shipped.pad) for i in range(len(sample))]
    fp32_accuracy, path, attempts, best = shipped.fp32["accuracy"], out / "model.int8.static.onnx", [], None
    # (what stays fp32, its nodes, 7-bit weights): everything int8 first, with 8- then 7-bit weights (x86 CPUs
    # without VNNI saturate with 8: quantization_ladder), then the dynamic ladder's rungs that keep layers fp32
    keep_fp32: list[tuple[str, list[str], bool]] = [("none", [], False), ("none_reduce_range", [], True)]
    keep_fp32 += [(s["name"], s["exclude"], s["reduce_range"]) for s in shipped.ladder if s["exclude"]]
    for step, (name, excluded, reduce_range) in enumerate(keep_fp32):
        candidate = work / f"int8_static_{step}.onnx"
        settings = quantize_static_int8(shipped.fp32_path, candidate, calibration, excluded, reduce_range)
        logits = onnx_logits(candidate, shipped.test, shipped.pad)
        accuracy = float((logits.argmax(-1) == shipped.test.labels).mean())
        attempt = {
            "kept_fp32": name,
            "accuracy": accuracy,
            "drop_points": 100 * (fp32_accuracy - accuracy),
            "file_mb": candidate.stat().st_size / 1e6,
            "excluded_nodes": len(excluded),
        }
        attempts.append(attempt)
        log.info(
            "[export] static int8 (kept fp32: %s): accuracy %.4f (drop %.2f points, budget %.2f)",
            name,
            accuracy,
            attempt["drop_points"],
            cfg.max_int8_drop,
        )
        if best is None or attempt["drop_points"] < best[0]["drop_points"] - 1e-12:
            best = (attempt, settings, candidate, logits)
        if attempt["drop_points"] <= cfg.max_int8_drop:
            break
    assert best is not None  # the first attempt sets it (keep_fp32 is never empty)
    attempt, settings, candidate, logits = best
    shutil.move(str(candidate), path)
    metrics = variant_metrics(
        logits, shipped.reference, shipped.test.labels, inputs.names, path, shipped.fp32["parameters"]
    )
    metrics["drop_points"] = attempt["drop_points"]
    metrics["batch_invariance"] = batch_invariance(path, shipped.test, shipped.pad, logits)
    setting = {
        **settings,
        "kept_fp32": attempt["kept_fp32"],
        "drop_points": attempt["drop_points"],
        "within_budget": attempt["drop_points"] <= cfg.max_int8_drop,
        "attempts": attempts,
        "calibration": {
            "split": "train",
            "examples": len(calibration),
            "seed": [seed, 11],
            "method": "MinMax",
            "one_text_per_call": True,
        },
    }
    log.info(
        "[export] static int8 in batches of 64: %d test predictions change (max logit difference %.1e)",
        metrics["batch_invariance"]["predictions_changed"],
        metrics["batch_invariance"]["max_abs_logit_diff"],
    )
    return Int8(path=path, setting=setting, attempts=attempts, metrics=metrics, logits=logits)


def export_teacher(inputs: Inputs, int8: Int8 | None, cfg, work: Path, cache_dir: Path | None = None) -> Teacher:
    """The teacher as ONNX fp32 and, quantized with the student's int8 setting, the int8 baseline (int8_teacher_baseline).

    The fp32 graph depends on the teacher alone, not on the student: with ``cache_dir`` it is exported once per
    teacher and reused by every later export of a student of it (sweep variants, ``--only export`` reruns)."""
    onnx_path, int8_path = work / "teacher.onnx", work / "teacher.int8.onnx"
    key = teacher_graph_key(inputs, cfg.opset) if cache_dir else None
    cached = cache_dir / f"teacher-{key}.onnx" if cache_dir and key else None
    if cached and reuse_cached(cached, onnx_path):
        log.info("[export] the teacher's fp32 graph reused from %s (same weights, opset and exporter)", cached)
    else:
        eager = load_classifier(str(inputs.teacher / "model"), attn_implementation="eager").eval()
        export_onnx(LogitsOnly(eager), onnx_path, cfg.opset, segments=inputs.segments)
        strip_node_metadata(onnx_path)  # as the student's: the exporter's stack traces would count in the size compared
        del eager
        if cached:
            store_cached(onnx_path, cached)
    baseline = int8_teacher_baseline(
        onnx_path, int8_path, int8.setting if int8 else None, inputs.test, inputs.pad, inputs.names
    )
    return Teacher(onnx=onnx_path, int8=int8_path if int8 else None, baseline=baseline)


TEACHER_GRAPH_FORMAT = 1  # bump when export_onnx or strip_node_metadata change what the teacher's graph holds


def teacher_graph_key(inputs: Inputs, opset: int) -> str | None:
    """What the teacher's fp32 graph depends on, hashed: its model files (their digests in the teacher stage's
    manifest), the opset, the segment input and the exporter's versions; None without a manifest."""
    try:
        outputs = json.loads((inputs.teacher / "manifest.json").read_text())["outputs"]
        model = {name: entry["sha256"] for name, entry in sorted(outputs.items()) if name.startswith("model/")}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    facts = {
        "model": model,
        "opset": opset,
        "segments": inputs.segments,
        "format": TEACHER_GRAPH_FORMAT,
        **{package: package_version(package) for package in ("torch", "onnx", "onnxscript", "transformers")},
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def reuse_cached(cached: Path, path: Path) -> bool:
    """Copy ``cached`` to ``path`` when it is whole (its recorded digest); False when absent or damaged."""
    try:
        recorded = json.loads(cached.with_suffix(".json").read_text())["sha256"]
        if sha256_file(cached) != recorded:
            log.warning("[export] %s does not match its recorded digest: exported again", cached)
            return False
        shutil.copyfile(cached, path)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def store_cached(path: Path, cached: Path) -> None:
    """``path`` into the cache under ``cached`` (the graph, then its digest: a half-written entry is never used); a
    cache that cannot be written only costs the next export the time."""
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
    digest = cached.with_name(f"{cached.stem}.json.{os.getpid()}.partial")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, partial)
        os.replace(partial, cached)
        digest.write_text(json.dumps({"sha256": sha256_file(cached)}))
        os.replace(digest, cached.with_suffix(".json"))
    except OSError as exc:
        for leftover in (partial, digest):  # a full disk: nothing half-written stays
            leftover.unlink(missing_ok=True)
        log.warning(
            "[export] could not keep the teacher's graph in %s (%s); the next export makes it again", cached, exc
        )


def choose_variant(cfg, int8: Int8 | None, static: Int8 | None, rows: list[dict]) -> tuple[str, str]:
    """The variant the bundle recommends: an int8 variant within the accuracy budget (one text per call), the
    clearly faster one on real sentences at one thread (its speed-up interval above the other's), else the more
    accurate, else static (the same answer whatever the batch); fp32 when no int8 variant fits."""
    fits = {name: v for name, v in (("int8", int8), ("int8_static", static)) if v and v.setting["within_budget"]}
    if not fits:
        return "fp32", (
            "no int8 variant kept test accuracy within export.max_int8_drop"
            if int8 or static
            else "export.quantize is off"
        )
    if len(fits) == 1:
        name = next(iter(fits))
        return name, f"the only int8 variant within {cfg.max_int8_drop} points of fp32"
    threads = min(cfg.latency_threads)
    speed = {r["model"]: r for r in rows if r["input"] == "sentences" and r["threads"] == threads}
    dynamic, fixed = speed.get(latency_name("int8")), speed.get(latency_name("int8_static"))
    key = "speedup_vs_teacher_int8"
    if dynamic and fixed and dynamic.get(key) and fixed.get(key):
        for faster, slower, name in ((fixed, dynamic, "int8_static"), (dynamic, fixed, "int8")):
            if faster[f"{key}_low"] > slower[f"{key}_high"]:
                return name, (
                    f"both int8 variants fit the budget; {'static' if name == 'int8_static' else 'dynamic'} is "
                    f"faster on real sentences ({faster[key]:.2f}x vs {slower[key]:.2f}x the int8 teacher at "
                    f"{threads} thread, 95% intervals apart)"
                )
    assert int8 is not None and static is not None  # both are in fits here
    a, b = int8.metrics["accuracy"], static.metrics["accuracy"]
    if a > b:
        return (
            "int8",
            f"both fit the budget and neither is clearly faster; dynamic is more accurate ({a:.4f} vs {b:.4f})",
        )
    return "int8_static", (
        f"both fit the budget and neither is clearly faster; static is as accurate or more "
        f"({b:.4f} vs {a:.4f}) and answers the same whatever the batch"
    )


def recommended_graph(
    shipped: Shipped, int8: Int8 | None, static: Int8 | None, recommended: str
) -> tuple[Path, np.ndarray]:
    """The recommended variant's ids-in graph and its logits on the test split, one text per call."""
    chosen = {"int8": int8, "int8_static": static}.get(recommended)  # choose_variant recommends only one that was made
    return (chosen.path, chosen.logits) if chosen else (shipped.fp32_path, shipped.fp32_logits)


def _brief(metrics: dict) -> dict:
    return {k: metrics[k] for k in ("accuracy", "macro_f1", "file_mb", "parameters", "agreement_with_pytorch")}
