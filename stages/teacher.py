"""Teacher: obtain the task teacher.

Either an already fine-tuned classifier (teacher.finetune: false; its label
count must match the data, and when its id2label holds real names, not
LABEL_0.., they must be the data's labels under the same ids: see
pipeline/models.py check_teacher_labels) or a pretrained encoder of a supported
family (pipeline/families.py) fine-tuned here on the train split with
cross-entropy, keeping the epoch with the best validation accuracy.

With teacher.ensemble n > 1, n - 1 more teachers are fine-tuned the same way with seeds seed + 1 .. seed + n - 1;
capture gives the students their averaged probabilities as the logit KD target (meant as a stronger target than
any one of them; on the clothing reviews it was not: docs/base-teacher.md), while model/ stays the first, the
teacher every other stage measures against.

Outputs: model/ (save_pretrained folder: config, safetensors, tokenizer),
metrics.json (validation and test accuracy), test_logits.npy (the teacher's logits on the test split, read by
evaluate: a sweep's variants share this stage and need not run a base-size teacher over the test split again),
members/<k>/model (their checkpoints deleted once each is saved) and ensemble_test_logits.npy (the log of the
members' mean probabilities; teacher.ensemble > 1).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from transformers import set_seed

from pipeline.inference import TEACHER_TEST_LOGITS, accuracy, ensemble_logits, predict_logits
from pipeline.models import (
    TEACHER_MEMBERS,
    build_teacher_for_finetune,
    count_parameters,
    load_classifier,
    load_tokenizer,
    save_model,
    tokenizer_reference,
    train_used_rows_only,
)
from pipeline.splits import TokenizedSplit, label_names, pad_id, used_token_ids
from pipeline.stage_api import Context
from pipeline.training import cross_entropy_loss, discard_training_files, fit

log = logging.getLogger("pipeline")

READS = ["seed", "precision", "teacher", "evaluate.batch_size"]
AFTER = ["prepare"]
# prepare also writes data.unlabeled_text's rows, which this stage never reads: runs with and without them share it
UNAFFECTED_BY = {"data.unlabeled_text": False, "data.unlabeled_source": None}
VERSION = 1
ENSEMBLE_TEST_LOGITS = "ensemble_test_logits.npy"


def run(ctx: Context) -> dict:
    config = ctx.config
    prepare = ctx.input("prepare")
    labels, pad = label_names(prepare), pad_id(prepare)
    tokenizer = load_tokenizer(tokenizer_reference(config), config.teacher.trust_remote_code)
    train, validation, test = (TokenizedSplit(prepare, s) for s in ("train", "validation", "test"))
    model, best_epoch = finetune(ctx, config.seed, "teacher", labels, tokenizer, train, validation, pad)
    val_logits = predict_logits(model, validation, config.evaluate.batch_size, ctx, pad)
    test_logits = predict_logits(model, test, config.evaluate.batch_size, ctx, pad)
    val_acc, test_acc = accuracy(val_logits, validation.labels), accuracy(test_logits, test.labels)
    metrics = {
        "validation_accuracy": val_acc,
        "test_accuracy": test_acc,
        "best_epoch": best_epoch,
        "parameters": count_parameters(model),
    }
    if ctx.is_main:
        save_model(model, tokenizer, ctx.out / "model")
        np.save(
            ctx.out / TEACHER_TEST_LOGITS, test_logits.astype(np.float32)
        )  # evaluate reads them: one teacher pass a run
        log.info("[teacher] validation accuracy %.4f, test accuracy %.4f", val_acc, test_acc)
    if config.teacher.ensemble > 1:
        metrics |= train_members(ctx, tokenizer, labels, train, validation, test, pad, (val_logits, test_logits))
    if ctx.is_main:
        ctx.write_json("metrics.json", metrics)
        ctx.log_metrics(metrics)
    return metrics


def finetune(ctx: Context, seed: int, tag: str, labels, tokenizer, train, validation, pad: int):
    """A teacher fine-tuned with ``seed`` (checkpoints and best weights under ``tag``), in eval mode, and its best
    epoch; the model as given when teacher.finetune is off."""
    config = ctx.config
    set_seed(seed)
    model = build_teacher_for_finetune(config, labels, len(tokenizer)).to(ctx.device)

    def validate(prepared=None) -> dict:
        logits = predict_logits((prepared or {}).get("model", model), validation, config.evaluate.batch_size, ctx, pad)
        return {"accuracy": accuracy(logits, validation.labels)}

    best_epoch = 0
    if config.teacher.finetune and config.teacher.epochs > 0:
        restore_table = None
        if (
            config.teacher.used_embedding_rows
        ):  # a smaller gradient and AdamW state (bench/results/roofline_bert_small.md)
            used = used_token_ids([train, validation], [pad, *tokenizer.all_special_ids])
            restore_table = train_used_rows_only(model, used)
            if ctx.is_main:
                log.info(
                    "[%s] fine-tuning %d of %d word-embedding rows (the token ids the train and validation "
                    "splits use; teacher.used_embedding_rows)",
                    tag,
                    len(used),
                    model.config.vocab_size,
                )
        progress = fit(
            ctx,
            modules={"model": model},
            lengths=train.lengths,
            make_batch=lambda idx: train.batch(idx, pad, ctx.device),
            loss_fn=cross_entropy_loss,
            validate=validate,
            settings=config.teacher,
            seed=seed,
            tag=tag,
        )
        model = ctx.unwrap(model)
        if restore_table is not None:
            model = restore_table()  # the full table again, trained rows written back: the teacher saved is ordinary
        best_epoch = progress.best_epoch
    return model.eval(), best_epoch


def train_members(ctx: Context, tokenizer, labels, train, validation, test, pad, first: tuple) -> dict:
    """teacher.ensemble: the members after the first, each fine-tuned as the first with seed + k and saved to
    members/<k>/model (capture averages their probabilities); a member already saved is loaded, not retrained.
    ``first``: the first teacher's validation and test logits. Returns each member's and the ensemble's accuracies."""
    config = ctx.config
    metrics = {}
    val_logits, test_logits = [first[0]], [first[1]]
    for k in range(1, config.teacher.ensemble):
        folder = ctx.out / TEACHER_MEMBERS / str(k)
        if (folder / "model" / "config.json").is_file():
            model = load_classifier(str(folder / "model")).to(ctx.device).eval()
            if ctx.is_main:
                log.info("[teacher] member %d already fine-tuned (%s)", k, folder / "model")
        else:
            tag = f"teacher-member{k}"
            model, _ = finetune(ctx, config.seed + k, tag, labels, tokenizer, train, validation, pad)
            if ctx.is_main:
                partial = folder / "model.partial"
                save_model(model, tokenizer, partial)
                partial.replace(folder / "model")  # whole or absent: a resumed stage never loads half a member
                discard_training_files(ctx.out, tag)  # the saved member is what a resume loads
        val_logits.append(predict_logits(model, validation, config.evaluate.batch_size, ctx, pad))
        test_logits.append(predict_logits(model, test, config.evaluate.batch_size, ctx, pad))
        metrics[f"member{k}_test_accuracy"] = accuracy(test_logits[-1], test.labels)
        del model
    combined = {
        split: ensemble_logits([torch.from_numpy(x) for x in outputs]).numpy()
        for split, outputs in (("validation", val_logits), ("test", test_logits))
    }
    metrics["ensemble_members"] = config.teacher.ensemble
    metrics["ensemble_validation_accuracy"] = accuracy(combined["validation"], validation.labels)
    metrics["ensemble_test_accuracy"] = accuracy(combined["test"], test.labels)
    if ctx.is_main:
        np.save(ctx.out / ENSEMBLE_TEST_LOGITS, combined["test"].astype(np.float32))
        log.info(
            "[teacher] ensemble of %d (the students' logit KD target): validation accuracy %.4f, test accuracy %.4f; "
            "members' test accuracy %s",
            config.teacher.ensemble,
            metrics["ensemble_validation_accuracy"],
            metrics["ensemble_test_accuracy"],
            ", ".join(f"{accuracy(x, test.labels):.4f}" for x in test_logits),  # the first's included
        )
    return metrics
