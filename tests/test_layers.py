"""pipeline/ in layers: read every module's imports (the ones inside functions too) and fail on a cycle, or on a
module importing from a layer above its own. The layer list is written once, here; docs/architecture.md draws it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parent.parent / "pipeline"

LAYERS = [  # lowest first: a module imports from its own layer or the ones below, never above
    ("leaves", {"errors", "integrity", "metrics", "timing", "plots", "augment", "mobile", "static_model",
                "fasttext_worker", "executorch_export"}),
    ("architectures and losses", {"families", "attention", "losses", "terms", "peers"}),
    ("config and data", {"config", "data", "inference"}),
    ("models, training, bundle", {"models", "pruning", "training", "objective", "cache", "bundle", "text_model",
                                  "from_text"}),
    ("results", {"summary", "tracking"}),
    ("orchestration", {"runner", "sweep"}),
    ("entry points", {"cli", "__main__"}),
]


def imports(source: str, modules: set[str]) -> set[str]:
    """The pipeline modules a module's source imports, at any depth (``from .x import``, ``from . import x``,
    ``from pipeline.x import``, ``import pipeline.x``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                names = [node.module.split(".")[0]] if node.module else [alias.name for alias in node.names]
            elif node.module and node.module.split(".")[0] == "pipeline":
                parts = node.module.split(".")
                names = [parts[1]] if len(parts) > 1 else [alias.name for alias in node.names]
            else:
                names = []
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".")[1] for alias in node.names if alias.name.startswith("pipeline.")]
        else:
            names = []
        found.update(name for name in names if name in modules)
    return found


def graph() -> dict[str, set[str]]:
    modules = {path.stem for path in PIPELINE.glob("*.py")} - {"__init__"}
    return {name: imports((PIPELINE / f"{name}.py").read_text(), modules) - {name} for name in modules}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_every_module_has_a_layer_and_no_import_goes_up_or_round():
    edges = graph()
    layer = {name: index for index, (_, names) in enumerate(LAYERS) for name in names}
    assert set(edges) == set(layer), f"modules without a layer: {sorted(set(edges) - set(layer))}; " \
                                     f"layers naming no module: {sorted(set(layer) - set(edges))}"
    upward = [f"{a} ({LAYERS[layer[a]][0]}) imports {b} ({LAYERS[layer[b]][0]})"
              for a in sorted(edges) for b in sorted(edges[a]) if layer[b] > layer[a]]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)
    assert cycle(edges) is None, f"import cycle: {' -> '.join(cycle(edges))}"


@pytest.mark.parametrize("extra, goes_up", [
    ({"errors": {"tracking"}}, True),  # the circle this layout removed: errors.explain imported tracking
    ({"peers": {"terms"}, "terms": {"peers"}}, False),  # within one layer: only the cycle check sees it
])
def test_the_checks_fail_when_a_bad_import_is_added(extra, goes_up):
    edges = {name: set(deps) for name, deps in graph().items()}
    for name, deps in extra.items():
        edges[name] |= deps
    layer = {name: index for index, (_, names) in enumerate(LAYERS) for name in names}
    assert any(layer[b] > layer[a] for a in edges for b in edges[a]) == goes_up
    assert cycle(edges) is not None  # both close a circle: errors <-> tracking, peers <-> terms


def test_imports_reads_every_form():
    source = ("from .errors import PipelineError\nfrom . import bundle as B\nimport pipeline.config\n"
              "def f():\n    from pipeline.tracking import redact\n    import numpy\n")
    assert imports(source, {"errors", "bundle", "config", "tracking", "runner"}) == {"errors", "bundle", "config", "tracking"}
