"""The stage contract as types (pipeline/stage_api.py) holds for what runs: the runner's StageContext has every member
the Context protocol names, with the same parameters, and every file of stages/ has READS, AFTER, VERSION and
run(ctx: Context) -> dict."""

from __future__ import annotations

import ast
import inspect
import typing

import pytest

from pipeline.runner import STAGES, StageContext
from pipeline.stage_api import Context, Stage
from tests.helpers import ROOT


def protocol_members(protocol: type) -> dict[str, object]:
    """Name -> the protocol's declaration (a function, a property, or the annotation of a field)."""
    members: dict[str, object] = dict(protocol.__annotations__)
    members.update(
        {
            name: value
            for name, value in vars(protocol).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))
        }
    )
    return members


def missing_or_different(implementation: type, protocol: type) -> list[str]:
    """What ``implementation`` lacks of ``protocol``, or has with other parameters or as another kind of member."""
    fields = typing.get_type_hints(implementation)
    problems = []
    absent = object()
    for name, declared in protocol_members(protocol).items():
        has = inspect.getattr_static(implementation, name, absent)
        if has is absent and name not in fields:
            problems.append(f"{name}: missing")
        elif isinstance(declared, property) and not isinstance(has, property):
            problems.append(f"{name}: not a property")
        elif inspect.isfunction(declared):
            if not inspect.isfunction(has):
                problems.append(f"{name}: not a method")
            elif list(inspect.signature(has).parameters) != list(inspect.signature(declared).parameters):
                problems.append(
                    f"{name}: parameters {list(inspect.signature(has).parameters)}, "
                    f"the protocol's {list(inspect.signature(declared).parameters)}"
                )
    return problems


def test_the_runners_context_has_every_member_of_the_protocol():
    assert missing_or_different(StageContext, Context) == []


def test_a_context_without_a_member_or_with_other_parameters_is_found():
    class Partial:
        config = name = out = None

        def input(self, stage_name):  # another parameter name
            return None

    problems = missing_or_different(Partial, Context)
    assert "input: parameters ['self', 'stage_name'], the protocol's ['self', 'stage']" in problems
    assert "final: missing" in problems and "write_json: missing" in problems and "config: missing" not in problems


@pytest.mark.parametrize("name", STAGES)
def test_every_stage_module_has_the_contract(name):
    """Read from the source, so the unit tier imports no stage's heavy dependencies."""
    tree = ast.parse((ROOT / "stages" / f"{name}.py").read_text())
    values = {}
    for node in tree.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        for target in targets:
            if isinstance(target, ast.Name) and target.id in Stage.__annotations__ and node.value is not None:
                values[target.id] = ast.literal_eval(node.value)
    assert isinstance(values.get("VERSION"), int), f"stages/{name}.py: VERSION {values.get('VERSION')!r}"
    for key in ("READS", "AFTER"):
        assert isinstance(values.get(key), list) and all(isinstance(v, str) for v in values[key]), (name, key)
    assert set(values["AFTER"]) <= set(STAGES[: STAGES.index(name)]), f"{name} runs after a later stage"
    run = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "run")
    assert [a.arg for a in run.args.args] == ["ctx"] and ast.unparse(run.args.args[0].annotation) == "Context"
    assert ast.unparse(run.returns) == "dict", f"stages/{name}.py: run returns {ast.unparse(run.returns)}"
