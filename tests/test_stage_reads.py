"""Fingerprints cannot drift: every config key a stage reads is declared in its READS.

A stage's fingerprint covers its READS and, through the fingerprints of
the stages in AFTER, theirs. Each stage of a small `tiny` run (with FFN pruning, augmentation and vocabulary
trimming on, so their code paths read their keys too) gets a config that
records every key read through it, including reads inside the pipeline
functions the stage passes its config to. A key read but not covered by READS
would change the stage's output without changing its fingerprint: a stale
result that looks current.
"""

from __future__ import annotations

import types

import pytest
from pydantic import BaseModel

from pipeline.config import load_config

pytestmark = pytest.mark.pipeline  # a tiny run, every stage reading through a recording config

# Keys that never change a stage's output: the run's name and description
# (folder, titles) and where MLflow records it.
NOT_INPUTS = ("name", "description", "tracking")


class RecordingConfig:
    """A read-only view of a config section that records the dotted key of every value read."""

    def __init__(self, model: BaseModel, reads: set[str], prefix: str = ""):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_reads", reads)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name: str):
        model, prefix = self._model, self._prefix
        if name in type(model).model_fields:
            value = getattr(model, name)
            if isinstance(value, BaseModel):
                return RecordingConfig(value, self._reads, f"{prefix}{name}.")
            self._reads.add(f"{prefix}{name}")
            return value
        if name == "section":  # a dotted key read at once

            def section(dotted: str):
                self._reads.add(f"{prefix}{dotted}")
                return model.section(dotted)

            return section
        attribute = getattr(type(model), name, None)
        if callable(attribute) and not hasattr(BaseModel, name):  # the config's own methods read through the recorder
            return types.MethodType(attribute, self)
        self._reads.add(prefix.rstrip(".") or "(whole config)")  # anything else reads the whole section
        return getattr(model, name)

    def __setattr__(self, name, value):
        raise AttributeError("configs are read-only in stages")


def fingerprinted(stage: str) -> list[str]:
    """Keys a stage's fingerprint covers: its READS, and through AFTER those of the stages it reads."""
    from pipeline.runner import stage_module

    module = stage_module(stage)
    return [*module.READS, *(key for before in module.AFTER for key in fingerprinted(before))]


def covered(key: str, declared: list[str]) -> bool:
    return any(key == d or key.startswith(d + ".") for d in declared)


def test_recorder_sees_reads_inside_methods_and_nested_sections():
    reads: set[str] = set()
    config = RecordingConfig(load_config("tiny"), reads)
    assert config.student_depth() == 1
    assert config.data.max_length == 32 and config.section("export.opset") == 18
    assert {"student.init", "student.teacher_layers", "data.max_length", "export.opset"} <= reads
    assert not covered("evaluate.batch_size", ["evaluate.heatmap_examples", "seed"])
    assert covered("evaluate.batch_size", ["evaluate"]) and not covered("distill", ["distill.lr"])


def test_every_key_a_stage_reads_is_declared(tmp_path, monkeypatch):
    import pipeline.runner as runner
    from pipeline.runner import STAGES, resolve_precision, run_pipeline

    config = load_config(
        "tiny",
        [
            "data.max_examples=160",
            "teacher.epochs=1",
            "distill.epochs=1",
            "student.ffn_size=32",
            "student.ffn_importance_examples=16",
            "capture.augment.copies=1",
            "export.trim_vocab=true",
            "export.latency_runs=2",
            "export.latency_rounds=1",
            "export.latency_sentences=4",
            "tracking.enabled=false",
        ],
    )
    config = config.model_copy(update={"precision": resolve_precision(config.precision)})
    reads: dict[str, set[str]] = {}

    class RecordingContext(runner.StageContext):
        def __init__(self, **fields):
            super().__init__(**fields)
            self.config = RecordingConfig(self.config, reads.setdefault(self.name, set()))

    monkeypatch.setattr(runner, "StageContext", RecordingContext)
    assert run_pipeline(config, tmp_path)["ran"] == STAGES
    undeclared = {}
    for name in STAGES:
        assert reads[name], f"{name} read no config key: the recorder is not in use"
        declared = fingerprinted(name)
        missing = sorted(k for k in reads[name] if not k.startswith(NOT_INPUTS) and not covered(k, declared))
        if missing:
            undeclared[name] = missing
    assert not undeclared, (
        f"keys read but in no READS the fingerprint covers (they would not rerun the stage): {undeclared}"
    )
