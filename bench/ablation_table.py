"""A loss ablation run as a sweep with seeds, as one markdown table: mean and spread of each loss setting.

    python bench/ablation_table.py runs/mpnet_base/sweeps/base_ablation [--spec configs/sweeps/base_ablation.yaml] [--out FILE.md]

Reads every variant folder of the sweep whose name is ``<setting>_s<seed>`` (configs/sweeps/base_ablation.yaml)
and has finished evaluate: the test accuracy and macro-F1 of the student in PyTorch, its retention of the teacher,
its distillation seconds. One row per setting in the sweep file's order: the mean over seeds, the lowest and
highest, and each setting's difference from the previous one (the lever it adds; with --against-first, from the
first setting) with the seeds it has in common.
Settings with fewer seeds than the others are marked. The labels and the order come from the sweep's sweep.json,
written when the whole sweep ends; ``--spec`` reads them from the sweep file instead (a sweep stopped part way).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, emit

from pipeline.config import read_yaml
from pipeline.sweep.spec import SweepSpec

VARIANT = re.compile(r"^(?P<setting>.+)_s(?P<seed>\d+)$")


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def collect(
    sweep_dir: Path, spec_file: Path | None = None
) -> tuple[dict[str, dict[int, dict]], dict[str, str], float | None]:
    """{setting: {seed: figures}} in the sweep file's order (``spec_file``, else sweep.json, else by name),
    {setting: description} and the teacher's accuracy, from the variant folders."""
    if spec_file is not None:
        spec = SweepSpec.model_validate(read_yaml(spec_file))
        descriptions = {name: variant.description for name, variant in spec.variants.items()}
    else:
        record = _json(sweep_dir / "sweep.json")
        descriptions = {v["variant"]: v.get("description", "") for v in record.get("variants", [])}
    runs: dict[str, dict[int, dict]] = {}
    labels: dict[str, str] = {}
    teacher = None
    for folder in sorted(p for p in sweep_dir.iterdir() if p.is_dir()):
        match = VARIANT.match(folder.name)
        metrics = _json(folder / "evaluate" / "metrics.json")
        if not match or not metrics.get("student"):
            continue
        setting, seed = match["setting"], int(match["seed"])
        distill = _json(folder / "distill" / "manifest.json")
        runs.setdefault(setting, {})[seed] = {
            "accuracy": metrics["student"]["accuracy"],
            "macro_f1": metrics["student"]["macro_f1"],
            "retention": metrics["retention"],
            "seconds": distill.get("duration_s"),
        }
        teacher = metrics["teacher"]["accuracy"]
        label = descriptions.get(folder.name, "")
        labels.setdefault(setting, re.sub(r",? seed \d+$", "", label) or setting)
    order = list(dict.fromkeys(m["setting"] for m in map(VARIANT.match, descriptions) if m))
    runs = dict(sorted(runs.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))
    return runs, labels, teacher


def _cell(values: list[float], points: bool = False) -> str:
    scale = 100 if points else 1
    mean = statistics.mean(values) * scale
    if len(values) == 1:
        return f"{mean:.4f}" if not points else f"{mean:+.2f}"
    low, high = min(values) * scale, max(values) * scale
    return f"{mean:.4f} ({low:.4f}-{high:.4f})" if not points else f"{mean:+.2f} ({low:+.2f} to {high:+.2f})"


def table(
    runs: dict[str, dict[int, dict]], labels: dict[str, str], teacher: float | None, against_first: bool = False
) -> list[str]:
    """One row per setting; each compared with the row above (levers added one after another) or, with
    ``against_first``, with the first row (levers tried one at a time on the same default)."""
    most = max((len(seeds) for seeds in runs.values()), default=0)
    over = "the first row" if against_first else "the row above"
    lines = [
        "| student losses | seeds | accuracy, mean (min-max) | macro-F1, mean | retention, mean | "
        f"points over {over}, same seeds (min to max) | distill s, mean |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    first, previous = next(iter(runs), None), None
    for setting, seeds in runs.items():
        accuracy = [seeds[s]["accuracy"] for s in sorted(seeds)]
        reference = first if against_first and setting != first else previous
        gain = "-"
        if reference is not None and (common := sorted(set(seeds) & set(runs[reference]))):
            gain = _cell([seeds[s]["accuracy"] - runs[reference][s]["accuracy"] for s in common], points=True)
        seconds = [seeds[s]["seconds"] for s in seeds if seeds[s]["seconds"] is not None]
        marked = f"{len(seeds)}" + (" (fewer)" if len(seeds) < most else "")
        macro_f1 = statistics.mean(seeds[s]["macro_f1"] for s in seeds)
        retention = statistics.mean(seeds[s]["retention"] for s in seeds)
        lines.append(
            f"| {labels[setting]} | {marked} | {_cell(accuracy)} | {macro_f1:.4f} | {retention:.4f} | {gain} | "
            f"{f'{statistics.mean(seconds):.0f}' if seconds else '-'} |"
        )
        previous = setting
    if teacher is not None:
        lines.append(f"| teacher (fine-tuned, PyTorch) | - | {teacher:.4f} | - | 1.0000 | - | - |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="the sweep folder (runs/<config>/sweeps/<sweep>)")
    parser.add_argument(
        "--spec", type=Path, help="the sweep file, for labels and order when the sweep stopped before sweep.json"
    )
    parser.add_argument("--out", type=Path, help="also write the table here, headed by command, date and machine")
    parser.add_argument(
        "--against-first",
        action="store_true",
        help="compare every setting with the first (levers tried one at a time on one default) instead of the one above",
    )
    args = parser.parse_args(argv)
    if not args.sweep.is_dir():
        print(
            f"error: {args.sweep} is not a folder; give a sweep folder, e.g. runs/mpnet_base/sweeps/base_ablation",
            file=sys.stderr,
        )
        return 2
    if args.spec is not None and not args.spec.is_file():
        print(
            f"error: --spec {args.spec} is not a file; give the sweep's YAML file, e.g. configs/sweeps/base_ablation.yaml",
            file=sys.stderr,
        )
        return 2
    runs, labels, teacher = collect(args.sweep, args.spec)
    if not runs:
        print(f"error: no variant named <setting>_s<seed> with a finished evaluate in {args.sweep}", file=sys.stderr)
        return 2
    emit(table(runs, labels, teacher, args.against_first), args.out, command_line("bench/ablation_table.py", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
