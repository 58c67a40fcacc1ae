"""Shipped students of several runs side by side, the way an app calls them: raw text in, one text per call, one
thread. Accuracy and macro-F1 on every test text of the first run, and time per text in interleaved rounds, each
paired against the first run's student (its 95% interval).

    python bench/text_latency.py runs/bert_small runs/mpnet_base/sweeps/base_phone_imdb/phone_imdb_s1 \
        [RUN ...] [--texts 300] [--out bench/results/text_latency.md]

The question it answers: does a student of another teacher fit the first run's latency budget? (Issue 39: a
student of the base teacher no slower than bert_small's shipped student, and 4 points more accurate.) Each RUN's
bundle must ship its text-in model (export/bundle/model.text.onnx: the tokenizer operators in front of the shipped
graph, what the export's own from-raw-text table times; file MB is that shipped graph's). The runs must share the
test texts (the same data split); the script stops when they do not, since accuracy and time would then be measured
on different texts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, emit  # (also puts the repository on the path)

from pipeline.export.from_text import text_model_runner
from pipeline.metrics import classification_report
from pipeline.timing import interleaved

TEXT_MODEL = "model.text.onnx"


def test_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "prepare" / "test.jsonl").read_text().splitlines() if line]


def bundle_facts(run: Path) -> dict:
    """What a row says about a run's shipped student: the graph behind its text-in model, that graph's file size and
    the test accuracy the export recorded for it on token ids (the text-in model is only shipped where it gives the
    same ids and labels as predict.py on every test text, so the figure measured here must equal it)."""
    bundle = run / "export" / "bundle"
    if not (bundle / TEXT_MODEL).is_file():
        raise SystemExit(
            f"{run}: no {bundle / TEXT_MODEL}. Expected a run folder whose export stage shipped a text-in model "
            "(a transformer or static student exported on a single-text data set); run its export first."
        )
    metrics = json.loads((run / "export" / "metrics.json").read_text())
    shipped = metrics[f"onnx_{metrics['recommended']}"]  # onnx_fp32, onnx_int8 or onnx_int8_static
    return {"file": shipped["file"], "file_mb": shipped["file_mb"], "recorded_accuracy": shipped["accuracy"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "runs", type=Path, nargs="+", help="run folders with an exported bundle; the first is the reference"
    )
    parser.add_argument("--texts", type=int, default=300, help="test texts timed (accuracy: all of them)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds at least (more until narrow)")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    if len(set(args.runs)) != len(args.runs):
        raise SystemExit("each run folder once: a run timed against itself says nothing")

    records = test_records(args.runs[0])
    texts = [r["text"] for r in records]
    for run in args.runs[1:]:
        if [r["text"] for r in test_records(run)] != texts:
            raise SystemExit(
                f"{run} has other test texts than {args.runs[0]}: its accuracy and time would not be comparable. "
                "Give runs of one data split (the same data section and seed)."
            )
    names = sorted({str(r["label"]) for r in records})
    labels = np.array([names.index(str(r["label"])) for r in records], dtype=np.int64)

    facts = {str(run): bundle_facts(run) for run in args.runs}
    runners = {str(run): text_model_runner(run / "export" / "bundle" / TEXT_MODEL) for run in args.runs}
    quality = {}
    for name, run_text in runners.items():
        # the label names are each bundle's own: map its predicted index back through its labels.json
        bundle_names = json.loads((Path(name) / "export" / "bundle" / "labels.json").read_text())  # {"0": "fresh"}
        predicted = np.array([names.index(bundle_names[str(run_text(t))]) for t in texts], dtype=np.int64)
        quality[name] = classification_report(labels, predicted, names)

    sample = [texts[i] for i in np.random.default_rng(0).permutation(len(texts))[: args.texts]]
    reference = str(args.runs[0])
    timed = interleaved(
        runners, {name: sample for name in runners}, reference=reference, min_rounds=args.rounds, max_rounds=60
    )

    lines = [
        "# Shipped students from raw text, one text per call, side by side",
        "",
        f"{len(texts)} test texts (accuracy), {len(sample)} of them timed on one thread in "
        f"{timed[reference]['rounds']} interleaved rounds; time relative to the first run's student, the median of "
        "per-round ratios with its 95% interval.",
        "",
        "| run | shipped graph | file MB | accuracy | macro-F1 | points over the first | ms per text, median (min-max) "
        "| time over the first's (95% interval) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    first = quality[reference]["accuracy"]
    for name, r in timed.items():
        q, f = quality[name], facts[name]
        ratio = (
            "1"
            if name == reference
            else f"{1 / r['speedup']:.2f}x ({1 / r['speedup_high']:.2f}-{1 / r['speedup_low']:.2f})"
        )
        points = "-" if name == reference else f"{100 * (q['accuracy'] - first):+.2f}"
        lines.append(
            f"| {name} | {f['file']} | {f['file_mb']:.1f} | {q['accuracy']:.4f} | {q['macro_f1']:.4f} | {points} "
            f"| {r['median_ms']:.3f} ({r['min_ms']:.3f}-{r['max_ms']:.3f}) | {ratio} |"
        )
    recorded = [f"{name}: {f['recorded_accuracy']:.4f}" for name, f in facts.items()]
    lines += ["", "The accuracy each export recorded for its shipped graph on token ids: " + "; ".join(recorded) + "."]
    emit(lines, args.out, command=command_line("bench/text_latency.py", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
