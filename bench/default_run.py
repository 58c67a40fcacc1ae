"""Time to first result (issue 30): `make distill` on a fresh clone, set-up included, per stage, side by side.

    python bench/default_run.py REV [REV ...] [--config bert_small] [--out bench/results/default_run_bert_small.md]
    python bench/default_run.py --report CLONE [CLONE ...] [--out ...]
    python bench/default_run.py --seeds CLONE [CLONE ...] [--out bench/results/distill_seeds_bert_small.md]

For each REV: `git clone` of this repository into /tmp/default-run-<rev>, checked out at REV, then
`make distill CONFIG=<config>` there (the environment created from nothing, as on a new machine), its wall time
written to CLONE/default_run.json. --report renders completed clones again (no running). Measure alone on the
machine: a job in another shell takes cores from the run.

--seeds (clones with their default_run.json): after `make sweep CONFIG=<config> SWEEP=configs/sweeps/distill_seeds.yaml` in each clone (two more
distillation seeds on the clone's teacher and capture), the run's and each seed's student and shipped accuracy, and
their mean.

Columns: the whole command's wall time; set-up and overhead (wall time less the stages: creating the environment,
Python start-up, MLflow); each stage's own seconds (its manifest's duration_s); the teacher's test accuracy and the
shipped accuracy (the recommended file, one text per call).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, STAGES, command_line, emit

TIMING = "default_run.json"


def run_clone(rev: str, config: str) -> Path:
    """A fresh clone at ``rev`` with `make distill CONFIG=config` run in it, timed."""
    sha = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    clone = Path(f"/tmp/default-run-{sha[:7]}")
    subprocess.run(["rm", "-rf", str(clone)], check=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", sha], cwd=clone, check=True)
    started = time.time()
    with open(clone / "default_run.log", "w") as log:
        subprocess.run(
            ["make", "distill", f"CONFIG={config}"], cwd=clone, stdout=log, stderr=subprocess.STDOUT, check=True
        )
    (clone / TIMING).write_text(json.dumps({"rev": sha, "config": config, "wall_s": time.time() - started}))
    return clone


def shipped_accuracy(run: Path) -> tuple[float, str]:
    """The recommended file's test accuracy (one text per call) and its variant, from export/metrics.json."""
    export = json.loads((run / "export" / "metrics.json").read_text())
    key = {"fp32": "onnx_fp32", "int8": "onnx_int8", "int8_static": "onnx_int8_static"}.get(
        export["recommended"], export["recommended"]
    )
    return export[key]["accuracy"], export["recommended"]


def row(clone: Path) -> dict:
    timing = json.loads((clone / TIMING).read_text())
    run = clone / "runs" / timing["config"]
    stages = {}
    for stage in STAGES:
        manifest = run / stage / "manifest.json"
        if manifest.is_file():
            stages[stage] = json.loads(manifest.read_text())["duration_s"]
    teacher = json.loads((run / "teacher" / "metrics.json").read_text())
    shipped, recommended = shipped_accuracy(run)
    timing["test_examples"] = json.loads((run / "prepare" / "stats.json").read_text())["splits"]["test"]["examples"]
    return {
        **timing,
        "stages": stages,
        "teacher_accuracy": teacher["test_accuracy"],
        "shipped_accuracy": shipped,
        "recommended": recommended,
    }


# Stages recorded under an earlier name (rows of older commits): shown in the stage's column.
FORMER_NAMES = {"baselines": "peers"}


def table(rows: list[dict]) -> list[str]:
    rows = [{**r, "stages": {FORMER_NAMES.get(s, s): v for s, v in r["stages"].items()}} for r in rows]
    stages = [s for s in STAGES if any(s in r["stages"] for r in rows)]
    lines = [
        "# The default run on a fresh clone, set-up included",
        "",
        "| commit | wall time | set-up and overhead | "
        + " | ".join(stages)
        + " | teacher test accuracy | shipped accuracy |",
        "|---|---:|---:|" + "---:|" * len(stages) + "---:|---:|",
    ]
    for r in rows:
        overhead = r["wall_s"] - sum(r["stages"].values())
        lines.append(
            f"| {r['rev'][:7]} | {r['wall_s'] / 60:.1f} min ({r['wall_s']:.0f} s) | {overhead:.0f} s | "
            + " | ".join(f"{r['stages'][s]:.0f} s" if s in r["stages"] else "-" for s in stages)
            + f" | {r['teacher_accuracy']:.5f} ({round(r['teacher_accuracy'] * r['test_examples'])} of {r['test_examples']}) "
            f"| {r['shipped_accuracy']:.4f} ({r['recommended']}) |"
        )
    lines += [
        "",
        "Wall time: the whole `make distill` command. Set-up and overhead: the wall time less the stages "
        "(creating the environment, then Python start-up and MLflow around the stages). Stages: each manifest's "
        "own seconds. Shipped accuracy: the recommended file on the test split, one text per call.",
    ]
    return lines


def seeds_table(clones: list[Path], config: str) -> list[str]:
    lines = [
        "# Three distillation seeds of the default (configs/sweeps/distill_seeds.yaml)",
        "",
        "| commit | seed | student test accuracy (PyTorch) | shipped accuracy |",
        "|---|---|---:|---:|",
    ]
    for clone in clones:
        rev = json.loads((clone / TIMING).read_text())["rev"][:7]
        folder = clone / "runs" / config / "sweeps" / "distill_seeds"
        students, shipped = [], []
        variants = sorted(
            (p for p in folder.iterdir() if (p / "export" / "metrics.json").is_file()), key=lambda p: p.name
        )
        for variant in [clone / "runs" / config, *variants]:  # the run itself: the config's seed
            student = json.loads((variant / "evaluate" / "metrics.json").read_text())["student"]["accuracy"]
            accuracy, recommended = shipped_accuracy(variant)
            students.append(student)
            shipped.append(accuracy)
            name = variant.name if variant in variants else "the run (config seed)"
            lines.append(f"| {rev} | {name} | {student:.4f} | {accuracy:.4f} ({recommended}) |")
        lines.append(
            f"| {rev} | mean of {len(shipped)} (sd) | {statistics.mean(students):.4f} "
            f"({statistics.pstdev(students):.4f}) | {statistics.mean(shipped):.4f} ({statistics.pstdev(shipped):.4f}) |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revs", nargs="*", help="commits to clone and run, one after the other")
    parser.add_argument("--config", default="bert_small")
    parser.add_argument("--report", nargs="+", type=Path, metavar="CLONE", help="render completed clones, run nothing")
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=Path,
        metavar="CLONE",
        help="the distill_seeds sweep of completed clones, run nothing",
    )
    parser.add_argument("--out", type=Path, help="also write the table here (bench/results/...)")
    args = parser.parse_args()
    if args.seeds:
        emit(seeds_table(args.seeds, args.config), args.out, command_line("bench/default_run.py"))
        return
    if not args.revs and not args.report:
        parser.error("give commits to run, or --report / --seeds with completed clones")
    clones = args.report or [run_clone(rev, args.config) for rev in args.revs]
    emit(table([row(clone) for clone in clones]), args.out, command_line("bench/default_run.py"))


if __name__ == "__main__":
    main()
