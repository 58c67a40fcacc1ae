"""One-off probe behind the README figure on ONNX Runtime offline fusions: random-weight teacher and students,
exported and int8-quantized as the export stage does, with and without onnxruntime.transformers.optimizer;
latency at L=128 / L=27, batch 1, 1 thread.  Run: python bench/probes/fusion.py (writes into /tmp/fuse)."""

import argparse
import logging
import os
import statistics
import sys
import time

argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
).parse_args()  # --help
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.makedirs("/tmp/fuse", exist_ok=True)
logging.disable(logging.WARNING)
import numpy as np
import torch
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers import optimizer
from transformers import BertConfig, BertForSequenceClassification

from pipeline.export.latency import latency_inputs
from pipeline.export.onnx_graph import LogitsOnly, export_onnx, ort_session


def build(layers, ffn, vocab=12000):
    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=384,
        num_hidden_layers=layers,
        num_attention_heads=12,
        intermediate_size=ffn,
        num_labels=2,
    )
    m = BertForSequenceClassification(cfg).eval()
    m.set_attn_implementation("eager")
    return m


out = {}
for name, (L, F, V) in {"teacher": (6, 1536, 30522), "s3_384": (3, 384, 12000), "s2_1536": (2, 1536, 12000)}.items():
    p = f"/tmp/fuse/{name}.onnx"
    torch.manual_seed(0)
    export_onnx(LogitsOnly(build(L, F, V)), p, 18)
    q = f"/tmp/fuse/{name}.int8.onnx"
    quantize_dynamic(p, q, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul", "Gather"])
    files = {"fp32": p, "int8": q}
    try:
        opt = optimizer.optimize_model(p, model_type="bert", num_heads=12, hidden_size=384, opt_level=1)
        print(name, "fusion stats", opt.get_fused_operator_statistics())
        fp = f"/tmp/fuse/{name}.fused.onnx"
        opt.save_model_to_file(fp)
        files["fused fp32"] = fp
        fq = f"/tmp/fuse/{name}.fused.int8.onnx"
        try:
            quantize_dynamic(
                fp,
                fq,
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul", "Gather", "Attention"],
            )
            files["fused int8"] = fq
        except Exception as e:
            print(name, "quantize fused failed:", type(e).__name__, str(e)[:200])
    except Exception as e:
        print(name, "fusion failed", type(e).__name__, str(e)[:300])
    out[name] = files

inp = latency_inputs(128, 12000, 101, 102)
short = latency_inputs(27, 12000, 101, 102)
sess = {(n, k): ort_session(f, 1) for n, fs in out.items() for k, f in fs.items()}
res = {k: {"128": [], "27": []} for k in sess}
for _round in range(5):
    for k, s in sess.items():
        for _ in range(2):
            s.run(None, inp)
        t = time.perf_counter()
        for _ in range(8):
            s.run(None, inp)
        res[k]["128"].append((time.perf_counter() - t) / 8 * 1000)
        t = time.perf_counter()
        for _ in range(30):
            s.run(None, short)
        res[k]["27"].append((time.perf_counter() - t) / 30 * 1000)
for k, v in res.items():
    print(k, f"L128 {statistics.median(v['128']):.2f} ms   L27 {statistics.median(v['27']):.3f} ms")
# agreement fused vs unfused
for n, fs in out.items():
    if "fused int8" in fs:
        a = ort_session(fs["int8"]).run(None, inp)[0]
        b = ort_session(fs["fused int8"]).run(None, inp)[0]
        c = ort_session(fs["fp32"]).run(None, inp)[0]
        print(n, "int8 vs fp32", np.abs(a - c).max(), "fused int8 vs fp32", np.abs(b - c).max())
