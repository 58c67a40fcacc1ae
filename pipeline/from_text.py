"""Models measured the way an app calls them: one raw text in, one label out, one text per call.

The export puts the shipped student, the int8 teacher and the peers (pipeline/peers.py) through the same
harness: every test text once for accuracy and macro-F1, then the same sample of test texts timed on one
thread in interleaved rounds (bundle.interleaved_latency), so tokenization, featurization and the runtime's
per-call cost are all inside each figure and machine load hits every model alike.
"""

from __future__ import annotations

import numpy as np

from . import bundle as B
from .metrics import classification_report
from .peers import TITLES


def _session(path, threads: int, custom_ops: str | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if custom_ops:
        options.register_custom_ops_library(custom_ops)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def text_model_runner(path, threads: int = 1):
    """A text-in ONNX model (tokenizer operators inside): text -> label index."""
    from .text_model import TEXT_INPUT, extensions_library

    session = _session(path, threads, extensions_library())
    return lambda text: int(session.run(["label"], {TEXT_INPUT: np.array([text], dtype=object)})[0][0])


def tokenizer_runner(tokenizer_json, onnx_path, max_length: int, threads: int = 1):
    """tokenizers (as predict.py uses it) + an ids-in ONNX graph: text -> label index."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    session = _session(onnx_path, threads)

    def run(text: str) -> int:
        ids = tokenizer.encode(text).ids
        feeds = {"input_ids": np.asarray([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}
        return int(session.run(B.OUTPUT_NAMES, feeds)[0][0].argmax())
    return run


def measure(runners: dict, texts: list[str], labels: np.ndarray, names: list[str], sample: list[int], rounds: int) -> dict:
    """Per model: test accuracy and macro-F1 one text per call, and the median ms per text over ``sample``."""
    rows = {}
    for name, run in runners.items():
        predictions = np.array([run(t) for t in texts], dtype=np.int64)
        report = classification_report(labels, predictions, names)
        rows[name] = {"accuracy": report["accuracy"], "macro_f1": report["macro_f1"]}
    timed = B.interleaved_latency(runners, {name: [texts[i] for i in sample] for name in runners}, runs=rounds,
                                  warmup=1, rounds=rounds)
    for name, figures in timed.items():
        rows[name].update({k: round(v, 5) if isinstance(v, float) else v for k, v in figures.items()})
    return rows


def comparison(rows: dict, peers: dict, student: str, teacher: str) -> dict:
    """The student against the peers: accuracy margin over the most accurate one, latency against the fastest."""
    best = max(peers, key=lambda p: rows[p]["accuracy"])
    fastest = min(peers, key=lambda p: rows[p]["median_ms"])
    s = rows[student]
    return {
        "best_peer": best, "best_peer_title": TITLES[best], "best_peer_accuracy": rows[best]["accuracy"],
        "accuracy_margin_points": round(100 * (s["accuracy"] - rows[best]["accuracy"]), 2),
        "fastest_peer": fastest, "fastest_peer_title": TITLES[fastest], "fastest_peer_ms": rows[fastest]["median_ms"],
        "latency_vs_fastest_peer": round(s["median_ms"] / rows[fastest]["median_ms"], 2),
        "student_ms": s["median_ms"], "teacher_int8_ms": rows[teacher]["median_ms"] if teacher in rows else None,
    }


def lines(from_text: dict) -> list[str]:
    """Plain-text table lines (end-of-run summary, logs): every model from raw text, one text per call."""
    out = [f"from raw text, one text per call ({from_text['threads']} thread; accuracy on all {from_text['examples']} "
           f"test texts, latency the median over {from_text['timed_texts']} of them):",
           f"  {'model':<56} {'accuracy':>9} {'macro-F1':>9} {'size MB':>8} {'ms/text':>9} {'train s':>8}"]
    for row in from_text["rows"]:
        train = f"{row['train_seconds']:.0f}" if row.get("train_seconds") is not None else "-"
        out.append(f"  {row['title']:<56} {row['accuracy']:>9.4f} {row['macro_f1']:>9.4f} {row['file_mb']:>8.1f} "
                   f"{row['median_ms']:>9.3f} {train:>8}")
    c = from_text.get("versus_peers")
    if c:
        out.append(f"  student vs best peer ({c['best_peer']} {c['best_peer_accuracy']:.4f}): "
                   f"{c['accuracy_margin_points']:+.2f} points; latency {c['latency_vs_fastest_peer']:.2f}x the fastest "
                   f"peer's ({c['fastest_peer']} {c['fastest_peer_ms']:.3f} ms)")
    return out


def markdown(from_text: dict) -> str:
    """The same table as markdown (bundle README, BENCHMARKS)."""
    rows = ["| model | accuracy | macro-F1 | file MB | ms per text | training s |", "|---|---:|---:|---:|---:|---:|"]
    for row in from_text["rows"]:
        train = f"{row['train_seconds']:.0f}" if row.get("train_seconds") is not None else "-"
        rows.append(f"| {row['title']} | {row['accuracy']:.4f} | {row['macro_f1']:.4f} | {row['file_mb']:.1f} | "
                    f"{row['median_ms']:.3f} | {train} |")
    return "\n".join(rows)
