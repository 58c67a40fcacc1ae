"""One capture for variants that differ only in what they ask of the teacher (a sweep file's ``shared_capture:
true``): each such variant's capture stores the union of their targets (``capture.extra_terms`` /
``capture.extra_teacher_layers``), so its fingerprint is the same for all and the teacher runs once; each variant's
distillation reads only its own targets from it (``TeacherCache(reader=...)``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..config import PipelineConfig
from ..objective import capture_plan
from ..runner import fingerprints, stage_module
from ..terms import TERMS

log = logging.getLogger("pipeline")

STORED = [name for name, term in TERMS.items() if set(term.needs) - {"logits"}]  # terms whose targets fill records


def capture_group(config: PipelineConfig, runs_dir: Path) -> str:
    """What a capture depends on besides its targets: the variants with the same key can share one."""
    current = fingerprints(config, runs_dir)
    capture: Any = stage_module("capture")  # a stage module with the optional fingerprint_inputs
    inputs = dict(capture.fingerprint_inputs(config))
    inputs.pop("targets")
    after = {dep: current[dep] for dep in capture.AFTER}
    return json.dumps([after, inputs, config.distill.relation_heads], sort_keys=True, default=str)


def shared_capture_configs(configs: dict[str, PipelineConfig], runs_dir: Path) -> dict[str, PipelineConfig]:
    """``configs`` with, in every group of variants that could share a capture but ask for different teacher targets,
    capture.extra_terms and capture.extra_teacher_layers set to the union of the group's targets. Variants whose
    group asks for one set of targets already share a capture and are returned unchanged (same fingerprints)."""
    groups: dict[str, list[str]] = {}
    for name, config in configs.items():
        groups.setdefault(capture_group(config, runs_dir), []).append(name)
    shared = dict(configs)
    for names in groups.values():
        if configs[names[0]].capture.mode == "online":  # nothing is stored: each computes its own targets
            continue
        plans = {name: capture_plan(configs[name]) for name in names}  # a variant's own extra targets count too
        if len({json.dumps(plan.needed(), sort_keys=True) for plan in plans.values()}) <= 1:
            continue
        terms = [name for name in STORED if any(plan.uses(name) for plan in plans.values())]
        layers = sorted({layer for plan in plans.values() for layer in plan.needed()["teacher_layers"]})
        for name in names:
            capture = configs[name].capture.model_copy(update={"extra_terms": terms, "extra_teacher_layers": layers})
            shared[name] = configs[name].model_copy(update={"capture": capture})
        log.info(
            "[sweep] variants %s share one capture: the teacher targets of %s at teacher layers %s",
            ", ".join(names),
            ", ".join(terms),
            layers or "none",
        )
    return shared
