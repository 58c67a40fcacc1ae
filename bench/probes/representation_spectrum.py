"""One-off probe: how much more than the logit do the fine-tuned teacher's top representations carry? (issue 39)

distill.loss.penultimate matches the vector the teacher's classifier output layer reads. It can only pass on more
than logit KD if that vector varies in more directions than the one the logit reads. This probe runs a run's
fine-tuned teacher (PyTorch fp32, one thread) over the first N test texts and reports, for three candidate targets,
the share of their variance (centred, over the texts) in the top 1, 5 and 10 principal directions and how many
directions hold 90%: the penultimate vector (what the output layer reads), the last layer's first-token state
(what the head reads before its dense layer) and the last layer's mean over the valid tokens.

    python bench/probes/representation_spectrum.py runs/mpnet_base [--texts 600]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import command_line, emit  # noqa: E402  (also puts the repository on the path)

from pipeline.attention import capture_classifier_input  # noqa: E402
from pipeline.inference import model_inputs  # noqa: E402
from pipeline.models import load_classifier  # noqa: E402
from pipeline.splits import TokenizedSplit, pad_id  # noqa: E402


def spectrum(vectors: np.ndarray) -> tuple[float, float, float, int]:
    """Shares of the centred variance in the top 1, 5 and 10 principal directions, and the directions for 90%."""
    centred = vectors - vectors.mean(0)
    energy = np.linalg.svd(centred, compute_uv=False) ** 2
    share = np.cumsum(energy) / energy.sum()
    return float(share[0]), float(share[4]), float(share[9]), int(np.searchsorted(share, 0.9)) + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder with a finished teacher stage")
    parser.add_argument("--texts", type=int, default=600, help="how many test texts (the first ones; default 600)")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    teacher = load_classifier(str(args.run / "teacher" / "model")).eval()
    test = TokenizedSplit(args.run / "prepare", "test")
    pad = pad_id(args.run / "prepare")
    count = min(args.texts, len(test))
    found: dict[str, list[torch.Tensor]] = {"penultimate": [], "first token": [], "token mean": []}
    with torch.no_grad():
        for start in range(0, count, 50):
            batch = test.batch(np.arange(start, min(start + 50, count)), pad, torch.device("cpu"))
            with capture_classifier_input(teacher) as head:
                out = teacher(**model_inputs(batch), output_hidden_states=True)
            last, mask = out.hidden_states[-1], batch["attention_mask"].unsqueeze(-1).float()
            found["penultimate"].append(head["input"])
            found["first token"].append(last[:, 0])
            found["token mean"].append((last * mask).sum(1) / mask.sum(1))
    lines = [
        f"`{args.run}`'s teacher, PyTorch fp32, the first {count} test texts; shares of the centred variance.",
        "",
        "| representation | width | top 1 | top 5 | top 10 | directions for 90% |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, parts in found.items():
        vectors = torch.cat(parts).float().numpy()
        top1, top5, top10, ninety = spectrum(vectors)
        lines.append(f"| {name} | {vectors.shape[1]} | {top1:.3f} | {top5:.3f} | {top10:.3f} | {ninety} |")
    emit(lines, args.out, command_line("bench/probes/representation_spectrum.py"))


if __name__ == "__main__":
    main()
