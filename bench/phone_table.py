"""Every shipped variant of finished runs, as the phone sees it: one-text-per-call accuracy, what batching
changes, size, and the speed-up on real sentences against the int8 teacher with its 95% interval.

    python bench/phone_table.py runs/bert_small/sweeps/budget/{static,layers1,layers2,layers3} \
        [--out bench/results/phone_table_bert_small.md]

Reads each run folder's export/metrics.json (written by the export stage) and prints one markdown row per
variant (ONNX fp32, dynamic int8, static QDQ int8, ExecuTorch fp32 and int8), the recommended one in bold.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, emit

ROWS = [
    ("onnx_fp32", "fp32", "student ONNX fp32"),
    ("onnx_int8", "int8", "student ONNX int8"),
    ("onnx_int8_static", "int8_static", "student ONNX int8 static"),
]


def cell(row: dict | None) -> tuple[str, str]:
    if not row or not row.get("speedup_vs_teacher_int8"):
        return "-", "-"
    return (
        f"{row['median_ms']:.3f}",
        f"{row['speedup_vs_teacher_int8']:.2f}x ({row['speedup_vs_teacher_int8_low']:.2f}-"
        f"{row['speedup_vs_teacher_int8_high']:.2f})",
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the table here, headed by command, date and machine")
    args = parser.parse_args(argv)
    lines = [
        "| run | variant | accuracy, one text per call | predictions changed in batches of 64 | file MB | "
        f"ms per sentence ({args.threads} thread) | speed-up vs int8 teacher (95% interval) | rounds |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in args.runs:
        m = json.loads((run / "export" / "metrics.json").read_text())
        speed = {r["model"]: r for r in m["latency"] if r["input"] == "sentences" and r["threads"] == args.threads}
        entries = [(key, name, speed.get(model), m[key]) for key, name, model in ROWS if key in m]
        for name, info in ((m.get("executorch") or {}).get("variants") or {}).items():
            entries.append(
                (
                    f"executorch_{name}",
                    f"ExecuTorch {name}",
                    speed.get(f"student ExecuTorch {name}"),
                    {**info, "batch_invariance": None},
                )
            )
        teacher = speed.get("teacher ONNX int8")
        for _key, name, row, info in entries:
            ms, up = cell(row)
            batch = info.get("batch_invariance")
            changed = "batch 1 only" if batch is None else str(batch["predictions_changed"])
            label = f"**{name}** (shipped)" if name == m["recommended"] else name
            lines.append(
                f"| {run.name} | {label} | {info['accuracy']:.4f} | {changed} | {info['file_mb']:.1f} | {ms} | "
                f"{up} | {row['rounds'] if row else '-'} |"
            )
        if teacher:
            lines.append(
                f"| {run.name} | teacher ONNX int8 | {m['versus_int8_teacher']['baseline']['accuracy']:.4f} | - | "
                f"{m['versus_int8_teacher']['baseline']['file_mb']:.1f} | {teacher['median_ms']:.3f} | 1.00x | "
                f"{teacher['rounds']} |"
            )
    emit(lines, args.out, command=command_line("bench/phone_table.py", argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
