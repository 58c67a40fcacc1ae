"""Models measured the way an app calls them: one raw text in, one label out, one text per call.

The export puts the shipped student, the int8 teacher and the peers (pipeline/peers.py) through the same
harness: every test text once for accuracy and macro-F1 (the figure measured on token ids where tokenizer.json
gives every test text those same ids: measure_bundle), then the same sample of test texts timed on one
thread in interleaved rounds (timing.interleaved), so tokenization, featurization and the runtime's
per-call cost are all inside each figure and machine load hits every model alike.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from .. import timing
from ..metrics import classification_report
from ..peers import TITLES, load_peer
from . import text_model
from .onnx_graph import OUTPUT_NAMES, ort_session
from .tokenizer import same_rows, tokenize_texts
from .variants import Inputs, Int8, Shipped, Teacher, recommended_graph

log = logging.getLogger("pipeline")


def text_model_runner(path, threads: int = 1):
    """A text-in ONNX model (tokenizer operators inside): text -> label index."""
    session = text_model.session(path, threads)
    return lambda text: int(session.run(["label"], {text_model.TEXT_INPUT: np.array([text], dtype=object)})[0][0])


def word_model_runner(path, threads: int = 1):
    """The static student's word model (word_model.py): text -> label index."""
    session = text_model.session(path, threads)
    return lambda text: int(session.run(["label"], {text_model.TEXT_INPUT: np.array([text], dtype=object)})[0][0])


def tokenizer_runner(tokenizer_json, onnx_path, max_length: int, threads: int = 1):
    """tokenizers (as predict.py uses it) + an ids-in ONNX graph: text -> label index."""
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    session = ort_session(onnx_path, threads)

    def run(text: str) -> int:
        ids = tokenizer.encode(text).ids
        feeds = {
            "input_ids": np.asarray([ids], dtype=np.int64),
            "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
        }
        return int(session.run(OUTPUT_NAMES, feeds)[0][0].argmax())

    return run


def same_ids(tokenizer_json: Path, texts: list[str], max_length: int, split) -> bool:
    """Whether ``tokenizer_json`` (as the bundle's tokenizer runs it) gives every text the ids ``split`` holds."""
    return same_rows(tokenize_texts(tokenizer_json, texts, max_length), split.input_ids)


def measure(
    runners: dict,
    texts: list[str],
    labels: np.ndarray,
    names: list[str],
    sample: list[int],
    cfg,
    known: dict | None = None,
    reference: str | None = None,
    watch: list[str] | None = None,
) -> dict:
    """Per model: test accuracy and macro-F1 one text per call (``known[name]`` where an earlier stage already
    measured them that way: the peers), and latency over ``sample`` (timing.interleaved: median ms per text,
    the interquartile range of single calls, and the paired speed-up over ``reference`` with its interval; rounds
    are added until the intervals of the models in ``watch``, default all, are narrow)."""
    known = known or {}
    rows = {}
    for name, run in runners.items():
        if name in known:
            rows[name] = {"accuracy": known[name]["accuracy"], "macro_f1": known[name]["macro_f1"]}
            continue
        report = classification_report(labels, np.array([run(t) for t in texts], dtype=np.int64), names)
        rows[name] = {"accuracy": report["accuracy"], "macro_f1": report["macro_f1"]}
    timed = timing.interleaved(
        runners,
        {name: [texts[i] for i in sample] for name in runners},
        warmup=1,
        min_rounds=cfg.latency_rounds,
        max_rounds=cfg.latency_max_rounds,
        reference=reference,
        max_spread=cfg.latency_max_spread,
        watch=watch,
    )
    for name, figures in timed.items():
        rows[name].update({k: round(v, 5) if isinstance(v, float) else v for k, v in figures.items()})
    return rows


def comparison(rows: dict, peers: dict, student: str, teacher: str) -> dict:
    """The student against the peers: accuracy margin over the most accurate one, macro-F1 margin over the one with
    the best macro-F1 (a peer that misses the minority class can lead on accuracy alone), latency against the
    fastest."""
    best = max(peers, key=lambda p: rows[p]["accuracy"])
    best_f1 = max(peers, key=lambda p: rows[p]["macro_f1"])
    fastest = min(peers, key=lambda p: rows[p]["median_ms"])
    s = rows[student]
    return {
        "student_row": student,
        "best_peer": best,
        "best_peer_title": TITLES[best],
        "best_peer_accuracy": rows[best]["accuracy"],
        "accuracy_margin_points": round(100 * (s["accuracy"] - rows[best]["accuracy"]), 2),
        "best_macro_f1_peer": best_f1,
        "best_macro_f1_peer_title": TITLES[best_f1],
        "best_peer_macro_f1": rows[best_f1]["macro_f1"],
        "macro_f1_margin_points": round(100 * (s["macro_f1"] - rows[best_f1]["macro_f1"]), 2),
        "fastest_peer": fastest,
        "fastest_peer_title": TITLES[fastest],
        "fastest_peer_ms": rows[fastest]["median_ms"],
        "latency_vs_fastest_peer": round(s["median_ms"] / rows[fastest]["median_ms"], 2),
        "student_ms": s["median_ms"],
        "teacher_int8_ms": rows[teacher]["median_ms"] if teacher in rows else None,
    }


def lines(from_text: dict) -> list[str]:
    """Plain-text table lines (end-of-run summary, logs): every model from raw text, one text per call."""
    out = [
        f"from raw text, one text per call ({from_text['threads']} thread; accuracy on all {from_text['examples']} "
        f"test texts, latency the median over {from_text['timed_texts']} of them):",
        f"  {'model':<56} {'accuracy':>9} {'macro-F1':>9} {'size MB':>8} {'ms/text':>9} {'train s':>8}",
    ]
    for row in from_text["rows"]:
        train = f"{row['train_seconds']:.0f}" if row.get("train_seconds") is not None else "-"
        out.append(
            f"  {row['title']:<56} {row['accuracy']:>9.4f} {row['macro_f1']:>9.4f} {row['file_mb']:>8.1f} "
            f"{row['median_ms']:>9.3f} {train:>8}"
        )
    c = from_text.get("versus_peers")
    if c:
        out.append(
            f"  student vs best peer ({c['best_peer']} {c['best_peer_accuracy']:.4f}): "
            f"{c['accuracy_margin_points']:+.2f} points; latency {c['latency_vs_fastest_peer']:.2f}x the fastest "
            f"peer's ({c['fastest_peer']} {c['fastest_peer_ms']:.3f} ms)"
        )
        if "macro_f1_margin_points" in c:  # metrics.json files written before it lack it
            out.append(
                f"  student vs best peer by macro-F1 ({c['best_macro_f1_peer']} {c['best_peer_macro_f1']:.4f}): "
                f"{c['macro_f1_margin_points']:+.2f} points"
            )
    for name, why in (from_text.get("skipped_peers") or {}).items():  # the peers stage could not train it
        out.append(f"  {name} skipped: {why}")
    return out


def markdown(from_text: dict) -> str:
    """The same table as markdown (bundle README, BENCHMARKS)."""
    rows = [
        "| model | accuracy | macro-F1 | file MB | ms per text | middle half of calls, ms | speed-up vs int8 teacher "
        "(95% interval) | training s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in from_text["rows"]:
        train = f"{row['train_seconds']:.0f}" if row.get("train_seconds") is not None else "-"
        rows.append(
            f"| {row['title']} | {row['accuracy']:.4f} | {row['macro_f1']:.4f} | {row['file_mb']:.1f} | "
            f"{row['median_ms']:.3f} | {_calls(row)} | {_speedup(row)} | {train} |"
        )
    return "\n".join(rows)


def _calls(row: dict) -> str:
    return f"{row['p25_ms']:.3f}-{row['p75_ms']:.3f}" if row.get("p25_ms") is not None else "-"


def _speedup(row: dict) -> str:
    if row.get("speedup") is None:
        return "-"
    return f"{row['speedup']:.2f}x ({row['speedup_low']:.2f}-{row['speedup_high']:.2f})"


def measure_bundle(
    peers_dir: Path,
    seed: int,
    cfg,
    inputs: Inputs,
    shipped: Shipped,
    int8: Int8 | None,
    static: Int8 | None,
    teacher: Teacher,
    text: dict,
    recommended: str,
    out: Path,
    words: dict | None = None,
    word_labels: np.ndarray | None = None,
) -> dict:
    """The shipped student, the int8 teacher and the peers (``peers_dir``, the peers stage's folder) from raw text,
    one text per call (:func:`measure`): accuracy on every test text (the peers' from the peers stage, which measured it
    the same way), latency on one thread over the same sampled texts, speed-ups paired against the int8 teacher.
    ``words``: a static student's word model (word_model.ship); when shipped it is timed too, and it is the student
    the peers are compared with (the route an app takes for that student); its accuracy is that of ``word_labels``,
    its labels one text per call from its export check."""
    recorded = json.loads((peers_dir / "peers.json").read_text())
    if not recorded["enabled"]:
        return {"measured": False, "why": "peers.enabled is false"}
    if inputs.segments:
        return {"measured": False, "why": "sentence pairs: the peers read one bag of words, not compared"}
    records = inputs.test_records
    texts = [r["text"] for r in records]
    index = {name: i for i, name in enumerate(inputs.names)}
    labels = np.array([index[str(r["label"])] for r in records], dtype=np.int64)
    classifier, _ = recommended_graph(shipped, int8, static, recommended)
    student = (
        text_model_runner(out / text["file"])
        if text["shipped"]
        else tokenizer_runner(shipped.tokenizer_json, classifier, inputs.max_length)
    )
    runners = {"student": student}
    if words and words["shipped"]:
        runners["student_words"] = word_model_runner(out / words["file"])
    teacher_graph = teacher.int8 or teacher.onnx
    teacher_name = "teacher_int8" if teacher.int8 else "teacher_fp32"
    runners[teacher_name] = tokenizer_runner(inputs.student / "tokenizer.json", teacher_graph, inputs.max_length)
    peers = recorded["peers"]
    for name in peers:
        runners[name] = load_peer(peers_dir / "models", name).predict_one
    sample = np.random.default_rng(seed).permutation(len(texts))[: max(1, cfg.latency_sentences)].tolist()
    log.info(
        "[export] from raw text, one text per call: %s on %d test texts, timed on %d",
        ", ".join(runners),
        len(texts),
        len(sample),
    )
    # The peers' accuracy is the peers stage's (measured one text per call there). The student's and the int8
    # teacher's is the one the export measured on token ids wherever tokenizer.json gives every test text exactly those
    # ids: the same graph on the same ids answers the same (the text-in model is only shipped when it reproduces
    # predict.py's ids and predictions on every test text). Where the ids differ, it is measured again here.
    known = dict(peers)
    chosen = {"fp32": shipped.fp32, "int8": int8 and int8.metrics, "int8_static": static and static.metrics}
    if chosen.get(recommended) and same_ids(shipped.tokenizer_json, texts, inputs.max_length, shipped.test):
        known["student"] = chosen[recommended]
    if (
        teacher.int8
        and teacher.baseline
        and same_ids(inputs.student / "tokenizer.json", texts, inputs.max_length, inputs.test)
    ):
        known[teacher_name] = teacher.baseline
    reused = [name for name in ("student", teacher_name) if name in known]
    if "student_words" in runners and word_labels is not None:  # measured one text per call by word_model.ship
        report = classification_report(labels, np.asarray(word_labels, dtype=np.int64), inputs.names)
        known["student_words"] = {"accuracy": report["accuracy"], "macro_f1": report["macro_f1"]}
    # rounds are added until the student's speed-up is narrow (a microsecond peer's ratio is noisy, and not the claim)
    student_rows: list[str] = [name for name in ("student", "student_words") if name in runners]
    measured = measure(
        runners, texts, labels, inputs.names, sample, cfg, known=known, reference=teacher_name, watch=student_rows
    )
    kind = (
        "static" if shipped.model.config.num_hidden_layers == 0 else f"{shipped.model.config.num_hidden_layers}-layer"
    )
    titles = {
        "student": f"student ({kind}, {recommended}{', text-in model' if text['shipped'] else ''})",
        "student_words": f"student ({kind}, fp32 word model)",
        "teacher_int8": "teacher ONNX int8 + tokenizer",
        "teacher_fp32": "teacher ONNX fp32 + tokenizer",
    }
    files = {"student": os.path.getsize(classifier) / 1e6, teacher_name: os.path.getsize(teacher_graph) / 1e6}
    if "student_words" in runners:
        files["student_words"] = os.path.getsize(out / words["file"]) / 1e6  # type: ignore[index]  # shipped above
    rows = []
    for name, figures in measured.items():
        peer = peers.get(name)
        rows.append(
            {
                "model": name,
                "title": peer["title"] if peer else titles[name],
                "kind": "peer" if peer else name.split("_")[0],  # student_words: a student row too
                "file_mb": peer["file_mb"] if peer else round(files[name], 3),
                "train_seconds": peer["train_seconds"] if peer else None,
                **figures,
            }
        )
    result = {
        "measured": True,
        "threads": 1,
        "examples": len(texts),
        "timed_texts": len(sample),
        "rows": rows,
        "accuracy_from_token_ids": reused,  # these rows' accuracy: the ids-in figures, the ids being identical
        "versus_peers": comparison(measured, peers, student_rows[-1], "teacher_int8") if peers else None,
        **({"skipped_peers": recorded["skipped"]} if recorded.get("skipped") else {}),
    }
    for line in lines(result):
        log.info("[export] %s", line)
    return result
