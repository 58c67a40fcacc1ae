"""Evaluate: teacher and student on the held-out test split.

accuracy, macro-F1, per-class precision/recall/F1, confusion matrices (PNG),
teacher-student agreement, retention (student accuracy / teacher accuracy),
parameter counts; attention health of the mapped layers (per-head entropy,
near-one-hot heads, output-norm imbalance, NaN/inf counts) and teacher vs
student attention heatmaps for a few validation sentences.

Outputs: metrics.json, predictions.jsonl, confusion_teacher.png,
confusion_student.png, attention_*.png.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import torch

from pipeline.attention import attention_probs, capture_projections, split_heads
from pipeline.families import attention_window
from pipeline.inference import TEACHER_TEST_LOGITS, model_inputs, predict_logits
from pipeline.metrics import attention_health, classification_report
from pipeline.models import count_parameters, load_classifier, load_tokenizer
from pipeline.objective import target_plan
from pipeline.plots import plot_attention_pair, plot_confusion
from pipeline.splits import TokenizedSplit, label_names, pad_id
from pipeline.stage_api import Context

log = logging.getLogger("pipeline")

READS = ["evaluate", "precision"]
AFTER = ["prepare", "teacher", "distill"]
VERSION = 2  # 2: teacher_ensemble (teacher.ensemble)


def run(ctx: Context) -> dict:
    config = ctx.config
    prepare, teacher_dir, distill_dir = ctx.input("prepare"), ctx.input("teacher"), ctx.input("distill")
    names, pad = label_names(prepare), pad_id(prepare)
    test = TokenizedSplit(prepare, "test")
    teacher = load_classifier(str(teacher_dir / "model")).to(ctx.device).eval()
    student = load_classifier(str(distill_dir / "student")).to(ctx.device).eval()
    stored = (
        teacher_dir / TEACHER_TEST_LOGITS
    )  # written by the teacher stage (from the same weights, batch size, precision)
    if stored.is_file() and (saved := np.load(stored)).shape[0] == len(test):
        t_logits = saved
    else:  # a teacher stage from before it kept them
        t_logits = predict_logits(teacher, test, config.evaluate.batch_size, ctx, pad)
    s_logits = predict_logits(student, test, config.evaluate.batch_size, ctx, pad)
    if not ctx.is_main:
        return {}
    t_pred, s_pred = t_logits.argmax(-1), s_logits.argmax(-1)
    metrics: dict[str, Any] = {
        "split": "test",
        "examples": len(test),
        "teacher": {
            **classification_report(test.labels, t_pred, names),
            "parameters": count_parameters(teacher),
            "layers": teacher.config.num_hidden_layers,
        },
        "student": {
            **classification_report(test.labels, s_pred, names),
            "parameters": count_parameters(student),
            "layers": student.config.num_hidden_layers,
        },
        "agreement": float((t_pred == s_pred).mean()),
        "majority_class_accuracy": float(np.bincount(test.labels).max() / len(test)),
    }
    metrics["retention"] = metrics["student"]["accuracy"] / max(metrics["teacher"]["accuracy"], 1e-12)
    teacher_stage = json.loads((teacher_dir / "metrics.json").read_text())
    if "ensemble_test_accuracy" in teacher_stage:  # teacher.ensemble: the student learned from the members' mean
        metrics["teacher_ensemble"] = {
            "members": teacher_stage["ensemble_members"],
            "accuracy": teacher_stage["ensemble_test_accuracy"],
        }
        log.info(
            "[evaluate] the student's logit target was an ensemble of %d teachers: test accuracy %.4f (retention is "
            "against the first, the teacher the int8 comparison ships)",
            metrics["teacher_ensemble"]["members"],
            teacher_stage["ensemble_test_accuracy"],
        )
    metrics["compression"] = metrics["teacher"]["parameters"] / metrics["student"]["parameters"]
    for who in ("teacher", "student"):
        plot_confusion(
            np.array(metrics[who]["confusion_matrix"]), names, ctx.out / f"confusion_{who}.png", f"{who} (test)"
        )
    metrics["attention_health"] = (
        attention_report(ctx, teacher, student, prepare, pad)
        if student.config.num_hidden_layers
        else {"skipped": "the static student has no attention layers"}
    )
    with open(ctx.out / "predictions.jsonl", "w") as fh:
        for i in range(len(test)):
            fh.write(
                json.dumps({"label": names[test.labels[i]], "teacher": names[t_pred[i]], "student": names[s_pred[i]]})
                + "\n"
            )
    ctx.write_json("metrics.json", metrics)
    flat = {f"{who}/{k}": metrics[who][k] for who in ("teacher", "student") for k in ("accuracy", "macro_f1")}
    flat.update({"retention": metrics["retention"], "agreement": metrics["agreement"]})
    ctx.log_metrics(flat)
    for path in sorted(ctx.out.glob("*.png")) + [ctx.out / "metrics.json", ctx.out / "predictions.jsonl"]:
        ctx.log_artifact(path)
    log.info(
        "[evaluate] teacher acc %.4f, student acc %.4f, retention %.4f, agreement %.4f",
        metrics["teacher"]["accuracy"],
        metrics["student"]["accuracy"],
        metrics["retention"],
        metrics["agreement"],
    )
    return {
        "teacher_accuracy": metrics["teacher"]["accuracy"],
        "student_accuracy": metrics["student"]["accuracy"],
        "retention": metrics["retention"],
    }


@torch.no_grad()
def attention_report(ctx, teacher, student, prepare, pad) -> dict:
    """Health of the mapped layers on validation sentences, plus heatmaps of a few."""
    config = ctx.config
    plan = target_plan(config, teacher.config)
    validation = TokenizedSplit(prepare, "validation")
    indices = np.arange(min(64, len(validation)))
    batch = validation.batch(indices, pad, ctx.device)
    tokenizer = load_tokenizer(str(ctx.input("teacher") / "model"))
    report: dict[str, dict] = {}
    for who, model, layers in (("teacher", teacher, plan.teacher_layers), ("student", student, plan.student_layers)):
        with capture_projections(model, layers, ("query", "key", "value")) as captured:
            model(**model_inputs(batch))
        heads = model.config.num_attention_heads
        report[who] = {}
        for layer in layers:
            probs = attention_probs(
                captured[layer]["query"],
                captured[layer]["key"],
                batch["attention_mask"],
                heads,
                attention_window(model.config, layer),
            )
            outputs = probs @ split_heads(captured[layer]["value"].float(), heads)
            health = attention_health(probs, batch["attention_mask"], outputs)
            report[who][f"layer_{layer}"] = health
            ctx.log_metrics(
                {
                    f"attention/{who}_layer{layer}_min_entropy": min(health["entropy_per_head"]),
                    f"attention/{who}_layer{layer}_norm_imbalance": health["output_norm_imbalance"],
                    f"attention/{who}_layer{layer}_nonfinite": health["nonfinite"],
                }
            )
            if health["low_entropy_heads"]:
                log.info("[evaluate] %s layer %d: near-one-hot heads %s", who, layer, health["low_entropy_heads"])
            captured[layer]["probs"] = probs
        if who == "teacher":
            teacher_probs = {layer: captured[layer]["probs"] for layer in layers}
        else:
            student_probs = {layer: captured[layer]["probs"] for layer in layers}
    for example in range(min(config.evaluate.heatmap_examples, len(indices))):
        n = int(batch["attention_mask"][example].sum())
        tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][example, :n].tolist())
        for s, t in plan.pairs:
            plot_attention_pair(
                teacher_probs[t][example, :, :n, :n].mean(0).cpu().numpy(),
                student_probs[s][example, :, :n, :n].mean(0).cpu().numpy(),
                tokens,
                ctx.out / f"attention_ex{example}_s{s}_t{t}.png",
                f"validation example {example}: teacher layer {t} vs student layer {s} (head mean)",
            )
    return report
