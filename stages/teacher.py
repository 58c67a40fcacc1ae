"""Teacher: obtain the task teacher.

Either an already fine-tuned classifier (teacher.finetune: false; its label
count must match the data, and when its id2label holds real names, not
LABEL_0.., they must be the data's labels under the same ids: see
pipeline/models.py check_teacher_labels) or a pretrained encoder of a supported
family (pipeline/families.py) fine-tuned here on the train split with
cross-entropy, keeping the epoch with the best validation accuracy.

Outputs: model/ (save_pretrained folder: config, safetensors, tokenizer),
metrics.json (validation and test accuracy), test_logits.npy (the teacher's logits on the test split, read by
evaluate: a sweep's variants share this stage and need not run a base-size teacher over the test split again).
"""

from __future__ import annotations

import logging

import numpy as np
from transformers import set_seed

from pipeline.inference import TEACHER_TEST_LOGITS, accuracy, predict_logits
from pipeline.models import (
    build_teacher_for_finetune,
    load_tokenizer,
    save_model,
    tokenizer_reference,
    train_used_rows_only,
)
from pipeline.splits import TokenizedSplit, label_names, pad_id, used_token_ids
from pipeline.stage_api import Context
from pipeline.training import cross_entropy_loss, fit

log = logging.getLogger("pipeline")

READS = ["seed", "precision", "teacher", "evaluate.batch_size"]
AFTER = ["prepare"]
# prepare also writes data.unlabeled_text's rows, which this stage never reads: runs with and without them share it
UNAFFECTED_BY = {"data.unlabeled_text": False}
VERSION = 1


def run(ctx: Context) -> dict:
    config = ctx.config
    set_seed(config.seed)
    prepare = ctx.input("prepare")
    labels, pad = label_names(prepare), pad_id(prepare)
    tokenizer = load_tokenizer(tokenizer_reference(config), config.teacher.trust_remote_code)
    train, validation, test = (TokenizedSplit(prepare, s) for s in ("train", "validation", "test"))
    model = build_teacher_for_finetune(config, labels, len(tokenizer)).to(ctx.device)

    def validate(prepared=None) -> dict:
        logits = predict_logits((prepared or {}).get("model", model), validation, config.evaluate.batch_size, ctx, pad)
        return {"accuracy": accuracy(logits, validation.labels)}

    if config.teacher.finetune and config.teacher.epochs > 0:
        restore_table = None
        if (
            config.teacher.used_embedding_rows
        ):  # a smaller gradient and AdamW state (bench/results/roofline_bert_small.md)
            used = used_token_ids([train, validation], [pad, *tokenizer.all_special_ids])
            restore_table = train_used_rows_only(model, used)
            if ctx.is_main:
                log.info(
                    "[teacher] fine-tuning %d of %d word-embedding rows (the token ids the train and validation "
                    "splits use; teacher.used_embedding_rows)",
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
            seed=config.seed,
            tag="teacher",
        )
        model = ctx.unwrap(model)
        if restore_table is not None:
            model = restore_table()  # the full table again, trained rows written back: the teacher saved is ordinary
        best_epoch = progress.best_epoch
    else:
        best_epoch = 0
    model.eval()
    val_acc = validate()["accuracy"]
    test_logits = predict_logits(model, test, config.evaluate.batch_size, ctx, pad)
    test_acc = accuracy(test_logits, test.labels)
    metrics = {
        "validation_accuracy": val_acc,
        "test_accuracy": test_acc,
        "best_epoch": best_epoch,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if ctx.is_main:
        save_model(model, tokenizer, ctx.out / "model")
        ctx.write_json("metrics.json", metrics)
        np.save(
            ctx.out / TEACHER_TEST_LOGITS, test_logits.astype(np.float32)
        )  # evaluate reads them: one teacher pass a run
        ctx.log_metrics(metrics)
        log.info("[teacher] validation accuracy %.4f, test accuracy %.4f", val_acc, test_acc)
    return metrics
