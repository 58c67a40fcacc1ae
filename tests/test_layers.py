"""pipeline/ in layers: read every module's imports (the ones inside functions too) and fail on a cycle, or on a
module importing from a layer above its own. The layer list is written once, here; docs/architecture.md draws it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parent.parent / "pipeline"

LAYERS = [  # lowest first: a module imports from its own layer or the ones below, never above
    (
        "leaves",
        {
            "errors",
            "integrity",
            "metrics",
            "timing",
            "plots",
            "augment",
            "static_model",
            "pair_model",
            "fasttext_worker",
            "parent_death",
            "interrupts",
            "model_packages",
            "redaction",
        },
    ),
    ("architectures and losses", {"families", "attention", "losses", "terms", "peers"}),
    ("config and data", {"config", "data", "splits", "inference", "stage_api"}),  # stage_api: the config as a type only
    ("models and training", {"models", "pruning", "training", "objective", "cache"}),
    (
        "export (the bundle)",
        {f"export.{path.stem}" for path in (PIPELINE / "export").glob("*.py")} - {"export.__init__"},
    ),
    ("results", {"summary", "run_record", "tracking"}),
    (
        "orchestration",
        {"runner"} | {f"sweep.{path.stem}" for path in (PIPELINE / "sweep").glob("*.py")} - {"sweep.__init__"},
    ),
    ("entry points", {"cli", "__main__", "launch"}),
]


def imports(source: str, modules: set[str], package: str = "") -> set[str]:
    """The pipeline modules (dotted below pipeline/: "errors", "export.latency") a module's source imports, at any
    depth (``from .x import``, ``from . import x``, ``from ..x import``, ``from pipeline.x import``, ``import
    pipeline.x``); ``package`` is the importing module's package below pipeline/ ("" or "export")."""
    found = set()

    def resolve(base: list[str], names: list[str]):
        for name in names:  # ``from base import name``: a module when base.name is one, else a name in base
            dotted = ".".join(base + [name])
            found.add(dotted if dotted in modules else ".".join(base))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            parts = node.module.split(".") if node.module else []
            if node.level:  # relative: the importing module's package, one level up per extra dot
                here = package.split(".") if package else []
                resolve(here[: len(here) - (node.level - 1)] + parts, [alias.name for alias in node.names])
            elif parts and parts[0] == "pipeline":
                resolve(parts[1:], [alias.name for alias in node.names])
        elif isinstance(node, ast.Import):
            found.update(
                alias.name.removeprefix("pipeline.") for alias in node.names if alias.name.startswith("pipeline.")
            )
    return {name for name in found if name in modules}


def graph() -> dict[str, set[str]]:
    files = {
        path.relative_to(PIPELINE).with_suffix("").as_posix().replace("/", "."): path
        for path in PIPELINE.rglob("*.py")
        if path.stem != "__init__" and "bundle_files" not in path.parts
    }
    return {
        name: imports(path.read_text(), set(files), name.rpartition(".")[0]) - {name} for name, path in files.items()
    }


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
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
    assert set(edges) == set(layer), (
        f"modules without a layer: {sorted(set(edges) - set(layer))}; "
        f"layers naming no module: {sorted(set(layer) - set(edges))}"
    )
    upward = [
        f"{a} ({LAYERS[layer[a]][0]}) imports {b} ({LAYERS[layer[b]][0]})"
        for a in sorted(edges)
        for b in sorted(edges[a])
        if layer[b] > layer[a]
    ]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)
    assert cycle(edges) is None, f"import cycle: {' -> '.join(cycle(edges))}"


@pytest.mark.parametrize(
    "extra, goes_up",
    [
        ({"errors": {"tracking"}}, True),  # the circle this layout removed: errors.explain imported tracking
        ({"export.variants": {"summary"}, "summary": {"export.variants"}}, True),  # the export reading the run summary
        ({"peers": {"terms"}, "terms": {"peers"}}, False),  # within one layer: only the cycle check sees it
    ],
)
def test_the_checks_fail_when_a_bad_import_is_added(extra, goes_up):
    edges = {name: set(deps) for name, deps in graph().items()}
    for name, deps in extra.items():
        edges[name] |= deps
    layer = {name: index for index, (_, names) in enumerate(LAYERS) for name in names}
    assert any(layer[b] > layer[a] for a in edges for b in edges[a]) == goes_up
    assert cycle(edges) is not None  # both close a circle: errors <-> tracking, peers <-> terms


def test_imports_reads_every_form():
    modules = {
        "errors",
        "config",
        "tracking",
        "runner",
        "export.latency",
        "export.files",
        "export.variants",
        "export.mobile",
    }
    source = (
        "from .errors import PipelineError\nfrom .export import latency as L\nimport pipeline.config\n"
        "def f():\n    from pipeline.tracking import redact\n    import numpy\n"
    )
    assert imports(source, modules) == {"errors", "export.latency", "config", "tracking"}
    inside = (
        "from .. import errors\nfrom ..config import load_config\nfrom . import files\nfrom .variants import Inputs\n"
        "from pipeline.export.mobile import usability\n"
    )
    assert imports(inside, modules, "export") == {
        "errors",
        "config",
        "export.files",
        "export.variants",
        "export.mobile",
    }


# ---------------------------------------------------------------- bench/: scripts that import each other by name

BENCH = PIPELINE.parent / "bench"


def bench_graph() -> dict[str, set[str]]:
    """bench/'s modules (bench/x.py is "x", bench/probes/y.py is "probes.y") and the bench modules each imports at any
    depth: the scripts put bench/ on sys.path (bench/common.py) and import each other by plain name."""
    files = {path.relative_to(BENCH).with_suffix("").as_posix().replace("/", "."): path for path in BENCH.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        edges[name] = {module for module in found if module in files} - {name}
    return edges


def test_bench_scripts_import_in_one_direction():
    """bench/common.py is the leaf every script imports; no circle (run_all -> report -> ablation -> run_all was one:
    the machine's description now lives in common)."""
    edges = bench_graph()
    assert {"common", "report", "run_all", "ablation"} <= set(edges) and not edges["common"], edges.get("common")
    assert cycle(edges) is None, f"import cycle in bench/: {' -> '.join(cycle(edges))}"
    assert cycle({**edges, "common": {"report"}}) is not None  # the check sees one when it is added
