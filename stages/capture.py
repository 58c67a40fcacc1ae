"""Capture: run the teacher once over the training data and store its targets.

Only what the configured loss terms need is stored (logits; the targets the
terms in pipeline/terms.py declare, e.g. per mapped teacher layer the attention /
value relations as probabilities or as raw vectors, whichever is smaller, or
hidden states), unpadded, fp16 by default,
in checksummed shards. The size is estimated before anything is written; when
the full cache would exceed capture.max_cache_gb, every example keeps its
logits and relation targets are stored for a seeded random subset of the
examples, as many as fit (relation_rows.npy says which; the others train with
CE + logit KD only), said in the log and recorded in capture.json and the
stage's metrics. If fewer than capture.min_relation_fraction of the examples
would keep them, the stage stops and points to capture.mode: online.
Completed shards survive an interruption and are verified, not recomputed.
With several processes, shards are divided between ranks.

With capture.augment.copies the stage first writes teacher-labelled variants of
the training sentences (pipeline/augment.py: masking, embedding-neighbour
replacement, n-gram spans) to augmented/; the teacher labels them here with
logits only (or online, inside each step), so the cache stays small.

With teacher.ensemble the stored logits are the log of the teachers' mean probabilities (stages/teacher.py
trains the members); relation targets come from the first teacher.

Outputs: cache/shard-*.bin + shard-*.json, cache/index.json, capture.json,
relation_rows.npy (only when the budget forced a subset), augmented/ (Arrow, when augmenting),
static_init.npz (student.kind static: the teacher's token vectors the student starts from, computed here once so
that every static student of this capture, whatever its seed, width or bigram buckets, reuses them).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from pipeline.augment import augment, continuation_mask, nearest_words, word_candidates
from pipeline.cache import (
    CacheLayout,
    choose_stores,
    estimate_bytes,
    flatten_targets,
    relation_subset,
    shard_complete,
    shard_ranges,
    write_index,
    write_shard,
)
from pipeline.errors import CacheError
from pipeline.inference import ensemble_logits, model_inputs
from pipeline.models import load_classifier, load_members, load_tokenizer
from pipeline.objective import capture_plan, teacher_targets
from pipeline.splits import RELATION_ROWS, TokenizedSplit, TrainingData, pad_id
from pipeline.stage_api import Context
from pipeline.static_model import STATIC_INIT, teacher_token_statistics

log = logging.getLogger("pipeline")

READS = [
    "precision",
    "capture",
    "distill.layer_map",
    "distill.relation_heads",
    "distill.loss",
    "student",
    "data.unlabeled_text",
    "seed",
]
AFTER = ["prepare", "teacher"]
FILE_READS: list[str] = []  # no local file of its own: the teacher and data arrive through prepare and teacher
VERSION = 2  # bump when the output changes for the same inputs (history: git log)


def fingerprint_inputs(config) -> dict:
    """Fingerprint inputs: which teacher targets the configured terms need (TargetPlan.needed: target names,
    their teacher layers, relation heads), not the loss weights' values, not which student layer each is
    matched to, so students of another depth reuse the cache."""
    # min_relation_fraction only decides whether an over-budget capture stops; a cache it lets through is the same.
    # extra_terms / extra_teacher_layers count through the targets they add (none added: the same cache).
    capture = config.capture.model_dump(exclude={"min_relation_fraction", "extra_terms", "extra_teacher_layers"})
    return {
        "targets": capture_plan(config).needed(),
        "capture": capture,
        "precision": config.precision,
        "unlabeled": config.data.unlabeled_text,
        **({"seed": config.seed} if config.capture.augment.copies else {}),
        **({"static_init": {"context": config.student.static.context}} if config.student.kind == "static" else {}),
    }


def write_static_init(config, teacher, teacher_dir, prepare, ctx: Context) -> None:
    """static_init.npz: the teacher's token statistics a static student starts from (pipeline/static_model.py)."""
    train = TokenizedSplit(prepare, "train")
    pad = pad_id(prepare)
    order = np.argsort(train.lengths, kind="stable")  # similar lengths per batch: little padding
    batches = (train.batch(order[i : i + 128], pad, ctx.device) for i in range(0, len(order), 128))
    tokenizer = load_tokenizer(str(teacher_dir / "model"))
    statistics: dict[str, Any] = teacher_token_statistics(  # Any: savez types **kwargs as its own keywords
        teacher, tokenizer, train.input_ids, batches, context=config.student.static.context
    )
    with open(ctx.out / STATIC_INIT, "wb") as fh:  # ctx.out is the stage's partial folder, renamed when complete
        np.savez(fh, **statistics)
    log.info(
        "[capture] static student's start: %d vocabulary tokens alone through the teacher%s (%s)",
        len(statistics["isolated"]),
        f", {len(train)} training texts in context" if config.student.static.context else "",
        STATIC_INIT,
    )


def run(ctx: Context) -> dict:
    config = ctx.config
    prepare, teacher_dir = ctx.input("prepare"), ctx.input("teacher")
    teacher = load_classifier(str(teacher_dir / "model")).to(ctx.device).eval()
    members = load_members(teacher_dir, ctx.device)  # teacher.ensemble: the logit targets average over them all
    if members and ctx.is_main:
        log.info("[capture] logit targets: the mean probabilities of %d teachers (teacher.ensemble)", 1 + len(members))
    if config.student.kind == "static" and ctx.is_main:  # the static student's start, once for every student of it
        write_static_init(config, teacher, teacher_dir, prepare, ctx)
    augmented = 0
    if config.capture.augment.copies:
        if ctx.is_main:
            augmented = write_augmented(config, teacher, teacher_dir, prepare, ctx.out / "augmented")
        ctx.barrier()
    if config.capture.mode == "online":
        if ctx.is_main:
            ctx.write_json("capture.json", {"mode": "online", "cache_bytes": 0, "augmented_examples": augmented})
            log.info("[capture] capture.mode is online: the teacher runs inside each distillation step; nothing stored")
        return {"mode": "online", "cache_bytes": 0, "augmented_examples": augmented}

    train = TrainingData(prepare, ctx.out)  # train split, unlabeled text, then augmented variants (logits only)
    lengths, relational = train.lengths, train.relational
    plan, layout, logits_layout = cache_layouts(config, teacher.config, train)
    estimate = estimate_bytes(layout, lengths[:relational]) + estimate_bytes(logits_layout, lengths[relational:])
    per_example = estimate / len(lengths)
    if ctx.is_main:
        log.info(
            "[capture] estimated cache size %.1f MB (%.0f bytes per example, stores %s, %s)",
            estimate / 1e6,
            per_example,
            layout.stores,
            layout.dtype,
        )
    keep = fit_budget(config.capture, layout, logits_layout, lengths, relational, estimate)
    if ctx.is_main:
        chosen = ctx.out / RELATION_ROWS
        if keep is None:
            chosen.unlink(missing_ok=True)
        else:
            tmp = ctx.out / (RELATION_ROWS + ".tmp")
            with open(tmp, "wb") as fh:
                np.save(fh, keep)
            tmp.replace(chosen)
    folder = ctx.out / "cache"
    folder.mkdir(exist_ok=True)
    pad = pad_id(prepare)
    # Shards never mix rows with relation targets and logits-only (augmented) rows.
    ranges = shard_ranges(relational, config.capture.shard_size)
    ranges += [
        (first + relational, last + relational)
        for first, last in shard_ranges(len(lengths) - relational, config.capture.shard_size)
    ]
    mine = [i for i in range(len(ranges)) if i % ctx.world == ctx.rank]
    todo = [i for i in mine if not shard_complete(folder, i)]
    if len(todo) < len(mine):
        log.info("[capture] %d shard(s) already complete and verified, %d to compute", len(mine) - len(todo), len(todo))
    bar = ctx.progress(total=sum(ranges[i][1] - ranges[i][0] for i in todo), desc="capture")
    for shard in todo:
        first, last = ranges[shard]
        logits_only = first >= relational
        shard_plan, shard_layout = (logits_layout.plan, logits_layout) if logits_only else (plan, layout)
        records, logits = capture_shard(
            teacher,
            train,
            first,
            last,
            shard_plan,
            shard_layout,
            config.capture.batch_size,
            pad,
            ctx,
            on_batch=bar.update,
            relations=None if logits_only else keep,
            members=members,
        )
        bare = [] if logits_only or keep is None else np.flatnonzero(~keep[first:last]).tolist()
        write_shard(folder, shard, records, logits, [int(n) for n in lengths[first:last]], first, logits_only, bare)
    bar.close()
    ctx.barrier()
    total = sum((folder / f"shard-{i:05d}.bin").stat().st_size for i in range(len(ranges)))
    relation_examples = relational if keep is None else int(keep.sum())
    summary = {
        "mode": "cached",
        "examples": int(len(lengths)),
        "cache_bytes": int(total),
        "bytes_per_example": total / len(lengths),
        "estimated_bytes": estimate,
        "shards": len(ranges),
        "stores": layout.stores,
        "dtype": layout.dtype,
        "logits_only_examples": int(len(lengths) - relation_examples),
        "augmented_examples": augmented,
        "over_budget": keep is not None,
        "relation_examples": relation_examples,
        "relation_fraction": relation_examples / max(relational, 1),
    }
    if ctx.is_main:
        write_index(folder, len(ranges), int(len(lengths)), layout)
        ctx.write_json("capture.json", summary)
        ctx.log_metrics(
            {
                "cache_bytes": total,
                "bytes_per_example": total / len(lengths),
                "examples": len(lengths),
                "relation_fraction": summary["relation_fraction"],
            }
        )
        log.info(
            "[capture] %d examples, %.1f MB, %.0f bytes per example", len(lengths), total / 1e6, total / len(lengths)
        )
    return {k: v for k, v in summary.items() if not isinstance(v, dict)}


def cache_layouts(config, teacher_config, train: TrainingData) -> tuple:
    """(target plan, layout of the rows with relation targets, layout of the logits-only rows) for ``train``."""
    plan = capture_plan(config, teacher_config)
    stores = choose_stores(plan, train.lengths[: train.relational], teacher_config.hidden_size, config.capture.store)
    layout = CacheLayout(plan, teacher_config.num_labels, teacher_config.hidden_size, stores, config.capture.dtype)
    logits_layout = CacheLayout(
        plan.logits_only(), teacher_config.num_labels, teacher_config.hidden_size, stores, config.capture.dtype
    )
    return plan, layout, logits_layout


def fit_budget(
    cfg, layout: CacheLayout, logits_layout: CacheLayout, lengths: np.ndarray, relational: int, estimate: int
) -> np.ndarray | None:
    """None when the full cache fits capture.max_cache_gb; else which of the ``relational`` rows keep their relation
    targets (every row keeps its logits), or a CacheError when too few would (capture.min_relation_fraction)."""
    budget = cfg.max_cache_gb * 1e9
    if estimate <= budget:
        return None
    if cfg.extra_terms:  # a subset chosen for the union would differ from each run's own: not the same students
        raise CacheError(
            f"The shared teacher cache (capture.extra_terms {cfg.extra_terms}) would take an estimated "
            f"{estimate / 1e9:.2f} GB, above capture.max_cache_gb={cfg.max_cache_gb}. A shared cache stores every "
            "example's targets, so that each run reads what its own cache would hold: raise capture.max_cache_gb, or "
            "give each run its own capture (in a sweep: shared_capture: false)."
        )
    logits_rest = estimate_bytes(logits_layout, lengths[relational:])  # augmented rows: logits only either way
    keep = relation_subset(layout, logits_layout, lengths[:relational], budget - logits_rest)
    fraction = float(keep.mean()) if relational else 0.0
    if not keep.any() or fraction < cfg.min_relation_fraction:
        raise CacheError(
            f"The teacher cache would take an estimated {estimate / 1e9:.2f} GB ({estimate / len(lengths):.0f} bytes per "
            f"example), above capture.max_cache_gb={cfg.max_cache_gb}, and within it relation targets fit for only "
            f"{fraction:.1%} of the {relational} examples (capture.min_relation_fraction={cfg.min_relation_fraction}). "
            "Set capture.mode=online (the teacher runs inside each training step, nothing stored), map fewer layers, "
            "shorten data.max_length, or raise capture.max_cache_gb."
        )
    log.warning(
        "[capture] the full cache would take %.2f GB, above capture.max_cache_gb=%g: storing logits for every "
        "example and relation targets for %d of %d examples (%.1f%%, a seeded random subset); the others train "
        "with CE + logit KD only",
        estimate / 1e9,
        cfg.max_cache_gb,
        int(keep.sum()),
        relational,
        100 * fraction,
    )
    return keep


@torch.no_grad()
def capture_shard(
    teacher,
    data,
    first: int,
    last: int,
    plan,
    layout,
    batch_size: int,
    pad: int,
    dist,
    on_batch=None,
    relations: np.ndarray | None = None,
    members: list | None = None,
) -> tuple[list[np.ndarray], np.ndarray]:
    """The teacher over examples [first, last) of ``data``: (per-example cache records, logits), in example order.

    Batches hold examples of similar length (less padding); ``dist`` is anything with ``device`` and
    ``autocast()`` (the stage context); ``on_batch(n)`` follows progress. ``relations`` (a mask over example
    indices, capture.max_cache_gb): examples it leaves out get empty records (the budget holds their logits only).
    ``members`` (teacher.ensemble): more teachers; the logits stored are then the log of all the teachers' mean
    probabilities, the relation targets still ``teacher``'s.
    """
    lengths = data.lengths
    by_length = first + np.argsort(lengths[first:last], kind="stable")
    records: list[np.ndarray] = [np.empty(0)] * (last - first)  # every slot is written below
    logits = np.zeros((last - first, teacher.config.num_labels), np.float32)
    for start in range(0, last - first, batch_size):
        global_ids = by_length[start : start + batch_size]
        batch = data.batch(global_ids, pad, dist.device)
        with dist.autocast():
            targets = teacher_targets(teacher, batch, plan)
            others = [member(**model_inputs(batch)).logits for member in members or []]
        empty = set() if relations is None else set(np.flatnonzero(~relations[global_ids]).tolist())
        batch_records = flatten_targets(
            targets, layout, [int(n) for n in lengths[global_ids]], batch["attention_mask"], empty
        )
        for i, record in zip(global_ids - first, batch_records):
            records[i] = record
        batch_logits = ensemble_logits([targets["logits"], *others]) if others else targets["logits"]
        logits[global_ids - first] = batch_logits.float().cpu().numpy()
        if on_batch is not None:
            on_batch(len(global_ids))
    return records, logits


def write_augmented(config, teacher, teacher_dir, prepare, folder) -> int:
    """capture.augment.copies teacher-labelled variants of every training sentence (pipeline/augment.py), as Arrow."""
    import datasets

    cfg = config.capture.augment
    tokenizer = load_tokenizer(str(teacher_dir / "model"))
    train_ids = TokenizedSplit(prepare, "train").input_ids
    neighbours = {}
    if cfg.replace_prob > 0 and cfg.neighbours > 0:
        if config.teacher.model == "random":
            log.info(
                "[capture] augment: a random teacher's embeddings have no neighbours worth using; words are masked, never replaced"
            )
        else:
            neighbours = nearest_words(
                teacher.get_input_embeddings().weight.detach().cpu(),
                word_candidates(tokenizer, train_ids),
                cfg.neighbours,
            )
    variants = augment(
        train_ids,
        cfg.copies,
        config.seed,
        mask_id=tokenizer.mask_token_id,
        continuation=continuation_mask(tokenizer),
        neighbours=neighbours,
        mask_prob=cfg.mask_prob,
        replace_prob=cfg.replace_prob,
        ngram_prob=cfg.ngram_prob,
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
    )
    datasets.Dataset.from_dict({"input_ids": variants, "label": [-1] * len(variants)}).save_to_disk(str(folder))
    log.info(
        "[capture] augment: %d variants of %d training sentences (mean %.1f tokens; %d words with embedding neighbours)",
        len(variants),
        len(train_ids),
        np.mean([len(v) for v in variants]) if variants else 0.0,
        len(neighbours),
    )
    return len(variants)
