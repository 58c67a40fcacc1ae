"""Probe: where a student's dynamic int8 loses accuracy, one text per call.

onnxruntime's quantize_dynamic scales each MatMul's input as one uint8 tensor per call (asymmetric, range including
0) and each weight per output channel (int8, symmetric). This probe (1) prints, per nn.Linear of a finished run's
student, its largest input over training texts and how far its largest input channel stands above the median
channel (activation outliers); (2) simulates that scheme exactly in PyTorch (fake quantization, float
arithmetic), per tensor and per token; (3) runs onnxruntime's own int8 graphs of the bundle's model.onnx with 8-bit
and 7-bit (reduce_range) weights on the same texts. When (2) keeps the accuracy and (3) loses it with 8-bit weights
only, the loss is the CPU kernel's arithmetic (x86 without VNNI sums uint8 x int8 products in int16 and saturates),
not the model's activations. Measured 2026-12-03 on the MPNet-base student (AVX2 only): see docs/base-teacher.md.
Run: python bench/probes/int8_activations.py runs/mpnet_base [--limit 800]"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder with prepare/, distill/ and export/ complete")
    parser.add_argument("--limit", type=int, default=0, help="test texts to use (default: all)")
    parser.add_argument("--calibration", type=int, default=256, help="training texts for the outlier table")
    args = parser.parse_args()

    import numpy as np
    import onnxruntime as ort
    import torch
    from tokenizers import Tokenizer

    from bench.common import machine_facts
    from pipeline.export.quantize import quantize_int8
    from pipeline.models import load_classifier
    from pipeline.splits import TokenizedSplit, pad_id

    torch.set_num_threads(1)
    print(machine_facts())
    prepare, bundle = args.run / "prepare", args.run / "export" / "bundle"
    pad = pad_id(prepare)
    test, train = TokenizedSplit(prepare, "test"), TokenizedSplit(prepare, "train")
    rows = range(len(test) if not args.limit else min(args.limit, len(test)))
    model = load_classifier(str(args.run / "distill" / "student"), attn_implementation="eager").eval()
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}

    absmax: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(module, inputs):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(dim=0)
            absmax[name] = x if name not in absmax else torch.maximum(absmax[name], x)

        return hook

    handles = [m.register_forward_pre_hook(record(name)) for name, m in linears.items()]
    with torch.inference_mode():
        for i in range(min(args.calibration, len(train))):
            batch = train.batch([i], pad, "cpu")  # one text, no padding
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    for handle in handles:
        handle.remove()
    print("linear | largest |input| | largest channel / median channel")
    for name, channels in absmax.items():
        print(f"{name} | {channels.max():.1f} | {float(channels.max() / channels.median().clamp(min=1e-6)):.1f}")

    def fake_input(x, per_token):
        dims = -1 if per_token else tuple(range(x.dim()))
        low = x.amin(dim=dims, keepdim=True).clamp(max=0)
        high = x.amax(dim=dims, keepdim=True).clamp(min=0)
        scale = ((high - low) / 255).clamp(min=1e-12)
        zero = torch.round(-low / scale)
        return (torch.clamp(torch.round(x / scale) + zero, 0, 255) - zero) * scale

    def fake_weight(w):  # nn.Linear weight [out, in]: one scale per output channel
        scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
        return torch.round(w / scale).clamp(-127, 127) * scale

    originals = {name: m.forward for name, m in linears.items()}

    def simulate(per_token: bool | None) -> None:
        for name, module in linears.items():
            if per_token is None:
                module.forward = originals[name]
                continue
            weight = fake_weight(module.weight.data)
            module.forward = lambda x, m=module, w=weight: torch.nn.functional.linear(
                fake_input(x, per_token), w, m.bias
            )

    def torch_accuracy() -> float:
        right = 0
        with torch.inference_mode():
            for i in rows:
                batch = test.batch([i], pad, "cpu")
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                right += int(logits.argmax(-1).item() == test.labels[i])
        return right / len(rows)

    for per_token, what in [
        (None, "fp32"),
        (False, "int8 simulated, per-tensor activations (onnxruntime's scheme)"),
        (True, "int8 simulated, per-token activations (ExecuTorch's int8 linears)"),
    ]:
        simulate(per_token)
        print(f"PyTorch {what}: {torch_accuracy():.4f} ({len(rows)} test texts)")

    tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    max_length = json.loads((bundle / "metadata.json").read_text())["max_length"]
    records = [json.loads(line) for line in (prepare / "test.jsonl").open()][: len(rows)]
    names = {v: int(k) for k, v in json.loads((bundle / "labels.json").read_text()).items()}

    def ort_accuracy(path: Path) -> float:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session, right = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), 0
        for record_ in records:
            encoding = tokenizer.encode(record_["text"])
            ids = np.array(
                [
                    encoding.ids[: max_length - 1] + encoding.ids[-1:]
                    if len(encoding.ids) > max_length
                    else encoding.ids
                ],
                dtype=np.int64,
            )
            logits = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
            right += int(logits.argmax() == names[record_["label"]])
        return right / len(records)

    print(f"onnxruntime fp32 (bundle's model.onnx): {ort_accuracy(bundle / 'model.onnx'):.4f}")
    with tempfile.TemporaryDirectory() as tmp:
        for reduce_range, bits in [(False, 8), (True, 7)]:
            path = Path(tmp) / f"int8_{bits}.onnx"
            quantize_int8(
                bundle / "model.onnx",
                path,
                {
                    "name": f"{bits}-bit",
                    "per_channel": True,
                    "reduce_range": reduce_range,
                    "op_types": ["MatMul", "Gather"],
                },
            )
            print(
                f"onnxruntime dynamic int8, {bits}-bit per-channel weights, int8 embeddings: "
                f"{ort_accuracy(path):.4f}, {path.stat().st_size / 1e6:.1f} MB"
            )


if __name__ == "__main__":
    main()
