"""Ablation and depth study on a config (default bert_small): what each distillation lever buys.

    python bench/ablation.py                      # all variants, results in bench/results/ablation.{md,json}
    python bench/ablation.py --only ce_only kd    # a subset
    python bench/ablation.py --extra "precision=fp32"   # overrides applied to every variant

Built on the pipeline's sweeps (`python -m pipeline sweep`, pipeline/sweep/): the
variants below are written as two sweep files into the runs folder, `ablation` (losses
and tuning, run through evaluate) and `depth` (run through export, for the int8
latency the depth table trades against). The sweeps run prepare / teacher / capture
once and hard-link them into every variant whose fingerprints match (capture reruns
only for a variant that needs other teacher targets); every figure comes from the
variants' own stage outputs (metrics.json, manifests). The sweeps' own tables,
Pareto plots and MLflow sweep runs are there too (runs/ablation/<config>/sweeps/).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT  # (also puts the repository on the path)

LOSS = "distill.loss={{ce: {ce}, kd: {kd}, attention: {att}, value_relation: {vr}, hidden: {hid}}}"

# name -> (table, description, overrides)
VARIANTS = {
    # No teacher, so no augmented copies either: they carry the teacher's logits and no label (the config refuses
    # copies without a logit KD weight since 2026-12-06; the committed 2026-11-30 row trained with them in its batches).
    "ce_only": (
        "ablation",
        "student, CE only (no teacher)",
        [LOSS.format(ce=1, kd=0, att=0, vr=0, hid=0), "capture.augment.copies=0"],
    ),
    "kd": ("ablation", "+ logit KD (T=2)", [LOSS.format(ce=1, kd=1, att=0, vr=0, hid=0)]),
    "kd_att": ("ablation", "+ attention KL (last layer)", [LOSS.format(ce=1, kd=1, att=1, vr=0, hid=0)]),
    "kd_att_vr": ("ablation", "+ value relation", [LOSS.format(ce=1, kd=1, att=1, vr=1, hid=0)]),
    "kd_att_vr_hid": (
        "ablation",
        "+ hidden states (uniform map)",
        [LOSS.format(ce=1, kd=1, att=1, vr=1, hid=1), "distill.layer_map=uniform"],
    ),
    "depth1": ("depth", "1 layer (teacher layer 5)", ["student.teacher_layers=[5]"]),
    "depth2": ("depth", "2 layers (teacher layers 0,5)", ["student.teacher_layers=[0,5]"]),
    "depth3": ("depth", "3 layers (teacher layers 0,3,5)", ["student.teacher_layers=[0,3,5]"]),
    "depth4": ("depth", "4 layers (teacher layers 0,2,4,5)", ["student.teacher_layers=[0,2,4,5]"]),
    # Levers for the 98% retention goal on the 2-layer student.
    "init01": ("tuning", "initialised from teacher layers 0,1 (bottom layers kept)", ["student.teacher_layers=[0,1]"]),
    "long8": ("tuning", "8 epochs", ["distill.epochs=8"]),
    "long8_all": (
        "tuning",
        "8 epochs, + value relation + hidden states (uniform)",
        ["distill.epochs=8", LOSS.format(ce=1, kd=1, att=1, vr=1, hid=1), "distill.layer_map=uniform"],
    ),
    "long8_kd_heavy": (
        "tuning",
        "8 epochs, CE 0.5 / KD 2 / attention 1, T=4",
        ["distill.epochs=8", LOSS.format(ce=0.5, kd=2, att=1, vr=0, hid=0), "distill.temperature=4"],
    ),
    "long8_unlabeled": (
        "tuning",
        "8 epochs + synopsis rows as unlabeled KD text",
        ["distill.epochs=8", "data.unlabeled_text=true"],
    ),
}


# Depth variants also export, for the int8 latency the depth table trades against (one length, one thread).
EXPORT = ["export.latency_lengths=[128]", "export.latency_threads=[1]"]


SWEEPS = {"ablation": ("ablation", "tuning"), "depth": ("depth",)}  # sweep name -> the tables it runs


def sweep_file(runs: Path, sweep: str, names: list[str]) -> Path | None:
    """The sweep file (YAML) for the chosen variants of one sweep; None when none was chosen."""
    import yaml

    from pipeline.config import parse_override

    chosen = [n for n in names if VARIANTS[n][0] in SWEEPS[sweep]]
    if not chosen:
        return None
    variants = {}
    for name in chosen:
        overrides = [*VARIANTS[name][2], *(EXPORT if sweep == "depth" else [])]
        variants[name] = {
            "description": VARIANTS[name][1],
            "overrides": {".".join(parse_override(o)[0]): parse_override(o)[1] for o in overrides},
        }
    path = runs / f"{sweep}.yaml"
    path.write_text(
        yaml.safe_dump({"description": f"bench/ablation.py: {sweep}", "variants": variants}, sort_keys=False)
    )
    return path


def run_sweep(config: str, runs_dir: Path, sweep: Path, extra: list[str], log, last_stage: str) -> None:
    command = [
        sys.executable,
        "-m",
        "pipeline",
        "sweep",
        config,
        str(sweep),
        *extra,
        "--to",
        last_stage,
        "--runs-dir",
        str(runs_dir),
    ]
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    if subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
        raise SystemExit(f"sweep {sweep} failed; see {log.name}")


def collect(run_dir: Path, exported: bool) -> dict:
    metrics = json.loads((run_dir / "evaluate" / "metrics.json").read_text())
    distill = json.loads((run_dir / "distill" / "manifest.json").read_text())
    return {
        "teacher_accuracy": metrics["teacher"]["accuracy"],
        "teacher_macro_f1": metrics["teacher"]["macro_f1"],
        "accuracy": metrics["student"]["accuracy"],
        "macro_f1": metrics["student"]["macro_f1"],
        "retention": metrics["retention"],
        "agreement": metrics["agreement"],
        "layers": metrics["student"]["layers"],
        "parameters": metrics["student"]["parameters"],
        "distill_seconds": distill["duration_s"],
        **(collect_export(run_dir) if exported else {}),
    }


def collect_export(run_dir: Path) -> dict:
    """int8 accuracy, size and batch-1 latency at length 128 on 1 thread (empty when int8 or that row is missing:
    export.quantize off, or a model with fewer than 128 positions)."""
    export = json.loads((run_dir / "export" / "metrics.json").read_text())
    ms = {r["model"]: r["median_ms"] for r in export["latency"] if r["length"] == 128 and r["threads"] == 1}
    needed = ("student ONNX int8", "student PyTorch fp32", "teacher PyTorch fp32")
    if "onnx_int8" not in export or any(name not in ms for name in needed):
        return {}
    return {
        "int8_accuracy": export["onnx_int8"]["accuracy"],
        "int8_mb": export["onnx_int8"]["file_mb"],
        "int8_ms": ms["student ONNX int8"],
        "student_pytorch_ms": ms["student PyTorch fp32"],
        "teacher_pytorch_ms": ms["teacher PyTorch fp32"],
        "speedup_int8": ms["teacher PyTorch fp32"] / ms["student ONNX int8"],
        "speedup_pytorch": ms["teacher PyTorch fp32"] / ms["student PyTorch fp32"],
    }


def machine() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    from common import machine_line

    return machine_line()


def precision(run_dir: Path) -> str:
    """The precision the runs used (config `auto` resolves per machine; the run folder records the result)."""
    import yaml

    return str(yaml.safe_load((run_dir / "config.yaml").read_text()).get("precision"))


def markdown(results: dict, header: dict) -> str:
    lines = [
        f"# Ablation on `{header['config']}`",
        "",
        f"Command: `{header['command']}`  ",
        f"Machine: {header['machine']}, precision {header.get('precision', '?')}  ",
        f"Date: {header['date']}",
        "",
        "One run per variant (seed 42) on the same split and teacher. The test split has 2,557 sentences, so "
        "one accuracy carries a standard error of about 0.8 points: differences under ~1.5 points between "
        "single runs are within noise.",
        "",
    ]
    teacher = next(iter(results.values()))
    base = [r.get("layers") for name, r in results.items() if VARIANTS.get(name, ("",))[0] != "depth"]
    student = f"{base[0]}-layer student" if base and base[0] else "the config's student"
    lines += [
        f"## Losses ({student})",
        "",
        "| student | accuracy | macro-F1 | retention | distill time (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        if VARIANTS[name][0] == "ablation":
            lines.append(
                f"| {VARIANTS[name][1]} | {r['accuracy']:.4f} | {r['macro_f1']:.4f} | {r['retention']:.4f} | {r['distill_seconds']:.0f} |"
            )
    lines.append(
        f"| teacher (MiniLM-L6, fine-tuned) | {teacher['teacher_accuracy']:.4f} | {teacher['teacher_macro_f1']:.4f} | 1.0000 | - |"
    )
    if any(VARIANTS[name][0] == "depth" for name in results):
        lines += [
            "",
            "## Depth (default losses): retention against int8 latency",
            "",
            "Latency: batch 1, length 128, 1 thread, median; speed-up against the teacher in PyTorch fp32.",
            "",
            "| student | parameters | accuracy | retention | int8 accuracy | int8 MB | int8 ms | speed-up int8 | "
            "speed-up PyTorch | distill time (s) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for name, r in results.items():
        if VARIANTS[name][0] == "depth":
            if "int8_ms" not in r:
                lines.append(
                    f"| {VARIANTS[name][1]} | {r['parameters'] / 1e6:.1f}M | {r['accuracy']:.4f} | "
                    f"{r['retention']:.4f} | - | - | - | - | - | {r['distill_seconds']:.0f} |"
                )
                continue
            lines.append(
                f"| {VARIANTS[name][1]} | {r['parameters'] / 1e6:.1f}M | {r['accuracy']:.4f} | {r['retention']:.4f} | "
                f"{r['int8_accuracy']:.4f} | {r['int8_mb']:.1f} | {r['int8_ms']:.1f} | {r['speedup_int8']:.1f}x | "
                f"{r['speedup_pytorch']:.1f}x | {r['distill_seconds']:.0f} |"
            )
    depth = [r for name, r in results.items() if VARIANTS[name][0] == "depth" and "int8_ms" in r]
    if depth:
        lines.append(
            f"| teacher (PyTorch fp32) | - | {teacher['teacher_accuracy']:.4f} | 1.0000 | - | - | "
            f"{depth[0]['teacher_pytorch_ms']:.1f} (PyTorch) | 1.0x | 1.0x | - |"
        )
    tuning = [name for name in results if VARIANTS[name][0] == "tuning"]
    if tuning:
        lines += [
            "",
            f"## Tuning ({student})",
            "",
            "| student | accuracy | macro-F1 | retention | distill time (s) |",
            "|---|---:|---:|---:|---:|",
        ]
        for name in tuning:
            r = results[name]
            lines.append(
                f"| {VARIANTS[name][1]} | {r['accuracy']:.4f} | {r['macro_f1']:.4f} | {r['retention']:.4f} | {r['distill_seconds']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="bert_small")
    parser.add_argument("--runs-dir", default="runs/ablation")
    parser.add_argument("--only", nargs="*", choices=list(VARIANTS), help="variants to run (default: all)")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides for every variant (key=value)")
    parser.add_argument("--out", default="bench/results", help="folder for ablation.md / ablation.json")
    args = parser.parse_args()
    runs = Path(args.runs_dir)
    runs.mkdir(parents=True, exist_ok=True)
    names = args.only or list(VARIANTS)
    folders = {}
    with open(runs / "ablation.log", "a") as log:
        for sweep in SWEEPS:  # ablation first: its first variant runs the shared stages, depth links them
            path = sweep_file(runs, sweep, names)
            if path is None:
                continue
            run_sweep(args.config, runs, path, args.extra, log, "export" if sweep == "depth" else "evaluate")
            folders.update(
                {n: runs / args.config / "sweeps" / sweep / n for n in names if VARIANTS[n][0] in SWEEPS[sweep]}
            )
    results = {}
    for name in names:  # in the order asked for
        results[name] = collect(folders[name], exported=VARIANTS[name][0] == "depth")
        print(
            f"{name:>16}: accuracy {results[name]['accuracy']:.4f}, retention {results[name]['retention']:.4f}",
            flush=True,
        )

    header = {
        "config": args.config,
        "command": "python bench/ablation.py " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "precision": precision(folders[names[0]]),
        "date": time.strftime("%Y-%m-%d"),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation.json").write_text(json.dumps({"header": header, "results": results}, indent=2))
    (out / "ablation.md").write_text(markdown(results, header))
    print(markdown(results, header))


if __name__ == "__main__":
    main()
