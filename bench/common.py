"""What the bench scripts share, kept once: the import path, the product's stage order, and ``spread``."""

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


def spread(values: list[float]) -> dict:
    """min / median / max / n of repeated measurements (the form every bench JSON uses)."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}
