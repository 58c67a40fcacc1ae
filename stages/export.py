"""Stage 6, export: the student as a mobile bundle, every variant measured.

1. ONNX fp32: single file, dynamic batch and sequence axes, opset recorded;
   parity against PyTorch fp32 on the whole test split (fails above
   export.parity_tolerance).
2. int8: dynamic quantization of the MatMul weights, per channel. If accuracy
   drops more than export.max_int8_drop points, safer settings are tried
   (pooler/classifier in fp32, then first/last layers in fp32 with 7-bit
   weights); if none fits, int8 is marked not recommended and fp32 is.
3. The text-in model (pipeline/text_model.py): model.text.onnx, the tokenizer
   as onnxruntime-extensions operators in front of the recommended graph,
   strings in, probabilities and label out; shipped only if it reproduces
   predict.py's token ids and predictions on the whole test split, otherwise
   metadata.json says why. ORT format (model.int8.ort, model.text.ort, plus
   model.ort when fp32 is recommended) and required_operators.config for
   reduced mobile builds. ONNX Runtime's mobile usability checker on the
   shipped graph (pipeline/mobile.py): NNAPI and CoreML verdicts.
4. The baseline a user would ship instead: the teacher exported and quantized
   with the student's int8 setting (test accuracy, file size). Latency at batch
   1 of every model side by side (interleaved rounds) at the configured lengths
   and on real test sentences: teacher (PyTorch, ONNX fp32, ONNX int8), student
   (PyTorch, ONNX fp32, int8); then accuracy kept, speed-up and size against
   the int8 teacher, checked against export.targets.
5. The bundle (bundle/): models, tokenizer.json (+ vocab.txt for WordPiece), labels.json,
   metadata.json (with sha256 of every file), README.md, predict.py,
   latency.json/.md, and demo.html (+ demo/: onnxruntime-web) when the browser
   runtime is installed (pipeline/bundle_files/web). Logged to MLflow; the recommended graph is registered as
   `attention-distill-<config>` with alias `candidate`.

With export.trim_vocab the shipped graph and tokenizer keep only the tokens
the train/validation text uses (plus specials): the embedding table shrinks,
test words made of other pieces become shorter pieces or [UNK]; accuracy and
size before and after are recorded (metadata.json, metrics.json: vocab_trim).
Only WordPiece vocabularies are trimmed; for other tokenizer models (BPE, Unigram)
trimming is skipped with a log line and vocab_trim {"applied": false, "reason": ...}.

Outputs: bundle/, metrics.json (per-variant test metrics, same keys as
evaluate's), export.json (summary figures).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import math
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import bundle as B
from pipeline import executorch_export as ET
from pipeline import from_text as FT
from pipeline import peers as PEERS
from pipeline import mobile as MOBILE
from pipeline import text_model as TM
from pipeline import timing
from pipeline.errors import PipelineError
from pipeline.inference import TokenizedSplit, label_names, pad_id
from pipeline.metrics import classification_report
from pipeline.models import count_parameters, load_classifier
from pipeline.summary import comparison_lines, latency_name

log = logging.getLogger("pipeline")

READS = ["export"]
AFTER = ["prepare", "teacher", "baselines", "distill"]
VERSION = 6  # 4: the student, the int8 teacher and the peers from raw text, one text per call (from_text); 5: every accuracy one text per call, static QDQ int8, ExecuTorch programs, latency intervals;
# 6: text_pairs in metadata.json; predict.py refuses paths outside the bundle and pair/single mismatches

ALIAS = "candidate"


def run(ctx) -> dict:
    """The export, step by step: each step below builds one thing; the figures are rendered into every output at the end."""
    if not ctx.is_main:  # export, measurement and registration happen once
        return {}
    cfg = ctx.config.export
    inputs = read_inputs(ctx)
    out = fresh_folder(ctx.out / "bundle")
    work = fresh_folder(ctx.out / "work")  # teacher graph and rejected int8 attempts; removed before the rename
    shipped = export_student(inputs, cfg, out, work)  # 1. fp32 ONNX and parity (vocabulary trimmed or not)
    int8 = quantize(shipped, inputs.names, cfg, out, work)  # 2. dynamic int8 within the accuracy budget
    static = quantize_static(shipped, inputs, cfg, ctx.config.seed, out, work)  # and static QDQ int8 (calibrated)
    pte = export_executorch(shipped, inputs, cfg, out)  # model.pte, model.int8.pte: ExecuTorch (XNNPACK)
    teacher = export_teacher(inputs, int8, cfg, work)  # 3. the baseline a user would ship instead
    latency = measure_side_by_side(ctx.config.seed, inputs, shipped, int8, static, pte, teacher, cfg)  # every model side by side
    recommended, because = choose_variant(cfg, int8, static, latency["rows"])  # on one-text-per-call accuracy and speed
    text = build_text_model(inputs, shipped, int8, static, recommended, out)  # 4. text in, probabilities out
    ort = convert_to_ort(shipped, int8, static, recommended, text, inputs.test_records, cfg, out)  # ORT format
    mobile = check_mobile(shipped, int8, static, recommended)  # what NNAPI and CoreML could take of each graph
    from_text = measure_from_text(ctx, inputs, shipped, int8, static, teacher, text, recommended, out)  # with the peers
    variants = {"onnx_fp32": shipped.fp32, **({"onnx_int8": int8.metrics} if int8 else {}),
                **({"onnx_int8_static": static.metrics} if static else {})}
    figures = Figures(
        examples=len(shipped.test), variants=variants, recommended=recommended, because=because, parity=shipped.parity,
        quant=int8.setting if int8 else None, attempts=int8.attempts if int8 else [],
        static=static.setting if static else None,
        trim=shipped.trim or {"enabled": False}, ort=ort, latency=latency, text_model=text, mobile=mobile, from_text=from_text,
        executorch=pte,
        comparison=compare_with_int8_teacher(cfg, inputs.teacher, teacher.baseline, variants, recommended, latency["rows"]))
    metadata = write_bundle(ctx, inputs, shipped, figures, mlflow_source(ctx))  # 5. the bundle files
    shutil.rmtree(work)
    ctx.write_json("metrics.json", metrics_json(figures))  # 6. metrics, MLflow
    registration = register(ctx, figures, metadata)
    summary = export_summary(cfg, figures, registration)
    ctx.write_json("export.json", summary)
    log_outcome(figures, ctx.final / "bundle")
    return summary


# ---------------------------------------------------------------- what the steps build


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
class Shipped:
    """The student as shipped: model, tokenizer and test split in its own (maybe trimmed) vocabulary, and its fp32 graph."""

    model: object
    test: object  # the test split in the shipped vocabulary (TokenizedSplit or bundle.IdSplit)
    pad: int
    tokenizer_json: Path
    facts: dict  # bundle.tokenizer_facts of tokenizer_json
    fp32_path: Path
    fp32_logits: np.ndarray
    fp32: dict  # the fp32 graph's test metrics (variant_metrics)
    reference: np.ndarray  # logits of the trained PyTorch student, which every variant is compared with
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


@dataclass
class Figures:
    """Every figure the export reports, built once. metadata.json, metrics.json, export.json, the README,
    latency.json/.md and MLflow render these and compute none of their own."""

    examples: int  # test examples every accuracy is measured on
    variants: dict  # "onnx_fp32" [, "onnx_int8"]: variant_metrics (+ drop_points for int8)
    recommended: str  # "int8", "int8_static" or "fp32"
    because: str  # why that variant (choose_variant)
    parity: dict  # max_abs_logit_diff, prediction_agreement
    quant: dict | None  # the chosen int8 setting; None when export.quantize is off
    attempts: list  # every int8 setting tried
    static: dict | None  # the static QDQ int8 setting, calibration and attempts; None when not built
    trim: dict  # vocab_trim ({"enabled": False} when off)
    ort: dict  # ORT-format files, their agreement with the .onnx
    latency: dict  # rows, skipped, load, machine
    comparison: dict | None  # versus_int8_teacher (the baseline inside); None without int8
    text_model: dict  # the text-in model: {"shipped": true, file, check...} or {"shipped": false, "why": ...}
    mobile: dict  # the mobile usability checker's verdicts: "shipped" (the recommended graph) and "fp32"
    from_text: dict  # student, int8 teacher and peers from raw text, one text per call (measure_from_text)
    executorch: dict  # model.pte / model.int8.pte: {"built": true, "variants": {...}} or {"built": false, "why": ...}

    @property
    def int8_recommended(self) -> bool:
        return self.recommended.startswith("int8")


# ---------------------------------------------------------------- the steps, in order


def read_inputs(ctx) -> Inputs:
    prepare, teacher, distill = ctx.input("prepare"), ctx.input("teacher"), ctx.input("distill")
    names = label_names(prepare)
    return Inputs(prepare=prepare, teacher=teacher, student=distill / "student", names=names,
                  labels={str(i): name for i, name in enumerate(names)}, pad=pad_id(prepare),
                  max_length=json.loads((prepare / "stats.json").read_text())["max_length"],
                  test=TokenizedSplit(prepare, "test"), test_records=read_records(prepare))


def fresh_folder(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def export_student(inputs: Inputs, cfg, out: Path, work: Path) -> Shipped:
    """The trained student as fp32 ONNX, parity-checked; with export.trim_vocab this graph is the "before" of the trimmed one."""
    model = load_classifier(str(inputs.student), attn_implementation="eager").eval()
    reference = B.torch_logits(model, inputs.test, inputs.pad)  # the PyTorch student every variant is compared with
    tokenizer_json = inputs.student / "tokenizer.json"
    trim = cfg.trim_vocab and trim_supported(B.tokenizer_facts(tokenizer_json))
    full = export_fp32(model, inputs.test, inputs.pad, tokenizer_json,
                       (work if trim else out) / "model.onnx", reference, reference, inputs.names, cfg)
    if cfg.trim_vocab and not trim:
        reason = (f"vocabulary trimming supports WordPiece tokenizers only; this tokenizer is {full.facts['type']} "
                  "(its merges or scores would have to be cut consistently), so the full vocabulary is shipped")
        log.info("[export] export.trim_vocab skipped: %s", reason)
        full.trim = {"enabled": False, "requested": True, "applied": False, "reason": reason,
                     "tokenizer_model": full.facts["type"]}
    return export_trimmed(full, inputs, cfg, out, work) if trim else full


def trim_supported(facts: dict) -> bool:
    """export.trim_vocab cuts WordPiece vocabularies only (bundle.trim_vocabulary); other models ship whole."""
    return facts.get("type") == "WordPiece"


def export_fp32(model, test, pad, tokenizer_json, path, own_logits, reference, names, cfg, role_tokens=None) -> Shipped:
    """``model`` as fp32 ONNX at ``path``: parity against ``own_logits`` (its PyTorch logits), metrics against ``reference``.

    ``role_tokens`` ({role: token}) names the special tokens when ``tokenizer_json`` has no tokenizer_config.json beside it."""
    logits, parity, ladder = export_checked(model, path, test, pad, own_logits, cfg)
    fp32 = variant_metrics(logits, reference, test.labels, names, path, count_parameters(model))
    fp32["batch_invariance"] = B.batch_invariance(path, test, pad, logits)
    facts = B.tokenizer_facts(tokenizer_json, role_tokens)
    return Shipped(model=model, test=test, pad=pad, tokenizer_json=tokenizer_json, facts=facts,
                   fp32_path=path, fp32_logits=logits, fp32=fp32, reference=reference, parity=parity, ladder=ladder)


def export_trimmed(full: Shipped, inputs: Inputs, cfg, out: Path, work: Path) -> Shipped:
    """A smaller embedding table: the student cut to the tokens the training text uses, exported and checked again."""
    model, test, tokenizer_json, trim = trimmed_student(full.model, inputs.prepare, inputs.test_records, full.tokenizer_json,
                                                        work, full.test,
                                                        inputs.max_length, full.facts)
    pad = trim["pad_id"]
    roles = {role: entry["token"] for role, entry in full.facts["special_tokens"].items()}
    shipped = export_fp32(model, test, pad, tokenizer_json, out / "model.onnx", B.torch_logits(model, test, pad),
                          full.reference, inputs.names, cfg, roles)
    before, after = full.fp32, shipped.fp32
    shipped.trim = {**trim, "before": _brief(before), "after": _brief(after)}
    log.info("[export] vocabulary trimmed to %d tokens: fp32 %.1f -> %.1f MB, test accuracy %.4f -> %.4f",
             trim["kept_tokens"], before["file_mb"], after["file_mb"], before["accuracy"], after["accuracy"])
    return shipped


def quantize(shipped: Shipped, names, cfg, out: Path, work: Path) -> Int8 | None:
    """int8 with an accuracy budget (quantize_with_budget); None when export.quantize is off."""
    if not cfg.quantize:
        return None
    path = out / "model.int8.onnx"
    setting, attempts, logits = quantize_with_budget(shipped.ladder, shipped.fp32_path, path, work, shipped.test, shipped.pad,
                                                     shipped.fp32["accuracy"], cfg.max_int8_drop)
    metrics = variant_metrics(logits, shipped.reference, shipped.test.labels, names, path, shipped.fp32["parameters"])
    metrics["drop_points"] = setting["drop_points"]
    metrics["batch_invariance"] = B.batch_invariance(path, shipped.test, shipped.pad, logits)
    log.info("[export] dynamic int8 in batches of 64: %d of %d test predictions change (activation scales per batch)",
             metrics["batch_invariance"]["predictions_changed"], len(shipped.test))
    return Int8(path=path, setting=setting, attempts=attempts, metrics=metrics, logits=logits)


def quantize_static(shipped: Shipped, inputs: Inputs, cfg, seed: int, out: Path, work: Path) -> Int8 | None:
    """Static QDQ int8 (bundle.quantize_static_int8), activation scales from a seeded sample of training texts in
    the shipped vocabulary; under the same accuracy budget, keeping the head, then the edge layers, in fp32 if
    needed. None when export.quantize or export.static_int8 is off."""
    if not (cfg.quantize and cfg.static_int8):
        return None
    records = read_records(inputs.prepare, "train")
    chosen = np.random.default_rng([seed, 11]).permutation(len(records))[: cfg.calibration_examples]
    texts = [records[i]["text"] for i in chosen]
    pairs = [records[i]["text_pair"] for i in chosen] if inputs.segments else None
    encoded = B.tokenize_texts(shipped.tokenizer_json, texts, inputs.max_length, pairs, segments=inputs.segments)
    ids, types = encoded if inputs.segments else (encoded, None)
    sample = B.IdSplit(ids, np.zeros(len(ids), dtype=np.int64), types)
    calibration = [B.split_feeds(sample, i, i + 1, shipped.pad) for i in range(len(sample))]
    fp32_accuracy, path, attempts, best = shipped.fp32["accuracy"], out / "model.int8.static.onnx", [], None
    keep_fp32 = {"none": [], **{s["name"]: s["exclude"] for s in shipped.ladder if s["exclude"]}}
    for step, (name, excluded) in enumerate(keep_fp32.items()):
        candidate = work / f"int8_static_{step}.onnx"
        settings = B.quantize_static_int8(shipped.fp32_path, candidate, calibration, excluded)
        logits = B.onnx_logits(candidate, shipped.test, shipped.pad)
        accuracy = float((logits.argmax(-1) == shipped.test.labels).mean())
        attempt = {"kept_fp32": name, "accuracy": accuracy, "drop_points": 100 * (fp32_accuracy - accuracy),
                   "file_mb": candidate.stat().st_size / 1e6, "excluded_nodes": len(excluded)}
        attempts.append(attempt)
        log.info("[export] static int8 (kept fp32: %s): accuracy %.4f (drop %.2f points, budget %.2f)", name, accuracy,
                 attempt["drop_points"], cfg.max_int8_drop)
        if best is None or attempt["drop_points"] < best[0]["drop_points"] - 1e-12:
            best = (attempt, settings, candidate, logits)
        if attempt["drop_points"] <= cfg.max_int8_drop:
            break
    attempt, settings, candidate, logits = best
    shutil.move(str(candidate), path)
    metrics = variant_metrics(logits, shipped.reference, shipped.test.labels, inputs.names, path, shipped.fp32["parameters"])
    metrics["drop_points"] = attempt["drop_points"]
    metrics["batch_invariance"] = B.batch_invariance(path, shipped.test, shipped.pad, logits)
    setting = {**settings, "kept_fp32": attempt["kept_fp32"], "drop_points": attempt["drop_points"],
               "within_budget": attempt["drop_points"] <= cfg.max_int8_drop, "attempts": attempts,
               "calibration": {"split": "train", "examples": len(calibration), "seed": [seed, 11],
                               "method": "MinMax", "one_text_per_call": True}}
    log.info("[export] static int8 in batches of 64: %d test predictions change (max logit difference %.1e)",
             metrics["batch_invariance"]["predictions_changed"], metrics["batch_invariance"]["max_abs_logit_diff"])
    return Int8(path=path, setting=setting, attempts=attempts, metrics=metrics, logits=logits)


def export_executorch(shipped: Shipped, inputs: Inputs, cfg, out: Path) -> dict:
    """model.pte (fp32) and model.int8.pte (int8 linears) from the shipped PyTorch student (pipeline/executorch_export.py):
    parity of the fp32 program with PyTorch on the whole test split, accuracy one text per call, and the int8 one kept
    only within export.max_int8_drop of the fp32 program. Where it cannot be built, the reason."""
    if cfg.executorch == "off":
        return {"built": False, "why": "export.executorch is off"}
    if ET.version() is None:
        if cfg.executorch == "on":
            raise PipelineError(f"export.executorch is on, but the executorch package is not installed: {ET.INSTALL}; "
                                "or set export.executorch: auto to build model.pte only where it is installed")
        why = f"the executorch package is not installed ({ET.INSTALL})"
        log.info("[export] no model.pte: %s", why)
        return {"built": False, "why": why}
    if inputs.segments:
        return {"built": False, "why": "sentence pairs: the .pte takes input_ids and attention_mask only (no token_type_ids)"}
    own = B.torch_logits(shipped.model, shipped.test, shipped.pad)  # the shipped PyTorch student, its own vocabulary
    variants, dropped = {}, {}
    for name, file, int8_linears in (("fp32", "model.pte", False), ("int8", "model.int8.pte", True)):
        info = ET.export_pte(shipped.model, out / file, inputs.max_length, int8_linears)
        logits = ET.logits(out / file, shipped.test)
        report = classification_report(shipped.test.labels, logits.argmax(-1), inputs.names)
        info.update({"accuracy": report["accuracy"], "macro_f1": report["macro_f1"],
                     "agreement_with_pytorch": float((logits.argmax(-1) == shipped.reference.argmax(-1)).mean()),
                     "max_abs_logit_diff_vs_pytorch": float(np.abs(logits - own).max())})
        if name == "fp32" and info["max_abs_logit_diff_vs_pytorch"] > cfg.parity_tolerance:
            (out / file).unlink()
            why = (f"model.pte does not compute what the PyTorch student computes: max |logit difference| "
                   f"{info['max_abs_logit_diff_vs_pytorch']:.2e} on the test split, above export.parity_tolerance={cfg.parity_tolerance}")
            log.warning("[export] no model.pte: %s", why)
            return {"built": False, "why": why}
        if name == "int8":
            info["drop_points"] = 100 * (variants["fp32"]["accuracy"] - info["accuracy"])
            if info["drop_points"] > cfg.max_int8_drop:
                (out / file).unlink()
                dropped[name] = {**info, "why": f"dropped {info['drop_points']:.2f} points against model.pte, above "
                                                f"export.max_int8_drop={cfg.max_int8_drop}: not shipped"}
                log.info("[export] %s %s", file, dropped[name]["why"])
                continue
        variants[name] = info
        log.info("[export] %s (ExecuTorch, XNNPACK%s): accuracy %.4f one text per call, %.1f MB, max |logit diff| vs "
                 "PyTorch %.1e, lowered in %.0f s", file, ", int8 linears" if int8_linears else "", info["accuracy"],
                 info["file_mb"], info["max_abs_logit_diff_vs_pytorch"], info["export_seconds"])
    return {"built": True, "executorch": ET.version(), "variants": variants, "not_shipped": dropped,
            "tokenizer": "tokenizer.json (the app tokenizes, as for the ids-in ONNX model)",
            "embeddings": "fp32 (8-bit embedding quantization has no ExecuTorch 1.5.1 kernel); the trimmed vocabulary "
                          "is what keeps the table small" if (shipped.trim or {}).get("applied") else
                          "fp32 (8-bit embedding quantization has no ExecuTorch 1.5.1 kernel)"}


def choose_variant(cfg, int8: Int8 | None, static: Int8 | None, rows: list[dict]) -> tuple[str, str]:
    """The variant the bundle recommends: an int8 variant within the accuracy budget (one text per call), the
    clearly faster one on real sentences at one thread (its speed-up interval above the other's), else the more
    accurate, else static (the same answer whatever the batch); fp32 when no int8 variant fits."""
    fits = {name: v for name, v in (("int8", int8), ("int8_static", static)) if v and v.setting["within_budget"]}
    if not fits:
        return "fp32", ("no int8 variant kept test accuracy within export.max_int8_drop"
                        if int8 or static else "export.quantize is off")
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
                return name, (f"both int8 variants fit the budget; {'static' if name == 'int8_static' else 'dynamic'} is "
                              f"faster on real sentences ({faster[key]:.2f}x vs {slower[key]:.2f}x the int8 teacher at "
                              f"{threads} thread, 95% intervals apart)")
    a, b = int8.metrics["accuracy"], static.metrics["accuracy"]
    if a > b:
        return "int8", f"both fit the budget and neither is clearly faster; dynamic is more accurate ({a:.4f} vs {b:.4f})"
    return "int8_static", (f"both fit the budget and neither is clearly faster; static is as accurate or more "
                           f"({b:.4f} vs {a:.4f}) and answers the same whatever the batch")


def shipped_graph(shipped: Shipped, int8: Int8 | None, static: Int8 | None, recommended: str) -> Path:
    """The recommended variant's ids-in graph."""
    return {"int8": int8.path if int8 else None, "int8_static": static.path if static else None}.get(recommended,
                                                                                                   shipped.fp32_path)


def build_text_model(inputs: Inputs, shipped: Shipped, int8: Int8 | None, static: Int8 | None, recommended: str,
                     out: Path) -> dict:
    """model.text.onnx: the tokenizer as onnxruntime-extensions operators in front of the recommended graph, checked
    against predict.py on the whole test split, one text per call (text_model.ship); where it cannot be built
    exactly, the reason."""
    classifier = shipped_graph(shipped, int8, static, recommended)
    text = TM.ship(classifier, shipped.tokenizer_json, shipped.facts, inputs.max_length, inputs.test_records, shipped.pad,
                   out / "model.text.onnx")
    if text["shipped"]:
        check = text["check"]
        log.info("[export] text-in model %s: identical token ids on %d/%d test texts, prediction agreement %.4f",
                 text["file"], check["token_ids_identical"], check["examples"], check["prediction_agreement"])
    else:
        log.info("[export] no text-in model: %s", text["why"])
    return text


def check_mobile(shipped: Shipped, int8: Int8 | None, static: Int8 | None, recommended: str) -> dict:
    """ONNX Runtime's mobile usability checker on the recommended graph, and on fp32 and static QDQ int8 beside it:
    NNAPI and CoreML partitions, dynamic shapes, CoreML's dimension limit against the vocabulary (mobile.usability)."""
    vocab = shipped.facts["vocab_size"]
    result = {"shipped": MOBILE.usability(shipped_graph(shipped, int8, static, recommended), vocab)}
    if recommended != "fp32":
        result["fp32"] = MOBILE.usability(shipped.fp32_path, vocab)
    if static:
        result["static_qdq_int8"] = {"built": True, **(result["shipped"] if recommended == "int8_static"
                                                       else MOBILE.usability(static.path, vocab))}
    else:
        result["static_qdq_int8"] = {"built": False, "why": "export.static_int8 or export.quantize is off"}
    verdicts = {name: p["verdict_with_fixed_shapes"] for name, p in result["shipped"]["providers"].items()}
    log.info("[export] mobile usability (%s): %s; %s", result["shipped"]["model"],
             ", ".join(f"{name} {verdict}" for name, verdict in verdicts.items()), result["shipped"]["recommendation"])
    if static and recommended != "int8_static":
        fixed = {name: p["verdict_with_fixed_shapes"] for name, p in result["static_qdq_int8"]["providers"].items()}
        log.info("[export] mobile usability (%s): %s", static.path.name, ", ".join(f"{n} {v}" for n, v in fixed.items()))
    return result


def read_records(prepare: Path, split: str = "test") -> list[dict]:
    """A split's records ({"text", "label"[, "text_pair"]}) as prepare wrote them."""
    with open(prepare / f"{split}.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def convert_to_ort(shipped: Shipped, int8: Int8 | None, static: Int8 | None, recommended: str, text: dict,
                   records: list[dict], cfg, out: Path) -> dict:
    """ORT-format twins of the int8 graphs, of model.onnx when fp32 is recommended, and of the text-in model;
    each must agree with its .onnx."""
    graphs = ([(v.path, v.logits) for v in (int8, static) if v]
              + ([(shipped.fp32_path, shipped.fp32_logits)] if recommended == "fp32" else []))
    text_path = out / text["file"] if text["shipped"] else None
    info = B.convert_to_ort([path for path, _ in graphs] + ([text_path] if text_path else []), out, cfg.ort_target_platform,
                            custom_op_library=TM.extensions_library() if text_path else None)
    for path, onnx_logits in graphs:
        ort_file = out / info["files"][path.name]
        ort_logits = B.onnx_logits(ort_file, shipped.test, shipped.pad)
        agreement = float((ort_logits.argmax(-1) == onnx_logits.argmax(-1)).mean())
        info.setdefault("agreement_with_onnx", {})[ort_file.name] = agreement
        if agreement < 1.0:
            log.warning("[export] %s disagrees with %s on %.2f%% of the test split", ort_file.name, path.name, 100 * (1 - agreement))
    if text_path:
        texts = [record["text"] for record in records]
        ort_file = out / info["files"][text_path.name]
        agreement = float((TM.run(ort_file, texts)[1] == TM.run(text_path, texts)[1]).mean())
        info.setdefault("agreement_with_onnx", {})[ort_file.name] = agreement
        text["ort_file"] = ort_file.name
        if agreement < 1.0:
            log.warning("[export] %s disagrees with %s on %.2f%% of the test split", ort_file.name, text_path.name,
                        100 * (1 - agreement))
    return info


def export_teacher(inputs: Inputs, int8: Int8 | None, cfg, work: Path) -> Teacher:
    """The teacher as ONNX fp32 and, quantized with the student's int8 setting, the int8 baseline (int8_teacher_baseline)."""
    eager = load_classifier(str(inputs.teacher / "model"), attn_implementation="eager").eval()
    onnx_path, int8_path = work / "teacher.onnx", work / "teacher.int8.onnx"
    B.export_onnx(B.LogitsOnly(eager), onnx_path, cfg.opset, segments=inputs.segments)
    del eager
    baseline = int8_teacher_baseline(onnx_path, int8_path, int8.setting if int8 else None, inputs.test, inputs.pad, inputs.names)
    return Teacher(onnx=onnx_path, int8=int8_path if int8 else None, baseline=baseline)


def measure_side_by_side(seed: int, inputs: Inputs, shipped: Shipped, int8: Int8 | None, static: Int8 | None, pte: dict,
                         teacher: Teacher, cfg) -> dict:
    """Batch-1 latency of the teacher and the student, PyTorch and ONNX (and int8), measured together (measure_latency)."""
    teacher_pt = load_classifier(str(inputs.teacher / "model")).eval()  # default attention backend, as users run it
    student_pt = load_classifier(str(inputs.student)).eval()
    full_facts = B.tokenizer_facts(inputs.student / "tokenizer.json")  # roles from the student's tokenizer_config.json  # the original vocabulary (the teacher's)
    sample = np.random.default_rng(seed).permutation(len(shipped.test))[: cfg.latency_sentences]
    full_ids, shipped_ids = [list(inputs.test.input_ids[i]) for i in sample], [list(shipped.test.input_ids[i]) for i in sample]
    full_types = shipped_types = None
    if inputs.segments:  # sentence pairs: each sentence's own segment ids
        full_types = [list(inputs.test.token_type_ids[i]) for i in sample]
        shipped_types = [list(shipped.test.token_type_ids[i]) for i in sample]
    models = {
        "teacher PyTorch fp32": _spec("pytorch", lambda t: B.torch_runner(teacher_pt, t), full_facts, teacher_pt.config),
        "teacher ONNX fp32": _spec("onnxruntime", lambda t: B.ort_runner(teacher.onnx, t), full_facts, teacher_pt.config),
        "student PyTorch fp32": _spec("pytorch", lambda t: B.torch_runner(student_pt, t), full_facts, student_pt.config),
        "student ONNX fp32": _spec("onnxruntime", lambda t: B.ort_runner(shipped.fp32_path, t), shipped.facts,
                                   shipped.model.config),
    }
    sentence_ids = {name: full_ids for name in models}
    sentence_ids["student ONNX fp32"] = shipped_ids
    if int8:
        models["teacher ONNX int8"] = _spec("onnxruntime", lambda t: B.ort_runner(teacher.int8, t), full_facts, teacher_pt.config)
        models["student ONNX int8"] = _spec("onnxruntime", lambda t: B.ort_runner(int8.path, t), shipped.facts,
                                            shipped.model.config)
        sentence_ids["teacher ONNX int8"], sentence_ids["student ONNX int8"] = full_ids, shipped_ids
    if static:
        models["student ONNX int8 static"] = _spec("onnxruntime", lambda t: B.ort_runner(static.path, t), shipped.facts,
                                                   shipped.model.config)
        sentence_ids["student ONNX int8 static"] = shipped_ids
    for name, info in (pte.get("variants") or {}).items():
        path = shipped.fp32_path.parent / info["file"]
        models[f"student ExecuTorch {name}"] = _spec("executorch", lambda t, path=path: ET.runner(path, t), shipped.facts,
                                                     shipped.model.config)
        sentence_ids[f"student ExecuTorch {name}"] = shipped_ids
    sentence_types = None
    if inputs.segments:
        sentence_types = {name: shipped_types if sentence_ids[name] is shipped_ids else full_types for name in models}
    return measure_latency(cfg, models, sentence_ids, sentence_types)


def measure_from_text(ctx, inputs: Inputs, shipped: Shipped, int8: Int8 | None, static: Int8 | None, teacher: Teacher,
                      text: dict, recommended: str, out: Path) -> dict:
    """The shipped student, the int8 teacher and the peers of the baselines stage from raw text, one text per call
    (pipeline/from_text.py): accuracy on every test text (the peers' from the baselines stage, which measured it
    the same way), latency on one thread over the same sampled texts, speed-ups paired against the int8 teacher."""
    cfg = ctx.config.export
    baselines = json.loads((ctx.input("baselines") / "baselines.json").read_text())
    if not baselines["enabled"]:
        return {"measured": False, "why": "baselines.enabled is false"}
    if inputs.segments:
        return {"measured": False, "why": "sentence pairs: the peers read one bag of words, not compared"}
    records = inputs.test_records
    texts = [r["text"] for r in records]
    index = {name: i for i, name in enumerate(inputs.names)}
    labels = np.array([index[str(r["label"])] for r in records], dtype=np.int64)
    classifier = shipped_graph(shipped, int8, static, recommended)
    student = (FT.text_model_runner(out / text["file"]) if text["shipped"]
               else FT.tokenizer_runner(shipped.tokenizer_json, classifier, inputs.max_length))
    runners = {"student": student}
    teacher_graph = teacher.int8 or teacher.onnx
    teacher_name = "teacher_int8" if teacher.int8 else "teacher_fp32"
    runners[teacher_name] = FT.tokenizer_runner(inputs.student / "tokenizer.json", teacher_graph, inputs.max_length)
    peers = baselines["peers"]
    for name in peers:
        runners[name] = PEERS.load_peer(ctx.input("baselines") / "peers", name).predict_one
    sample = np.random.default_rng(ctx.config.seed).permutation(len(texts))[: max(1, cfg.latency_sentences)].tolist()
    log.info("[export] from raw text, one text per call: %s on %d test texts, timed on %d", ", ".join(runners), len(texts), len(sample))
    measured = FT.measure(runners, texts, labels, inputs.names, sample, cfg, known=peers, reference=teacher_name)
    kind = "static" if shipped.model.config.num_hidden_layers == 0 else f"{shipped.model.config.num_hidden_layers}-layer"
    titles = {"student": f"student ({kind}, {recommended}{', text-in model' if text['shipped'] else ''})",
              "teacher_int8": "teacher ONNX int8 + tokenizer", "teacher_fp32": "teacher ONNX fp32 + tokenizer"}
    files = {"student": os.path.getsize(classifier) / 1e6, teacher_name: os.path.getsize(teacher_graph) / 1e6}
    rows = []
    for name, figures in measured.items():
        peer = peers.get(name)
        rows.append({"model": name, "title": peer["title"] if peer else titles[name], "kind": "peer" if peer else name.split("_")[0],
                     "file_mb": peer["file_mb"] if peer else round(files[name], 3),
                     "train_seconds": peer["train_seconds"] if peer else None, **figures})
    result = {"measured": True, "threads": 1, "examples": len(texts), "timed_texts": len(sample), "rows": rows,
              "versus_peers": FT.comparison(measured, peers, "student", "teacher_int8") if peers else None}
    for line in FT.lines(result):
        log.info("[export] %s", line)
    return result


def _spec(runtime, factory, tokenizer_facts, model_config) -> tuple:
    """A measure_latency model entry."""
    roles, legacy = tokenizer_facts["special_tokens"], tokenizer_facts["special_token_ids"]
    cls = roles["cls"]["id"] if "cls" in roles else legacy.get("[CLS]", 101)
    sep = roles["sep"]["id"] if "sep" in roles else legacy.get("[SEP]", 102)
    return (runtime, factory, tokenizer_facts["vocab_size"], cls, sep, model_config.max_position_embeddings)


def compare_with_int8_teacher(cfg, teacher_dir: Path, baseline: dict | None, variants: dict, recommended: str,
                              rows: list[dict]) -> dict | None:
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


def mlflow_source(ctx) -> dict:
    """Where the bundle is tracked and registered (metadata.json "source"); registration needs MLflow on."""
    ids = ctx.mlflow_ids() or {}
    registered = bundle_name(ctx.config) if ctx.config.export.register_model and ids else None
    return {"mlflow_tracking_uri": ids.get("tracking_uri", ""), "mlflow_experiment": ids.get("experiment"),
            "mlflow_parent_run_id": ids.get("parent_run_id"), "mlflow_export_run_id": ids.get("stage_run_id"),
            "registered_model": registered, "registered_alias": ALIAS if registered else None}


def write_bundle(ctx, inputs: Inputs, shipped: Shipped, figures: Figures, source: dict) -> dict:
    """The bundle's files besides the graphs; metadata.json last, with the sha256 of every other file. Returns the metadata."""
    out, latency = ctx.out / "bundle", figures.latency
    ctx.write_json("bundle/latency.json", {"batch": 1, "machine": latency["machine"], **latency["load"],
                                           "rows": latency["rows"], "skipped": latency["skipped"]})
    (out / "latency.md").write_text(B.latency_markdown(latency["rows"], latency["machine"], latency["load"]))
    written = B.write_bundle_tokenizer(shipped.tokenizer_json, out / "tokenizer.json", out / "vocab.txt", inputs.max_length)
    if written != B.tokenizer_files(shipped.facts):
        raise PipelineError(f"the bundle's tokenizer files {written} are not the ones metadata.json lists "
                            f"({B.tokenizer_files(shipped.facts)})")
    ctx.write_json("bundle/labels.json", inputs.labels)
    B.copy_predict_script(out / "predict.py")
    metadata = bundle_metadata(ctx.config, inputs, shipped, figures, source)
    metadata["demo"] = B.write_demo(out, metadata["name"], metadata["variants"][figures.recommended]["file"],
                                    inputs.max_length)  # demo.html: the model in a browser (onnxruntime-web)
    if not metadata["demo"]["shipped"]:
        log.info("[export] no demo.html: %s", metadata["demo"]["why"])
    (out / "README.md").write_text(B.render_template("README.md", readme_values(ctx.config, metadata, latency)))
    metadata["files"] = B.file_table(out)
    ctx.write_json("bundle/metadata.json", metadata)
    return metadata


def register(ctx, figures: Figures, metadata: dict) -> dict | None:
    """MLflow: the figures, the bundle and metrics.json; the recommended graph registered with alias ``candidate``."""
    ctx.log_metrics(mlflow_metrics(figures))
    ctx.set_tags({"attention_distill.recommended_variant": figures.recommended})
    ctx.log_artifacts(ctx.out / "bundle", "bundle")
    ctx.log_artifact(ctx.out / "metrics.json")
    source = metadata["source"]
    if not source["registered_model"]:
        return None
    chosen = metadata["variants"][figures.recommended]
    registration = B.register_onnx(ctx.out / "bundle" / chosen["file"], source["mlflow_export_run_id"],
                                   source["registered_model"], ALIAS, {
        "variant": figures.recommended, "file": chosen["file"], "sha256": metadata["files"][chosen["file"]]["sha256"],
        "test_accuracy": chosen["accuracy"], "config": ctx.config.name, "bundle_artifact_path": "bundle",
    })
    try:  # the headline figures and a description: niceties, MLflow refusing them never fails the export
        import mlflow

        from pipeline.summary import headline_metrics

        headline = headline_metrics({}, metrics_json(figures))  # the pipeline run's figures (export's part)
        lines = [ctx.config.description or f"Distilled student of config `{ctx.config.name}`.", "",
                 f"ONNX {figures.recommended} student (the variant the bundle ships): test accuracy {chosen['accuracy']:.4f}, "
                 f"macro-F1 {chosen['macro_f1']:.4f}, {chosen['file_mb']:.1f} MB, on {figures.examples} test examples."]
        if figures.comparison:
            headline["teacher_fp32_accuracy"] = figures.comparison["teacher_fp32_accuracy"]
            lines += [f"- {line}" for line in comparison_lines(figures.comparison)[2:]]
        lines += ["", f"Pipeline run {source['mlflow_parent_run_id']} (experiment `{source['mlflow_experiment']}`); "
                  "the bundle is the export run's artifact `bundle/`."]
        client, name, version = mlflow.MlflowClient(), source["registered_model"], registration["version"]
        for key, value in {"pipeline_run_id": source["mlflow_parent_run_id"],
                           **{k: f"{v:.6g}" for k, v in headline.items()}}.items():
            client.set_model_version_tag(name, version, key, value)
        client.update_model_version(name, version, description="\n".join(lines))
    except Exception as exc:
        log.warning("[export] the registered version's figures or description were not set (%s: %s)", type(exc).__name__,
                    str(exc)[:200])
    log.info("[export] registered %s version %s (alias '%s', %s)", source["registered_model"], registration["version"], ALIAS,
             figures.recommended)
    return registration


def log_outcome(figures: Figures, bundle: Path) -> None:
    fp32, int8 = figures.variants["onnx_fp32"], figures.variants.get("onnx_int8")
    log.info("[export] parity max diff %.2e; fp32 acc %.4f (%.1f MB)%s; recommended %s; bundle %s",
             figures.parity["max_abs_logit_diff"], fp32["accuracy"], fp32["file_mb"],
             f", int8 acc {int8['accuracy']:.4f} ({int8['file_mb']:.1f} MB, {figures.quant['setting']})" if int8 else "",
             figures.recommended, bundle)


# ---------------------------------------------------------------- renderings of the figures


def bundle_name(config) -> str:
    """The bundle's name, also the registered model's."""
    return f"attention-distill-{config.name}"


def bundle_metadata(config, inputs: Inputs, shipped: Shipped, figures: Figures, source: dict) -> dict:
    """metadata.json, without its "files" table (added once every other file is written)."""
    cfg, variants, max_length = config.export, figures.variants, inputs.max_length
    variant_files = {"fp32": ("model.onnx", "onnx_fp32", None if figures.int8_recommended else "model.ort")}
    if "onnx_int8" in variants:
        variant_files["int8"] = ("model.int8.onnx", "onnx_int8", "model.int8.ort")
    if "onnx_int8_static" in variants:
        variant_files["int8_static"] = ("model.int8.static.onnx", "onnx_int8_static", "model.int8.static.ort")
    return {
        "format_version": 1,
        "name": bundle_name(config),
        "created_at": dt.datetime.now().isoformat(timespec="seconds"),
        "task": "single-label text classification",
        "text_pairs": inputs.text_pairs,  # predict.py refuses a pair for a single-text model and vice versa
        "config": config.name,
        "inputs": [{"name": n, "dtype": "int64", "shape": ["batch", "sequence"]} for n in B.input_names(inputs.segments)],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", len(inputs.names)],
                     "meaning": "unnormalised class scores (logits); apply softmax over the last axis for "
                                "probabilities; argmax is the label index in labels.json"}],
        "dynamic_axes": {n: {"0": "batch", "1": "sequence"} for n in B.input_names(inputs.segments)},
        "opset": cfg.opset,
        "max_length": max_length,
        "max_position_embeddings": shipped.model.config.max_position_embeddings,
        "labels": inputs.labels,
        "tokenizer": {**shipped.facts, "files": B.tokenizer_files(shipped.facts),
                      "truncation": f"longest first, to {max_length} tokens including specials",
                      "padding": f"right, with {_token(shipped.facts, 'pad')}, to the longest sequence of the batch; "
                                 "attention_mask 0 there"},
        "variants": {v: {"file": f, "ort_file": o, **{k: variants[key][k] for k in
                         ("accuracy", "macro_f1", "agreement_with_pytorch", "file_mb", "parameters", "batch_invariance")}}
                     for v, (f, key, o) in variant_files.items()},
        "accuracy_measured": "one text per call (batch 1, unpadded), as predict.py, the Kotlin/Swift/JS examples and the "
                             "text-in model run it; batch_invariance says which variants answer the same in batches",
        "recommended": figures.recommended,
        "recommended_because": figures.because,
        "int8_recommended": figures.int8_recommended,
        "quantization": {**(figures.quant or {"enabled": False}), "attempts": figures.attempts,
                         "max_int8_drop_points": cfg.max_int8_drop},
        "static_quantization": figures.static or {"enabled": False},
        "executorch": figures.executorch,
        "parity": {**figures.parity, "tolerance": cfg.parity_tolerance, "split": "test", "examples": figures.examples},
        "vocab_trim": figures.trim,
        "versus_int8_teacher": figures.comparison,
        "from_text": figures.from_text,
        "ort_format": figures.ort,
        "text_model": figures.text_model,
        "mobile_usability": figures.mobile,
        "evaluation": {"split": "test", "examples": figures.examples},
        "latency_file": "latency.json",
        "source": source,
        "runtime": {"onnxruntime": _version("onnxruntime"), "onnx": _version("onnx"), "torch": _version("torch"),
                    "transformers": _version("transformers"), "tokenizers": _version("tokenizers")},
    }


def metrics_json(figures: Figures) -> dict:
    """metrics.json: per-variant test metrics (evaluate's keys) and the summary figures."""
    return {"split": "test", "examples": figures.examples, **figures.variants, "recommended": figures.recommended,
            "int8_recommended": figures.int8_recommended, "parity_max_abs_diff": figures.parity["max_abs_logit_diff"],
            "latency": figures.latency["rows"], "vocab_trim": figures.trim, "versus_int8_teacher": figures.comparison,
            "from_text": figures.from_text, "executorch": figures.executorch}


def export_summary(cfg, figures: Figures, registration: dict | None) -> dict:
    """export.json and the stage's summary figures (the manifest)."""
    fp32, comparison, quant = figures.variants["onnx_fp32"], figures.comparison, figures.quant
    summary = {"opset": cfg.opset, "parity_max_abs_diff": figures.parity["max_abs_logit_diff"],
               "parity_agreement": figures.parity["prediction_agreement"], "fp32_accuracy": fp32["accuracy"],
               "fp32_mb": fp32["file_mb"], "recommended": figures.recommended,
               "text_model_shipped": figures.text_model["shipped"]}
    if comparison:
        summary.update({"accuracy_kept": comparison["accuracy_kept"], "size_vs_int8_teacher": comparison["size_vs_int8_teacher"],
                        **{f"speedup_vs_int8_teacher_{k.replace('=', '')}": v for k, v in comparison["speedup_vs_int8_teacher"].items()},
                        "targets_met": comparison["all_met"]})
    if quant:
        int8 = figures.variants["onnx_int8"]
        summary.update({"int8_accuracy": int8["accuracy"], "int8_mb": int8["file_mb"],
                        "int8_drop_points": quant["drop_points"], "int8_setting": quant["setting"]})
    if figures.static:
        static = figures.variants["onnx_int8_static"]
        summary.update({"int8_static_accuracy": static["accuracy"], "int8_static_mb": static["file_mb"],
                        "int8_static_drop_points": figures.static["drop_points"],
                        "int8_static_batch_invariant": static["batch_invariance"]["invariant"]})
    if registration:
        summary["registered_version"] = registration["version"]
    return summary


def mlflow_metrics(figures: Figures) -> dict:
    """The figures as flat MLflow metrics."""
    variants, comparison = figures.variants, figures.comparison
    flat = {f"{v}/{k}": variants[v][k] for v in variants for k in ("accuracy", "macro_f1", "agreement_with_pytorch", "file_mb")}
    flat.update({"parity_max_abs_diff": figures.parity["max_abs_logit_diff"], "int8_recommended": float(figures.int8_recommended)})
    if figures.quant:
        flat["onnx_int8/drop_points"] = figures.quant["drop_points"]
    if figures.static:
        flat["onnx_int8_static/drop_points"] = figures.static["drop_points"]
    flat.update({f"{v}/batch_changed_predictions": variants[v]["batch_invariance"]["predictions_changed"] for v in variants})
    for name, info in (figures.executorch.get("variants") or {}).items():
        flat.update({f"executorch_{name}/{k}": info[k] for k in ("accuracy", "macro_f1", "file_mb", "max_abs_logit_diff_vs_pytorch")})
    flat.update({f"latency_ms/{r['model'].replace(' ', '_')}_{r['input'].replace('=', '')}_t{r['threads']}": r["median_ms"]
                 for r in figures.latency["rows"]})
    if figures.from_text.get("measured"):
        for row in figures.from_text["rows"]:
            flat.update({f"from_text/{row['model']}_{k}": row[k] for k in ("accuracy", "macro_f1", "median_ms", "p25_ms", "p75_ms")})
        versus = figures.from_text["versus_peers"]
        if versus:
            flat.update({"vs_peers/accuracy_margin_points": versus["accuracy_margin_points"],
                         "vs_peers/latency_vs_fastest_peer": versus["latency_vs_fastest_peer"]})
    if comparison:
        baseline = comparison["baseline"]
        flat.update({"vs_int8_teacher/accuracy_kept": comparison["accuracy_kept"],
                     "vs_int8_teacher/size_ratio": comparison["size_vs_int8_teacher"],
                     "vs_int8_teacher/baseline_accuracy": baseline["accuracy"], "vs_int8_teacher/baseline_mb": baseline["file_mb"],
                     **{f"vs_int8_teacher/speedup_{k.replace('=', '')}": v for k, v in comparison["speedup_vs_int8_teacher"].items()},
                     **{f"vs_int8_teacher/speedup_{k.replace('=', '')}_low": v[0]
                        for k, v in comparison["speedup_vs_int8_teacher_interval"].items()}})
    return flat


# ---------------------------------------------------------------- the steps' machinery


def export_checked(student, path, split, pad, reference, cfg):
    """Export ``student`` to ``path``, strip exporter metadata, and fail loudly unless ONNX matches PyTorch on ``split``."""
    B.export_onnx(B.LogitsOnly(student), path, cfg.opset, segments=getattr(split, "token_type_ids", None) is not None)
    ladder = B.quantization_ladder(path, student.config.num_hidden_layers)  # needs the exporter's node scopes
    B.strip_node_metadata(path)
    logits = B.onnx_logits(path, split, pad)
    max_diff = float(np.abs(reference - logits).max())
    agreement = float((reference.argmax(-1) == logits.argmax(-1)).mean())
    if max_diff > cfg.parity_tolerance:
        raise PipelineError(
            f"ONNX parity check failed: max |logit difference| {max_diff:.2e} on the test split is above "
            f"export.parity_tolerance={cfg.parity_tolerance} (prediction agreement {agreement:.4f}). "
            f"The exported graph does not compute what the PyTorch student computes; nothing was shipped."
        )
    return logits, {"max_abs_logit_diff": max_diff, "prediction_agreement": agreement}, ladder


def trimmed_student(student, prepare, records, tokenizer_json, work, test, max_length, full_facts):
    """The student and tokenizer cut to the tokens train/validation use; test re-tokenized with the cut vocabulary.

    ``full_facts``: tokenizer_facts of the untrimmed tokenizer (its special-token roles name the trimmed one's)."""
    keep = B.corpus_token_ids(prepare, tokenizer_json)
    trimmed_json = work / "tokenizer.trimmed.json"
    kept = B.trim_vocabulary(tokenizer_json, keep, trimmed_json)
    original_vocab = student.config.vocab_size
    student = B.trim_embeddings(copy.deepcopy(student), kept).eval()
    pairs = [r["text_pair"] for r in records] if records and "text_pair" in records[0] else None
    if test.token_type_ids is not None:  # sentence pairs with segment ids: re-tokenized with them
        ids, types = B.tokenize_texts(trimmed_json, [r["text"] for r in records], max_length, pairs, segments=True)
    else:
        ids, types = B.tokenize_texts(trimmed_json, [r["text"] for r in records], max_length, pairs), None
    split = B.IdSplit(ids, test.labels, types)
    facts = B.tokenizer_facts(trimmed_json, {role: entry["token"] for role, entry in full_facts["special_tokens"].items()})
    unk_new, unk_old = facts["special_tokens"]["unk"]["id"], full_facts["special_tokens"]["unk"]["id"]
    changed = sum(a != [kept[i] for i in b] for a, b in zip(test.input_ids, ids))
    info = {"enabled": True, "applied": True, "kept_tokens": len(kept), "original_vocab": original_vocab, "source_splits": "train, validation, unlabeled",
            "test_unk_rate_before": _rate(test.input_ids, unk_old), "test_unk_rate_after": _rate(ids, unk_new),
            "test_texts_tokenized_differently": changed, "pad_id": facts["special_tokens"]["pad"]["id"]}
    return student, split, trimmed_json, info


def _rate(rows, token: int) -> float:
    total = sum(len(r) for r in rows)
    return sum(r.count(token) if isinstance(r, list) else list(r).count(token) for r in rows) / max(total, 1)


def _brief(metrics: dict) -> dict:
    return {k: metrics[k] for k in ("accuracy", "macro_f1", "file_mb", "parameters", "agreement_with_pytorch")}


def variant_metrics(logits, reference, labels, names, path, parameters) -> dict:
    """evaluate's metric keys for one exported variant, plus agreement with the PyTorch student and file facts."""
    report = classification_report(labels, logits.argmax(-1), names)
    return {**report, "agreement_with_pytorch": float((logits.argmax(-1) == reference.argmax(-1)).mean()),
            "max_abs_logit_diff_vs_pytorch": float(np.abs(logits - reference).max()),
            "file": path.name, "file_mb": path.stat().st_size / 1e6, "parameters": parameters,
            "onnx_initializer_elements": B.onnx_parameters(path)}


def quantize_with_budget(ladder, fp32_path, int8_path, work, test, pad, fp32_accuracy, budget):
    """Walk the quantization ladder until the accuracy drop fits the budget; keep the best attempt."""
    attempts, best = [], None
    for step, setting in enumerate(ladder):
        candidate = work / f"int8_{step}.onnx"
        settings = B.quantize_int8(fp32_path, candidate, setting)
        logits = B.onnx_logits(candidate, test, pad)
        accuracy = float((logits.argmax(-1) == test.labels).mean())
        drop = 100 * (fp32_accuracy - accuracy)
        attempt = {"setting": setting["name"], "why": setting["why"], "accuracy": accuracy, "drop_points": drop,
                   "file_mb": candidate.stat().st_size / 1e6, "excluded_nodes": len(setting["exclude"])}
        attempts.append(attempt)
        log.info("[export] int8 %s: accuracy %.4f (drop %.2f points, budget %.2f)", setting["name"], accuracy, drop, budget)
        if best is None or drop < best[0]["drop_points"] - 1e-12:
            best = (attempt, settings, candidate, logits)
        if drop <= budget:
            break
    attempt, settings, candidate, logits = best
    shutil.move(str(candidate), int8_path)
    within = attempt["drop_points"] <= budget
    note = (f"int8 accuracy is within {budget} points of fp32 on the test split" if within else
            f"int8 is NOT recommended: every setting tried dropped more than {budget} points "
            f"(best: {attempt['setting']}, {attempt['drop_points']:.2f} points); ship model.onnx")
    if not within:
        log.warning("[export] %s", note)
    return {**settings, "why": attempt["why"], "accuracy": attempt["accuracy"], "drop_points": attempt["drop_points"],
            "within_budget": within, "note": note, "decided_on": "test split"}, attempts, logits


def int8_teacher_baseline(teacher_onnx, teacher_int8, quant, test, pad, names) -> dict | None:
    """The teacher quantized exactly as the shipped student was (same quantizer and setting), on the test split."""
    if not quant:
        return None
    B.quantize_int8(teacher_onnx, teacher_int8, {"name": quant["setting"], "per_channel": quant["per_channel"],
                                                  "reduce_range": quant["reduce_range"], "op_types": quant["op_types"],
                                                  "exclude": []})
    report = classification_report(test.labels, B.onnx_logits(teacher_int8, test, pad).argmax(-1), names)
    return {"model": "teacher ONNX int8", "accuracy": report["accuracy"], "macro_f1": report["macro_f1"],
            "file_mb": teacher_int8.stat().st_size / 1e6, "setting": quant["setting"],
            "note": "the fine-tuned teacher exported to ONNX and quantized with the student's int8 setting (no distillation); "
                    "same test split, same latency inputs"}


def measure_latency(cfg, models: dict, sentence_ids: dict, sentence_types: dict | None = None) -> dict:
    """Batch-1 latency rows, every model measured side by side (interleaved) in this process.

    ``models[name] = (runtime, runner factory(threads), vocab size, [CLS] id, [SEP] id, position embeddings)``;
    ``sentence_ids[name]``: real test sentences in that model's own vocabulary; ``sentence_types[name]`` their
    token_type_ids for sentence-pair models (the fixed-length inputs are then pairs of two equal halves too).
    Inputs: one sequence of exactly L tokens per configured length (lengths
    beyond a model's position table are skipped), and the real sentences.
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
        settings.append((f"L={length}", length, {name: [B.latency_inputs(length, m[2], m[3], m[4], segments=sentence_types is not None)]
                                                 for name, m in models.items()}))
    if cfg.latency_sentences:
        feeds = {name: [{"input_ids": np.asarray([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}
                        for ids in sentence_ids[name]] for name in models}
        for name in sentence_types or {}:
            for feed, types in zip(feeds[name], sentence_types[name]):
                feed[B.SEGMENT_INPUT] = np.asarray([types], dtype=np.int64)
        mean_tokens = float(np.mean([len(ids) for ids in next(iter(sentence_ids.values()))]))
        settings.append(("sentences", round(mean_tokens, 1), feeds))
    reference = "teacher ONNX int8" if "teacher ONNX int8" in models else None
    for label, length, inputs in settings:
        for threads in cfg.latency_threads:
            runners = {name: m[1](threads) for name, m in models.items()}
            # One fixed-length input is called latency_runs times over the first latency_rounds rounds; each real
            # sentence once per round. Rounds are added until every speed-up's interval is narrow (timing.interleaved).
            repeat = max(1, math.ceil(cfg.latency_runs / cfg.latency_rounds)) if label != "sentences" else 1
            # the rounds stop on the student's variants: the speed-ups the bundle claims
            timed = timing.interleaved(runners, inputs, repeat=repeat, warmup=cfg.latency_warmup if label != "sentences" else 1,
                                       min_rounds=cfg.latency_rounds, max_rounds=cfg.latency_max_rounds,
                                       reference=reference, max_spread=cfg.latency_max_spread,
                                       watch=[name for name in models if name.startswith(("student ONNX", "student ExecuTorch"))])
            for name, figures in timed.items():
                paired = {f"speedup_vs_teacher_int8{suffix}": figures.pop(f"speedup{suffix}", None)
                          for suffix in ("", "_low", "_high", "_spread")}
                rows.append({"model": name, "runtime": models[name][0], "batch": 1, "input": label, "length": length,
                             "threads": threads, **({"sentences": len(inputs[name])} if label == "sentences" else {}),
                             **figures, **paired})
            runners.clear()  # release this setting's sessions and programs before the next is loaded
    B.add_speedups(rows, {"teacher_pytorch": "teacher PyTorch fp32"})
    for row in rows:
        for key in ("median_ms", "min_ms", "max_ms", "p25_ms", "p75_ms"):
            row[key] = round(row[key], 4)
        for key in ("speedup_vs_teacher_int8", "speedup_vs_teacher_int8_low", "speedup_vs_teacher_int8_high",
                    "speedup_vs_teacher_int8_spread"):
            if row.get(key) is not None:
                row[key] = round(row[key], 3)
    load = {"load_average_1m_before": round(load_before, 2), "load_average_1m_after": round(os.getloadavg()[0], 2),
            "cpu_count": os.cpu_count()}
    machine = f"{platform.machine()}, {platform.processor() or 'cpu'}, onnxruntime {_version('onnxruntime')}"
    return {"rows": rows, "skipped": skipped, "load": load, "machine": machine}


def baseline_comparison(cfg, teacher_accuracy: float, baseline: dict, shipped: dict, rows: list[dict]) -> dict:
    """The shipped student against what a user would ship without distillation: the int8 teacher.

    Three ratios (accuracy kept, speed-up, size) with the targets of export.targets, each marked met or not.
    """
    shipped_name = latency_name(shipped["variant"])
    threads = min(cfg.latency_threads)  # the headline is single-threaded where measured (phones run one model per core)
    mine = [r for r in rows if r["model"] == shipped_name and r["threads"] == threads and r.get("speedup_vs_teacher_int8")]
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
    checks = {"accuracy_kept": ratios["accuracy_kept"] >= t.min_accuracy_kept,
              "size": ratios["size_vs_int8_teacher"] <= t.max_size_ratio}
    # a speed-up counts as met only when its interval's lower bound reaches the target
    checks.update({f"speedup {name}": intervals[name][0] >= t.min_speedup for name in speedups})
    if not speedups:  # nothing timed (no lengths within the position table, no sentences): cannot count as met
        checks["speedup"] = False
    return {"baseline": baseline, "teacher_fp32_accuracy": teacher_accuracy, "shipped": shipped, "threads": threads, **ratios,
            "targets": t.model_dump(), "meets": checks, "all_met": all(checks.values())}


def peers_section(from_text: dict) -> str:
    """The bundle README's comparison with what mobile teams ship instead (TF-IDF, fastText, static embeddings)."""
    if not from_text.get("measured"):
        return f"Not compared with TF-IDF, fastText or static embeddings: {from_text.get('why', 'not measured')}."
    text = ("Beside what mobile teams ship instead, each trained on the same splits (stage `baselines`), every model from "
            "raw text to label, one text per call, one thread (accuracy on every test text; latency the median over "
            f"{from_text['timed_texts']} test texts, interleaved):\n\n" + FT.markdown(from_text))
    c = from_text.get("versus_peers")
    if c:
        text += (f"\n\nThis student is {c['accuracy_margin_points']:+.2f} points from the most accurate peer "
                 f"({c['best_peer_title']}, {c['best_peer_accuracy']:.4f}) and takes {c['latency_vs_fastest_peer']:.2f}x "
                 f"the time of the fastest ({c['fastest_peer_title']}, {c['fastest_peer_ms']:.3f} ms per text).")
    return text


def readme_values(config, metadata: dict, latency: dict) -> dict:
    """The README's placeholders, rendered from metadata.json and the latency figures."""
    facts, quant = metadata["tokenizer"], metadata["quantization"]
    recommended = metadata["recommended"]
    chosen = metadata["variants"][recommended]
    rows = ["| variant | file | accuracy | macro-F1 | agreement with PyTorch student | size MB | in batches of 64 |",
            "|---|---|---:|---:|---:|---:|---|"]
    for v, info in metadata["variants"].items():
        batch = info["batch_invariance"]
        same = "same answers" if batch["invariant"] else f"{batch['predictions_changed']} answers change"
        rows.append(f"| {v.replace('_', ' ')}{' (recommended)' if v == recommended else ''} | `{info['file']}` | {info['accuracy']:.4f} | "
                    f"{info['macro_f1']:.4f} | {info['agreement_with_pytorch']:.4f} | {info['file_mb']:.2f} | {same} |")
    rows += ["", "Accuracy is measured one text per call, as an app (and `predict.py`, the code below, the text-in model) "
             "calls the model. Dynamic int8 scales activations over the whole padded batch, so in batches some answers "
             "depend on the other texts; static int8 fixed its scales on training text and answers the same either way.",
             "", f"Recommended: {recommended.replace('_', ' ')}, because {metadata.get('recommended_because', '')}."]
    ort_version = metadata["runtime"]["onnxruntime"]
    if "int8" not in metadata["variants"]:
        verdict = "int8 quantization was switched off (export.quantize: false)."
    else:
        verdict = quant.get("note", "") + f" (setting `{quant.get('setting')}`: {quant.get('why', '') or _why(quant)})."
    static = metadata.get("static_quantization") or {}
    if static.get("method"):
        verdict += (f" Static QDQ int8: {static['drop_points']:+.2f} points of drop against fp32 "
                    f"({'within' if static['within_budget'] else 'NOT within'} the budget), activation scales from "
                    f"{static['calibration']['examples']} training texts (MinMax), kept fp32: {static['kept_fp32']}.")
    return {
        "title": metadata["name"],
        "description": config.description or f"Distilled student of config `{config.name}`.",
        "num_labels": len(metadata["labels"]),
        "label_list": ", ".join(f"{i} = `{n}`" for i, n in metadata["labels"].items()),
        "recommended_file": chosen["file"], "recommended_variant": recommended,
        "recommended_note": "" if recommended != "fp32" else ", int8 lost too much accuracy" if "int8" in metadata["variants"] else "",
        "recommended_ort": chosen["ort_file"] or "model.int8.ort",
        "recommended_ort_stem": (chosen["ort_file"] or "model.int8.ort").removesuffix(".ort"),
        "files_table": files_table(metadata),
        "opset": metadata["opset"], "max_length": metadata["max_length"], "positions": metadata["max_position_embeddings"],
        "test_examples": metadata["evaluation"]["examples"], "variant_table": "\n".join(rows), "int8_verdict": verdict,
        "versus_int8_teacher": "" if not metadata.get("versus_int8_teacher") else (
            "Against what you would ship without distillation, the fine-tuned teacher quantized to int8 the same way:\n\n"
            + "\n".join(f"- {line}" for line in comparison_lines(metadata["versus_int8_teacher"]))),
        "peers_section": peers_section(metadata.get("from_text") or {}),
        "tokenize_section": tokenize_section(facts, metadata["max_length"], metadata["vocab_trim"]),
        "cls_token": _token(facts, "cls"), "sep_token": _token(facts, "sep"),
        "pad_note": (f"`{facts['special_tokens']['pad']['token']}` = {facts['special_tokens']['pad']['id']}"
                     if "pad" in facts.get("special_tokens", {}) else "any id (this tokenizer has no pad token; masked out)"),
        "empty_text": _empty_text(facts),
        "segment_row": "" if "token_type_ids" not in [i["name"] for i in metadata["inputs"]] else (
            "\n| `token_type_ids` | int64 | [batch, sequence] | sentence pairs: the encoding's type ids (0 for the first "
            "text and its special tokens, 1 for the second text and its final separator), 0 at padding; add it to the "
            "inputs of the code below |"),
        "ort_version": ort_version, "ort_version_short": ".".join(ort_version.split(".")[:2]),
        "latency_table": B.latency_markdown(latency["rows"], "see latency.json", latency["load"]).split("\n", 2)[2].strip(),
        "config": config.name, "experiment": metadata["source"]["mlflow_experiment"] or "none (tracking off)",
        "parent_run": metadata["source"]["mlflow_parent_run_id"] or "none",
        "stage_run": metadata["source"]["mlflow_export_run_id"] or "none",
        "registered_model": (f"`{metadata['source']['registered_model']}` (alias `{ALIAS}`)"
                             if metadata["source"]["registered_model"] else "none (export.register_model off or MLflow disabled)"),
        "quant_summary": _why(quant) if quant.get("per_channel") is not None else "off",
        "text_model_section": text_model_section(metadata),
        "mobile_section": mobile_section(metadata),
        "executorch_section": executorch_section(metadata, latency),
    }


def files_table(metadata: dict) -> str:
    """The README's file list: only the files this bundle really has."""
    opset, max_length = metadata["opset"], metadata["max_length"]
    described = [("model.onnx", f"fp32 ONNX graph (opset {opset}, one file, dynamic batch and sequence)")]
    if "int8" in metadata["variants"]:
        described += [("model.int8.onnx", "the same graph with int8 MatMul weights (dynamic quantization)"),
                      ("model.int8.ort", "`model.int8.onnx` in ORT format, for ONNX Runtime Mobile")]
    if "int8_static" in metadata["variants"]:
        described += [("model.int8.static.onnx", "static QDQ int8: activation scales calibrated on training text (the same "
                                                  "answer whatever the batch; the form NNAPI and CoreML read)"),
                      ("model.int8.static.ort", "`model.int8.static.onnx` in ORT format, for ONNX Runtime Mobile")]
    if metadata["variants"]["fp32"]["ort_file"]:
        described.append(("model.ort", "`model.onnx` in ORT format, for ONNX Runtime Mobile"))
    for name, info in ((metadata.get("executorch") or {}).get("variants") or {}).items():
        described.append((info["file"], f"ExecuTorch program (XNNPACK, batch 1{', int8 linears' if name == 'int8' else ''}): "
                                         "for apps on PyTorch's mobile runtime"))
    text = metadata.get("text_model") or {}
    if text.get("shipped"):
        described += [(text["file"], f"text in, probabilities out: the tokenizer (onnxruntime-extensions operators) in front "
                                     f"of `{text['classifier']}`; needs the extensions library"),
                      (text["ort_file"], f"`{text['file']}` in ORT format, for ONNX Runtime Mobile + extensions")]
    described += [
        ("required_operators.config", "operators the `.ort` file(s) use: input of a reduced ONNX Runtime build"),
        ("tokenizer.json", f"the tokenizer (Hugging Face `tokenizers` format; truncation at {max_length}, no padding)"),
        *([("vocab.txt", "the WordPiece vocabulary, one token per line; line number (from 0) = token id")]
          if "vocab.txt" in metadata["tokenizer"].get("files", ["vocab.txt"]) else []),
        ("labels.json", "output index -> label name"),
        ("metadata.json", "inputs, outputs, tokenizer facts, accuracy and size per variant, sha256 of every other file"),
        ("latency.md, latency.json", "latency at batch 1 on the export machine (use the ratios, not the milliseconds)"),
        ("predict.py", "reference classifier (onnxruntime + tokenizers + numpy only): the executable spec"),
        *([("demo.html", "type a sentence, see the label and probabilities: the model in your browser (onnxruntime-web, "
                         "files in `demo/`; serve the folder with `python -m http.server`)")]
          if (metadata.get("demo") or {}).get("shipped") else []),
        *[(name, "the demo's runtime: onnxruntime-web (WebAssembly) or the JavaScript tokenizer, copied from npm")
          for name in (metadata.get("demo") or {}).get("files", [])[1:]],
        ("README.md", "this file"),
    ]
    rows = ["| file | what it is |", "|---|---|"]
    rows += [f"| `{name}` | {what} |" if "," not in name else f"| `{name.split(', ')[0]}`, `{name.split(', ')[1]}` | {what} |"
             for name, what in described]
    return "\n".join(rows)


def executorch_section(metadata: dict, latency: dict) -> str:
    """The README's "ExecuTorch" section: the .pte files, their figures and how to run them, or why there are none."""
    pte = metadata.get("executorch") or {}
    if not pte.get("built"):
        return f"No `.pte` in this bundle: {pte.get('why', 'not built')}."
    speed = {r["model"]: r for r in latency["rows"] if r["input"] == "sentences" and r["threads"] == 1}
    rows = ["| file | accuracy (one text per call) | macro-F1 | size MB | max logit diff vs PyTorch | ms per sentence, 1 thread "
            "| speed-up vs teacher ONNX int8 |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, info in pte["variants"].items():
        r = speed.get(f"student ExecuTorch {name}", {})
        ms = f"{r['median_ms']:.3f}" if r else "-"
        up = (f"{r['speedup_vs_teacher_int8']:.2f}x ({r['speedup_vs_teacher_int8_low']:.2f}-{r['speedup_vs_teacher_int8_high']:.2f})"
              if r.get("speedup_vs_teacher_int8") else "-")
        rows.append(f"| `{info['file']}` | {info['accuracy']:.4f} | {info['macro_f1']:.4f} | {info['file_mb']:.1f} | "
                    f"{info['max_abs_logit_diff_vs_pytorch']:.1e} | {ms} | {up} |")
    for name, info in (pte.get("not_shipped") or {}).items():
        rows.append(f"| ~~`{info['file']}`~~ | {info['accuracy']:.4f} | {info['macro_f1']:.4f} | {info['file_mb']:.1f} | "
                    f"{info['max_abs_logit_diff_vs_pytorch']:.1e} | - | {info['why']} |")
    best = "model.int8.pte" if "int8" in pte["variants"] else "model.pte"
    return EXECUTORCH_SECTION.format(table="\n".join(rows), version=pte["executorch"], best=best, best_stem=best[:-4],
                                     max_length=metadata["max_length"], embeddings=pte["embeddings"])


EXECUTORCH_SECTION = """For apps built on PyTorch's runtime: the same student as ExecuTorch programs, lowered to the XNNPACK delegate
(ARM and x86 CPU kernels), batch 1, sequence length 2 to {max_length} (as the tokenizer truncates). Inputs are `input_ids` and `attention_mask`
(int64, shape [1, sequence]) from `tokenizer.json` exactly as for the ids-in ONNX model (step 1 above): there is no
text-in `.pte`. Output: logits [1, labels]. Embeddings: {embeddings}.

{table}

- **Android** (`implementation("org.pytorch:executorch-android:{version}")`; Kotlin, `import org.pytorch.executorch.*`):
  `val module = Module.load(filesDir.resolve("{best}").path)`, then, with `ids` and `mask` as `LongArray` of length `n`,
  `val logits = module.forward(EValue.from(Tensor.fromBlob(ids, longArrayOf(1, n.toLong()))), EValue.from(Tensor.fromBlob(mask, longArrayOf(1, n.toLong()))))[0].toTensor().dataAsFloatArray`.
- **iOS** (Swift Package `executorch` at {version}, products `executorch` and `backend_xnnpack`; `import ExecuTorch`):
  `let module = Module(filePath: Bundle.main.path(forResource: "{best_stem}", ofType: "pte")!)`, then
  `let outputs = try module.forward([Tensor<Int64>(ids, shape: [1, n]), Tensor<Int64>(mask, shape: [1, n])])`; the
  first output is the logits (check the Swift API of your ExecuTorch release: it is younger than the Java one).
- **Python** check: `python predict.py --model {best} "a text"` (needs `pip install executorch=={version}`, which
  brings PyTorch; the ONNX files need only onnxruntime).
"""


def mobile_section(metadata: dict) -> str:
    """The README's "Mobile execution providers" section: the usability checker's verdicts."""
    mobile = metadata["mobile_usability"]
    lines = [MOBILE.markdown(mobile["shipped"])]
    if "fp32" in mobile:
        fp32 = mobile["fp32"]["providers"]
        lines += ["", "The fp32 graph `model.onnx` for comparison: " + ", ".join(
            f"{name} {p['as_shipped']['supported_nodes']}/{p['as_shipped']['nodes']} nodes, {p['verdict']} "
            f"({p['verdict_with_fixed_shapes']} with fixed shapes)" for name, p in fp32.items()) + "."]
    static = mobile.get("static_qdq_int8") or {}
    if static.get("built") and mobile["shipped"]["model"] != static["model"]:
        lines += ["", f"The static QDQ int8 graph `{static['model']}`: " + ", ".join(
            f"{name} {p['as_shipped']['supported_nodes']}/{p['as_shipped']['nodes']} nodes, {p['verdict']} "
            f"({p['verdict_with_fixed_shapes']} with fixed shapes)" for name, p in static["providers"].items()) + "."]
    elif not static.get("built"):
        lines += ["", f"No static QDQ int8 graph: {static.get('why', 'not built')}."]
    lines += ["", "The text-in model runs on the CPU provider: its tokenizer operators exist only there."]
    return "\n".join(lines)


def text_model_section(metadata: dict) -> str:
    """The README's "Text in, probabilities out" section: how to run model.text.ort on Android and iOS, or why there is none."""
    text, labels = metadata.get("text_model") or {}, len(metadata["labels"])
    if not text.get("shipped"):
        return ("This bundle has no text-in model: " + text.get("why", "it was not built") + ". Tokenize as in step 1 and "
                "feed the ids-in model as in steps 2 and 3.")
    check, ort_version = text["check"], metadata["runtime"]["onnxruntime"]
    ext = text.get("onnxruntime_extensions", "0.15.2")
    differences = "\n".join(f"- {line}" for line in text.get("known_differences", []))
    return TEXT_MODEL_SECTION.format(
        file=text["file"], ort=text["ort_file"], ort_stem=text["ort_file"].removesuffix(".ort"), classifier=text["classifier"],
        max_length=text["truncation"], labels=labels, same=check["token_ids_identical"], examples=check["examples"],
        agreement=check["prediction_agreement"], ort_version=ort_version, ext=ext, ext_short=".".join(ext.split(".")[:2]),
        differences=differences, operator=text["operator"].split(" ", 1)[1])


TEXT_MODEL_SECTION = """`{file}` (ORT format: `{ort}`) takes the raw strings: the tokenizer is inside the graph as
onnxruntime-extensions operators (`{operator}`, truncation at {max_length} tokens) in front of `{classifier}`,
followed by softmax and argmax. No tokenizer port to write.

| name | dtype | shape | value |
|---|---|---|---|
| `text` (input) | string | [batch] | the texts, any length (cut to {max_length} tokens) |
| `probabilities` | float32 | [batch, {labels}] | softmax of the logits, index -> `labels.json` |
| `label` | int64 | [batch] | the most probable label index |
| `input_ids` | int64 | [batch, sequence] | the token ids it used (right-padded), for checking |

Checked at export on the whole test split: identical token ids to `predict.py` on {same} of {examples} texts,
prediction agreement {agreement:.4f}. Known differences from the `tokenizers` library (not in the test split):
{differences}

It needs the extensions library registered next to ONNX Runtime:

- **Android**: `implementation("com.microsoft.onnxruntime:onnxruntime-android:{ort_version}")` and
  `implementation("com.microsoft.onnxruntime:onnxruntime-extensions-android:{ext}")` (the extensions AAR).
- **iOS**: `pod 'onnxruntime-objc', '~> {ort_version}'` and `pod 'onnxruntime-extensions-c', '~> {ext_short}'`.
- A reduced build: `required_operators.config` lists the extension operators too (the `ai.onnx.contrib` line);
  build ONNX Runtime with `--use_extensions --include_ops_by_config required_operators.config` (its `ai.onnx.contrib`
  lines select the extension operators compiled in).

```kotlin
import ai.onnxruntime.OnnxTensor
import ai.onnxruntime.OrtEnvironment
import ai.onnxruntime.OrtSession
import ai.onnxruntime.extensions.OrtxPackage

val env = OrtEnvironment.getEnvironment()
val options = OrtSession.SessionOptions().apply {{ registerCustomOpLibrary(OrtxPackage.getLibraryPath()) }}
val textSession = env.createSession(assets.open("{ort}").readBytes(), options)

fun classifyText(texts: Array<String>): Array<FloatArray> {{
    OnnxTensor.createTensor(env, texts, longArrayOf(texts.size.toLong())).use {{ input ->
        textSession.run(mapOf("text" to input), setOf("probabilities")).use {{ result ->
            @Suppress("UNCHECKED_CAST")
            return result[0].value as Array<FloatArray>   // probabilities per text, index -> labels.json
        }}
    }}
}}
val probabilities = classifyText(arrayOf("an unexpectedly moving film"))[0]
```

```swift
import onnxruntime_objc   // RegisterCustomOps: #include <onnxruntime_extensions.h> in the bridging header

let env = try ORTEnv(loggingLevel: .warning)
let options = try ORTSessionOptions()
try options.registerCustomOps(functionPointer: RegisterCustomOps)   // the extensions pod's C entry point
let textPath = Bundle.main.path(forResource: "{ort_stem}", ofType: "ort")!
let textSession = try ORTSession(env: env, modelPath: textPath, sessionOptions: options)

func classifyText(_ text: String) throws -> [Float] {{
    let input = try ORTValue(tensorStringData: [text], shape: [1])
    let out = try textSession.run(withInputs: ["text": input], outputNames: ["probabilities"], runOptions: nil)
    let data = try out["probabilities"]!.tensorData() as Data
    return data.withUnsafeBytes {{ Array($0.bindMemory(to: Float.self)) }}   // index -> labels.json
}}
```

Python (`pip install onnxruntime onnxruntime-extensions numpy`):

```python
import numpy as np, onnxruntime as ort
from onnxruntime_extensions import get_library_path

options = ort.SessionOptions()
options.register_custom_ops_library(get_library_path())
session = ort.InferenceSession("{file}", options)
probabilities, label, _ = session.run(None, {{"text": np.array(["an unexpectedly moving film"], dtype=object)}})
```"""


def _token(facts: dict, role: str) -> str:
    """The special token playing ``role`` (cls, sep, pad, unk, mask), or a word for its absence: never None."""
    entry = facts.get("special_tokens", {}).get(role)
    return entry["token"] if entry else f"(no {role} token)"


def _empty_text(facts: dict) -> str:
    """What an empty text tokenizes to: the single template's special tokens alone."""
    marks = [t for t in facts.get("template", "text").split() if t not in ("text", "text_pair")]
    return f"`{' '.join(marks)}`" if marks else "no tokens at all"


def _specials_line(facts: dict) -> str:
    roles = facts.get("special_tokens", {})
    parts = [f"`{entry['token']}` = {entry['id']} ({role})" for role, entry in roles.items()]
    return "Special token ids: " + (", ".join(parts) if parts else "none") + "."


def _normalize_step(facts: dict) -> str:
    """One sentence for the normalizer of a non-WordPiece tokenizer.json."""
    steps = []
    for kind in facts.get("normalizers", []):
        steps.append({"NFC": "Unicode NFC", "NFD": "Unicode NFD", "NFKC": "Unicode NFKC", "NFKD": "Unicode NFKD",
                      "Lowercase": "lower-case", "StripAccents": "strip accents (combining marks)",
                      "Strip": "strip surrounding whitespace", "Replace": "replace patterns (see tokenizer.json)",
                      "Prepend": "prepend a marker (see tokenizer.json)", "Precompiled": "SentencePiece's precompiled "
                      "character map (NFKC-like; see tokenizer.json)",
                      "BertNormalizer": "BERT cleaning" + (", lower-case" if facts.get("lowercase") else "")}.get(kind, kind))
    return ("Normalize: " + ", then ".join(steps) + "." if steps
            else "Normalize: nothing (**cased**: the text is used as is, no lower-casing or Unicode normalization).")


def tokenize_section(facts: dict, max_length: int, trim: dict) -> str:
    """The README's "1. Tokenize" text for the tokenizer the bundle really ships (WordPiece, byte-level BPE, Unigram...)."""
    kind, cls, sep, unk = facts.get("type"), _token(facts, "cls"), _token(facts, "sep"), _token(facts, "unk")
    template, pair = facts.get("template", "text"), facts.get("pair_template", "")
    pair_note = f" (text pairs: `{pair.replace('text_pair', 'b').replace('text', 'a')}`)" if pair else ""
    truncate = (f"Truncate to **{max_length} tokens including `{cls}` and `{sep}`** (drop pieces from the end, keep the "
                f"final `{sep}`)." if template != "text" else f"Truncate to **{max_length} tokens** (drop pieces from the end).")
    vocab_size = facts["vocab_size"]
    if trim.get("enabled"):
        vocab_note = (f" The vocabulary was trimmed to the {trim['kept_tokens']} tokens the training text uses "
                      f"(of {trim['original_vocab']}): use this bundle's vocab.txt / tokenizer.json, never the "
                      f"original BERT vocabulary; words made of other pieces become shorter pieces or `{unk}`.")
    elif trim.get("requested"):
        vocab_note = f" The vocabulary was not trimmed (export.trim_vocab): {trim.get('reason', '')}."
    else:
        vocab_note = ""
    if kind == "WordPiece" and facts.get("pre_tokenizer") == "BertPreTokenizer":
        lowercase = facts.get("lowercase")
        accents = ", accents stripped" if lowercase and facts.get("strip_accents") in (None, True) else ""
        case = f"**uncased** (lower-case{accents})" if lowercase else "**cased** (no lower-casing)"
        prefix, max_chars = facts.get("continuing_subword_prefix") or "##", facts.get("max_input_chars_per_word") or 100
        return "\n".join([
            f"WordPiece, {case}, exactly as `tokenizer.json` does it:", "",
            "1. Normalize: drop control characters, map whitespace to spaces, put spaces around CJK characters"
            + (f", lower-case{accents}." if lowercase else "."),
            "2. Pre-tokenize: split on whitespace and around every punctuation character.",
            "3. WordPiece each word: greedy longest match from the start of the word against `vocab.txt`; pieces after the",
            f"   first carry the `{prefix}` prefix; a word with no match (or longer than {max_chars} characters) becomes `{unk}`.",
            f"4. Add special tokens: `{template}`{pair_note}.",
            f"5. {truncate}", "",
            f"{_specials_line(facts)}",
            f"Vocabulary size {vocab_size}.{vocab_note} Check your port against `predict.py` on a few hundred sentences: "
            "the ids must be identical.",
            "Libraries that read `tokenizer.json` or `vocab.txt` directly save you writing this (for example a BERT WordPiece",
            "tokenizer in your app's ML kit of choice), but keep the " + ("lower-casing and the " if lowercase else "")
            + "truncation length."])
    pre = facts.get("pre_tokenizers", [])
    if facts.get("byte_level"):
        prefix = (" A space is first added in front of the text, so the first word is treated like any other."
                  if facts.get("add_prefix_space") else "")
        pre_step = ("Pre-tokenize (byte-level, GPT-2 / RoBERTa style): split into words, numbers, punctuation and "
                    "whitespace runs with the GPT-2 regular expression, keeping a word's leading space; then map every "
                    "UTF-8 byte to one printable character (GPT-2's byte-to-unicode table: a space becomes `Ġ`)." + prefix)
    elif facts.get("metaspace"):
        meta = facts["metaspace"]
        first = {"always": " and add one in front of the text", "first": " and add one in front of the text",
                 "never": ""}.get(meta.get("prepend_scheme"), "")
        pre_step = (f"Pre-tokenize (SentencePiece style, Metaspace): replace every space with `{meta.get('replacement')}`"
                    f"{first}; each `{meta.get('replacement')}` starts a new word.")
    elif "BertPreTokenizer" in pre:
        pre_step = "Pre-tokenize: split on whitespace and around every punctuation character."
    elif pre:
        pre_step = f"Pre-tokenize: {', then '.join(pre)} (see `tokenizer.json` -> `pre_tokenizer`)."
    else:
        pre_step = "Pre-tokenize: none (the model splits the whole normalized text)."
    if kind == "BPE":
        name = "byte-level BPE" if facts.get("byte_level") else "BPE"
        model_step = (f"BPE each word: start from single characters{' (bytes)' if facts.get('byte_level') else ''} and "
                      f"apply the {facts.get('merges') or 0} merges of `tokenizer.json` -> `model.merges`, always the "
                      "highest-priority (earliest listed) pair present, until none applies; each resulting piece's id is "
                      "`model.vocab[piece]`." + (" Every byte is in the vocabulary, so no text is unknown."
                                                 if facts.get("byte_level") else f" Pieces not in the vocabulary become `{unk}`."))
    elif kind == "Unigram":
        name = "Unigram (SentencePiece)"
        model_step = ("Unigram each word: of all ways to cut it into pieces of `tokenizer.json` -> `model.vocab` "
                      "([piece, log-probability] pairs, id = position), take the one with the highest total log-probability "
                      f"(Viterbi); characters no piece covers become `{unk}`.")
    elif kind == "WordPiece":
        name = "WordPiece"
        model_step = (f"WordPiece each word: greedy longest match against the vocabulary; pieces after the first carry the "
                      f"`{facts.get('continuing_subword_prefix') or '##'}` prefix; a word with no match becomes `{unk}`.")
    else:
        name = str(kind)
        model_step = f"{kind} model: see `tokenizer.json` -> `model`."
    return "\n".join([
        f"{name}, {'**uncased** (lower-cased)' if facts.get('lowercase') else '**cased**'}, exactly as `tokenizer.json` does it:", "",
        f"1. {_normalize_step(facts)}",
        f"2. {pre_step}",
        f"3. {model_step}",
        f"4. Add special tokens: `{template}`{pair_note}." if template != "text" else "4. Add special tokens: none.",
        f"5. {truncate}", "",
        f"{_specials_line(facts)}",
        f"Vocabulary size {vocab_size}.{vocab_note} Check your port against `predict.py` on a few hundred sentences: "
        "the ids must be identical.",
        "Writing this by hand is error-prone: prefer a library that loads Hugging Face `tokenizer.json` files directly, "
        "and keep the truncation length."])


def _why(quant: dict) -> str:
    excluded = quant.get("nodes_excluded") or []
    embeddings = "; embedding tables int8" if "Gather" in quant.get("op_types", []) else ""
    return (f"dynamic int8, MatMul weights {'per channel' if quant.get('per_channel') else 'per tensor'}{embeddings}"
            f"{', 7-bit (reduce_range)' if quant.get('reduce_range') else ''}"
            f"{f', {len(excluded)} MatMul(s) kept fp32' if excluded else ''}; activations uint8 per tensor at run time")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"
