"""Plots people would rather look at than read: curves, confusion matrices, attention maps."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display
import matplotlib.pyplot as plt  # noqa: E402 (after matplotlib.use, as matplotlib requires)
import numpy as np  # noqa: E402 (grouped with the plotting imports)


def plot_history(history: list[dict], path: Path, title: str) -> None:
    epochs = [h["epoch"] for h in history]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for key in sorted({k for h in history for k in h if k != "epoch"}):
        ax.plot(epochs, [h.get(key) for h in history], marker="o", label=key)
    ax.set_xlabel("epoch")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_confusion(matrix: np.ndarray, labels: list[str], path: Path, title: str) -> None:
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
