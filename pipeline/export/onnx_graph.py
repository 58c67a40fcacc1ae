"""The student as an ONNX graph: export (dynamo, one file, dynamic batch and sequence), parity against PyTorch,
logits one text per call, and whether a graph answers the same in padded batches.

Shipped graphs have the signature ``(input_ids int64 [batch, sequence], attention_mask int64 [batch, sequence])
-> logits float32 [batch, labels]``; a sentence-pair model whose family has segment embeddings (BERT, ELECTRA)
takes a third input, ``token_type_ids int64 [batch, sequence]``.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from ..data import pad_batch, pad_segments
from ..errors import ModelError
from ..families import LAYER_SCOPE
from ..metrics import classification_report

INPUT_NAMES = ["input_ids", "attention_mask"]


SEGMENT_INPUT = "token_type_ids"  # the third input of a sentence-pair graph


OUTPUT_NAMES = ["logits"]


def input_names(segments: bool) -> list[str]:
    """The graph's inputs: input_ids, attention_mask (+ token_type_ids for sentence pairs with segment ids)."""
    return INPUT_NAMES + ([SEGMENT_INPUT] if segments else [])


def split_feeds(split, rows, pad: int) -> dict:
    """int64 numpy inputs for examples ``rows`` (indices) of a TokenizedSplit / IdSplit, right-padded to the longest;
    token_type_ids (padded with 0) when the split has them."""
    ids, mask = pad_batch([split.input_ids[int(i)] for i in rows], pad)
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    if getattr(split, "token_type_ids", None) is not None:
        segments = [split.token_type_ids[int(i)] for i in rows]
        feeds[SEGMENT_INPUT] = pad_segments(segments, ids.shape[1]).numpy()
    return feeds


def batches(split, batch_size: int):
    """Example indices to run together: one at a time in split order for ``batch_size`` 1, else batches of similar
    length (a stable sort by length), so that a batch is padded little: a third of the tokens of batches in split
    order on the default test sentences."""
    if batch_size == 1:
        return ([i] for i in range(len(split)))
    order = np.argsort(np.asarray(split.lengths), kind="stable")
    return (order[start : start + batch_size] for start in range(0, len(order), batch_size))


class _OneOutput(torch.nn.Module):
    """A HF model as a graph of (input_ids, attention_mask[, token_type_ids]) -> one output field (``FIELD``)."""

    FIELD = ""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        segments = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return getattr(self.model(input_ids=input_ids, attention_mask=attention_mask, **segments), self.FIELD)


class LogitsOnly(_OneOutput):
    """ONNX graph signature: (input_ids, attention_mask[, token_type_ids]) -> logits."""

    FIELD = "logits"


class HiddenStates(_OneOutput):
    """Feature-extractor signature: (input_ids, attention_mask[, token_type_ids]) -> last_hidden_state."""

    FIELD = "last_hidden_state"


def export_onnx(
    module: torch.nn.Module, path: Path, opset: int, output_names: list[str] | None = None, segments: bool = False
) -> None:
    """A single-file ONNX graph with dynamic batch and sequence axes (dynamo exporter).

    ``module`` takes (input_ids, attention_mask[, token_type_ids]); wrap a HF model in
    :class:`LogitsOnly` or :class:`HiddenStates`. ``segments`` adds the third input
    ``token_type_ids`` (sentence pairs for a family with segment embeddings). No
    external data file: mobile runtimes load one file.
    """
    # torch's exporter logs one warning per missing torchvision op; not ours to fix.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    example: tuple[torch.Tensor, ...] = (
        torch.ones(2, 16, dtype=torch.long),
        torch.ones(2, 16, dtype=torch.long),
    )  # length 1 fails to export
    if segments:  # a pair's second segment: ones in the second half
        example += (torch.cat([torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long)], dim=1),)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    names = input_names(segments)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # raised inside torch.onnx on this version
        warnings.filterwarnings("ignore", message=".*axis name.*will not be used")  # dynamo's Dim renaming note
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            module.eval(),
            example,
            str(path),
            dynamo=True,
            opset_version=opset,
            input_names=names,
            output_names=output_names or OUTPUT_NAMES,
            dynamic_shapes={name: {0: batch, 1: seq} for name in names},
            external_data=False,
            optimize=True,
            verbose=False,
        )
    if Path(str(path) + ".data").exists():
        raise RuntimeError(f"ONNX export of {path} wrote an external data file; the bundle needs a single file")
    # Below its native opset the exporter converts down and, when that fails, keeps
    # its own opset with only a log line: never ship a graph labelled with an opset it does not have.
    imports = {entry.domain: entry.version for entry in onnx.load(str(path), load_external_data=False).opset_import}
    written = imports.get("", imports.get("ai.onnx"))
    if written != opset:
        raise ModelError(
            f"ONNX export of {Path(path).name} wrote opset {written}, not the requested export.opset {opset} "
            f"(torch {torch.__version__} cannot write opset {opset} for this model). Set export.opset to {written} "
            "or another opset the exporter writes (18..23)."
        )


def node_scopes(model) -> dict[str, str]:
    """Node name -> the innermost torch module path that produced it (from the dynamo exporter's metadata)."""
    scopes = {}
    for node in model.graph.node:
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.name_scopes":
                try:
                    names = json.loads(prop.value.replace("'", '"'))
                except json.JSONDecodeError:
                    names = re.findall(r"'([^']*)'", prop.value)
                if names:
                    scopes[node.name] = max(names, key=len)
    return scopes


def weight_matmuls(path: Path) -> list[dict]:
    """The MatMul / Gemm nodes with a constant weight, each with its module scope and encoder layer."""
    model = onnx.load(str(path))
    constants = {init.name for init in model.graph.initializer}
    constants |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    scopes = node_scopes(model)
    found = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in constants:
            continue
        scope = scopes.get(node.name, "")
        layer = LAYER_SCOPE.search(scope)
        weight = node.input[1]
        head = any(key in scope or key in weight for key in ("pooler", "classifier"))
        found.append(
            {
                "name": node.name,
                "op": node.op_type,
                "scope": scope,
                "head": head,
                "layer": int(layer.group(1)) if layer else None,
            }
        )
    return found


def strip_node_metadata(path: Path) -> None:
    """Drop per-node exporter metadata (stack traces with build-machine paths, FX node dumps) from a shipped graph."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        del node.metadata_props[:]
    onnx.save(model, str(path))


def onnx_parameters(path: Path) -> int:
    """Elements in the graph's initializers (weights, biases, quantization scales)."""
    model = onnx.load(str(path), load_external_data=False)
    return int(sum(np.prod(init.dims, dtype=np.int64) for init in model.graph.initializer))


def ort_session(path: str | Path | bytes, threads: int | None = None, custom_ops: str | None = None):
    """A CPU onnxruntime session; ``threads`` pins one sequential pool (the way latency is measured), ``custom_ops``
    registers an operator library (onnxruntime-extensions for the text-in model)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if custom_ops:
        options.register_custom_ops_library(custom_ops)
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    else:  # a pool's idle threads would spin against the ExecuTorch lowering beside the export's accuracy runs
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = path if isinstance(path, bytes) else str(path)  # a file, or a serialized model
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def in_split_order(split, batch_size: int, run) -> np.ndarray:
    """``run(rows)`` (the logits of those examples) over the :func:`batches` of ``split``, put back in split order."""
    logits: np.ndarray | None = None
    for rows in batches(split, batch_size):
        part = run(rows)
        if logits is None:  # the shape and type of the first answer
            logits = np.empty((len(split), *part.shape[1:]), dtype=part.dtype)
        logits[rows] = part
    return logits if logits is not None else np.empty(0)


def onnx_logits(path_or_session, split, pad: int, batch_size: int = 1) -> np.ndarray:
    """Logits of an ONNX classifier for every example of a TokenizedSplit, in order (token_type_ids fed when the
    split has them: the graph must then take them).

    One example per call by default, unpadded: the way an app calls the model, and what every recorded accuracy
    means. ``batch_size`` > 1 is a speed option; dynamic int8 then scales activations over the whole padded
    batch, so its answers depend on the other texts (see :func:`batch_invariance`).

    One thread: a call of a small graph gains little from a second one, and the export lowers the ExecuTorch
    programs on the other core meanwhile."""
    if isinstance(path_or_session, (str, Path)):
        session = ort_session(path_or_session, threads=1)
    else:
        session = path_or_session
    return in_split_order(split, batch_size, lambda rows: session.run(OUTPUT_NAMES, split_feeds(split, rows, pad))[0])


def batch_invariance(path, split, pad: int, one_per_call: np.ndarray, batch_size: int = 64) -> dict:
    """Whether a graph answers the same one text per call and in padded batches of ``batch_size`` texts of similar
    length (every text in a batch with others, as an app that batches would run it): predictions changed and the
    largest logit difference (``one_per_call``: its batch-1 logits)."""
    batched = onnx_logits(path, split, pad, batch_size)
    changed = int((batched.argmax(-1) != one_per_call.argmax(-1)).sum())
    diff = float(np.abs(batched - one_per_call).max())
    return {
        "batch_size": batch_size,
        "predictions_changed": changed,
        "max_abs_logit_diff": diff,
        "invariant": changed == 0 and diff <= 1e-4,
    }


@torch.no_grad()
def torch_logits(model, split, pad: int, batch_size: int = 64) -> np.ndarray:
    """fp32 PyTorch logits, in split order, from the same batches and inputs as :func:`onnx_logits` (the parity
    reference; padding changes an fp32 answer by float noise only)."""

    def run(rows):
        feeds = split_feeds(split, rows, pad)
        return model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.float().numpy()

    return in_split_order(split, batch_size, run)


def variant_metrics(logits, reference, labels, names, path, parameters) -> dict:
    """evaluate's metric keys for one exported variant, plus agreement with the PyTorch student and file facts."""
    report = classification_report(labels, logits.argmax(-1), names)
    return {
        **report,
        "agreement_with_pytorch": float((logits.argmax(-1) == reference.argmax(-1)).mean()),
        "max_abs_logit_diff_vs_pytorch": float(np.abs(logits - reference).max()),
        "file": path.name,
        "file_mb": path.stat().st_size / 1e6,
        "parameters": parameters,
        "onnx_initializer_elements": onnx_parameters(path),
    }
