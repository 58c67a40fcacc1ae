"""Every figure the export reports, built once (Measurements), and its renderings: metadata.json, metrics.json,
export.json and the MLflow metrics compute none of their own."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from .files import package_version
from .latency import comparison_lines
from .onnx_graph import input_names
from .tokenizer import role_token, tokenizer_files
from .variants import Inputs, Shipped

ALIAS = "candidate"  # the registered model's alias for the newest export


@dataclass
class Measurements:
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
    word_model: dict | None = None  # a static student's model.words.onnx (word_model.ship); None for other students

    @property
    def int8_recommended(self) -> bool:
        return self.recommended.startswith("int8")


def bundle_name(config) -> str:
    """The bundle's name, also the registered model's."""
    return f"attention-distill-{config.name}"


def bundle_metadata(config, inputs: Inputs, shipped: Shipped, measured: Measurements, source: dict) -> dict:
    """metadata.json, without its "files" table (added once every other file is written)."""
    cfg, variants, max_length = config.export, measured.variants, inputs.max_length
    variant_files = {"fp32": ("model.onnx", "onnx_fp32", None if measured.int8_recommended else "model.ort")}
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
        "inputs": [{"name": n, "dtype": "int64", "shape": ["batch", "sequence"]} for n in input_names(inputs.segments)],
        "outputs": [
            {
                "name": "logits",
                "dtype": "float32",
                "shape": ["batch", len(inputs.names)],
                "meaning": "unnormalised class scores (logits); apply softmax over the last axis for "
                "probabilities; argmax is the label index in labels.json",
            }
        ],
        "dynamic_axes": {n: {"0": "batch", "1": "sequence"} for n in input_names(inputs.segments)},
        "opset": cfg.opset,
        "max_length": max_length,
        "max_position_embeddings": shipped.model.config.max_position_embeddings,
        "labels": inputs.labels,
        "tokenizer": {
            **shipped.facts,
            "files": tokenizer_files(shipped.facts),
            "truncation": f"longest first, to {max_length} tokens including specials",
            "padding": f"right, with {role_token(shipped.facts, 'pad')}, to the longest sequence of the batch; "
            "attention_mask 0 there",
        },
        "variants": {
            v: {
                "file": f,
                "ort_file": o,
                **{
                    k: variants[key][k]
                    for k in (
                        "accuracy",
                        "macro_f1",
                        "agreement_with_pytorch",
                        "file_mb",
                        "parameters",
                        "batch_invariance",
                    )
                },
            }
            for v, (f, key, o) in variant_files.items()
        },
        "accuracy_measured": "one text per call (batch 1, unpadded), as predict.py, the Kotlin/Swift/JS examples and the "
        "text-in model run it; batch_invariance says which variants answer the same in batches",
        "recommended": measured.recommended,
        "recommended_because": measured.because,
        "int8_recommended": measured.int8_recommended,
        "quantization": {
            **(measured.quant or {"enabled": False}),
            "attempts": measured.attempts,
            "max_int8_drop_points": cfg.max_int8_drop,
        },
        "static_quantization": measured.static or {"enabled": False},
        "executorch": measured.executorch,
        "parity": {
            **measured.parity,
            "tolerance": cfg.parity_tolerance,
            "split": "test",
            "examples": measured.examples,
        },
        "vocab_trim": measured.trim,
        "versus_int8_teacher": measured.comparison,
        "from_text": measured.from_text,
        "ort_format": measured.ort,
        "text_model": measured.text_model,
        **({"word_model": measured.word_model} if measured.word_model else {}),
        "mobile_usability": measured.mobile,
        "evaluation": {"split": "test", "examples": measured.examples},
        "latency_file": "latency.json",
        "source": source,
        "runtime": {
            "onnxruntime": package_version("onnxruntime"),
            "onnx": package_version("onnx"),
            "torch": package_version("torch"),
            "transformers": package_version("transformers"),
            "tokenizers": package_version("tokenizers"),
        },
    }


def metrics_json(measured: Measurements) -> dict:
    """metrics.json: per-variant test metrics (evaluate's keys) and the summary figures."""
    return {
        "split": "test",
        "examples": measured.examples,
        **measured.variants,
        "recommended": measured.recommended,
        "int8_recommended": measured.int8_recommended,
        "parity_max_abs_diff": measured.parity["max_abs_logit_diff"],
        "latency": measured.latency["rows"],
        "vocab_trim": measured.trim,
        "versus_int8_teacher": measured.comparison,
        "from_text": measured.from_text,
        "executorch": measured.executorch,
    }


def export_summary(cfg, measured: Measurements, registration: dict | None) -> dict:
    """export.json and the stage's summary figures (the manifest)."""
    fp32, comparison, quant = measured.variants["onnx_fp32"], measured.comparison, measured.quant
    summary = {
        "opset": cfg.opset,
        "parity_max_abs_diff": measured.parity["max_abs_logit_diff"],
        "parity_agreement": measured.parity["prediction_agreement"],
        "fp32_accuracy": fp32["accuracy"],
        "fp32_mb": fp32["file_mb"],
        "recommended": measured.recommended,
        "text_model_shipped": measured.text_model["shipped"],
        **({"word_model_shipped": measured.word_model["shipped"]} if measured.word_model else {}),
    }
    if comparison:
        summary.update(
            {
                "accuracy_kept": comparison["accuracy_kept"],
                "size_vs_int8_teacher": comparison["size_vs_int8_teacher"],
                **{
                    f"speedup_vs_int8_teacher_{k.replace('=', '')}": v
                    for k, v in comparison["speedup_vs_int8_teacher"].items()
                },
                "targets_met": comparison["all_met"],
            }
        )
    if quant:
        int8 = measured.variants["onnx_int8"]
        summary.update(
            {
                "int8_accuracy": int8["accuracy"],
                "int8_mb": int8["file_mb"],
                "int8_drop_points": quant["drop_points"],
                "int8_setting": quant["setting"],
            }
        )
    if measured.static:
        static = measured.variants["onnx_int8_static"]
        summary.update(
            {
                "int8_static_accuracy": static["accuracy"],
                "int8_static_mb": static["file_mb"],
                "int8_static_drop_points": measured.static["drop_points"],
                "int8_static_batch_invariant": static["batch_invariance"]["invariant"],
            }
        )
    if registration:
        summary["registered_version"] = registration["version"]
    return summary


def mlflow_metrics(measured: Measurements) -> dict:
    """The figures as flat MLflow metrics."""
    variants, comparison = measured.variants, measured.comparison
    flat = {
        f"{v}/{k}": variants[v][k]
        for v in variants
        for k in ("accuracy", "macro_f1", "agreement_with_pytorch", "file_mb")
    }
    flat.update(
        {
            "parity_max_abs_diff": measured.parity["max_abs_logit_diff"],
            "int8_recommended": float(measured.int8_recommended),
        }
    )
    if measured.quant:
        flat["onnx_int8/drop_points"] = measured.quant["drop_points"]
    if measured.static:
        flat["onnx_int8_static/drop_points"] = measured.static["drop_points"]
    flat.update(
        {f"{v}/batch_changed_predictions": variants[v]["batch_invariance"]["predictions_changed"] for v in variants}
    )
    for name, info in (measured.executorch.get("variants") or {}).items():
        flat.update(
            {
                f"executorch_{name}/{k}": info[k]
                for k in ("accuracy", "macro_f1", "file_mb", "max_abs_logit_diff_vs_pytorch")
            }
        )
    flat.update(
        {
            f"latency_ms/{r['model'].replace(' ', '_')}_{r['input'].replace('=', '')}_t{r['threads']}": r["median_ms"]
            for r in measured.latency["rows"]
        }
    )
    if measured.from_text.get("measured"):
        for row in measured.from_text["rows"]:
            flat.update(
                {
                    f"from_text/{row['model']}_{k}": row[k]
                    for k in ("accuracy", "macro_f1", "median_ms", "p25_ms", "p75_ms")
                }
            )
        versus = measured.from_text["versus_peers"]
        if versus:
            flat.update(
                {
                    "vs_peers/accuracy_margin_points": versus["accuracy_margin_points"],
                    "vs_peers/macro_f1_margin_points": versus["macro_f1_margin_points"],
                    "vs_peers/latency_vs_fastest_peer": versus["latency_vs_fastest_peer"],
                }
            )
    if comparison:
        baseline = comparison["baseline"]
        flat.update(
            {
                "vs_int8_teacher/accuracy_kept": comparison["accuracy_kept"],
                "vs_int8_teacher/size_ratio": comparison["size_vs_int8_teacher"],
                "vs_int8_teacher/baseline_accuracy": baseline["accuracy"],
                "vs_int8_teacher/baseline_mb": baseline["file_mb"],
                **{
                    f"vs_int8_teacher/speedup_{k.replace('=', '')}": v
                    for k, v in comparison["speedup_vs_int8_teacher"].items()
                },
                **{
                    f"vs_int8_teacher/speedup_{k.replace('=', '')}_low": v[0]
                    for k, v in comparison["speedup_vs_int8_teacher_interval"].items()
                },
            }
        )
    return flat


def registered_description(config, measured: Measurements, chosen: dict, source: dict) -> str:
    """The registered model version's description in the MLflow UI: what it is, its figures, where it came from."""
    lines = [
        config.description or f"Distilled student of config `{config.name}`.",
        "",
        f"ONNX {measured.recommended} student (the variant the bundle ships): test accuracy {chosen['accuracy']:.4f}, "
        f"macro-F1 {chosen['macro_f1']:.4f}, {chosen['file_mb']:.1f} MB, on {measured.examples} test examples.",
    ]
    if measured.comparison:
        lines += [f"- {line}" for line in comparison_lines(measured.comparison)[2:]]
    lines += [
        "",
        f"Pipeline run {source['mlflow_parent_run_id']} (experiment `{source['mlflow_experiment']}`); "
        "the bundle is the export run's artifact `bundle/`.",
    ]
    return "\n".join(lines)
