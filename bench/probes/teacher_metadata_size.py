"""The int8 teacher's file with and without the exporter's per-node metadata (stack traces with source paths), as
the export builds it (pipeline/export/variants.export_teacher strips it since 2026-12-01), and the student's size
ratio against each.

    python bench/probes/teacher_metadata_size.py runs/bert_small/sweeps/budget/layers3
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pipeline.export.onnx_graph import LogitsOnly, export_onnx, strip_node_metadata
from pipeline.export.quantize import quantize_like_student
from pipeline.models import load_classifier

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("run", type=Path, help="a finished run folder (its export/bundle and distill/student)")
run = parser.parse_args().run
metadata = json.loads((run / "export" / "bundle" / "metadata.json").read_text())
quant = metadata["quantization"]
student_mb = metadata["variants"][metadata["recommended"]]["file_mb"]
teacher = load_classifier(str(run / "teacher" / "model"), attn_implementation="eager").eval()
work = Path(tempfile.mkdtemp())
export_onnx(LogitsOnly(teacher), work / "with.onnx", metadata["opset"])
shutil.copy(work / "with.onnx", work / "stripped.onnx")
strip_node_metadata(work / "stripped.onnx")
for name in ("with", "stripped"):
    quantize_like_student(work / f"{name}.onnx", work / f"{name}.int8.onnx", quant)
    mb = (work / f"{name}.int8.onnx").stat().st_size / 1e6
    print(
        f"teacher int8, {name:>8} exporter metadata: {mb:.3f} MB; student ({metadata['recommended']}) {student_mb:.3f} MB: "
        f"size ratio {student_mb / mb:.4f}"
    )
shutil.rmtree(work)
