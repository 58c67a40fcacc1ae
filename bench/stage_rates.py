"""Per-stage wall time and samples/s of completed run folders (reads manifests only).

    python bench/stage_rates.py runs/bert_small [more run folders...] [> bench/results/NAME.md]

The output starts with the command, date and machine (the header bench/report.py reads).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def rates(run_dir: Path) -> dict:
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    stats = json.loads((run_dir / "prepare" / "stats.json").read_text())["splits"]
    train, val, test = (stats[s]["examples"] for s in ("train", "validation", "test"))
    work = {  # examples processed by each stage (training stages: epochs x train, plus validation passes)
        "prepare": train + val + test,
        "teacher": config["teacher"]["epochs"] * (train + val) + val + test,
        "capture": train,
        "distill": config["distill"]["epochs"] * (train + val),
        "evaluate": 2 * test,
    }
    out = {}
    for stage, examples in work.items():
        manifest = run_dir / stage / "manifest.json"
        if manifest.is_file():
            seconds = json.loads(manifest.read_text())["duration_s"]
            out[stage] = {"seconds": seconds, "samples_per_s": examples / max(seconds, 1e-9)}
    return {"precision": config["precision"], "stages": out}


def main() -> None:
    import argparse

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import command_line, header_lines

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders (each with config.yaml)")
    runs = parser.parse_args().runs
    missing = [str(p) for p in runs if not (p / "config.yaml").is_file()]
    if missing:
        parser.error(f"not run folders (no config.yaml): {', '.join(missing)}")
    rows = {str(p): rates(p) for p in runs}
    print("\n".join(header_lines(command_line("bench/stage_rates.py"))))  # bench/report.py reads it
    print(
        "| run | precision | "
        + " | ".join(f"{s} s (samples/s)" for s in ("teacher", "capture", "distill", "evaluate"))
        + " |"
    )
    print("|---|---|" + "---:|" * 4)
    for name, r in rows.items():
        cells = [
            f"{r['stages'][s]['seconds']:.1f} ({r['stages'][s]['samples_per_s']:.0f})" if s in r["stages"] else "-"
            for s in ("teacher", "capture", "distill", "evaluate")
        ]
        print(f"| {name} | {r['precision']} | " + " | ".join(cells) + " |")
    print()
    print("```json")
    print(json.dumps(rows, indent=1))
    print("```")


if __name__ == "__main__":
    main()
