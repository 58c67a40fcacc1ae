"""The recorded accuracies of a finished bundle, measured again the way its users run it.

    python bench/bundle_agreement.py runs/bert_small [--out bench/results/bundle_agreement_bert_small.md]

For every model file the bundle lists (ONNX, ORT format, ExecuTorch): `predict.py --model FILE --eval
test.jsonl` at batch 1 (its default: one text per call) and at batch 64, and for the ONNX and ORT files the
Node.js check (`tests/node/predict.mjs`: onnxruntime-node and the JavaScript tokenizer, one text per call),
each beside the accuracy metadata.json records. The Node column needs `node` and `tests/node/node_modules`
(`make venv` installs them where npm is present).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from common import ROOT, command_line, emit


def predict_py(bundle: Path, model: str, test: Path, batch: int) -> float:
    proc = subprocess.run(
        [sys.executable, "predict.py", "--model", model, "--eval", str(test), "--batch-size", str(batch)],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode:
        raise SystemExit(f"predict.py --model {model} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["accuracy"]


def node(bundle: Path, model: str, test: Path) -> float | None:
    if shutil.which("node") is None or not (ROOT / "tests" / "node" / "node_modules").is_dir():
        return None
    proc = subprocess.run(
        ["node", str(ROOT / "tests" / "node" / "predict.mjs"), str(bundle), str(test), model],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode:
        raise SystemExit(f"the Node check on {model} failed:\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    gold = [json.loads(line)["label"] for line in test.read_text().splitlines() if line.strip()]
    return sum(r["label"] == g for r, g in zip(rows, gold)) / len(gold)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a finished run folder (runs/<config> or a sweep variant's)")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    bundle, test = args.run / "export" / "bundle", (args.run / "prepare" / "test.jsonl").resolve()
    metadata = json.loads((bundle / "metadata.json").read_text())
    files = []
    for name, variant in metadata["variants"].items():
        files += [(variant["file"], name, variant["accuracy"])]
        if variant.get("ort_file"):
            files += [(variant["ort_file"], name, variant["accuracy"])]
    for name, info in ((metadata.get("executorch") or {}).get("variants") or {}).items():
        files.append((info["file"], f"ExecuTorch {name}", info["accuracy"]))
    lines = [
        f"# Recorded accuracy against the bundle's own runners: {args.run}",
        "",
        f"`python bench/bundle_agreement.py {args.run}`; {metadata['evaluation']['examples']} test texts.",
        "",
        "| file | variant | recorded (one text per call) | predict.py, batch 1 | predict.py, batch 64 | Node.js, one per call |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for file, name, recorded in files:
        one, batched = predict_py(bundle, file, test, 1), predict_py(bundle, file, test, 64)
        js = node(bundle, file, test) if file.endswith((".onnx", ".ort")) else None
        lines.append(
            f"| `{file}` | {name} | {recorded:.4f} | {one:.4f}{'' if one == recorded else ' (differs)'} | "
            f"{batched:.4f} | {'-' if js is None else f'{js:.4f}'} |"
        )
        print(lines[-1], flush=True)
    emit(lines, args.out, command=command_line("bench/bundle_agreement.py", argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
