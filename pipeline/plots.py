"""Plots people would rather look at than read: curves, confusion matrices, attention maps, a sweep's variants."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def _pyplot():
    """matplotlib's pyplot, headless (never needs a display), imported on the first plot: every command imports this
    module through the stages, and most of them draw nothing (half a second each on two cores)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_history(history: list[dict], path: Path, title: str) -> None:
    plt = _pyplot()
    epochs = [h["epoch"] for h in history]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for key in sorted({k for h in history for k in h if k != "epoch"}):
        ax.plot(epochs, [h.get(key, np.nan) for h in history], marker="o", label=key)
    ax.set_xlabel("epoch")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_confusion(matrix: np.ndarray, labels: list[str], path: Path, title: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(labels), 1.0 + 0.9 * len(labels)))
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for i in range(len(labels)):
        for j in range(len(labels)):
            ax.text(
                j,
                i,
                str(int(matrix[i, j])),
                ha="center",
                va="center",
                color="white" if matrix[i, j] > matrix.max() / 2 else "black",
            )
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_attention_pair(teacher: np.ndarray, student: np.ndarray, tokens: list[str], path: Path, title: str) -> None:
    """Head-averaged attention of a mapped teacher layer next to the student's."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    for ax, matrix, name in ((axes[0], teacher, "teacher"), (axes[1], student, "student")):
        ax.imshow(matrix, cmap="viridis", vmin=0, vmax=max(teacher.max(), student.max()))
        ax.set_title(name)
        ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(len(tokens)), tokens, fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pareto_front(rows: list[dict], x: str) -> list[dict]:
    """Rows no other row beats on both retention (higher) and ``x`` (lower), sorted by ``x``."""
    points = [r for r in rows if r.get(x) is not None and r.get("retention") is not None]
    front = [
        r
        for r in points
        if not any(
            o is not r
            and o[x] <= r[x]
            and o["retention"] >= r["retention"]
            and (o[x] < r[x] or o["retention"] > r["retention"])
            for o in points
        )
    ]
    return sorted(front, key=lambda r: r[x])


def pareto_plot(
    rows: list[dict],
    path: Path,
    title: str,
    picked: str | None,
    references: list[dict] | tuple[()] = (),
    alias: str = "picked",
) -> Path | None:
    """A sweep's variants: retention against latency and against size, the Pareto front joined, the pick starred
    (labelled with the registry ``alias`` it moved); with reference points (peers, int8 teacher from raw text)
    the ladder plot instead (ladder_plot)."""
    plt = _pyplot()
    if references and any(r.get("text_ms") is not None for r in rows):
        return ladder_plot(rows, references, path, title, picked, alias)
    panels = [
        ("latency_ms", "shipped latency, ms (batch 1, median)", "baseline_latency_ms"),
        ("mb", "shipped file, MB", "baseline_mb"),
    ]
    if not any(r.get(x) is not None and r.get("retention") is not None for x, _, _ in panels for r in rows):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (x, label, baseline) in zip(axes, panels):
        points = [r for r in rows if r.get(x) is not None and r.get("retention") is not None]
        ax.scatter([r[x] for r in points], [r["retention"] for r in points], color="tab:blue", zorder=3)
        for r in points:
            ax.annotate(r["variant"], (r[x], r["retention"]), textcoords="offset points", xytext=(5, 4), fontsize=9)
        front = pareto_front(rows, x)
        if len(front) > 1:
            ax.plot(
                [r[x] for r in front],
                [r["retention"] for r in front],
                color="tab:blue",
                alpha=0.5,
                label="Pareto front",
            )
        chosen = [r for r in points if r["variant"] == picked]
        if chosen:
            ax.scatter(
                [chosen[0][x]],
                [chosen[0]["retention"]],
                marker="*",
                s=260,
                color="tab:orange",
                zorder=4,
                label=f"{alias}: {picked}",
            )
        ref = next((r[baseline] for r in rows if r.get(baseline) is not None), None)
        if ref is not None:
            ax.axvline(ref, color="gray", linestyle="--", label="int8 teacher")
        ax.set_xlabel(label)
        ax.set_ylabel("retention (student / teacher accuracy)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="lower right")
    return save_figure(fig, title, path)


def ladder_plot(
    rows: list[dict], references: list[dict], path: Path, title: str, picked: str | None, alias: str = "picked"
) -> Path:
    """Accuracy from raw text against ms per text (log) and against file size: students joined, peers and the
    int8 teacher as grey reference points, the pick starred."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.4))
    for ax, (x, label) in zip(
        axes, [("text_ms", "ms per text from raw text (batch 1, 1 thread, median, log)"), ("mb", "file, MB")]
    ):
        students = sorted(
            (r for r in rows if r.get(x) is not None and r.get("text_accuracy") is not None), key=lambda r: r[x]
        )
        ax.plot(
            [r[x] for r in students],
            [r["text_accuracy"] for r in students],
            "o-",
            color="tab:blue",
            zorder=3,
            label="students",
        )
        for r in students:
            ax.annotate(r["variant"], (r[x], r["text_accuracy"]), textcoords="offset points", xytext=(5, 4), fontsize=9)
        refs = [r for r in references if r.get(x) is not None]
        ax.scatter(
            [r[x] for r in refs],
            [r["text_accuracy"] for r in refs],
            marker="s",
            color="gray",
            zorder=3,
            label="peers and int8 teacher (references)",
        )
        for r in refs:
            ax.annotate(
                r["name"].split(" (")[0].split(" + ")[0],
                (r[x], r["text_accuracy"]),
                textcoords="offset points",
                xytext=(5, -10),
                fontsize=8,
                color="dimgray",
            )
        chosen = [r for r in students if r["variant"] == picked]
        if chosen:
            ax.scatter(
                [chosen[0][x]],
                [chosen[0]["text_accuracy"]],
                marker="*",
                s=260,
                color="tab:orange",
                zorder=4,
                label=f"{alias}: {picked}",
            )
        if x == "text_ms":
            ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy (one text per call)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    return save_figure(fig, title, path)


def save_figure(fig, title: str, path: Path) -> Path:
    """Title, layout, then written whole and renamed into place."""
    plt = _pyplot()
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
