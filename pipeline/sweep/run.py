"""Running a sweep: every variant an ordinary pipeline run in its own folder (shared stages linked first), then the
table, the plot and the pick."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
from pathlib import Path

from ..errors import PipelineError
from ..plots import pareto_plot
from ..runner import STAGES, fingerprints, read_manifest, run_lock, run_pipeline
from ..tracking import run_status
from .pick import CHAMPION, Constraint, choose, parse_pick
from .reuse import reuse_stages
from .spec import Sweep, override_items
from .table import csv_text, markdown_table, reference_points, variant_row, write_text
from .tracker import SweepTracker

log = logging.getLogger("pipeline")


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
    rows: list[dict] = []
    shared: dict[str, tuple[str, float]] = {}
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
    plot = pareto_plot(
        rows, folder / "pareto.png", f"sweep {sweep.name} on {sweep.base.name}", name, references, CHAMPION
    )
    if plot:
        outputs.append(plot)
    return outputs
