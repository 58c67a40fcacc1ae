"""Prepare: load the dataset, split it deterministically, tokenize once.

Tokenization streams: batches of texts go straight into Arrow files (datasets'
batched map, several processes where the machine has more than two cores), and
the truncation count comes from the same pass, so memory stays flat in the
number of examples; the readers memory-map what is written here.

Outputs (runs/<config>/prepare/):
  train.jsonl, validation.jsonl, test.jsonl  plain records {"text", "label"} (+ "text_pair")
  unlabeled.jsonl, tokenized/unlabeled/      in-domain text without labels (if data.unlabeled_text; their count is
                                             in the summary, not stats.json: OUTPUTS_FOR below)
  tokenized/<split>/                         token ids (unpadded) + label ids, Arrow; + token_type_ids for
                                             sentence pairs when the teacher has segment embeddings (BERT, ELECTRA)
  labels.json                                {"0": "<name>", ...}
  stats.json                                 sizes, class balance, truncation count, tokenizer facts,
                                             rows dropped (missing label, empty text, duplicate), texts cut
"""

from __future__ import annotations

import json
import logging
import sys

from pipeline.data import SPLITS, load_splits, tokenize_split, tokenize_to_disk, uses_segment_ids
from pipeline.models import load_tokenizer, teacher_model_config, tokenizer_reference
from pipeline.stage_api import Context

log = logging.getLogger("pipeline")

READS = ["seed", "data", "teacher.model", "teacher.tokenizer", "teacher.trust_remote_code"]
AFTER: list[str] = []
VERSION = 2  # bump when the output changes for the same inputs (history: git log)
# The files written only for data.unlabeled_text: stages that never read them (stages/teacher.py, stages/peers.py:
# UNAFFECTED_BY) leave them out of what they recorded reading, so turning it on does not rerun them
OUTPUTS_FOR = {
    "data.unlabeled_text": ("unlabeled.jsonl", "tokenized/unlabeled/"),
    "data.unlabeled_source": ("unlabeled.jsonl", "tokenized/unlabeled/"),
}
PAIR_FORMAT = 2  # 2: token_type_ids stored for teachers with segment embeddings (sentence pairs only)


def fingerprint_inputs(config) -> dict:
    """READS, plus for sentence pairs the pair format: a pair run prepared before segment ids were stored is
    redone, while single-sentence fingerprints (and so their cached outputs) stay as they were."""
    reads = {key: config.section(key) for key in READS}
    return {**reads, "pair_format": PAIR_FORMAT} if config.data.text_pair_column else reads


def run(ctx: Context) -> dict:
    if not ctx.is_main:  # cheap, single-process work; other ranks wait at the barrier
        return {}
    cfg = ctx.config.data
    cleaning: dict = {}
    splits, unlabeled = load_splits(cfg, ctx.config.seed, report=cleaning)
    if cleaning["missing_labels"]:
        values = ", ".join(f"{value} x{count}" for value, count in cleaning["missing_label_values"].items())
        log.info(
            "[prepare] %d of %d rows have no label (%s) and were dropped; data.missing_labels lists the values read as 'no label'",
            cleaning["missing_labels"],
            cleaning["rows_read"],
            values,
        )
    if cleaning["cut_texts"]:
        log.info(
            "[prepare] %d texts were longer than data.max_text_chars=%d characters and were cut before tokenization",
            cleaning["cut_texts"],
            cleaning["max_text_chars"],
        )
    if cleaning["given"]:
        log.info(
            "[prepare] splits used as given: %s; carved from train: %s",
            ", ".join(cleaning["given"]),
            ", ".join(s for s in SPLITS if s not in cleaning["given"]) or "none",
        )
        for split, shared in cleaning["train_texts_in_other_splits"].items():
            if shared:
                log.warning(
                    "[prepare] %d %s texts also appear in train (kept: the splits are used as given)", shared, split
                )
    # label_names fixes the ids (id i is label_names[i], as in a teacher fine-tuned on them); else alphabetical.
    label_names = list(cfg.label_names) if cfg.label_names else sorted(set(splits["train"]["label"]))
    label_ids = {name: i for i, name in enumerate(label_names)}
    tokenizer = load_tokenizer(tokenizer_reference(ctx.config), ctx.config.teacher.trust_remote_code)

    stats = {
        "label_names": label_names,
        "pad_token_id": tokenizer.pad_token_id,
        "max_length": cfg.max_length,
        "source": cfg.source,
        "rows": {k: cleaning[k] for k in ("rows_read", "missing_labels", "empty_texts", "duplicates")},
        "missing_label_values": cleaning["missing_label_values"],
        "max_text_chars": cleaning["max_text_chars"],
        "cut_texts": cleaning["cut_texts"],
        "given_splits": cleaning["given"],
        "splits": {},
    }
    # Sentence pairs for a teacher with segment embeddings carry token_type_ids; single sentences never do
    # (every model then defaults them to 0), so single-sentence outputs are as before.
    segments = bool(cfg.text_pair_column) and uses_segment_ids(
        tokenizer, teacher_model_config(ctx.config, len(tokenizer))
    )
    if segments:
        stats["token_type_ids"] = True
        log.info(
            "[prepare] sentence pairs: token_type_ids stored (0 for %s, 1 for %s)",
            cfg.text_column,
            cfg.text_pair_column,
        )
    max_length = cfg.max_length
    bars = sys.stderr.isatty()  # as the stage context's progress bars: in terminals, not in CI logs

    def encode(texts, pairs):  # one batch; looked up here at call time, so a test can watch what the tokenizer sees
        return tokenize_split(tokenizer, texts, pairs, max_length, segments)

    total_truncated = 0
    for split in SPLITS:
        part = splits[split]
        write_records(
            ctx.out / f"{split}.jsonl", part[["text", "label"] + (["text_pair"] if "text_pair" in part else [])]
        )
        facts = tokenize_to_disk(
            encode,
            part["text"],
            part["text_pair"] if "text_pair" in part else None,
            part["label"].map(label_ids).to_numpy(),
            ctx.out / "tokenized" / split,
            desc=f"tokenize {split}",
            progress=bars,
            segments=segments,
        )
        total_truncated += facts["truncated"]
        counts = part["label"].value_counts()
        stats["splits"][split] = {
            "examples": len(part),
            "truncated": facts["truncated"],
            "groups": int(part["group"].nunique()) if "group" in part else None,
            "class_counts": {name: int(counts.get(name, 0)) for name in label_names},
            "mean_tokens": facts["mean_tokens"],
            "max_tokens": facts["max_tokens"],
        }
    if unlabeled is not None and len(unlabeled):
        facts = tokenize_to_disk(
            encode,
            unlabeled["text"],
            None,
            [-1] * len(unlabeled),
            ctx.out / "tokenized" / "unlabeled",
            desc="tokenize unlabeled",
            progress=bars,
            segments=segments,
        )
        unlabeled.to_json(ctx.out / "unlabeled.jsonl", orient="records", lines=True, force_ascii=False)
        unlabeled_examples = facts["examples"]
        log.info(
            "[prepare] unlabeled: %d texts, taught by the teacher only (%d cut to data.max_text_chars%s)",
            unlabeled_examples,
            cleaning.get("unlabeled_cut_texts", 0),
            f"; {cleaning['unlabeled_in_splits']} dropped as equal to a split's text, case and punctuation aside"
            if "unlabeled_in_splits" in cleaning
            else "",
        )
    else:
        unlabeled_examples = 0
    if total_truncated:
        log.info(
            "[prepare] %d texts were longer than data.max_length=%d tokens and were truncated",
            total_truncated,
            cfg.max_length,
        )
    ctx.write_json("labels.json", {str(i): name for i, name in enumerate(label_names)})
    ctx.write_json("stats.json", stats)
    ctx.log_artifact(ctx.out / "stats.json")
    summary = {f"{s}_examples": stats["splits"][s]["examples"] for s in SPLITS}
    summary["truncated"] = total_truncated
    summary["missing_labels"] = cleaning["missing_labels"]
    summary["cut_texts"] = cleaning["cut_texts"]
    if unlabeled_examples:
        summary["unlabeled_examples"] = unlabeled_examples
    if "unlabeled_in_splits" in cleaning:  # data.unlabeled_source: its texts left out as a split's
        summary["unlabeled_in_splits"] = cleaning["unlabeled_in_splits"]
    ctx.log_metrics({k: v for k, v in summary.items()})
    for split in SPLITS:
        log.info(
            "[prepare] %s: %d examples, classes %s",
            split,
            stats["splits"][split]["examples"],
            stats["splits"][split]["class_counts"],
        )
    return summary


def write_records(path, frame, chunk: int = 10_000) -> None:
    """One JSON object per row, written a chunk of rows at a time (never the whole split as Python dicts)."""
    with open(path, "w", encoding="utf-8") as fh:
        for start in range(0, len(frame), chunk):
            for record in frame.iloc[start : start + chunk].to_dict("records"):
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
