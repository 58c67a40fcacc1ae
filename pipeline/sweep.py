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
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import difflib
import io
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .config import RUN_NAME, RUN_NAME_RULE, PipelineConfig, load_config, read_yaml, to_yaml
from .errors import ConfigError, LockedError, PipelineError
from .integrity import output_identity
from .runner import (
    STAGES,
    check_stage,
    fingerprints,
    read_manifest,
    replace_folder,
    run_lock,
    run_pipeline,
    stage_module,
)
from .summary import headline_metrics, metric_suffix, summary_rows
from .tracking import MAX_NOTE, NOTE_TAG, REGISTERED_TAG, Tracker, config_hash, result_tags, run_status

log = logging.getLogger("pipeline")

CHAMPION = "champion"
SWEEP_RECORD = "mlflow_sweep.json"
# Keys a variant may not override: they name the run folder, the experiment and the registered model
# that the variants share (the champion alias moves between versions of one registered model).
SHARED_KEYS = ("name", "tracking")


# ---------------------------------------------------------------- the sweep file


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Variant(_Strict):
    description: str = ""
    overrides: dict[str, object] = Field(default_factory=dict, description="dotted config key -> value")


class SweepSpec(_Strict):
    description: str = ""
    overrides: dict[str, object] = Field(default_factory=dict, description="applied to every variant")
    pick: str | None = Field(None, description="the default --pick constraint")
    variants: dict[str, Variant] = Field(min_length=1)

    @field_validator("variants")
    @classmethod
    def _variant_names(cls, value):
        for name in value:
            if not isinstance(name, str) or not RUN_NAME.fullmatch(name):
                raise ValueError(
                    f"{json.dumps(name)[:80]} is not a usable variant name: it names the variant's run "
                    f"folder. Use {RUN_NAME_RULE}"
                )
        return value


def sweep_problems(exc: ValidationError, path: Path) -> str:
    """Every problem of a sweep file, with its key path; unknown keys get the nearest valid one."""
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        where = ".".join(loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            valid = list((Variant if len(loc) == 3 and loc[0] == "variants" else SweepSpec).model_fields)
            near = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.5)
            lines.append(
                f"  - {where}: unknown key.{f' Did you mean {near[0]!r}?' if near else ''} "
                f"Valid keys here: {', '.join(valid)}."
            )
        else:
            got = err.get("input")
            shown = json.dumps(got, default=str)[:80] if not isinstance(got, dict) else "a mapping"
            lines.append(f"  - {where}: {err['msg'].removeprefix('Value error, ')} (got {shown}).")
    return (
        f"Sweep file {path} has {len(lines)} problem(s):\n" + "\n".join(lines) + "\nA sweep file holds "
        "description, overrides (applied to every variant), pick, and variants: {name: {description, "
        "overrides: {dotted.key: value}}}; see configs/sweeps/depth.yaml."
    )


def override_items(overrides: dict) -> list[str]:
    """A sweep file's {dotted.key: value} as command-line overrides (JSON is YAML)."""
    return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]


@dataclass
class Sweep:
    name: str
    path: Path
    spec: SweepSpec
    configs: dict[str, PipelineConfig]  # variant -> resolved config
    base: PipelineConfig  # the config with the command line's and the sweep's common overrides, no variant's

    @property
    def variants(self) -> list[str]:
        return list(self.spec.variants)


def load_sweep(
    config_name: str, sweep_path: str | Path, overrides: list[str] | None = None, resolve=lambda config: config
) -> Sweep:
    """Read and validate a sweep file and every variant's config, before any work.

    ``resolve`` turns a loaded config into the one that runs (the CLI resolves precision: auto).
    """
    path = Path(sweep_path)
    if not path.is_file():
        found = sorted(str(p) for p in Path("configs/sweeps").glob("*.yaml")) if Path("configs/sweeps").is_dir() else []
        raise ConfigError(
            f"Sweep file {path} not found. Give the path of a sweep YAML file"
            f"{' (found: ' + ', '.join(found) + ')' if found else ''}."
        )
    raw = read_yaml(path)
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(sweep_problems(exc, path)) from None
    for where, items in [
        ("overrides", spec.overrides),
        *((f"variants.{n}.overrides", v.overrides) for n, v in spec.variants.items()),
    ]:
        for key in items:
            if key.split(".")[0] in SHARED_KEYS:
                raise ConfigError(
                    f"Sweep file {path}: {where} sets '{key}', which the variants must share (it names "
                    "the run folder, the MLflow experiment and the registered model whose 'champion' "
                    "alias the pick moves). Remove it from the sweep; set it on the config instead."
                )
    if spec.pick:
        parse_pick(spec.pick)
    common = [*override_items(spec.overrides), *(overrides or [])]  # the command line has the last word
    try:
        base = resolve(load_config(config_name, common))
    except ConfigError as exc:
        raise ConfigError(f"Sweep {path} on config '{config_name}', overrides common to every variant: {exc}") from None
    configs = {}
    for name, variant in spec.variants.items():
        try:
            configs[name] = resolve(
                load_config(
                    config_name,
                    [*override_items(spec.overrides), *override_items(variant.overrides), *(overrides or [])],
                )
            )
        except ConfigError as exc:
            raise ConfigError(f"Sweep {path}, variant '{name}': {exc}") from None
    return Sweep(name=path.stem, path=path, spec=spec, configs=configs, base=base)


# ---------------------------------------------------------------- the pick

# metric name in a constraint -> (row key, what it is, better when)
PICK_METRICS = {
    "retention": ("retention", "student / teacher accuracy (PyTorch, test split)", "higher"),
    "accuracy_kept": ("accuracy_kept", "shipped student's accuracy / fp32 teacher's", "higher"),
    "accuracy": ("accuracy", "shipped student's test accuracy", "higher"),
    "latency_ms": ("latency_ms", "shipped student's median latency, batch 1", "lower"),
    "mb": ("mb", "shipped file size in MB", "lower"),
    "speedup": ("speedup", "speed-up against the int8 teacher", "higher"),
    "size_ratio": ("size_ratio", "size against the int8 teacher", "lower"),
    "text_ms": ("text_ms", "shipped student from raw text, one text per call, median ms (tokenizer included)", "lower"),
    "text_accuracy": ("text_accuracy", "shipped student's test accuracy from raw text, one text per call", "higher"),
}
_CONSTRAINT = re.compile(r"^\s*([a-z_]+)\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Constraint:
    metric: str
    op: str
    bound: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"

    def met(self, value: float | None) -> bool:
        if value is None:
            return False
        return {">=": value >= self.bound, "<=": value <= self.bound, ">": value > self.bound, "<": value < self.bound}[
            self.op
        ]

    def gap(self, value: float | None) -> str:
        """How far ``value`` is from meeting the constraint, in words."""
        if value is None:
            return f"{self.metric} not measured"
        return f"{self.metric} {value:.4g} (needs {self.op} {self.bound:g}, off by {abs(value - self.bound):.4g})"


def parse_pick(text: str) -> list[Constraint]:
    """'retention>=0.98' or several joined by commas ('retention>=0.97,mb<=10')."""
    constraints = []
    for part in text.split(","):
        match = _CONSTRAINT.match(part)
        if not match or match.group(1) not in PICK_METRICS:
            raise ConfigError(
                f"--pick '{text}': '{part.strip()}' is not a constraint. Write METRIC OP NUMBER with OP one of >= <= > <, "
                f"several joined by commas, e.g. retention>=0.98, latency_ms<=5, mb<=10. Metrics: "
                + "; ".join(f"{k} ({v[1]})" for k, v in PICK_METRICS.items())
                + "."
            )
        constraints.append(Constraint(match.group(1), match.group(2), float(match.group(3))))
    return constraints


def choose(rows: list[dict], constraints: list[Constraint]) -> tuple[dict | None, list[str]]:
    """The fastest variant meeting every constraint (ties: the smaller file), and the reasoning in lines."""
    meeting = [r for r in rows if all(c.met(r.get(PICK_METRICS[c.metric][0])) for c in constraints)]
    wanted = " and ".join(map(str, constraints))
    if not meeting:
        lines = [f"No variant meets {wanted}. How close each came:"]
        for r in rows:
            misses = [
                c.gap(r.get(PICK_METRICS[c.metric][0]))
                for c in constraints
                if not c.met(r.get(PICK_METRICS[c.metric][0]))
            ]
            lines.append(f"  {r['variant']}: " + "; ".join(misses))
        return None, lines
    timed = lambda r: (r.get("latency_ms") is None, r.get("latency_ms") or 0.0, r.get("mb") or 0.0)  # noqa: E731 (a one-line node builder, read where it is used)
    best = min(meeting, key=timed)
    others = [r for r in rows if r is not best]
    lines = [
        f"Picked '{best['variant']}': the fastest of the {len(meeting)} of {len(rows)} variants meeting {wanted} "
        f"({_figures(best)})."
    ]
    for r in others:
        if r in meeting:
            lines.append(f"  {r['variant']} also meets it but is slower ({_figures(r)}).")
        else:
            misses = [
                c.gap(r.get(PICK_METRICS[c.metric][0]))
                for c in constraints
                if not c.met(r.get(PICK_METRICS[c.metric][0]))
            ]
            lines.append(f"  {r['variant']} does not meet it: " + "; ".join(misses) + ".")
    return best, lines


def _figures(row: dict) -> str:
    parts = [
        f"retention {row['retention']:.4f}" if row.get("retention") is not None else None,
        f"{row['latency_ms']:.2f} ms" if row.get("latency_ms") is not None else "latency not measured",
        f"{row['mb']:.1f} MB" if row.get("mb") is not None else None,
    ]
    return ", ".join(p for p in parts if p)


# ---------------------------------------------------------------- shared stages


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links refused: a copy (mtime kept, so the manifest check passes)
        shutil.copy2(src, dst)


def link_stage(source: Path, target: Path) -> None:
    """Put a hard-linked copy of the complete stage folder ``source`` at ``target``, atomically."""
    staging = target.with_name(f".{target.name}.linking")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, copy_function=_link_or_copy, symlinks=True)
    replace_folder(staging, target)


def reuse_stages(run_dir: Path, current: dict[str, str], sources: list[Path]) -> dict[str, Path]:
    """Link into ``run_dir`` every stage it lacks that a source folder has complete with the same fingerprint.

    A stage is taken from a source only when the upstream outputs it read there are the same files
    as the ones in ``run_dir`` (compared by their recorded identity), so a linked stage is exactly
    what the runner would have produced here. Returns stage -> the folder it came from.
    """
    reused: dict[str, Path] = {}
    for name in STAGES:
        if check_stage(run_dir, name, current[name])[0] == "done":
            continue
        deps = stage_module(name).AFTER
        mine = {dep: output_identity(read_manifest(run_dir / dep) or {}) for dep in deps}
        for source in sources:
            if not source.is_dir() or source.resolve() == run_dir.resolve():
                continue
            try:
                with run_lock(source):  # never copy a folder while a pipeline is writing it
                    state, _, _ = check_stage(source, name, current[name])
                    if state != "done" or any(
                        output_identity(read_manifest(source / dep) or {}) != mine[dep] for dep in deps
                    ):
                        continue
                    link_stage(source / name, run_dir / name)
            except LockedError:
                log.info("[sweep] %s is in use by another pipeline; not reusing its stages", source)
                continue
            reused[name] = source
            log.info("[%s] reused from %s (same fingerprint %s)", name, source, current[name])
            break
    return reused


# ---------------------------------------------------------------- results


def variant_row(
    name: str, description: str, config: PipelineConfig, run_dir: Path, done: set[str], own_seconds: float
) -> dict:
    """One row of the comparison: the variant's headline figures (from its stages' outputs)."""
    rows, setting, evaluate, export = summary_rows(run_dir, done)
    head = headline_metrics(evaluate, export)
    suffix = metric_suffix(setting[0]) if setting else None
    baseline = next((r for r in rows if r["name"].startswith("teacher ONNX int8")), {})
    registered = None
    if "export" in done:
        registered = result_tags(config, run_dir, done).get(REGISTERED_TAG)
    student = evaluate.get("student") or {}
    from_text = {r["model"]: r for r in (export.get("from_text") or {}).get("rows", [])}
    return {
        "variant": name,
        "description": description,
        "layers": student.get("layers"),
        "parameters": student.get("parameters"),
        "student_accuracy": head.get("student_accuracy"),
        "accuracy": head.get("shipped_accuracy"),
        "retention": head.get("retention"),
        "accuracy_kept": head.get("accuracy_kept"),
        "mb": head.get("shipped_mb"),
        "latency_ms": head.get(f"shipped_latency_ms_{suffix}") if suffix else None,
        "speedup": head.get(f"speedup_vs_int8_teacher_{suffix}") if suffix else None,
        "size_ratio": head.get("size_vs_int8_teacher"),
        "wall_s": round(own_seconds, 1),
        "latency_setting": f"{setting[0]}, {setting[1]} thread{'s' if setting[1] > 1 else ''}" if setting else None,
        "teacher_accuracy": head.get("teacher_accuracy"),
        "baseline_accuracy": baseline.get("accuracy"),
        "baseline_mb": baseline.get("size_mb"),
        "baseline_latency_ms": baseline.get("latency_ms"),
        "registered": registered,
        "text_accuracy": from_text.get("student", {}).get("accuracy"),
        "text_ms": from_text.get("student", {}).get("median_ms"),
    }


def reference_points(folder: Path, variants: list[str]) -> list[dict]:
    """What the students are measured against, from raw text (the first variant's export that compared them):
    the peers of the baselines stage and the int8 teacher. Reference points only: never picked."""
    for name in variants:
        metrics = _read_json(folder / name / "export" / "metrics.json")
        rows = ((metrics or {}).get("from_text") or {}).get("rows") or []
        if rows:
            return [
                {
                    "name": r["title"],
                    "kind": r["kind"],
                    "text_accuracy": r["accuracy"],
                    "text_ms": r["median_ms"],
                    "mb": r["file_mb"],
                }
                for r in rows
                if r["kind"] != "student"
            ]
    return []


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


COLUMNS = [  # (key, markdown header, format)
    ("variant", "variant", "{}"),
    ("description", "description", "{}"),
    ("layers", "layers", "{}"),
    ("accuracy", "shipped accuracy", "{:.4f}"),
    ("retention", "retention", "{:.4f}"),
    ("accuracy_kept", "accuracy kept", "{:.4f}"),
    ("mb", "MB", "{:.1f}"),
    ("latency_ms", "ms", "{:.2f}"),
    ("speedup", "speed-up vs int8 teacher", "{:.2f}x"),
    ("size_ratio", "size vs int8 teacher", "{:.2f}"),
    ("text_accuracy", "accuracy from text", "{:.4f}"),
    ("text_ms", "ms per text", "{:.3f}"),
    ("wall_s", "wall time (s)", "{:.0f}"),
]


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    return "-" if value is None or value == "" else fmt.format(value)


def markdown_table(
    rows: list[dict], shared: list[str], pick_lines: list[str], picked: str | None, references: list[dict] = ()
) -> str:
    setting = next((r["latency_setting"] for r in rows if r.get("latency_setting")), None)
    head = [h if k != "latency_ms" else f"ms ({setting})" if setting else "ms" for k, h, _ in COLUMNS]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if i < 3 else "---:" for i in range(len(COLUMNS))) + "|",
    ]
    for row in rows:
        cells = [_cell(row, key, fmt) for key, _, fmt in COLUMNS]
        if row["variant"] == picked:
            cells[0] = f"**{cells[0]}** ({CHAMPION})"
        lines.append("| " + " | ".join(cells) + " |")
    base = next((r for r in rows if r.get("baseline_mb") is not None), None)
    if base:
        ms = f"{base['baseline_latency_ms']:.2f}" if base.get("baseline_latency_ms") is not None else "-"
        lines.append(
            f"| int8 teacher (baseline) | what ships without distillation | - | {base['baseline_accuracy']:.4f} | - "
            f"| - | {base['baseline_mb']:.1f} | {ms} | 1.00x | 1.00 | - | - | - |"
        )
    for ref in references:  # peers (and the int8 teacher) from raw text: reference points, not candidates
        if ref["kind"] == "peer":
            lines.append(
                f"| {ref['name']} | peer (reference, not picked) | - | - | - | - | {ref['mb']:.1f} | - | - | - "
                f"| {ref['text_accuracy']:.4f} | {ref['text_ms']:.3f} | - |"
            )
    notes = [
        "",
        "Retention: the PyTorch student's test accuracy over the teacher's. Shipped accuracy, MB and ms: the "
        "ONNX file the bundle ships (int8 unless it lost too much accuracy), batch 1, median. Accuracy from text and "
        "ms per text: raw text to label, one text per call, one thread, tokenizer included, the same harness and "
        "texts for students and peers. Wall time: the stages this variant ran itself.",
    ]
    if shared:
        notes.append("Shared (run once, hard-linked into the variants): " + "; ".join(shared) + ".")
    if pick_lines:
        notes += ["", *pick_lines]
    return "\n".join(lines + notes) + "\n"


def pareto_front(rows: list[dict], x: str) -> list[dict]:
    """Rows no other row beats on both retention (higher) and ``x`` (lower), sorted by ``x``."""
    points = [r for r in rows if r.get(x) is not None and r.get("retention") is not None]
    front = [
        r
        for r in points
        if not any(
            o is not r
            and o[x] <= r[x]
            and o["retention"] >= r["retention"]
            and (o[x] < r[x] or o["retention"] > r["retention"])
            for o in points
        )
    ]
    return sorted(front, key=lambda r: r[x])


def pareto_plot(
    rows: list[dict], path: Path, title: str, picked: str | None, references: list[dict] = ()
) -> Path | None:
    """Retention against latency and against size, the Pareto front joined, the pick starred; with reference
    points (peers, int8 teacher from raw text) the ladder plot instead (ladder_plot)."""
    import matplotlib  # here, not at the top: the backend must be chosen before pyplot is imported, and only plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if references and any(r.get("text_ms") is not None for r in rows):
        return ladder_plot(plt, rows, references, path, title, picked)
    panels = [
        ("latency_ms", "shipped latency, ms (batch 1, median)", "baseline_latency_ms"),
        ("mb", "shipped file, MB", "baseline_mb"),
    ]
    if not any(r.get(x) is not None and r.get("retention") is not None for x, _, _ in panels for r in rows):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (x, label, baseline) in zip(axes, panels):
        points = [r for r in rows if r.get(x) is not None and r.get("retention") is not None]
        ax.scatter([r[x] for r in points], [r["retention"] for r in points], color="tab:blue", zorder=3)
        for r in points:
            ax.annotate(r["variant"], (r[x], r["retention"]), textcoords="offset points", xytext=(5, 4), fontsize=9)
        front = pareto_front(rows, x)
        if len(front) > 1:
            ax.plot(
                [r[x] for r in front],
                [r["retention"] for r in front],
                color="tab:blue",
                alpha=0.5,
                label="Pareto front",
            )
        chosen = [r for r in points if r["variant"] == picked]
        if chosen:
            ax.scatter(
                [chosen[0][x]],
                [chosen[0]["retention"]],
                marker="*",
                s=260,
                color="tab:orange",
                zorder=4,
                label=f"{CHAMPION}: {picked}",
            )
        ref = next((r[baseline] for r in rows if r.get(baseline) is not None), None)
        if ref is not None:
            ax.axvline(ref, color="gray", linestyle="--", label="int8 teacher")
        ax.set_xlabel(label)
        ax.set_ylabel("retention (student / teacher accuracy)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="lower right")
    return save_figure(plt, fig, title, path)


def ladder_plot(plt, rows: list[dict], references: list[dict], path: Path, title: str, picked: str | None) -> Path:
    """Accuracy from raw text against ms per text (log) and against file size: students joined, peers and the
    int8 teacher as grey reference points, the pick starred."""
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.4))
    for ax, (x, label) in zip(
        axes, [("text_ms", "ms per text from raw text (batch 1, 1 thread, median, log)"), ("mb", "file, MB")]
    ):
        students = sorted(
            (r for r in rows if r.get(x) is not None and r.get("text_accuracy") is not None), key=lambda r: r[x]
        )
        ax.plot(
            [r[x] for r in students],
            [r["text_accuracy"] for r in students],
            "o-",
            color="tab:blue",
            zorder=3,
            label="students",
        )
        for r in students:
            ax.annotate(r["variant"], (r[x], r["text_accuracy"]), textcoords="offset points", xytext=(5, 4), fontsize=9)
        refs = [r for r in references if r.get(x) is not None]
        ax.scatter(
            [r[x] for r in refs],
            [r["text_accuracy"] for r in refs],
            marker="s",
            color="gray",
            zorder=3,
            label="peers and int8 teacher (references)",
        )
        for r in refs:
            ax.annotate(
                r["name"].split(" (")[0].split(" + ")[0],
                (r[x], r["text_accuracy"]),
                textcoords="offset points",
                xytext=(5, -10),
                fontsize=8,
                color="dimgray",
            )
        chosen = [r for r in students if r["variant"] == picked]
        if chosen:
            ax.scatter(
                [chosen[0][x]],
                [chosen[0]["text_accuracy"]],
                marker="*",
                s=260,
                color="tab:orange",
                zorder=4,
                label=f"{CHAMPION}: {picked}",
            )
        if x == "text_ms":
            ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy (one text per call)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    return save_figure(plt, fig, title, path)


def save_figure(plt, fig, title: str, path: Path) -> Path:
    """Title, layout, then written whole and renamed into place."""
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def csv_text(rows: list[dict]) -> str:
    keys = [k for k in rows[0]] if rows else []
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


# ---------------------------------------------------------------- MLflow: the sweep run


@dataclass
class SweepTracker:
    """The sweep's own MLflow run (re-attached when the same sweep is rerun); nothing when tracking is off."""

    sweep: Sweep
    runs_dir: Path
    sweep_dir: Path
    run_id: str | None = None
    client: object = field(default=None, repr=False)

    def start(self) -> None:
        config = self.sweep.base
        if not config.tracking.enabled:
            return
        tracker = Tracker(
            self.runs_dir, self.sweep_dir, config.tracking.experiment or config.name
        )  # store set-up, errors
        self.client = tracker.client
        experiment_id = tracker.ensure_experiment()
        record = self.sweep_dir / SWEEP_RECORD
        previous = json.loads(record.read_text()) if record.is_file() else {}
        identity = self.identity()
        if previous.get("identity") == identity:
            with contextlib.suppress(Exception):
                run = self.client.get_run(previous["run_id"])
                if run.info.lifecycle_stage == "active":
                    self.run_id = run.info.run_id
                    self.client.update_run(self.run_id, status="RUNNING")
                    log.info("MLflow: re-attached to sweep run %s", self.run_id)
        if self.run_id is None:
            run = self.client.create_run(
                experiment_id,
                run_name=f"{config.name}-sweep-{self.sweep.name}",
                tags={
                    "attention_distill.role": "sweep",
                    "attention_distill.config": config.name,
                    "attention_distill.sweep": self.sweep.name,
                    "attention_distill.run_folder": tracker.run_folder,
                },
            )
            self.run_id = run.info.run_id
            self.client.log_text(self.run_id, self.sweep.path.read_text(), f"sweep/{self.sweep.path.name}")
            self.client.log_param(self.run_id, "variants", ",".join(self.sweep.variants))
            log.info("MLflow: new sweep run %s in experiment '%s'", self.run_id, tracker.experiment)
        write_text(record, json.dumps({"run_id": self.run_id, "identity": identity}))

    def identity(self) -> str:
        """Same variants with the same resolved configs -> the same sweep run."""
        return config_hash(json.dumps({name: to_yaml(c) for name, c in self.sweep.configs.items()}, sort_keys=True))

    def adopt(self, run_dir: Path) -> None:
        """Nest a variant's pipeline run under this sweep run (also one recorded by an earlier sweep run)."""
        if not self.run_id:
            return
        with contextlib.suppress(OSError, ValueError, KeyError):
            parent = json.loads((run_dir / "mlflow_run.json").read_text())["parent_run_id"]
            self.client.set_tag(parent, "mlflow.parentRunId", self.run_id)

    def finish(
        self, status: str, note: str | None = None, artifacts: list[Path] = (), tags: dict | None = None
    ) -> None:
        if not self.run_id:
            return
        try:
            if note is not None:
                self.client.set_tag(self.run_id, NOTE_TAG, note[:MAX_NOTE])
            for key, value in (tags or {}).items():
                self.client.set_tag(self.run_id, key, str(value))
            for path in artifacts:
                self.client.log_artifact(self.run_id, str(path), "sweep")
        except Exception as exc:  # the sweep's own outputs are on disk: MLflow refusing is a warning
            log.warning("MLflow: the sweep's results were not all logged (%s: %s)", type(exc).__name__, str(exc)[:200])
        finally:
            self.client.set_terminated(self.run_id, status=status)


# ---------------------------------------------------------------- the sweep


def sweep_folder(runs_dir: Path, sweep: Sweep) -> Path:
    return Path(runs_dir) / sweep.base.name / "sweeps" / sweep.name


def run_sweep(sweep: Sweep, runs_dir: Path, pick: str | None = None, to_stage: str | None = None) -> dict:
    """Run every variant (reusing complete stages), then the table, the plot and the pick.

    ``to_stage``: stop each variant after this stage (``evaluate``: no export, so no latency, size or
    registered version; the table shows what was measured).

    Returns {"rows", "picked", "pick_lines", "ran", "folder"}; raises PipelineError when a pick was asked
    for and no variant meets it (after the table and plot are written; the alias is left where it was).
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise PipelineError(
            "A sweep runs in one process (its variants one after another); launch it without "
            "accelerate launch / torchrun (NPROC=1). Each variant is an ordinary pipeline run."
        )
    runs_dir = Path(runs_dir)
    constraints = parse_pick(pick) if pick else (parse_pick(sweep.spec.pick) if sweep.spec.pick else [])
    folder = sweep_folder(runs_dir, sweep)
    base_dir = runs_dir / sweep.base.name
    with run_lock(folder):
        tracker = SweepTracker(sweep, runs_dir, folder)
        tracker.start()
        status, ran, states = "FAILED", {}, {}
        try:
            for index, name in enumerate(sweep.variants, 1):
                config, run_dir = sweep.configs[name], folder / name
                run_dir.mkdir(parents=True, exist_ok=True)
                log.info(
                    "[sweep %s] variant %d/%d: %s %s",
                    sweep.name,
                    index,
                    len(sweep.variants),
                    name,
                    " ".join(override_items(sweep.spec.variants[name].overrides)),
                )
                current = fingerprints(config, runs_dir)
                earlier = [folder / other for other in sweep.variants[: index - 1]]
                others = sorted(
                    p for p in folder.parent.glob("*/*") if p.parent != folder and (p / "config.yaml").is_file()
                )
                reuse_stages(run_dir, current, [base_dir, *earlier, *others])
                result = run_pipeline(
                    config,
                    runs_dir,
                    run_dir=run_dir,
                    sweep_run_id=tracker.run_id,
                    run_name=f"{config.name}-{name}",
                    to_stage=to_stage,
                )
                tracker.adopt(run_dir)
                ran[name], states[name] = result["ran"], result["states"]
            status = "FINISHED"
        except BaseException as exc:
            status = run_status(exc)
            tracker.finish(status)
            raise
        rows, shared = results(sweep, folder, base_dir, states)
        picked, lines = choose(rows, constraints) if constraints else (None, [])
        moved = None
        if picked is not None:
            moved = move_champion(picked, tracker.client if tracker.run_id else None, lines)
        references = reference_points(folder, sweep.variants)
        outputs = write_outputs(sweep, folder, rows, shared, lines, picked, constraints, references)
        note = (
            f"**{sweep.spec.description or 'Sweep ' + sweep.name}**: sweep `{sweep.name}` on config "
            f"`{sweep.base.name}`, {len(rows)} variants.\n\n"
            + markdown_table(rows, shared, lines, picked["variant"] if picked else None, references)
            + f"\nRerun: `python -m pipeline sweep {sweep.base.name} {sweep.path}"
            + (f' --pick "{pick or sweep.spec.pick}"' if constraints else "")
            + "`"
        )
        tracker.finish(
            status,
            note=note,
            artifacts=outputs,
            tags={
                "attention_distill.pick": ", ".join(map(str, constraints)) or "none",
                f"attention_distill.{CHAMPION}": picked["variant"] if picked else "none",
            },
        )
    for line in lines:
        log.info("[sweep] %s", line.strip())
    if constraints and picked is None:
        raise PipelineError("\n".join(lines) + f"\nThe '{CHAMPION}' alias was not moved. Table and plot: {folder}.")
    return {"rows": rows, "picked": picked, "pick_lines": lines, "ran": ran, "folder": folder, "champion": moved}


def results(sweep: Sweep, folder: Path, base_dir: Path, states: dict[str, dict]) -> tuple[list[dict], list[str]]:
    """Comparison rows; a stage's time counts for the first folder that ran it (the others linked it).

    ``states``: variant -> its stages' states after its run (figures only from stages complete and current).
    """
    seen: dict[tuple, str] = {}
    for stage in STAGES:  # stages the base run folder holds were not run by any variant
        manifest = read_manifest(base_dir / stage) or {}
        if manifest:
            seen[(stage, manifest.get("fingerprint"), manifest.get("completed_at"))] = "the config's run folder"
    rows, shared = [], {}
    for name in sweep.variants:
        run_dir = folder / name
        done = {stage for stage, state in states[name].items() if state == "done"}
        seconds = 0.0
        for stage in STAGES:
            manifest = read_manifest(run_dir / stage) or {}
            key = (stage, manifest.get("fingerprint"), manifest.get("completed_at"))
            if not manifest:
                continue
            if key in seen:
                shared.setdefault(stage, (seen[key], manifest.get("duration_s", 0.0)))
                continue
            seen[key] = name
            seconds += manifest.get("duration_s", 0.0)
        rows.append(
            variant_row(name, sweep.spec.variants[name].description, sweep.configs[name], run_dir, done, seconds)
        )
    counted = [f"{stage} ({seconds:.0f} s, run by {by})" for stage, (by, seconds) in shared.items()]
    return rows, counted


def move_champion(row: dict, client, lines: list[str]) -> str | None:
    """Point the registry alias 'champion' at the picked variant's registered version; say what happened."""
    registered = row.get("registered")
    if client is None or not registered:
        lines.append(
            f"The '{CHAMPION}' alias was not moved: the variant has no registered model version "
            "(tracking.enabled or export.register_model is off)."
        )
        return None
    model, _, version = registered.rpartition("/")
    previous = None
    with contextlib.suppress(Exception):
        previous = str(client.get_model_version_by_alias(model, CHAMPION).version)
    client.set_registered_model_alias(model, CHAMPION, version)
    was = "" if previous is None else (" (unchanged)" if previous == version else f" (was version {previous})")
    lines.append(f"Registry: '{model}' alias '{CHAMPION}' -> version {version}{was}.")
    return registered


def write_outputs(
    sweep: Sweep,
    folder: Path,
    rows: list[dict],
    shared: list[str],
    lines: list[str],
    picked: dict | None,
    constraints: list[Constraint],
    references: list[dict],
) -> list[Path]:
    """sweep.md, sweep.csv, sweep.json and pareto.png in the sweep folder (each written whole, then renamed);
    ``references``: the peers and the int8 teacher (reference_points)."""
    name = picked["variant"] if picked else None
    outputs = []
    write_text(
        folder / "sweep.md",
        f"# Sweep `{sweep.name}` on `{sweep.base.name}`\n\n" + markdown_table(rows, shared, lines, name, references),
    )
    write_text(folder / "sweep.csv", csv_text(rows))
    write_text(
        folder / "sweep.json",
        json.dumps(
            {
                "sweep": sweep.name,
                "config": sweep.base.name,
                "description": sweep.spec.description,
                "completed_at": dt.datetime.now().isoformat(timespec="seconds"),
                "variants": rows,
                "shared": shared,
                "pick": {"constraints": [str(c) for c in constraints], "picked": name, "reasoning": lines},
                "references": references,
            },
            indent=2,
        ),
    )
    outputs += [folder / "sweep.md", folder / "sweep.csv", folder / "sweep.json"]
    plot = pareto_plot(rows, folder / "pareto.png", f"sweep {sweep.name} on {sweep.base.name}", name, references)
    if plot:
        outputs.append(plot)
    return outputs
