"""Does reading more than ``data.max_length`` tokens pay? The run's fine-tuned teacher on the test texts that the
cut shortens, read at max_length (what teacher and students see), at longer lengths and as head + tail (the first
and last max_length/2 tokens, Sun et al. 2019's best cut for long reviews). Only the cut texts are read: every other
text gives the same tokens at every length, so the difference on them is the whole difference on the test split.

    python bench/truncation.py runs/clothing_base/sweeps/clothing_base_unlabeled/default_s42 \
        [--lengths 256 512] [--out bench/results/truncation_clothing_base.md]

A RUN is a run folder with a finished teacher stage (teacher/model, a transformers folder) and prepare stage (the
test split and labels.json); max_length is read from the run's config.yaml. Batched PyTorch, bf16 autocast where the
CPU has native bf16, fp32 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml
from transformers import AutoModelForSequenceClassification, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, emit  # (also puts the repository on the import path)

from pipeline.runner import native_bf16
from pipeline.splits import label_names


def head_and_tail(ids: list[int], length: int) -> list[int]:
    """The first length//2 and the last length - length//2 token ids of a tokenized text longer than ``length``
    (the text unchanged otherwise): the leading and trailing special tokens stay where they are."""
    half = length // 2
    return ids if len(ids) <= length else ids[:half] + ids[-(length - half) :]


def correct(model, tokenizer, texts: list[str], labels: list[int], length: int, head_tail: bool, bf16: bool) -> int:
    """How many of the texts the model gets right when it reads ``length`` tokens of each (head + tail: the first
    and last halves of that budget, the special tokens kept at both ends); bf16 autocast when ``bf16``."""
    right = 0
    for start in range(0, len(texts), 16):
        batch = texts[start : start + 16]
        if head_tail:
            ids = [head_and_tail(tokenizer(t)["input_ids"], length) for t in batch]
            enc = tokenizer.pad({"input_ids": ids}, return_tensors="pt")
        else:
            enc = tokenizer(batch, truncation=True, max_length=length, padding=True, return_tensors="pt")
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            predicted = model(**enc).logits.argmax(-1).tolist()
        right += sum(p == y for p, y in zip(predicted, labels[start : start + 16]))
    return right


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder with finished prepare and teacher stages")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512], help="longer lengths to read")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    args = parser.parse_args(argv)

    config = yaml.safe_load((args.run / "config.yaml").read_text())
    max_length = int(config["data"]["max_length"])
    tokenizer = AutoTokenizer.from_pretrained(args.run / "teacher" / "model")
    model = AutoModelForSequenceClassification.from_pretrained(args.run / "teacher" / "model").eval()
    index = {name: i for i, name in enumerate(label_names(args.run / "prepare"))}
    rows = [json.loads(line) for line in (args.run / "prepare" / "test.jsonl").read_text().splitlines() if line]
    tokens = [len(tokenizer(r["text"])["input_ids"]) for r in rows]
    cut = [r for r, n in zip(rows, tokens) if n > max_length]
    texts, labels = [r["text"] for r in cut], [index[r["label"]] for r in cut]

    settings = [(f"the first {max_length} tokens (the run's max_length)", max_length, False)]
    settings += [(f"the first {n} tokens", n, False) for n in args.lengths]
    settings += [
        (f"head + tail: the first {max_length // 2} and last {max_length - max_length // 2}", max_length, True)
    ]
    lines = [
        f"# Reading more than max_length: the teacher of {args.run}",
        "",
        f"{len(rows):,} test texts; {len(cut):,} ({len(cut) / len(rows):.1%}) longer than max_length {max_length} "
        f"tokens, {sum(n > 2 * max_length for n in tokens):,} longer than {2 * max_length}; the longest "
        f"{max(tokens):,} tokens. The teacher was fine-tuned at max_length {max_length}.",
        "",
        "| the teacher reads | right on the cut texts | accuracy on them | change in test accuracy |",
        "|---|---:|---:|---:|",
    ]
    base, bf16 = None, native_bf16()
    for title, length, head_tail in settings:
        right = correct(model, tokenizer, texts, labels, length, head_tail, bf16) if cut else 0
        base = right if base is None else base
        share = f"{right / len(cut):.4f}" if cut else "-"
        lines.append(f"| {title} | {right} / {len(cut)} | {share} | {(right - base) / len(rows) * 100:+.2f} points |")
    emit(lines, args.out, command=command_line("bench/truncation.py", argv))


if __name__ == "__main__":
    main()
