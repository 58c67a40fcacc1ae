"""Stage 1, prepare: load the dataset, split it deterministically, tokenize once.

Outputs (runs/<config>/prepare/):
  train.jsonl, validation.jsonl, test.jsonl  plain records {"text", "label"} (+ "text_pair")
  unlabeled.jsonl                            in-domain text without labels (if data.unlabeled_text)
  tokenized/<split>/                         token ids (unpadded) + label ids, Arrow
  labels.json                                {"0": "<name>", ...}
  stats.json                                 sizes, class balance, truncation count, tokenizer facts
"""

from __future__ import annotations

import json
import logging

import datasets

from pipeline.augment import augment, continuation_mask, nearest_words, word_candidates
from pipeline.data import SPLITS, load_frame, split_frame, tokenize_split
from pipeline.models import input_embeddings, load_tokenizer, tokenizer_reference
from pipeline.runner import write_json

log = logging.getLogger("pipeline")

READS = ["seed", "data", "teacher.model", "teacher.tokenizer", "teacher.trust_remote_code"]
AFTER: list[str] = []
VERSION = 1


def run(ctx) -> dict:
    if not ctx.is_main:  # cheap, single-process work; other ranks wait at the barrier
        return {}
    cfg = ctx.config.data
    frame, unlabeled = load_frame(cfg)
    splits = split_frame(frame, cfg, ctx.config.seed)
    label_names = sorted(splits["train"]["label"].unique())
    label_ids = {name: i for i, name in enumerate(label_names)}
    tokenizer = load_tokenizer(tokenizer_reference(ctx.config), ctx.config.teacher.trust_remote_code)

    stats = {"label_names": label_names, "pad_token_id": tokenizer.pad_token_id, "max_length": cfg.max_length,
             "source": cfg.source, "splits": {}}
    total_truncated = 0
    for split in SPLITS:
        part = splits[split]
        records = part[["text", "label"] + (["text_pair"] if "text_pair" in part else [])].to_dict("records")
        with open(ctx.out / f"{split}.jsonl", "w", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        pairs = part["text_pair"].astype(str).tolist() if "text_pair" in part else None
        ids, truncated = tokenize_split(tokenizer, part["text"].tolist(), pairs, cfg.max_length)
        total_truncated += truncated
        labels = [label_ids[name] for name in part["label"]]
        datasets.Dataset.from_dict({"input_ids": ids, "label": labels}).save_to_disk(str(ctx.out / "tokenized" / split))
        lengths = [len(x) for x in ids]
        stats["splits"][split] = {
            "examples": len(part), "truncated": truncated,
            "groups": int(part["group"].nunique()) if "group" in part else None,
            "class_counts": {name: int((part["label"] == name).sum()) for name in label_names},
            "mean_tokens": sum(lengths) / len(lengths), "max_tokens": max(lengths),
        }
    if cfg.augment.copies:
        train_ids = datasets.load_from_disk(str(ctx.out / "tokenized" / "train"))["input_ids"]
        variants = augmented_sentences(ctx.config, tokenizer, train_ids)
        datasets.Dataset.from_dict({"input_ids": variants, "label": [-1] * len(variants)}).save_to_disk(
            str(ctx.out / "tokenized" / "augmented"))
        stats["splits"]["augmented"] = {"examples": len(variants), "mean_tokens": sum(map(len, variants)) / max(len(variants), 1)}
        log.info("[prepare] augmented: %d teacher-labelled variants of the %d training sentences (mean %.1f tokens)",
                 len(variants), len(train_ids), stats["splits"]["augmented"]["mean_tokens"])
    if unlabeled is not None and len(unlabeled):
        ids, _ = tokenize_split(tokenizer, unlabeled["text"].tolist(), None, cfg.max_length)
        datasets.Dataset.from_dict({"input_ids": ids, "label": [-1] * len(ids)}).save_to_disk(str(ctx.out / "tokenized" / "unlabeled"))
        unlabeled.to_json(ctx.out / "unlabeled.jsonl", orient="records", lines=True, force_ascii=False)
        stats["splits"]["unlabeled"] = {"examples": len(ids)}
    if total_truncated:
        log.info("[prepare] %d texts were longer than data.max_length=%d tokens and were truncated", total_truncated, cfg.max_length)
    write_json(ctx.out / "labels.json", {str(i): name for i, name in enumerate(label_names)})
    write_json(ctx.out / "stats.json", stats)
    ctx.tracker.log_artifact(ctx.out / "stats.json")
    summary = {f"{s}_examples": stats["splits"][s]["examples"] for s in SPLITS}
    summary["truncated"] = total_truncated
    ctx.tracker.log_metrics({k: v for k, v in summary.items()})
    for split in SPLITS:
        log.info("[prepare] %s: %d examples, classes %s", split, stats["splits"][split]["examples"], stats["splits"][split]["class_counts"])
    return summary


def augmented_sentences(config, tokenizer, train_ids: list[list[int]]) -> list[list[int]]:
    """data.augment.copies variants of every training sentence (pipeline/augment.py)."""
    cfg = config.data.augment
    neighbours = {}
    embeddings = input_embeddings(config) if cfg.replace_prob > 0 and cfg.neighbours > 0 else None
    if embeddings is not None:
        neighbours = nearest_words(embeddings, word_candidates(tokenizer, train_ids), cfg.neighbours)
    elif cfg.replace_prob > 0:
        log.info("[prepare] augment: the teacher has no pretrained embeddings (random); words are masked, never replaced")
    return augment(train_ids, cfg.copies, config.seed, mask_id=tokenizer.mask_token_id, continuation=continuation_mask(tokenizer),
                   neighbours=neighbours, mask_prob=cfg.mask_prob, replace_prob=cfg.replace_prob, ngram_prob=cfg.ngram_prob,
                   cls_id=tokenizer.cls_token_id, sep_id=tokenizer.sep_token_id)
