"""The from-raw-text comparison (student, int8 teacher, peers) of finished runs, as one markdown table.

    python bench/peers_table.py runs/bert_small runs/bert_small/sweeps/static_seeds/seed1 ... [--out FILE.md]

Reads each run folder's export/metrics.json ("from_text", written by the export stage) and prints one row per
model per run, then, where several runs hold the same student kind, the mean and spread of its accuracy and of
its margin over the best peer (seed noise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, emit


def rows_of(run_dir: Path) -> tuple[list[dict], dict | None]:
    metrics = json.loads((run_dir / "export" / "metrics.json").read_text())
    from_text = metrics.get("from_text") or {}
    if not from_text.get("measured"):
        raise SystemExit(
            f"{run_dir}: no from-text comparison in export/metrics.json ({from_text.get('why', 'missing')})"
        )
    return from_text["rows"], from_text.get("versus_peers")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (runs/<config> or a sweep variant's folder)")
    parser.add_argument("--out", type=Path, help="also write the table here, headed by command, date and machine")
    args = parser.parse_args(argv)
    lines = [
        "| run | model | accuracy | macro-F1 | file MB | ms per text | training s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    students: dict[str, list[tuple[float, float, float | None]]] = {}
    for run in args.runs:
        rows, versus = rows_of(run)
        for row in rows:
            train = f"{row['train_seconds']:.0f}" if row.get("train_seconds") is not None else "-"
            lines.append(
                f"| {run} | {row['title']} | {row['accuracy']:.4f} | {row['macro_f1']:.4f} | "
                f"{row['file_mb']:.1f} | {row['median_ms']:.3f} | {train} |"
            )
            if row["kind"] == "student" and versus:  # each student row's own margins (a static run has two)
                f1 = versus.get("best_peer_macro_f1")  # metrics.json files written before 2026-12-05 lack it
                students.setdefault(row["title"], []).append(
                    (
                        row["accuracy"],
                        100 * (row["accuracy"] - versus["best_peer_accuracy"]),
                        None if f1 is None else 100 * (row["macro_f1"] - f1),
                    )
                )
    for title, values in students.items():
        if len(values) > 1:
            accuracy, margin = [v[0] for v in values], [v[1] for v in values]
            f1_margin = [v[2] for v in values if v[2] is not None]
            f1_line = (
                f"; macro-F1 margin over the best peer by macro-F1 {statistics.mean(f1_margin):+.2f} points "
                f"(min {min(f1_margin):+.2f}, max {max(f1_margin):+.2f})"
                if len(f1_margin) == len(values)
                else ""
            )
            lines += [
                "",
                f"{title}, {len(values)} runs: accuracy {statistics.mean(accuracy):.4f} "
                f"(min {min(accuracy):.4f}, max {max(accuracy):.4f}); margin over the best peer "
                f"{statistics.mean(margin):+.2f} points (min {min(margin):+.2f}, max {max(margin):+.2f}){f1_line}",
            ]
    emit(lines, args.out, command=command_line("bench/peers_table.py", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
