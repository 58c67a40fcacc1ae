"""The comparison: one row of headline figures per variant, the peers as reference points, and the table as
markdown and CSV, each file written whole and renamed into place."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

from ..config import PipelineConfig
from ..run_record import REGISTERED_TAG, result_tags
from ..summary import headline_metrics, metric_suffix, summary_rows
from .pick import CHAMPION


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
    # a static student's fastest route from raw text is its word model (model.words.onnx): the figure a team compares
    text_row = from_text.get("student_words") or from_text.get("student", {})
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
        "text_accuracy": text_row.get("accuracy"),
        "text_ms": text_row.get("median_ms"),
        "text_route": {"student_words": "word model", "student": "text-in model"}.get(text_row.get("model")),
        "text_mb": text_row.get("file_mb"),
    }


def reference_points(folder: Path, variants: list[str]) -> list[dict]:
    """What the students are measured against, from raw text (the first variant's export that compared them):
    the peers stage's models and the int8 teacher. Reference points only: never picked."""
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
    rows: list[dict], shared: list[str], pick_lines: list[str], picked: str | None, references: Sequence[dict] = ()
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
        "texts for students and peers; for a static student its word model (model.words.onnx), its fastest route. "
        "Wall time: the stages this variant ran itself.",
    ]
    if shared:
        notes.append("Shared (run once, hard-linked into the variants): " + "; ".join(shared) + ".")
    if pick_lines:
        notes += ["", *pick_lines]
    return "\n".join(lines + notes) + "\n"


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
