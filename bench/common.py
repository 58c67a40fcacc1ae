"""What the bench scripts share, kept once: the import path, the product's stage order, ``emit``, ``spread``
and ``link_upstream``."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
for _path in (str(ROOT), str(BENCH)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from pipeline.runner import STAGES  # noqa: E402,F401  (the runner's order: the bench keeps no copy)
from pipeline.sweep import link_stage  # noqa: E402


def emit(lines: list[str], out: Path | None) -> None:
    """Print a markdown report and, with ``out``, write it there too (the committed copy in bench/results)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)


def spread(values: list[float]) -> dict:
    """min / median / max / n of repeated measurements (the form every bench JSON uses)."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def link_upstream(source: Path, target: Path) -> None:
    """Hard-link a base run's complete stages into another run folder (the sweep's ``link_stage``); the runner
    reruns exactly those whose fingerprints differ (a rerun writes <stage>.partial and renames it, so the base
    files are never modified)."""
    target.mkdir(parents=True, exist_ok=True)
    for stage in STAGES:
        if (source / stage).is_dir() and not (target / stage).exists():
            link_stage(source / stage, target / stage)
