"""Running a sweep: every variant an ordinary pipeline run in its own folder (shared stages linked first), then the
table, the plot and the pick."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import PipelineError, exception_chain
from ..interrupts import interrupt
from ..parent_death import end_with_parent
from ..plots import pareto_plot
from ..runner import STAGES, fingerprints, plan, read_manifest, run_lock, run_pipeline
from ..tracking import run_status
from .pick import CHAMPION, Constraint, choose, parse_pick
from .reuse import StageReuse, reuse_stages
from .shared_capture import shared_capture_configs
from .spec import Sweep, override_items
from .table import csv_text, markdown_table, reference_points, variant_row, write_text
from .tracker import SweepTracker

log = logging.getLogger("pipeline")


def sweep_folder(runs_dir: Path, sweep: Sweep) -> Path:
    return Path(runs_dir) / sweep.base.name / "sweeps" / sweep.name


def run_sweep(
    sweep: Sweep,
    runs_dir: Path,
    pick: str | None = None,
    to_stage: str | None = None,
    child_setup: Callable[[], None] | None = None,
) -> dict:
    """Run every variant (reusing complete stages), then the table, the plot and the pick.

    ``to_stage``: stop each variant after this stage (``evaluate``: no export, so no latency, size or
    registered version; the table shows what was measured). Each variant runs in its own process
    (:func:`run_variant`); ``child_setup`` is called first in that process (the command line's logging set-up).

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
        if sweep.spec.shared_capture:
            sweep.configs = shared_capture_configs(sweep.configs, runs_dir)
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
                sources = [base_dir, *earlier, *others]
                reuse_stages(run_dir, current, sources)
                arguments: dict[str, Any] = {
                    "config": config,
                    "runs_dir": runs_dir,
                    "run_dir": run_dir,
                    "sweep_run_id": tracker.run_id,
                    "run_name": f"{config.name}-{name}",
                    "to_stage": to_stage,
                    "reuse": StageReuse(run_dir, tuple(sources)),  # and again before each stage it would run
                }
                if any(plan(config, run_dir, False, None, None, to_stage, current).values()):
                    result = run_variant(name, arguments, child_setup)
                else:  # complete and current: nothing is loaded, so no process of its own (seconds saved per rerun)
                    result = run_pipeline(**arguments)
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


def run_variant(name: str, arguments: dict, child_setup: Callable[[], None] | None = None) -> dict:
    """One variant's pipeline run (``run_pipeline(**arguments)``) in a fresh spawned process; returns its
    {"ran", "states"}, or raises the error it raised (with its chain, so the command line explains it as usual).

    Why a process: the memory a variant's run holds (cached relation targets, the allocator's arenas) is given back
    only when its process ends. Run one after another in one process, a base-size sweep grew to 24 GB and its sixth
    variant was killed by the out-of-memory killer (2026-12-04). The variant's process leaves stopping to this one:
    it ignores Ctrl-C (which reaches the whole process group) and takes a SIGTERM from here as its Ctrl-C, so it
    checkpoints and marks its MLflow runs as killed, once, however this process was stopped.
    """
    context = multiprocessing.get_context("spawn")  # not fork: MLflow's and torch's threads do not survive a fork
    receive, send = context.Pipe(duplex=False)
    process = context.Process(
        target=_variant_process, args=(send, os.getpid(), child_setup, arguments), name=f"sweep-variant-{name}"
    )
    process.start()
    log.info("[sweep] variant %s runs in process %d", name, process.pid)
    send.close()  # the child holds the only writer now: recv() ends with EOFError if it dies without a word
    try:
        try:
            kind, payload = receive.recv()
        except EOFError:
            kind, payload = "died", None
        process.join()
    except BaseException:  # Ctrl-C or SIGTERM here: let the variant stop cleanly, then make sure it has ended
        _stop(process)
        raise
    finally:
        receive.close()
    if kind == "done":
        return payload
    if kind == "interrupted":
        raise KeyboardInterrupt
    if kind == "error":
        for exc, cause in zip(payload, payload[1:]):
            exc.__cause__ = cause
        raise payload[0]
    code = process.exitcode
    how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
    raise PipelineError(
        f"The process of sweep variant '{name}' ended without finishing its run ({how}). A SIGKILL most often comes "
        "from the system's out-of-memory killer (see `dmesg`): lower the batch sizes or run fewer stages at once. "
        "Finished variants and complete stages are kept; rerun the same command to continue."
    )


def _variant_process(send, parent: int, child_setup: Callable[[], None] | None, arguments: dict) -> None:
    end_with_parent(parent)  # a kill -9 of the sweep ends its variant too
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the sweep process passes Ctrl-C on as SIGTERM (_stop)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        if child_setup is not None:
            child_setup()
        result = run_pipeline(**arguments)
        send.send(("done", {"ran": result["ran"], "states": result["states"]}))
    except KeyboardInterrupt:
        send.send(("interrupted", None))
    except BaseException as exc:
        log.debug("sweep variant failed", exc_info=True)  # --debug: the traceback, from where it was raised
        send.send(("error", [_portable(e) for e in exception_chain(exc)]))


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (its attributes, such as the stage it came from, included), else a
    RuntimeError naming it."""
    try:
        pickle.dumps(exc)  # what the pipe will do to it (between this run's own two processes)
        return exc
    except Exception:
        stand_in = RuntimeError(f"{type(exc).__name__}: {exc}")
        if hasattr(exc, "pipeline_stage"):
            stand_in.pipeline_stage = exc.pipeline_stage  # type: ignore[attr-defined]  # the CLI names the stage
        return stand_in


def _stop(process, grace_s: float = 60.0) -> None:
    if process.is_alive() and process.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        process.join(grace_s)
    if process.is_alive():
        process.kill()
        process.join()


def stage_seconds(folder: Path, base_dir: Path, variants: list[str]) -> tuple[dict[str, float], dict[str, tuple]]:
    """Each variant's seconds of stage work, and the stages it shared: stage -> (who ran it, its seconds).

    A manifest names the run folder its stage ran in (``ran_in``, kept by every hard-linked copy): a variant counts
    the stages it ran, and a stage linked from the config's run folder or from another sweep's variant is shared
    under that folder's name. Manifests written before ``ran_in``: the first folder holding the stage (the config's
    run folder, then the variants in order) is taken to have run it.
    """
    names = {base_dir.name: "the config's run folder"}
    names.update({f"{base_dir.name}/sweeps/{folder.name}/{name}": name for name in variants})
    seen: dict[tuple, str] = {}
    for stage in STAGES:  # older manifests: stages the base run folder holds were not run by any variant
        manifest = read_manifest(base_dir / stage) or {}
        if manifest:
            seen[(stage, manifest.get("fingerprint"), manifest.get("completed_at"))] = names[base_dir.name]
    seconds: dict[str, float] = {}
    shared: dict[str, tuple[str, float]] = {}
    for name in variants:
        seconds[name] = 0.0
        for stage in STAGES:
            manifest = read_manifest(folder / name / stage) or {}
            if not manifest:
                continue
            if "ran_in" in manifest:
                who = names.get(manifest["ran_in"])
                if who is None:  # another sweep's variant, or a folder this sweep does not know
                    parts = Path(manifest["ran_in"]).parts
                    mine = len(parts) == 4 and parts[0] == base_dir.name and parts[1] == "sweeps"
                    who = f"sweep {parts[2]}, variant {parts[3]}" if mine else manifest["ran_in"]
            else:
                who = seen.setdefault((stage, manifest.get("fingerprint"), manifest.get("completed_at")), name)
            if who == name:
                seconds[name] += manifest.get("duration_s", 0.0)
            else:
                shared.setdefault(stage, (who, manifest.get("duration_s", 0.0)))
    return seconds, shared


def results(sweep: Sweep, folder: Path, base_dir: Path, states: dict[str, dict]) -> tuple[list[dict], list[str]]:
    """Comparison rows (a variant's wall time: the stages it ran itself, stage_seconds) and the shared stages.

    ``states``: variant -> its stages' states after its run (figures only from stages complete and current).
    """
    seconds, shared = stage_seconds(folder, base_dir, list(sweep.variants))
    rows: list[dict] = []
    for name in sweep.variants:
        run_dir = folder / name
        done = {stage for stage, state in states[name].items() if state == "done"}
        rows.append(
            variant_row(name, sweep.spec.variants[name].description, sweep.configs[name], run_dir, done, seconds[name])
        )
    counted = [f"{stage} ({secs:.0f} s, run by {by})" for stage, (by, secs) in shared.items()]
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
