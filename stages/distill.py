"""Distill: train the student against the teacher.

The student is built as configured (teacher layers, a pretrained encoder,
random, or with student.kind: static one vector per token initialised from the
teacher's outputs that capture saved: pipeline/static_model.py) and trained with the objective declared in distill.loss (CE, logit KD,
attention KL, value-relation KL, hidden-state MSE; see pipeline/objective.py)
under Accelerate: mixed precision, data parallel over processes, gradient
clipping and accumulation, warmup + schedule, validation each epoch with the
best epoch kept, resumable checkpoints. Teacher targets come from the capture
cache, or from the teacher run inside the step when capture.mode is online.

Outputs: student/ (save_pretrained folder), history.json, curves.png.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from transformers import set_seed

from pipeline.cache import TeacherCache
from pipeline.families import check_layer_windows, layer_types
from pipeline.inference import accuracy, predict_logits
from pipeline.models import (
    build_student,
    count_parameters,
    encoder_layers,
    load_classifier,
    load_tokenizer,
    save_model,
    train_used_rows_only,
)
from pipeline.objective import DistillObjective, balanced_class_weights, target_plan
from pipeline.plots import plot_history
from pipeline.pruning import task_importance
from pipeline.splits import TokenizedSplit, TrainingData, pad_id, used_token_ids
from pipeline.stage_api import Context
from pipeline.static_model import STATIC_INIT, build_static_student, static_table_from
from pipeline.terms import some_parameters_may_get_no_gradient
from pipeline.training import fit

log = logging.getLogger("pipeline")

READS = ["seed", "precision", "student", "distill", "capture.mode", "evaluate.batch_size"]
AFTER = ["prepare", "teacher", "capture"]
VERSION = 1


def run(ctx: Context) -> dict:
    config = ctx.config
    seed = config.distill.seed if config.distill.seed is not None else config.seed
    set_seed(seed)
    prepare, teacher_dir, capture_dir = ctx.input("prepare"), ctx.input("teacher"), ctx.input("capture")
    pad = pad_id(prepare)
    tokenizer = load_tokenizer(str(teacher_dir / "model"))
    teacher = load_classifier(str(teacher_dir / "model")).to(ctx.device).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    if config.student.kind == "static":
        student = static_student(config, teacher.config, capture_dir).to(ctx.device)
    else:
        ffn_scores, width_scores = teacher_importance(
            teacher, TokenizedSplit(prepare, "train"), config, seed, pad, ctx.device
        )
        student = build_student(config, teacher, ffn_scores, width_scores).to(ctx.device)
    if config.student.dropout is not None:
        for module in student.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = config.student.dropout
    train = TrainingData(prepare, capture_dir)  # + augmented variants written by capture
    validation = TokenizedSplit(prepare, "validation")
    restore_table = None
    if config.distill.used_embedding_rows and config.student.kind != "static":
        used = used_token_ids([*train.parts, validation], [pad, *tokenizer.all_special_ids])
        restore_table = train_used_rows_only(student, used)
        if ctx.is_main:
            log.info(
                "[distill] training %d of %d word-embedding rows (the token ids the training and validation data "
                "use; distill.used_embedding_rows)",
                len(used),
                student.config.vocab_size,
            )
    plan = target_plan(config, teacher.config)
    if plan.pairs and plan.uses(
        "attention"
    ):  # ModernBERT: a sliding-window student layer must learn from a teacher layer it can imitate
        check_layer_windows(plan.pairs, student.config, teacher.config)
    class_weights = None
    if config.distill.class_weight == "balanced":
        class_weights = balanced_class_weights(train.labels, teacher.config.num_labels)
        if ctx.is_main:
            log.info(
                "[distill] cross-entropy class weights (balanced): %s", ", ".join(f"{w:.3f}" for w in class_weights)
            )
    objective = DistillObjective(
        config, plan, teacher.config.hidden_size, student.config.hidden_size, class_weights
    ).to(ctx.device)
    online = config.capture.mode == "online"
    cache = None if online else TeacherCache(capture_dir / "cache", reader=plan)
    if ctx.is_main:
        relational = any(target.relation for target in plan.targets)
        log.info(
            "[distill] student: %d layers, %.1fM parameters (teacher %.1fM); terms %s; teacher targets %s (%s)%s",
            student.config.num_hidden_layers,
            count_parameters(student) / 1e6,
            count_parameters(teacher) / 1e6,
            ", ".join(plan.terms),
            ", ".join(target.name for target in plan.targets) or "none",
            "online" if online else "cached",
            f"; layer map (student, teacher) {plan.pairs}, relation heads {plan.relation_heads}" if relational else "",
        )
        if plan.pairs and (kinds := layer_types(student.config)) is not None:
            log.info("[distill] student layer kinds %s (teacher %s)", kinds, layer_types(teacher.config))

    def validate(prepared):
        logits = predict_logits(prepared["model"], validation, config.evaluate.batch_size, ctx, pad)
        return {"accuracy": accuracy(logits, validation.labels)}

    progress = fit(
        ctx,
        modules=objective.trained_modules(student),
        lengths=train.lengths,
        make_batch=lambda idx: train.batch(idx, pad, ctx.device),
        loss_fn=objective.loss_fn(cache=cache, teacher=teacher),
        validate=validate,
        settings=config.distill,
        seed=seed,
        tag="distill",
        find_unused_parameters=some_parameters_may_get_no_gradient(config.distill.loss),
    )
    student = ctx.unwrap(student).eval()
    if restore_table is not None:
        student = restore_table()  # the full table again: evaluate and export read a model like any other
    summary = {
        "best_epoch": progress.best_epoch,
        "validation_accuracy": progress.best_metric,
        "parameters": count_parameters(student),
        "layers": student.config.num_hidden_layers,
        "world_size": ctx.world,
    }
    if ctx.is_main:
        save_model(student, tokenizer, ctx.out / "student")
        ctx.write_json("history.json", progress.history)
        if progress.history:
            plot_history(progress.history, ctx.out / "curves.png", title=f"{config.name}: distillation")
            ctx.log_artifact(ctx.out / "curves.png")
        ctx.log_metrics(summary)
    return summary


def static_student(config, teacher_config, capture_dir):
    """A static student whose token vectors start from the teacher's outputs, computed once by capture
    (pipeline/static_model.py teacher_token_statistics)."""
    with np.load(capture_dir / STATIC_INIT) as statistics:
        vectors, log_weights = static_table_from(statistics, config.student.static.dim)
        seen = len(statistics["seen_ids"]) if "seen_ids" in statistics else 0
    log.info(
        "[distill] static student: %d token vectors of width %d (%d of them from the teacher in context over the "
        "training texts; capture/%s), SIF pooling weights, %d hashed bigram buckets, %s",
        len(vectors),
        config.student.static.dim,
        seen,
        STATIC_INIT,
        config.student.static.bigram_buckets,
        f"a hidden layer of {config.student.static.hidden} before the head"
        if config.student.static.hidden
        else "a linear head",
    )
    return build_static_student(
        teacher_config,
        config.student.static.dim,
        vectors,
        log_weights,
        max_positions=getattr(teacher_config, "max_position_embeddings", 512),
        bigram_buckets=config.student.static.bigram_buckets,
        pooling=config.student.static.pooling,
        head_hidden=config.student.static.hidden,
    )


# The importance pass keeps the teacher's whole backward graph for a batch: 64 rows of 128 tokens through the base
# teacher (clothing_base) took the distill process from 6.5 to 18.6 GB and, after the stages before it in one process,
# past 24 GB (killed by the OOM killer). Batches are capped in padded tokens too; the scores are sums over examples,
# so the batching does not change them.
IMPORTANCE_ROWS, IMPORTANCE_TOKENS = 64, 4096  # 64 sentences of up to 64 tokens; 32 reviews of 128


def importance_batches(sample: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """``sample`` (sorted by length) cut into batches of at most IMPORTANCE_ROWS rows and IMPORTANCE_TOKENS padded
    tokens (rows x the batch's longest)."""
    batches: list[np.ndarray] = []
    current: list[int] = []
    for index in sample:
        if current and (
            len(current) == IMPORTANCE_ROWS or (len(current) + 1) * max(int(lengths[index]), 1) > IMPORTANCE_TOKENS
        ):
            batches.append(np.asarray(current))
            current = []
        current.append(index)
    if current:
        batches.append(np.asarray(current))
    return batches


def teacher_importance(teacher, train: TokenizedSplit, config, seed: int, pad: int, device) -> tuple:
    """What the student's pruning needs from the teacher, on a seeded sample of training examples: Taylor importance
    of its FFN neurons by teacher layer (student.ffn_size) and of its heads and hidden channels
    (student.attention_heads); None for what the student does not prune."""
    student = config.student
    if student.ffn_size is None and student.attention_heads is None:
        return None, None  # a student of whole teacher layers: nothing to rank
    count = min(len(train), student.ffn_importance_examples)
    sample = np.random.default_rng([seed, 7]).permutation(len(train))[:count]
    sample = sample[np.argsort(train.lengths[sample], kind="stable")]  # similar lengths per batch: little padding
    ffn_scores, width_scores = task_importance(  # one backward pass over the sample for both
        teacher,
        (train.batch(rows, pad, device) for rows in importance_batches(sample, train.lengths)),
        ffn_layers=None if student.ffn_size is None else encoder_layers(teacher),
        width_layers=None if student.attention_heads is None else student.teacher_layers,
    )
    if ffn_scores is not None:
        log.info(
            "[distill] FFN importance from %d training examples; keeping %d of %d neurons per layer",
            count,
            student.ffn_size,
            len(ffn_scores[0]),
        )
    if width_scores is not None:
        heads = teacher.config.num_attention_heads
        log.info(
            "[distill] head and channel importance from %d training examples; keeping %d of %d heads per layer and "
            "%d of %d hidden channels",
            count,
            student.attention_heads,
            heads,
            student.attention_heads * teacher.config.hidden_size // heads,
            teacher.config.hidden_size,
        )
    return ffn_scores, width_scores
