"""Sweeps: several variants of one config, the stages they have in common run once, and a pick.

    python -m pipeline sweep bert_small configs/sweeps/depth.yaml --pick "retention>=0.98"

A sweep file (YAML, strict: unknown keys are errors) names its variants, each a set of
overrides on the config::

    description: three student depths          # optional
    overrides: {export.latency_lengths: [128]} # optional: applied to every variant
    pick: retention>=0.98                      # optional: the default --pick
    variants:
      depth1: {description: 1 layer, overrides: {student.teacher_layers: [5]}}
      depth2: {overrides: {student.teacher_layers: [0, 5]}}

Run folders: a variant is a normal pipeline run in its own folder,
``<runs>/<config>/sweeps/<sweep>/<variant>/``. Before it runs, every stage it does not
have complete is looked for, with the variant's own fingerprint, in the config's
ordinary run folder ``<runs>/<config>/``, in the sweep's earlier variant folders and in
other sweeps' variant folders of the same config: a
stage that is complete there with the same fingerprint, read from upstream outputs that
are the same files, is hard-linked into the variant's folder (a copy only across file
systems) and the runner skips it. So prepare, teacher and capture run once for a depth
sweep (or not at all after a ``make distill`` of the same config), and each variant
reruns only what its overrides touch. The runner never writes into a complete stage
folder (a rerun writes ``<stage>.partial`` and renames it), so linked files are never
changed under another folder.

MLflow: one sweep run in the config's experiment; each variant's pipeline run is nested
under it (its stage runs under that). The sweep run gets the comparison table (its
description and sweep.md / sweep.csv / sweep.json), the Pareto plot and the pick; the
pick moves the registry alias ``champion`` to the chosen variant's registered version.

Interrupting a sweep and rerunning it continues where it stopped: complete variants do
no stage work, an interrupted one resumes like any pipeline run.

One job per module: spec.py (the sweep file), pick.py, reuse.py (shared stages), table.py, tracker.py (the
sweep's MLflow run) and run.py; the plots are in pipeline/plots.py with the pipeline's other figures.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .pick import CHAMPION, PICK_METRICS, Constraint, choose, parse_pick
from .spec import Sweep, SweepSpec, Variant, load_sweep, override_items

if TYPE_CHECKING:
    from .reuse import link_stage, reuse_stages
    from .run import run_sweep, sweep_folder
    from .table import markdown_table, reference_points

# reuse, run and table import the runner and torch (seconds): loaded on first use, so that a sweep file that is
# missing or wrong is answered before them (tests/test_sweep.py).
_LAZY = {
    "link_stage": "reuse",
    "reuse_stages": "reuse",
    "run_sweep": "run",
    "sweep_folder": "run",
    "markdown_table": "table",
    "reference_points": "table",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CHAMPION",
    "PICK_METRICS",
    "Constraint",
    "Sweep",
    "SweepSpec",
    "Variant",
    "choose",
    "link_stage",
    "load_sweep",
    "markdown_table",
    "override_items",
    "parse_pick",
    "reference_points",
    "reuse_stages",
    "run_sweep",
    "sweep_folder",
]
