"""One-off probe: do students trained from one start on the same data differ enough for averaging to pay? (issue 39)

If the phone-shaped student under the base teacher were held by its seeds' variance, averaging would lift it:
the mean of their class probabilities (an ensemble, three models' time) or the mean of their weights (a "model
soup", Wortsman et al. 2022: one model's time, possible because every seed starts from the same weights). If
neither moves it, the seeds have learnt the same function and the shape's capacity is what holds it.

Each RUN is a finished run folder of the same split whose distill/student starts from the same weights (the seeds
of one sweep). Accuracy is PyTorch's on the test split (fp32, batched), as in the evaluate stage.

    python bench/probes/student_ensemble.py runs/mpnet_base/sweeps/base_phone_imdb/phone_imdb_s{1,2,3}
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import command_line, emit  # noqa: E402  (also puts the repository on the path)

from pipeline.inference import predict_logits  # noqa: E402
from pipeline.models import load_classifier  # noqa: E402
from pipeline.splits import TokenizedSplit, pad_id  # noqa: E402


class OneProcess:
    """What predict_logits reads of a stage context: one rank on the CPU, no autocast (fp32)."""

    rank, world, device = 0, 1, torch.device("cpu")

    @staticmethod
    def autocast():
        return contextlib.nullcontext()


def averaged(states: list[dict]) -> dict:
    """The element-wise mean of floating-point weights (integer buffers such as position ids taken from the first)."""
    return {
        key: (sum(s[key].float() for s in states) / len(states)).to(states[0][key].dtype)
        if states[0][key].is_floating_point()
        else states[0][key]
        for key in states[0]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders whose students share their start weights")
    args = parser.parse_args()
    if len(args.runs) < 2:
        parser.error("give at least two runs (the seeds to average)")
    torch.set_num_threads(1)
    test = TokenizedSplit(args.runs[0] / "prepare", "test")
    pad = pad_id(args.runs[0] / "prepare")

    def logits(model) -> np.ndarray:
        with torch.no_grad():
            return predict_logits(model.eval(), test, 64, OneProcess, pad)

    def accuracy(values: np.ndarray) -> float:
        return float((values.argmax(-1) == test.labels).mean())

    models = [load_classifier(str(run / "distill" / "student")) for run in args.runs]
    each = [logits(model) for model in models]
    rows = [(f"student `{run.name}`", accuracy(value)) for run, value in zip(args.runs, each)]
    mean = float(np.mean([score for _, score in rows]))
    rows.append(("mean of the students", mean))
    probabilities = np.mean([torch.softmax(torch.from_numpy(value), -1).numpy() for value in each], axis=0)
    rows.append((f"ensemble: mean class probabilities ({len(models)} models' time)", accuracy(probabilities)))
    states = [model.state_dict() for model in models]
    soup = load_classifier(str(args.runs[0] / "distill" / "student"))
    soup.load_state_dict(averaged(states))
    rows.append((f"uniform soup of all {len(models)} (one model's time)", accuracy(logits(soup))))
    for i, j in itertools.combinations(range(len(models)), 2):
        soup.load_state_dict(averaged([states[i], states[j]]))
        rows.append((f"soup of `{args.runs[i].name}` and `{args.runs[j].name}`", accuracy(logits(soup))))
    predictions = [value.argmax(-1) for value in each]
    agreement = [float((a == b).mean()) for a, b in itertools.combinations(predictions, 2)]
    lines = [
        "# Averaging students of one start: ensemble and weight soup",
        "",
        f"PyTorch fp32 accuracy on the {len(test)} test texts of `{args.runs[0]}`'s split. The students give the "
        f"same label to {100 * min(agreement):.1f}-{100 * max(agreement):.1f}% of the texts (each pair).",
        "",
        "| model | accuracy | vs the mean of the students |",
        "|---|---:|---:|",
        *(f"| {name} | {score:.4f} | {100 * (score - mean):+.2f} |" for name, score in rows),
    ]
    emit(lines, None, command_line("bench/probes/student_ensemble.py"))


if __name__ == "__main__":
    main()
