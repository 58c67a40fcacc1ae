"""Mobile suitability of a shipped graph: ONNX Runtime's mobile usability checker, as data.

``python -m onnxruntime.tools.check_onnx_model_mobile_usability MODEL`` only logs
its findings; :func:`usability` runs the same functions
(``onnxruntime.tools.mobile_helpers.usability_checker``) on the same
BASIC-optimized copy of the graph and returns, for NNAPI (Android) and CoreML
(iOS, NeuralNetwork and MLProgram formats): how many nodes the execution
provider could take, in how many partitions, which operators it lacks, how many
nodes it refuses only because of dynamic shapes, and the checker's verdict
(YES / MAYBE / NO), as the graph is and with its dynamic axes fixed. It adds
one limit the checker does not test: CoreML refuses tensors with a dimension
above 16,384, which the word-embedding table passes with a BERT-size vocabulary.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from onnxruntime.tools.mobile_helpers import usability_checker as checker
from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo, optimize_model

from .variants import Int8, Shipped

log = logging.getLogger("pipeline")

COREML_MAX_DIMENSION = 16384

PROVIDERS = {
    "NNAPI": ("Android", None),
    "CoreML NeuralNetwork": ("iOS", "coreml_supported_neuralnetwork_ops.md"),
    "CoreML MLProgram": ("iOS", "coreml_supported_mlprogram_ops.md"),
}


def _partitions(info) -> dict:
    """A usability_checker.PartitioningInfo as plain figures."""
    return {
        "nodes": info.num_nodes,
        "supported_nodes": info.num_supported_nodes,
        "supported_share": round(info.num_supported_nodes / max(info.num_nodes, 1), 4),
        "partitions": info.num_partitions,
        "unsupported_ops": sorted(info.unsupported_ops),
        "nodes_unsupported_due_to_op": info.nodes_unsupported_due_to_op,
        "nodes_unsupported_due_to_dynamic_shape": info.nodes_unsupported_due_to_dynamic_input,
        "verdict": info.suitability().name,
    }


def usability(model_path: Path, vocab_size: int | None = None, pair_rows: int = 0) -> dict:
    """The mobile usability checker's findings for ``model_path`` (an ONNX file), per execution provider;
    ``pair_rows``: the rows of a token-pair table beside the word embeddings (student.token_pairs), which
    vocabulary trimming does not shrink."""
    quiet = logging.getLogger("pipeline.mobile_usability")
    quiet.setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        optimized = Path(tmp) / Path(model_path).name
        optimize_model(Path(model_path), optimized, use_external_initializers=True)  # as the checker does (BASIC level)
        model = ModelProtoWithShapeInfo(optimized).model_with_shape_info
        dynamic_inputs, dynamic_values = checker.check_shapes(model.graph, quiet)
        providers = {}
        for name, (platform, ops_file) in PROVIDERS.items():

            def check(fixed_inputs: bool, ops_file=ops_file):
                if ops_file is None:
                    return checker.check_nnapi_partitions(model, fixed_inputs)
                return checker.check_coreml_partitions(model, fixed_inputs, ops_file)

            as_is = _partitions(check(True))
            fixed = _partitions(check(False)) if dynamic_inputs else None
            providers[name] = {
                "platform": platform,
                "as_shipped": as_is,
                "with_fixed_shapes": fixed,
                "verdict": as_is["verdict"],
                "verdict_with_fixed_shapes": fixed["verdict"] if fixed else as_is["verdict"],
            }
    result = {
        "tool": "onnxruntime.tools.check_onnx_model_mobile_usability (functions of mobile_helpers.usability_checker)",
        "model": Path(model_path).name,
        "dynamic_inputs": [i.name for i in dynamic_inputs],
        "values_with_dynamic_shape": dynamic_values,
        "providers": providers,
        "recommendation": _recommendation(providers),
    }
    if vocab_size is not None:
        result["coreml_dimension_limit"] = {
            "limit": COREML_MAX_DIMENSION,
            "embedding_rows": vocab_size,
            "exceeded": max(vocab_size, pair_rows) > COREML_MAX_DIMENSION,
            "note": (
                f"CoreML refuses tensors with a dimension above {COREML_MAX_DIMENSION}: the {vocab_size}-row word-"
                "embedding table keeps its Gather on the CPU; a trimmed vocabulary (export.trim_vocab) can get under it"
                if vocab_size > COREML_MAX_DIMENSION
                else f"the {vocab_size}-row word-embedding table is within CoreML's {COREML_MAX_DIMENSION} dimension limit"
            ),
        }
        if pair_rows:
            result["coreml_dimension_limit"]["pair_rows"] = pair_rows
            result["coreml_dimension_limit"]["note"] += (
                f"; the {pair_rows}-row token-pair table (student.token_pairs) "
                + (
                    "keeps its Gather on the CPU too, and trimming does not shrink it"
                    if pair_rows > COREML_MAX_DIMENSION
                    else "is within it"
                )
            )
    return result


def _recommendation(providers: dict) -> str:
    """The checker's conclusion in one sentence."""
    try_them = [name for name, p in providers.items() if p["verdict_with_fixed_shapes"] != "NO"]
    if not try_them:
        return (
            "use the CPU execution provider: neither NNAPI nor CoreML can take enough of this graph in few enough "
            "partitions to pay for the copies between CPU and accelerator"
        )
    fixed_only = [name for name in try_them if providers[name]["verdict"] == "NO"]
    note = (
        f" ({', '.join(fixed_only)} only once the batch and sequence axes are fixed: "
        "python -m onnxruntime.tools.make_dynamic_shape_fixed)"
        if fixed_only
        else ""
    )
    return f"compare {', '.join(try_them)} against the CPU execution provider on a device{note}"


def markdown(result: dict) -> str:
    """The bundle README's table of the checker's verdicts."""
    rows = [
        "| execution provider | nodes it takes (as shipped) | partitions | verdict | with fixed shapes | operators it lacks |",
        "|---|---:|---:|---|---|---|",
    ]
    for name, p in result["providers"].items():
        as_is, fixed = p["as_shipped"], p["with_fixed_shapes"] or p["as_shipped"]
        lacking = ", ".join(f"`{op}`" for op in as_is["unsupported_ops"]) or "none"
        rows.append(
            f"| {name} ({p['platform']}) | {as_is['supported_nodes']}/{as_is['nodes']} "
            f"({100 * as_is['supported_share']:.0f}%) | {as_is['partitions']} | {p['verdict']} | "
            f"{p['verdict_with_fixed_shapes']} ({fixed['supported_nodes']}/{fixed['nodes']} nodes, "
            f"{fixed['partitions']} partitions) | {lacking} |"
        )
    lines = [
        f"ONNX Runtime's mobile usability checker on `{result['model']}`:",
        "",
        *rows,
        "",
        f"Dynamic inputs: {', '.join(f'`{n}`' for n in result['dynamic_inputs']) or 'none'} "
        f"({result['values_with_dynamic_shape']} values with a dynamic shape; NNAPI takes fixed shapes only). "
        f"Recommendation: {result['recommendation']}.",
    ]
    if "coreml_dimension_limit" in result:
        lines.append(f"CoreML vocabulary limit: {result['coreml_dimension_limit']['note']}.")
    return "\n".join(lines)


def usability_of_graphs(shipped: Shipped, int8: Int8 | None, static: Int8 | None) -> dict[str, dict]:
    """:func:`usability` of every ids-in graph built, by variant name (fp32, int8, int8_static): run beside the
    ExecuTorch lowering, before the recommended graph is chosen (:func:`check_bundle` picks from it)."""
    graphs = {
        "fp32": shipped.fp32_path,
        "int8": int8.path if int8 else None,
        "int8_static": static.path if static else None,
    }
    pair_rows = getattr(shipped.model.config, "token_pairs", 0)
    return {name: usability(path, shipped.facts["vocab_size"], pair_rows) for name, path in graphs.items() if path}


def check_bundle(found: dict[str, dict], recommended: str) -> dict:
    """ONNX Runtime's mobile usability checker on the recommended graph, and on fp32 and static QDQ int8 beside it:
    NNAPI and CoreML partitions, dynamic shapes, CoreML's dimension limit against the vocabulary (:func:`usability`,
    each graph's findings in ``found`` from :func:`usability_of_graphs`)."""
    result = {"shipped": found[recommended]}
    if recommended != "fp32":
        result["fp32"] = found["fp32"]
    static = "int8_static" in found
    if static:
        result["static_qdq_int8"] = {"built": True, **found["int8_static"]}
    else:
        result["static_qdq_int8"] = {"built": False, "why": "export.static_int8 or export.quantize is off"}
    verdicts = {name: p["verdict_with_fixed_shapes"] for name, p in result["shipped"]["providers"].items()}
    log.info(
        "[export] mobile usability (%s): %s; %s",
        result["shipped"]["model"],
        ", ".join(f"{name} {verdict}" for name, verdict in verdicts.items()),
        result["shipped"]["recommendation"],
    )
    if static and recommended != "int8_static":
        fixed = {name: p["verdict_with_fixed_shapes"] for name, p in result["static_qdq_int8"]["providers"].items()}
        log.info(
            "[export] mobile usability (%s): %s",
            found["int8_static"]["model"],
            ", ".join(f"{n} {v}" for n, v in fixed.items()),
        )
    return result
