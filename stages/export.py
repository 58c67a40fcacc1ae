"""Stage 6, export: the student as ONNX for mobile, checked against PyTorch.

Single-file ONNX (no external data) with dynamic batch and sequence axes,
parity against PyTorch on the whole test split (fails above
export.parity_tolerance), int8 dynamic quantization (per-channel weights) with
its accuracy measured, and the model registered in MLflow.

Outputs: model.onnx, model.int8.onnx, export.json.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import torch

from pipeline.errors import PipelineError
from pipeline.inference import TokenizedSplit, accuracy, label_names, pad_id
from pipeline.models import load_classifier
from pipeline.runner import write_json

log = logging.getLogger("pipeline")

READS = ["export"]
AFTER = ["prepare", "distill"]
VERSION = 1


class LogitsOnly(torch.nn.Module):
    """ONNX graph signature: (input_ids, attention_mask) -> logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def export_onnx(model, path, opset: int) -> None:
    example = (torch.ones(2, 16, dtype=torch.long), torch.ones(2, 16, dtype=torch.long))  # length 1 fails to export
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # raised inside torch.onnx on this version
        warnings.filterwarnings("ignore", message=".*axis name.*will not be used")  # dynamo's Dim renaming note
        torch.onnx.export(LogitsOnly(model).eval(), example, str(path), dynamo=True, opset_version=opset,
                          input_names=["input_ids", "attention_mask"], output_names=["logits"],
                          dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
                          external_data=False, optimize=True, verbose=False)


def onnx_logits(path, split: TokenizedSplit, pad: int, batch_size: int = 64) -> np.ndarray:
    import onnxruntime as ort

    from pipeline.data import pad_batch

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    out = np.zeros((len(split), 0), dtype=np.float32)
    parts = []
    for start in range(0, len(split), batch_size):
        ids, mask = pad_batch(split.input_ids[start:start + batch_size], pad)
        parts.append(session.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0])
    out = np.concatenate(parts)
    return out


@torch.no_grad()
def torch_logits(model, split: TokenizedSplit, pad: int, batch_size: int = 64) -> np.ndarray:
    from pipeline.data import pad_batch

    parts = []
    for start in range(0, len(split), batch_size):
        ids, mask = pad_batch(split.input_ids[start:start + batch_size], pad)
        parts.append(model(input_ids=ids, attention_mask=mask).logits.float().numpy())
    return np.concatenate(parts)


def run(ctx) -> dict:
    if not ctx.is_main:  # export and registration happen once
        return {}
    from onnxruntime.quantization import QuantType, quantize_dynamic

    config = ctx.config
    prepare, distill_dir = ctx.input("prepare"), ctx.input("distill")
    pad = pad_id(prepare)
    test = TokenizedSplit(prepare, "test")
    student = load_classifier(str(distill_dir / "student"), attn_implementation="eager").eval()
    onnx_path = ctx.out / "model.onnx"
    export_onnx(student, onnx_path, config.export.opset)
    reference = torch_logits(student, test, pad)
    exported = onnx_logits(onnx_path, test, pad)
    max_diff = float(np.abs(reference - exported).max())
    agreement = float((reference.argmax(-1) == exported.argmax(-1)).mean())
    if max_diff > config.export.parity_tolerance:
        raise PipelineError(
            f"ONNX parity check failed: max |logit difference| {max_diff:.2e} on the test split is above "
            f"export.parity_tolerance={config.export.parity_tolerance} (prediction agreement {agreement:.4f})."
        )
    summary = {"opset": config.export.opset, "parity_max_abs_diff": max_diff, "parity_agreement": agreement,
               "fp32_accuracy": accuracy(exported, test.labels), "fp32_mb": onnx_path.stat().st_size / 1e6}
    if config.export.quantize:
        int8_path = ctx.out / "model.int8.onnx"
        quantize_dynamic(str(onnx_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"])
        int8 = onnx_logits(int8_path, test, pad)
        summary.update({"int8_accuracy": accuracy(int8, test.labels), "int8_mb": int8_path.stat().st_size / 1e6})
        summary["int8_drop_points"] = 100 * (summary["fp32_accuracy"] - summary["int8_accuracy"])
    write_json(ctx.out / "export.json", summary)
    ctx.tracker.log_metrics(summary)
    ctx.tracker.log_artifact(onnx_path, "onnx")
    log.info("[export] ONNX parity max diff %.2e, agreement %.4f; fp32 acc %.4f%s", max_diff, agreement,
             summary["fp32_accuracy"], f", int8 acc {summary['int8_accuracy']:.4f}" if config.export.quantize else "")
    return summary
