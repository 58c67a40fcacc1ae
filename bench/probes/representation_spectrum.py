"""One-off probe: how much more than the logit do the fine-tuned teacher's top representations carry? (issue 39)

distill.loss.penultimate matches the vector the teacher's classifier output layer reads. It can only pass on more
than logit KD if that vector varies in more directions than the one the logit reads. This probe runs a run's
fine-tuned teacher (PyTorch fp32, one thread) over the first N test texts and reports, for each candidate target,
the share of its variance (centred, over the texts) in the top 1, 5 and 10 principal directions and how many
directions hold 90%: the penultimate vector (what the output layer reads), the last layer's first-token state
(what the head reads before its dense layer), the last layer's mean over the valid tokens and a middle layer's.
``--model`` adds another encoder on the same texts, such as the pretrained one before fine-tuning
(``package:all-mpnet-base-v2``); its classifier head is untrained, so its penultimate row is a random projection
of its first-token state.

    python bench/probes/representation_spectrum.py runs/mpnet_base [--texts 600] [--model package:all-mpnet-base-v2]
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
from pipeline.models import load_classifier, package_folder  # noqa: E402
from pipeline.splits import TokenizedSplit, label_names, pad_id  # noqa: E402


def spectrum(vectors: np.ndarray) -> tuple[float, float, float, int]:
    """Shares of the centred variance in the top 1, 5 and 10 principal directions, and the directions for 90%."""
    centred = vectors - vectors.mean(0)
    energy = np.linalg.svd(centred, compute_uv=False) ** 2
    share = np.cumsum(energy) / energy.sum()
    return float(share[0]), float(share[4]), float(share[9]), int(np.searchsorted(share, 0.9)) + 1


def representations(model, test: TokenizedSplit, count: int, pad: int) -> dict[str, np.ndarray]:
    """The candidate targets of ``model`` over the first ``count`` texts of ``test``, [count, width] each."""
    middle = model.config.num_hidden_layers // 2
    names = ["penultimate", "first token", "token mean", f"token mean, layer {middle}"]
    found: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    with torch.no_grad():
        for start in range(0, count, 50):
            batch = test.batch(np.arange(start, min(start + 50, count)), pad, torch.device("cpu"))
            with capture_classifier_input(model) as head:
                out = model(**model_inputs(batch), output_hidden_states=True)
            mask = batch["attention_mask"].unsqueeze(-1).float()
            last, mid = out.hidden_states[-1], out.hidden_states[middle]
            parts = [head["input"], last[:, 0], (last * mask).sum(1) / mask.sum(1), (mid * mask).sum(1) / mask.sum(1)]
            for name, part in zip(names, parts):
                found[name].append(part)
    return {name: torch.cat(parts).float().numpy() for name, parts in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder with a finished teacher stage")
    parser.add_argument("--texts", type=int, default=600, help="how many test texts (the first ones; default 600)")
    parser.add_argument("--model", help="also read this encoder (a folder or package:<name>), e.g. before fine-tuning")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    prepare = args.run / "prepare"
    test, pad = TokenizedSplit(prepare, "test"), pad_id(prepare)
    count = min(args.texts, len(test))
    sources = [("the fine-tuned teacher", load_classifier(str(args.run / "teacher" / "model")))]
    if args.model:
        name = args.model.removeprefix("package:")
        folder = str(package_folder(name)) if name != args.model else args.model
        sources.append((f"`{args.model}` (head untrained)", load_classifier(folder, label_names(prepare))))
    lines = [
        f"`{args.run}`'s teacher, PyTorch fp32, the first {count} test texts of its split; shares of the centred "
        "variance in the top principal directions.",
        "",
        "| model | representation | width | top 1 | top 5 | top 10 | directions for 90% |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for label, model in sources:
        for name, vectors in representations(model.eval(), test, count, pad).items():
            top1, top5, top10, ninety = spectrum(vectors)
            lines.append(
                f"| {label} | {name} | {vectors.shape[1]} | {top1:.3f} | {top5:.3f} | {top10:.3f} | {ninety} |"
            )
    emit(lines, args.out, command_line("bench/probes/representation_spectrum.py"))


if __name__ == "__main__":
    main()
