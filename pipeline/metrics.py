"""Classification metrics (numpy only) and attention health figures."""

from __future__ import annotations

import numpy as np
import torch


def confusion(labels: np.ndarray, predictions: np.ndarray, num_labels: int) -> np.ndarray:
    matrix = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(matrix, (labels, predictions), 1)
    return matrix


def classification_report(labels: np.ndarray, predictions: np.ndarray, names: list[str]) -> dict:
    """accuracy, macro-F1 and per-class precision / recall / F1 / support."""
    matrix = confusion(labels, predictions, len(names))
    per_class, f1s = {}, []
    for i, name in enumerate(names):
        tp = matrix[i, i]
        precision = tp / matrix[:, i].sum() if matrix[:, i].sum() else 0.0
        recall = tp / matrix[i].sum() if matrix[i].sum() else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class[name] = {
            "precision": float(precision),
            "recall": float(recall),
            "f1": float(f1),
            "support": int(matrix[i].sum()),
        }
        f1s.append(f1)
    return {
        "accuracy": float((labels == predictions).mean()),
        "macro_f1": float(np.mean(f1s)),
        "per_class": per_class,
        "confusion_matrix": matrix.tolist(),
    }


def attention_health(probs: torch.Tensor, mask: torch.Tensor, head_outputs: torch.Tensor | None = None) -> dict:
    """Per-head entropy of attention rows (normalised to [0, 1] by log n) and NaN/inf counts.

    probs: [B,H,N,N]; mask: [B,N]. A head whose mean normalised entropy is
    below 0.1 attends almost one-hot (flagged); head_outputs [B,H,N,d], when
    given, yields per-head output norms and their max/min imbalance.
    """
    valid = mask.bool()
    n = mask.sum(-1).clamp(min=2).float()  # [B]
    p = probs.float().clamp_min(1e-12)
    entropy = -(probs.float() * p.log()).sum(-1)  # [B,H,N]
    entropy = entropy / n.log()[:, None, None]
    rows = valid[:, None, :].expand_as(entropy)
    per_head = (entropy * rows).sum((0, 2)) / rows.sum((0, 2)).clamp(min=1)
    result = {
        "entropy_per_head": per_head.tolist(),
        "low_entropy_heads": [i for i, e in enumerate(per_head.tolist()) if e < 0.1],
        "nonfinite": int((~torch.isfinite(probs)).sum()),
    }
    if head_outputs is not None:
        norms = (head_outputs.float().norm(dim=-1) * valid[:, None, :]).sum((0, 2)) / valid.sum()
        result["output_norm_per_head"] = norms.tolist()
        result["output_norm_imbalance"] = float(norms.max() / norms.min().clamp(min=1e-12))
    return result
