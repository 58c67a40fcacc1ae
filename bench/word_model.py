"""The static student's word model (model.words.onnx, pipeline/export/word_model.py) against its text-in model
(model.text.onnx: the tokenizer operators in front of the shipped graph) and the run's peers (fastText, the fastest,
which the speed target is set against; TF-IDF + logistic regression; model2vec's classifier): accuracy and macro-F1
on every test text and time per text from raw text, one text per call on one thread, all interleaved over the same
test texts; and where the word model's time goes: the share of test texts on each of its routes and its time on
each. The int8 teacher is not here: the export keeps no copy of it (the export's own from-raw-text table in
metadata.json has it beside these).

    python bench/word_model.py runs/clothing/sweeps/static_balanced_export/balanced_bigrams_s42 [RUN ...] \
        [--texts 300] [--out bench/results/word_model.md]

A RUN is a run folder whose export built a word model (a static student, export VERSION >= 12): its bundle, its
peers stage's fastText model and its test split are read. Routes: every word in the table and the text within
max_length (one Gather and a sum); a word outside the table (WordpieceTokenizer on those words); longer than
max_length - 2 pieces (the piece route, cut as predict.py cuts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, emit  # (also puts the repository on the path)

from pipeline.export import text_model, word_model
from pipeline.export.from_text import text_model_runner, word_model_runner
from pipeline.export.tokenizer import tokenize_texts, tokenizer_facts
from pipeline.peers import PEERS, TITLES, load_peer
from pipeline.timing import interleaved

ROUTES = ("words in the table", "a word outside the table", "cut at max_length")


def table_words(path: Path) -> list[str]:
    """The words summed at export: the keys of the word model's word lookup."""
    lookup = next(n for n in onnx.load(str(path)).graph.node if n.name == "w_word_id")  # one text per call: no Scan
    return [k.decode() for a in lookup.attribute if a.name == "keys_strings" for k in a.strings]


def routes(bundle: Path, texts: list[str], max_length: int) -> list[str]:
    """Which route of the word model each text takes (module docstring)."""
    tokenizer_json = bundle / "tokenizer.json"
    facts = tokenizer_facts(tokenizer_json)
    lowercase, strip = text_model.casing(facts)
    fixes = text_model.normalization_fixes(tokenizer_json, lowercase, strip)
    known = set(table_words(bundle / word_model.FILE))
    words = text_model._basic_tokenizer_words(texts, lowercase, strip, fixes)
    pieces = [len(ids) for ids in tokenize_texts(tokenizer_json, texts, 100_000)]
    return [
        ROUTES[2] if n > max_length else ROUTES[0] if all(w in known for w in line.split(" ") if w) else ROUTES[1]
        for line, n in zip(words, pieces)
    ]


def per_route_ms(run, texts: list[str], taken: list[str], repeat: int = 5) -> dict[str, float]:
    """Mean ms per text of ``run`` on each route's texts (best of ``repeat`` passes)."""
    out = {}
    for route in ROUTES:
        chosen = [t for t, r in zip(texts, taken) if r == route]
        if not chosen:
            continue
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            for text in chosen:
                run(text)
            best = min(best, (time.perf_counter() - start) / len(chosen) * 1e3)
        out[route] = best
    return out


def measure_run(run: Path, sample_size: int) -> list[str]:
    bundle = run / "export" / "bundle"
    if not (bundle / word_model.FILE).is_file():
        raise SystemExit(f"{bundle} has no {word_model.FILE}: export a static student with export VERSION >= 12")
    metadata = json.loads((bundle / "metadata.json").read_text())
    max_length = metadata["text_model"]["truncation"]
    records = [json.loads(line) for line in (run / "prepare" / "test.jsonl").read_text().splitlines() if line]
    texts = [r["text"] for r in records]
    taken = routes(bundle, texts, max_length)
    peers = json.loads((run / "peers" / "peers.json").read_text())["peers"]  # accuracy measured one text per call
    runners = {
        "model.text.onnx": text_model_runner(bundle / "model.text.onnx"),
        word_model.FILE: word_model_runner(bundle / word_model.FILE),
        **{TITLES[name]: load_peer(run / "peers" / "models", name).predict_one for name in PEERS if name in peers},
    }
    student = metadata["from_text"]["rows"]  # the export's one-text-per-call accuracy of both student rows
    quality = {row["model"]: row for row in student}
    quality = {
        "model.text.onnx": quality["student"],
        word_model.FILE: quality["student_words"],
        **{TITLES[name]: peers[name] for name in PEERS if name in peers},
    }
    sample = [texts[i] for i in np.random.default_rng(0).permutation(len(texts))[:sample_size]]
    fasttext = TITLES["fasttext"]
    timed = interleaved(runners, {name: sample for name in runners}, reference=fasttext, min_rounds=10)
    share = {route: taken.count(route) / len(texts) for route in ROUTES}
    by_route = per_route_ms(runners[word_model.FILE], texts, taken)
    words = metadata["word_model"]
    lines = [
        f"## {run}",
        "",
        f"{len(texts)} test texts (mean {np.mean([len(t.split()) for t in texts]):.0f} words), {len(sample)} timed, "
        f"one text per call, one thread, {timed[fasttext]['rounds']} interleaved rounds; the word model's table: "
        f"{words['words_in_table']} words, {words['file_mb']} MB.",
        "",
        "| model | accuracy | macro-F1 | ms per text, median of rounds (min-max) | time over fastText's (95% interval) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in timed.items():
        ratio = (
            "1"
            if name == fasttext
            else f"{1 / r['speedup']:.2f}x ({1 / r['speedup_high']:.2f}-{1 / r['speedup_low']:.2f})"
        )
        q = quality[name]
        lines.append(
            f"| {name} | {q['accuracy']:.4f} | {q['macro_f1']:.4f} | {r['median_ms']:.4f} "
            f"({r['min_ms']:.4f}-{r['max_ms']:.4f}) | {ratio} |"
        )
    lines += [
        "",
        "| word model route | share of test texts | ms per text on them (best of 5 passes) |",
        "|---|---:|---:|",
    ]
    lines += [f"| {route} | {share[route]:.1%} | {by_route.get(route, float('nan')):.4f} |" for route in ROUTES]
    return lines + [""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="run folders whose static student has a word model")
    parser.add_argument("--texts", type=int, default=300, help="test texts timed per run (routes: all of them)")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    lines = ["# The static student's word model against its text-in model and the peers, from raw text", ""]
    for run in args.runs:
        lines += measure_run(run, args.texts)
    emit(lines, args.out, command=command_line("bench/word_model.py", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
