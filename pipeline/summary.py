"""The table `make distill` ends with."""

from __future__ import annotations

import json
from pathlib import Path


def print_summary(run_dir: Path, ran: list[str]) -> None:
    metrics_path = Path(run_dir) / "evaluate" / "metrics.json"
    print()
    print(f"run folder: {run_dir}   stages run now: {', '.join(ran) or 'none (all current)'}")
    if not metrics_path.is_file():
        return
    m = json.loads(metrics_path.read_text())
    rows = [("teacher (PyTorch)", m["teacher"]), ("student (PyTorch)", m["student"])]
    rows += [(f"student {name}", values) for name, values in m.get("exported", {}).items()]
    print(f"{'model':<24} {'accuracy':>9} {'macro-F1':>9} {'params':>12} {'size MB':>9}")
    for name, values in rows:
        size = values.get("file_mb")
        print(f"{name:<24} {values['accuracy']:>9.4f} {values['macro_f1']:>9.4f} {values.get('parameters', 0):>12,} "
              f"{(f'{size:.1f}' if size else '-'):>9}")
    print(f"retention (student / teacher accuracy): {m['retention']:.4f}   agreement: {m.get('agreement', float('nan')):.4f}")
    bundle = Path(run_dir) / "export" / "bundle"
    if bundle.is_dir():
        print(f"mobile bundle: {bundle}")
