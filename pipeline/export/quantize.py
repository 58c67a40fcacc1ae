"""int8 graphs under an accuracy budget: dynamic quantization (onnxruntime's quantize_dynamic) walked down a
ladder of safer settings, static QDQ quantization with calibrated activation scales, and the int8 teacher
quantized exactly as the student was (the baseline a user would ship instead).
"""

from __future__ import annotations

import logging
import platform
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from ..errors import require_room
from ..metrics import classification_report
from .onnx_graph import onnx_logits, weight_matmuls

log = logging.getLogger("pipeline")


def quantization_ladder(path: Path, num_layers: int) -> list[dict]:
    """int8 settings from most to least aggressive; the stage stops at the first within the accuracy budget.

    1. per-channel int8 weights on every weight MatMul and int8 embedding
       tables (Gather): the embeddings are most of a small student's bytes,
    2. the same with 7-bit weights (reduce_range): on x86 CPUs without VNNI (AVX2 only) onnxruntime multiplies
       uint8 activations by int8 weights with VPMADDUBSW, which adds two products in int16 and saturates when
       both are large (2 x 255 x 127 > 32767). Measured on the MPNet-base student on an AVX2 machine: 8-bit
       weights 0.64, 7-bit 0.83 (fp32 0.83); ARM phones and VNNI CPUs do not saturate,
    3. per-channel int8 weights on every weight MatMul, embeddings fp32,
    4. the same, keeping the pooler and classifier in fp32,
    5. also keeping the first (if deeper than 2 layers) and last encoder layers
       in fp32, with reduce_range (7-bit weights).
    Activations are quantized dynamically (uint8, per tensor, at run time).
    Settings that would leave nothing quantized are dropped.
    """
    nodes = weight_matmuls(path)
    head = [n["name"] for n in nodes if n["head"]]
    edge_layers = {num_layers - 1} | ({0} if num_layers > 2 else set())
    edges = [n["name"] for n in nodes if n["layer"] in edge_layers]
    candidates: list[dict[str, Any]] = [
        {
            "name": "per_channel_embeddings",
            "per_channel": True,
            "reduce_range": False,
            "exclude": [],
            "op_types": ["MatMul", "Gather"],
            "why": "all weight MatMuls and the embedding tables int8, per-channel scales",
        },
        {
            "name": "per_channel_embeddings_reduce_range",
            "per_channel": True,
            "reduce_range": True,
            "exclude": [],
            "op_types": ["MatMul", "Gather"],
            "why": "all weight MatMuls and the embedding tables int8, 7-bit weights (no int16 saturation on x86 "
            "CPUs without VNNI)",
        },
        {
            "name": "per_channel",
            "per_channel": True,
            "reduce_range": False,
            "exclude": [],
            "why": "all weight MatMuls int8, per-channel scales",
        },
        {
            "name": "per_channel_fp32_head",
            "per_channel": True,
            "reduce_range": False,
            "exclude": head,
            "why": "pooler and classifier kept fp32",
        },
        {
            "name": "per_channel_fp32_head_edges_reduce_range",
            "per_channel": True,
            "reduce_range": True,
            "exclude": head + edges,
            "why": f"pooler, classifier and encoder layer(s) {sorted(edge_layers)} kept fp32; 7-bit weights",
        },
    ]
    ladder, seen = [], set()
    for setting in candidates:
        key = (tuple(sorted(setting["exclude"])), setting["reduce_range"], tuple(setting.get("op_types", ["MatMul"])))
        # (a folded static student has no weight MatMul at all: only its tables, the Gather settings, are left)
        matmuls_left = len(set(setting["exclude"])) < len(nodes)
        if key in seen or not (matmuls_left or "Gather" in setting.get("op_types", [])):
            continue
        seen.add(key)
        ladder.append(setting)
    return ladder


def cpu_int8_kernels() -> str:
    """How this CPU multiplies int8, which decides whether 8-bit weights saturate (see quantization_ladder): the
    ladder's accuracies are measured here, so metadata.json says which kind of machine measured them."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return f"{platform.machine()}: no int16 saturation in onnxruntime's int8 kernels"
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "x86 (CPU flags unreadable)"
    vnni = sorted(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})
    if vnni:
        return f"x86 with {', '.join(vnni)}: int8 products summed in int32 (8-bit weights do not saturate)"
    return "x86 without VNNI (AVX2): uint8 x int8 products summed in pairs in int16 (8-bit weights can saturate)"


def quantize_with_budget(ladder, fp32_path, int8_path, work, test, pad, fp32_accuracy, budget):
    """Walk the quantization ladder until the accuracy drop fits the budget; keep the best attempt."""
    attempts, best = [], None
    for step, setting in enumerate(ladder):
        candidate = work / f"int8_{step}.onnx"
        settings = quantize_int8(fp32_path, candidate, setting)
        logits = onnx_logits(candidate, test, pad)
        accuracy = float((logits.argmax(-1) == test.labels).mean())
        drop = 100 * (fp32_accuracy - accuracy)
        attempt = {
            "setting": setting["name"],
            "why": setting["why"],
            "accuracy": accuracy,
            "drop_points": drop,
            "file_mb": candidate.stat().st_size / 1e6,
            "excluded_nodes": len(setting["exclude"]),
        }
        attempts.append(attempt)
        log.info(
            "[export] int8 %s: accuracy %.4f (drop %.2f points, budget %.2f)", setting["name"], accuracy, drop, budget
        )
        if best is None or drop < best[0]["drop_points"] - 1e-12:
            best = (attempt, settings, candidate, logits)
        if drop <= budget:
            break
    attempt, settings, candidate, logits = best
    shutil.move(str(candidate), int8_path)
    within = attempt["drop_points"] <= budget
    note = (
        f"int8 accuracy is within {budget} points of fp32 on the test split"
        if within
        else f"int8 is NOT recommended: every setting tried dropped more than {budget} points "
        f"(best: {attempt['setting']}, {attempt['drop_points']:.2f} points); ship model.onnx"
    )
    if not within:
        log.warning("[export] %s", note)
    return (
        {
            **settings,
            "why": attempt["why"],
            "accuracy": attempt["accuracy"],
            "drop_points": attempt["drop_points"],
            "within_budget": within,
            "note": note,
            "decided_on": "test split",
            "measured_on": cpu_int8_kernels(),
        },
        attempts,
        logits,
    )


def room_for_shape_inference(source: Path) -> None:
    """onnxruntime's quantizer first runs onnx's shape inference, which writes ``<source stem>-inferred.onnx`` beside
    the source with onnx's C++ writer; on a full disk that writer leaves a truncated file without an error, and the
    quantizer fails reading it back ("Wire format was corrupt"). So the room it needs is checked first."""
    source = Path(source)
    require_room(
        source.with_name(f"{source.stem}-inferred{source.suffix}"),
        source.stat().st_size + (1 << 20),
        "the export stage",
        "onnx's shape inference (run by onnxruntime's quantizer)",
    )


def quantize_int8(source: Path, target: Path, setting: dict) -> dict:
    """Dynamic int8 quantization of MatMul weights; returns the settings as recorded in metadata."""
    exclude = list(setting.get("exclude", []))
    # quantize_dynamic rewrites Gemm (pooler / classifier) into '<name>_MatMul' before quantizing.
    names = sorted(set(exclude) | {f"{name}_MatMul" for name in exclude})
    op_types = setting.get("op_types", ["MatMul"])
    room_for_shape_inference(source)
    quantize_dynamic(
        str(source),
        str(target),
        weight_type=QuantType.QInt8,
        per_channel=setting["per_channel"],
        reduce_range=setting["reduce_range"],
        op_types_to_quantize=op_types,
        nodes_to_exclude=names,
    )
    return {
        "method": "onnxruntime.quantization.quantize_dynamic",
        "weight_type": "int8 (QInt8, symmetric)",
        "activations": "uint8, dynamic per-tensor (computed at run time)",
        "op_types": op_types,
        "per_channel": setting["per_channel"],
        "reduce_range": setting["reduce_range"],
        "nodes_excluded": exclude,
        "setting": setting["name"],
    }


def quantize_static_int8(
    source: Path, target: Path, calibration: list[dict], excluded: Sequence[str] = (), reduce_range: bool = False
) -> dict:
    """Static QDQ int8: weights int8 per channel (every weight MatMul/Gemm and the embedding tables), activations
    uint8 with per-tensor scales fixed from ``calibration`` (batch-1 feeds of training text; MinMax), so no
    scale depends on the batch. QuantizeLinear/DequantizeLinear pairs: the format NNAPI and CoreML read.
    ``reduce_range``: 7-bit weights, for x86 CPUs without VNNI (see quantization_ladder)."""

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.items = iter(calibration)

        def get_next(self):
            return next(self.items, None)

    names = sorted(set(excluded) | {f"{name}_MatMul" for name in excluded})
    room_for_shape_inference(source)
    with tempfile.TemporaryDirectory(dir=Path(target).parent) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Please consider to run pre-processing before quantization"
        quantize_static(
            str(source),
            str(target),
            Feeds(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            reduce_range=reduce_range,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Gemm", "Gather"],
            nodes_to_exclude=names,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={
                "ActivationSymmetric": False,
                "WeightSymmetric": True,
                "CalibTensorRangeSymmetric": False,
                "CalibIntermediateOutputPath": str(Path(tmp) / "augmented.onnx"),
            },
        )
    return {
        "method": "onnxruntime.quantization.quantize_static (QDQ)",
        "weight_type": f"int8 (QInt8, symmetric, per channel{', 7-bit' if reduce_range else ''})",
        "reduce_range": reduce_range,
        "activations": "uint8, static per-tensor scales (MinMax over the calibration texts)",
        "op_types": ["MatMul", "Gemm", "Gather"],
        "calibration_examples": len(calibration),
        "nodes_excluded": list(excluded),
    }


def quantized_node_count(path: Path) -> int:
    return sum(
        node.op_type in ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat")
        for node in onnx.load(str(path)).graph.node
    )


def quantize_like_student(teacher_onnx: Path, teacher_int8: Path, quant: dict) -> dict:
    """The teacher quantized with the shipped student's recorded setting (metadata.json "quantization"), every
    layer int8: no layer of the teacher is kept fp32, whatever the student's rung kept."""
    setting = {key: quant[key] for key in ("per_channel", "reduce_range", "op_types")}
    return quantize_int8(teacher_onnx, teacher_int8, {"name": quant["setting"], **setting, "exclude": []})


def int8_teacher_baseline(teacher_onnx, teacher_int8, quant, test, pad, names) -> dict | None:
    """The teacher quantized exactly as the shipped student was (same quantizer and setting), on the test split."""
    if not quant:
        return None
    quantize_like_student(teacher_onnx, teacher_int8, quant)
    report = classification_report(test.labels, onnx_logits(teacher_int8, test, pad).argmax(-1), names)
    return {
        "model": "teacher ONNX int8",
        "accuracy": report["accuracy"],
        "macro_f1": report["macro_f1"],
        "file_mb": teacher_int8.stat().st_size / 1e6,
        "setting": quant["setting"],
        "note": "the fine-tuned teacher exported to ONNX and quantized with the student's int8 setting (no distillation); "
        "same test split, same latency inputs",
    }
