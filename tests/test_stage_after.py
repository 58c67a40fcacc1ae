"""A stage reads only the stages its AFTER names: its fingerprint covers theirs, so an upstream rerun reruns it.

The READS twin of this guard is tests/test_stage_reads.py. Here: every ``ctx.input("x")`` written in stages/ names a
stage of that module's AFTER, and ``StageContext.input`` refuses one that is not (so a new call cannot slip past)."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

from pipeline import runner

STAGES = Path(__file__).resolve().parent.parent / "stages"


def inputs_read(source: str) -> set[str]:
    """The stage names of every ``<anything>.input("name")`` call with a literal argument."""
    return {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "input"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


@pytest.mark.parametrize("stage", runner.STAGES)
def test_every_stage_input_is_in_after(stage):
    read = inputs_read((STAGES / f"{stage}.py").read_text())
    assert read <= set(runner.stage_module(stage).AFTER), (
        f"{stage} reads {sorted(read)} but AFTER is {runner.stage_module(stage).AFTER}"
    )


def test_the_scan_sees_a_call_outside_after():
    assert inputs_read('prepare = ctx.input("prepare")\nx = self.ctx.input("capture") / "a"') == {"prepare", "capture"}


def test_input_refuses_a_stage_not_in_after(tmp_path):
    dist = types.SimpleNamespace(world=1, rank=0, is_main=True)
    ctx = runner.StageContext(
        config=None, name="evaluate", run_dir=tmp_path, out=tmp_path / "evaluate.partial", tracker=None, dist=dist
    )
    (tmp_path / "capture").mkdir()
    with pytest.raises(runner.PipelineError) as err:
        ctx.input("capture")
    assert "'capture'" in str(err.value) and "AFTER" in str(err.value) and "stages/evaluate.py" in str(err.value)
    with pytest.raises(runner.PipelineError, match="not complete"):  # one it lists: the usual check runs
        ctx.input("distill")
