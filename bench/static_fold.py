"""The static student's head folded into its tables (StaticEmbeddingForSequenceClassification.fold_classifier, what
the export ships since 2026-12-05) against the same student unfolded: file size, logits and time per text of the
ids-in ONNX graph, fp32, one text per call on one thread, the two graphs interleaved.

    python bench/static_fold.py runs/clothing/sweeps/static_balanced/balanced_bigrams_s42 \
        [--texts 300] [--out bench/results/static_fold_clothing.md]

Reads the run folder's trained student (distill/student) and test split (prepare/test.jsonl, tokenized with the
student's tokenizer.json as predict.py does, cut at the config's max_length); exports both graphs with the
pipeline's exporter into a temporary folder. The text-in model's tokenizer operators are the same for both and are
not timed here (the export's from-raw-text table times the whole model beside fastText).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, emit  # (also puts the repository on the path)

from pipeline.export.onnx_graph import OUTPUT_NAMES, LogitsOnly, export_onnx, ort_session
from pipeline.models import load_classifier
from pipeline.timing import interleaved


def test_ids(run: Path) -> tuple[list[np.ndarray], np.ndarray]:
    max_length = yaml.safe_load((run / "config.yaml").read_text())["data"]["max_length"]
    tokenizer = Tokenizer.from_file(str(run / "distill" / "student" / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    records = [json.loads(line) for line in (run / "prepare" / "test.jsonl").read_text().splitlines() if line]
    ids = [np.array([tokenizer.encode(r["text"]).ids], dtype=np.int64) for r in records]
    return ids, np.array([len(i[0]) for i in ids])


def one_text(session):
    """ids [1, length] -> logits, as predict.py calls the ids-in graph (no padding: the mask is all ones)."""
    return lambda ids: session.run(OUTPUT_NAMES, {"input_ids": ids, "attention_mask": np.ones_like(ids)})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder whose student is static (runs/<config>[/sweeps/...])")
    parser.add_argument("--texts", type=int, default=300, help="test texts timed (all of them are compared)")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args(argv)
    model = load_classifier(str(args.run / "distill" / "student")).eval()
    if not hasattr(model, "fold_classifier"):
        parser.error(f"{args.run}/distill/student is not a static student (model_type {model.config.model_type})")
    ids, lengths = test_ids(args.run)
    with tempfile.TemporaryDirectory() as folder:
        paths = {"unfolded": Path(folder) / "unfolded.onnx", "folded": Path(folder) / "folded.onnx"}
        export_onnx(LogitsOnly(model), paths["unfolded"], 18)
        hidden = model.embeddings.embedding_dim
        model.fold_classifier()
        export_onnx(LogitsOnly(model), paths["folded"], 18)
        sessions = {name: ort_session(path, threads=1) for name, path in paths.items()}
        runners = {name: one_text(session) for name, session in sessions.items()}
        logits = {name: np.concatenate([run(x)[0] for x in ids]) for name, run in runners.items()}
        sizes = {name: path.stat().st_size / 1e6 for name, path in paths.items()}
        timed = ids[: args.texts]
        result = interleaved(runners, {name: timed for name in runners}, reference="unfolded", min_rounds=8)
    diff = float(np.abs(logits["folded"] - logits["unfolded"]).max())
    agree = float((logits["folded"].argmax(-1) == logits["unfolded"].argmax(-1)).mean())
    lines = [
        f"# The static student's head folded into its tables: {args.run}",
        "",
        f"Student: {hidden}-dimensional tables, {model.config.vocab_size} tokens, "
        f"{model.config.bigram_buckets or 'no'} bigram buckets, {model.config.num_labels} labels. "
        f"Test split: {len(ids)} texts (mean {lengths.mean():.1f} tokens); {len(timed)} timed, one text per call, "
        f"fp32 ids-in graph, ONNX Runtime on one thread, {result['folded']['rounds']} interleaved rounds.",
        "",
        "| ids-in graph | table columns | MB | ms per text, median of rounds (min-max) | speed-up (95% interval) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, columns in (("unfolded", hidden), ("folded", model.config.num_labels)):
        r = result[name]
        speed = "-" if name == "unfolded" else f"{r['speedup']:.2f}x ({r['speedup_low']:.2f}-{r['speedup_high']:.2f})"
        lines.append(
            f"| {name} | {columns} | {sizes[name]:.2f} | {r['median_ms']:.4f} ({r['min_ms']:.4f}-{r['max_ms']:.4f}) "
            f"| {speed} |"
        )
    lines += [
        "",
        f"Logits of the two graphs on all {len(ids)} test texts: max abs difference {diff:.1e}, "
        f"predictions agree on {agree:.2%}.",
    ]
    emit(lines, args.out, command=command_line("bench/static_fold.py", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
