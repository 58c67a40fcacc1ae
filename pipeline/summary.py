"""The table `make distill` ends with: evaluate's PyTorch rows and export's ONNX rows in one table."""

from __future__ import annotations

import json
from pathlib import Path

from .export.from_text import lines as from_text_lines
from .export.from_text import markdown as from_text_markdown
from .export.latency import comparison_lines
from .export.variants import latency_name

# (row label, latency model name in export's latency table)
LATENCY_NAMES = {
    "teacher (PyTorch)": "teacher PyTorch fp32",
    "student (PyTorch)": "student PyTorch fp32",
    "teacher ONNX int8 (baseline)": "teacher ONNX int8",
    "student ONNX fp32": "student ONNX fp32",
    "student ONNX int8": "student ONNX int8",
    "student ONNX int8 static": "student ONNX int8 static",
}


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _mb(path: Path) -> float | None:
    return path.stat().st_size / 1e6 if path.is_file() else None


def latency_setting(rows: list[dict]) -> tuple[str, int] | None:
    """(input, threads) for the summary column: L=128 on 1 thread when measured, else the closest fixed length."""
    settings = {(r["input"], r["threads"]) for r in rows if r.get("input", "").startswith("L=")}
    if not settings:
        return None
    if ("L=128", 1) in settings:
        return ("L=128", 1)
    return min(settings, key=lambda s: (s[1] != 1, abs(int(s[0][2:]) - 128), s))


def summary_rows(
    run_dir: Path, current: set[str] | None = None
) -> tuple[list[dict], tuple[str, int] | None, dict, dict]:
    """One dict per model (name, accuracy, macro_f1, parameters, size_mb, latency_ms), plus the latency setting.

    ``current``: the stages whose outputs are current; figures of the others are left out, never shown as today's.
    """
    run_dir = Path(run_dir)
    evaluate = (_read(run_dir / "evaluate" / "metrics.json") or {}) if current is None or "evaluate" in current else {}
    export = (_read(run_dir / "export" / "metrics.json") or {}) if current is None or "export" in current else {}
    rows = []
    sizes = {
        "teacher": _mb(run_dir / "teacher" / "model" / "model.safetensors"),
        "student": _mb(run_dir / "distill" / "student" / "model.safetensors"),
    }
    for who in ("teacher", "student"):
        if who in evaluate:
            m = evaluate[who]
            rows.append(
                {
                    "name": f"{who} (PyTorch)",
                    "accuracy": m["accuracy"],
                    "macro_f1": m["macro_f1"],
                    "parameters": m.get("parameters"),
                    "size_mb": sizes[who],
                }
            )
    baseline = (export.get("versus_int8_teacher") or {}).get("baseline")
    if baseline:
        rows.append(
            {
                "name": "teacher ONNX int8 (baseline)",
                "accuracy": baseline["accuracy"],
                "macro_f1": baseline["macro_f1"],
                "parameters": None,
                "size_mb": baseline["file_mb"],
            }
        )
    for key, label in (
        ("onnx_fp32", "student ONNX fp32"),
        ("onnx_int8", "student ONNX int8"),
        ("onnx_int8_static", "student ONNX int8 static"),
    ):
        if key in export:
            m = export[key]
            rows.append(
                {
                    "name": label,
                    "accuracy": m["accuracy"],
                    "macro_f1": m["macro_f1"],
                    "parameters": m.get("parameters"),
                    "size_mb": m.get("file_mb"),
                    "recommended": export.get("recommended") == key.removeprefix("onnx_"),
                }
            )
    latency = export.get("latency") or []
    setting = latency_setting(latency)
    if setting:
        by_model = {r["model"]: r["median_ms"] for r in latency if (r.get("input"), r["threads"]) == setting}
        for row in rows:
            row["latency_ms"] = by_model.get(LATENCY_NAMES.get(row["name"], ""))
    return rows, setting, evaluate, export


def print_summary(run_dir: Path, ran: list[str], states: dict[str, str] | None = None) -> None:
    """The closing table; ``states`` (stage -> done/stale/...) keeps outdated figures out of it."""
    run_dir = Path(run_dir)
    print()
    print(f"run folder: {run_dir}   stages run now: {', '.join(ran) or 'none (all current)'}")
    current = None if states is None else {stage for stage, state in states.items() if state == "done"}
    for stage in ("evaluate", "export"):
        if states is not None and states.get(stage) not in ("done", "pending"):
            print(
                f"note: {stage} figures are left out: its output is {states[stage]} (older than its inputs or changed "
                f"on disk). Run without --to/--only to bring it up to date."
            )
    rows, setting, evaluate, export = summary_rows(run_dir, current)
    for stage in ("evaluate", "export"):  # never drop rows silently: say which file could not be read
        path = run_dir / stage / "metrics.json"
        if (current is None or stage in current) and path.exists() and _read(path) is None:
            print(
                f"warning: {path} is unreadable (damaged?); its rows are missing. "
                "The next run notices the damage and reruns that stage."
            )
    if not rows:
        return
    latency_head = f"ms b1/{setting[0]}/{setting[1]}t" if setting else "latency ms"
    print(f"{'model':<30} {'accuracy':>9} {'macro-F1':>9} {'params':>12} {'size MB':>9} {latency_head:>15}")
    for row in rows:
        size, ms, params = row.get("size_mb"), row.get("latency_ms"), row.get("parameters")
        name = row["name"] + (" *" if row.get("recommended") else "")
        print(
            f"{name:<30} {row['accuracy']:>9.4f} {row['macro_f1']:>9.4f} "
            f"{(f'{params:,}' if params else '-'):>12} {(f'{size:.1f}' if size else '-'):>9} "
            f"{(f'{ms:.2f}' if ms is not None else '-'):>15}"
        )
    if "retention" in evaluate:
        print(
            f"retention (student / teacher accuracy): {evaluate['retention']:.4f}   "
            f"agreement: {evaluate.get('agreement', float('nan')):.4f}"
        )
    if export:
        verdict = (
            f"{export['recommended'].replace('_', ' ')} recommended"
            if export.get("int8_recommended")
            else "fp32 recommended (int8 over the accuracy budget)"
        )
        if "onnx_int8" not in export:
            verdict = "fp32 (int8 off)"
        print(
            f"* shipped variant: {verdict}; ONNX parity max |diff| {export.get('parity_max_abs_diff', float('nan')):.1e}"
        )
    comparison = export.get("versus_int8_teacher")
    if comparison:
        print("against the int8 teacher (what a user ships without distillation):")
        for line in comparison_lines(comparison)[2:]:
            print(f"  {line}")
    from_text = export.get("from_text") or {}
    if from_text.get("measured"):
        for line in from_text_lines(from_text):
            print(line)
    bundle = run_dir / "export" / "bundle"
    if bundle.is_dir():
        print(f"mobile bundle: {bundle}  (README.md, predict.py, latency.md inside)")


# ---------------------------------------------------------------- the same figures for MLflow (pipeline run, registered version)


def metric_suffix(setting_input: str) -> str:
    """A latency input as part of an MLflow metric name ("L=128" -> "L128"; MLflow names take no '=')."""
    return setting_input.replace("=", "")


def headline_metrics(evaluate: dict, export: dict) -> dict[str, float]:
    """The run's result as flat figures: what the pipeline run shows in MLflow's runs table.

    From evaluate's metrics.json (teacher and student in PyTorch, retention) and export's
    metrics.json (the shipped variant, its latency, the ratios against the int8 teacher); a
    stage whose dict is empty contributes nothing.
    """
    out: dict[str, float] = {}
    for who in ("teacher", "student"):
        if who in evaluate:
            out[f"{who}_accuracy"] = evaluate[who]["accuracy"]
            out[f"{who}_macro_f1"] = evaluate[who]["macro_f1"]
    if "retention" in evaluate:
        out["retention"] = evaluate["retention"]
    variant = export.get("recommended")
    shipped = export.get(f"onnx_{variant}") if variant else None
    if variant and shipped:
        out["shipped_accuracy"] = shipped["accuracy"]
        out["shipped_macro_f1"] = shipped["macro_f1"]
        out["shipped_mb"] = shipped["file_mb"]
        rows = export.get("latency") or []
        setting = latency_setting(rows)
        threads = setting[1] if setting else min((r["threads"] for r in rows), default=1)
        inputs = {setting[0], "sentences"} if setting else {"sentences"}
        for row in rows:
            if row["model"] == latency_name(variant) and row["threads"] == threads and row.get("input") in inputs:
                out[f"shipped_latency_ms_{metric_suffix(row['input'])}"] = row["median_ms"]
    versus_peers = (export.get("from_text") or {}).get("versus_peers")
    if versus_peers:
        out["accuracy_margin_over_best_peer_points"] = versus_peers["accuracy_margin_points"]
        if "macro_f1_margin_points" in versus_peers:  # runs exported before it was recorded lack it
            out["macro_f1_margin_over_best_peer_points"] = versus_peers["macro_f1_margin_points"]
        out["latency_vs_fastest_peer"] = versus_peers["latency_vs_fastest_peer"]
    comparison = export.get("versus_int8_teacher")
    if comparison:
        out["accuracy_kept"] = comparison["accuracy_kept"]
        out["size_vs_int8_teacher"] = comparison["size_vs_int8_teacher"]
        for name, value in comparison["speedup_vs_int8_teacher"].items():
            out[f"speedup_vs_int8_teacher_{metric_suffix(name)}"] = value
    return out


def markdown_results(rows: list[dict], setting, evaluate: dict, export: dict) -> str:
    """The closing table of print_summary as markdown (the pipeline run's description in MLflow)."""
    if not rows:
        return "_No results yet: evaluate and export have not completed for this configuration._"
    latency_head = f"ms b1/{setting[0]}/{setting[1]}t" if setting else "latency ms"
    lines = [f"| model | accuracy | macro-F1 | params | size MB | {latency_head} |", "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        size, ms, params = row.get("size_mb"), row.get("latency_ms"), row.get("parameters")
        name = row["name"] + (" **(shipped)**" if row.get("recommended") else "")
        lines.append(
            f"| {name} | {row['accuracy']:.4f} | {row['macro_f1']:.4f} | {f'{params:,}' if params else '-'} | "
            f"{f'{size:.1f}' if size else '-'} | {f'{ms:.2f}' if ms is not None else '-'} |"
        )
    notes = []
    if "retention" in evaluate:
        notes.append(
            f"retention (student / teacher accuracy): {evaluate['retention']:.4f}; "
            f"agreement: {evaluate.get('agreement', float('nan')):.4f}"
        )
    comparison = export.get("versus_int8_teacher")
    if comparison:
        notes += comparison_lines(comparison)
    text = "\n".join(lines) + ("\n\n" + "\n".join(f"- {n}" for n in notes) if notes else "")
    from_text = export.get("from_text") or {}
    if from_text.get("measured"):
        text += "\n\nFrom raw text, one text per call, beside what mobile teams ship instead:\n\n" + from_text_markdown(
            from_text
        )
    return text
