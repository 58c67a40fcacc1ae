"""distill.used_embedding_rows against the full embedding table: the distill stage of a completed run, twice, on
the same prepare / teacher / capture outputs (hard links, nothing re-run upstream), one process, no tracking.

    python bench/used_embedding_rows.py runs/bert_small [--out bench/results/used_embedding_rows_bert_small.md]

Prints the stage's wall time, its seconds per optimizer step (wall time over epochs x batches of the training
rows, augmented copies included) and its validation accuracy, lever on and off, in that order. The used rows
train exactly as the full table trains them (tests/test_levers.py), so the accuracy should not move at all.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, command_line, emit, link_upstream


def distill_once(source: Path, used_rows: bool, scratch: Path) -> dict:
    runs = scratch / ("used" if used_rows else "full")
    run = runs / source.name
    link_upstream(source, run)
    for later in ("distill", "evaluate", "export"):  # this lever's stage runs fresh
        target = run / later
        if target.exists():
            subprocess.run(["rm", "-rf", str(target)], check=True)
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            source.name,
            "--only",
            "distill",
            "--runs-dir",
            str(runs),
            "tracking.enabled=false",
            f"distill.used_embedding_rows={str(used_rows).lower()}",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    manifest = json.loads((run / "distill" / "manifest.json").read_text())
    return {
        "wall_s": wall,
        "stage_s": manifest["duration_s"],
        "validation_accuracy": manifest["summary"]["validation_accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a completed run folder (runs/<config>) with prepare, teacher, capture")
    parser.add_argument("--out", type=Path, help="also write the report here (bench/results/...)")
    args = parser.parse_args()
    source = args.run.resolve()
    config = yaml.safe_load((source / "config.yaml").read_text())
    train = json.loads((source / "prepare" / "stats.json").read_text())["splits"]["train"]["examples"]
    copies = ((config.get("capture") or {}).get("augment") or {}).get("copies", 0) or 0
    steps = config["distill"]["epochs"] * math.ceil(train * (1 + copies) / config["distill"]["batch_size"])
    with tempfile.TemporaryDirectory(dir=source.parent) as scratch:  # same disk: hard links
        results = {used: distill_once(source, used, Path(scratch)) for used in (True, False)}
    lines = [
        f"# distill.used_embedding_rows ({source.name})",
        "",
        f"The distill stage alone, {steps} optimizer steps ({train} training rows x {1 + copies} with the "
        f"augmented copies, {config['distill']['epochs']} epochs, batch {config['distill']['batch_size']}), "
        f"precision {config['precision']}, one process, tracking off; lever on first, then off.",
        "",
        "| embedding rows trained | distill stage s | s per step | validation accuracy |",
        "|---|---:|---:|---:|",
    ]
    for used, label in (
        (True, "the used ones (distill.used_embedding_rows: true, the default)"),
        (False, "all (distill.used_embedding_rows: false)"),
    ):
        r = results[used]
        lines.append(f"| {label} | {r['stage_s']:.1f} | {r['stage_s'] / steps:.3f} | {r['validation_accuracy']:.4f} |")
    on, off = results[True]["stage_s"], results[False]["stage_s"]
    lines += [
        "",
        f"The stage takes {on / off:.2f}x the full table's time "
        f"({off - on:.0f} s less); validation accuracy {results[True]['validation_accuracy']:.6f} against "
        f"{results[False]['validation_accuracy']:.6f}.",
    ]
    emit(lines, args.out, command_line("bench/used_embedding_rows.py"))


if __name__ == "__main__":
    main()
