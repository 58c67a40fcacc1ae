"""Levers against the int8 teacher (issue: distillation must beat the int8 teacher), each a real pipeline run.

    python bench/levers.py --only ffn768_3l aug4_ffn768_3l --seeds 42 43 44 --jobs 2
    python bench/levers.py --table            # rewrite bench/results/levers.md from levers.json
    python bench/levers.py --config debates --upstream runs/debates --only default --seeds 42 43 44 --export

Every variant is `python -m pipeline run bert_small <overrides>` sharing the
prepare / teacher / capture stages of one upstream run (hard-linked: their
fingerprints match, so the runner skips them; a variant that needs other
teacher targets or data reruns those stages itself). Seeds vary only the
student's training (`distill.seed`): the teacher and the split stay fixed.
Variants run through evaluate (student accuracy, PyTorch); with --export they
also run the export stage, which measures the shipped file against the int8
teacher (accuracy kept, speed-up, size). Latency needs a quiet machine: use
--jobs 1 with --export. Results accumulate in bench/results/levers.json
(variant -> seed -> figures); the table shows mean and spread over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ablation import machine, precision
from common import ROOT, link_upstream

RESULTS = ROOT / "bench" / "results"

# name -> (description, overrides). The pruned/deeper students all start from teacher layers.
VARIANTS = {
    "default": ("the config as committed", []),
    "old_default_2l": (
        "2 layers [0,5], full FFN, full vocabulary (the previous default)",
        ["student.teacher_layers=[0,5]", "export.trim_vocab=false"],
    ),
    "2l": ("2 layers [0,5], full FFN", ["student.teacher_layers=[0,5]"]),
    "3l_ffn768": ("3 layers [0,3,5], FFN 768 of 1536", ["student.teacher_layers=[0,3,5]", "student.ffn_size=768"]),
    "3l_ffn512": ("3 layers [0,3,5], FFN 512", ["student.teacher_layers=[0,3,5]", "student.ffn_size=512"]),
    "3l_ffn384": ("3 layers [0,3,5], FFN 384", ["student.teacher_layers=[0,3,5]", "student.ffn_size=384"]),
    "3l_ffn256": ("3 layers [0,3,5], FFN 256", ["student.teacher_layers=[0,3,5]", "student.ffn_size=256"]),
    "2l_ffn768": ("2 layers [0,5], FFN 768", ["student.teacher_layers=[0,5]", "student.ffn_size=768"]),
    "3l_ffn384_aug1_e2": (
        "3 layers, FFN 384, + 1 augmented copy, 2 epochs (same steps as 4 epochs without)",
        ["student.teacher_layers=[0,3,5]", "student.ffn_size=384", "capture.augment.copies=1", "distill.epochs=2"],
    ),
    "3l_ffn384_aug3_e1": (
        "3 layers, FFN 384, + 3 augmented copies, 1 epoch (same steps as 4 epochs without)",
        ["student.teacher_layers=[0,3,5]", "student.ffn_size=384", "capture.augment.copies=3", "distill.epochs=1"],
    ),
    "3l_ffn256_aug1_e2": (
        "3 layers, FFN 256, + 1 augmented copy, 2 epochs (same steps as 4 epochs without)",
        ["student.teacher_layers=[0,3,5]", "student.ffn_size=256", "capture.augment.copies=1", "distill.epochs=2"],
    ),
    "3l_ffn256_aug3_e1": (
        "3 layers, FFN 256, + 3 augmented copies, 1 epoch (same steps as 4 epochs without)",
        ["student.teacher_layers=[0,3,5]", "student.ffn_size=256", "capture.augment.copies=3", "distill.epochs=1"],
    ),
    "3l_ffn256_aug3_e2": (
        "3 layers, FFN 256, + 3 augmented copies, 2 epochs (2x the steps)",
        ["student.teacher_layers=[0,3,5]", "student.ffn_size=256", "capture.augment.copies=3", "distill.epochs=2"],
    ),
    "3l_ffn256_aug1_e2_uniform": (
        "3 layers, FFN 256, + 1 augmented copy, 2 epochs, relations on every layer (uniform map)",
        [
            "student.teacher_layers=[0,3,5]",
            "student.ffn_size=256",
            "capture.augment.copies=1",
            "distill.epochs=2",
            "distill.layer_map=uniform",
        ],
    ),
    "3l_ffn128": ("3 layers [0,3,5], FFN 128", ["student.teacher_layers=[0,3,5]", "student.ffn_size=128"]),
    "4l_ffn384": ("4 layers [0,2,4,5], FFN 384", ["student.teacher_layers=[0,2,4,5]", "student.ffn_size=384"]),
    "4l_ffn256": ("4 layers [0,2,4,5], FFN 256", ["student.teacher_layers=[0,2,4,5]", "student.ffn_size=256"]),
    "3l_ffn384_aug4": (
        "3 layers, FFN 384, + 4 augmented copies (2 epochs)",
        ["student.teacher_layers=[0,3,5]", "student.ffn_size=384", "capture.augment.copies=4", "distill.epochs=2"],
    ),
    "3l_ffn512_aug4": (
        "3 layers, FFN 512, + 4 augmented copies (2 epochs)",
        ["student.teacher_layers=[0,3,5]", "student.ffn_size=512", "capture.augment.copies=4", "distill.epochs=2"],
    ),
    "3l_ffn512_kd": (
        "3 layers, FFN 512, logit KD only (no relation losses)",
        [
            "student.teacher_layers=[0,3,5]",
            "student.ffn_size=512",
            "distill.loss={ce: 1, kd: 1, attention: 0, value_relation: 0, hidden: 0}",
        ],
    ),
    "3l_ffn512_uniform": (
        "3 layers, FFN 512, relations on every layer (uniform map)",
        ["student.teacher_layers=[0,3,5]", "student.ffn_size=512", "distill.layer_map=uniform"],
    ),
}


def run_variant(
    config: str, name: str, seed: int, upstream: Path, runs: Path, export: bool, threads: int, extra: list[str]
) -> dict:
    variant_dir = runs / f"{name}-s{seed}"
    link_upstream(upstream, variant_dir / config)
    overrides = [*VARIANTS[name][1], f"distill.seed={seed}", "tracking.enabled=false", *extra]
    command = [
        sys.executable,
        "-m",
        "pipeline",
        "run",
        config,
        *overrides,
        "--to",
        "export" if export else "evaluate",
        "--runs-dir",
        str(variant_dir),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    started = time.time()
    with open(variant_dir / "run.log", "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        result = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        raise SystemExit(f"variant {name} seed {seed} failed; see {variant_dir / 'run.log'}")
    return collect(variant_dir / config, export, time.time() - started, threads)


def collect(run_dir: Path, exported: bool, wall: float, threads: int) -> dict:
    evaluate = json.loads((run_dir / "evaluate" / "metrics.json").read_text())
    distill = json.loads((run_dir / "distill" / "manifest.json").read_text())
    figures = {
        "teacher_accuracy": evaluate["teacher"]["accuracy"],
        "accuracy": evaluate["student"]["accuracy"],
        "macro_f1": evaluate["student"]["macro_f1"],
        "retention": evaluate["retention"],
        "parameters": evaluate["student"]["parameters"],
        "layers": evaluate["student"]["layers"],
        "distill_seconds": distill["duration_s"],
        "torch_threads": threads,
        "wall_seconds": wall,
        "precision": precision(run_dir),
    }
    if exported:
        export = json.loads((run_dir / "export" / "metrics.json").read_text())
        versus = export.get("versus_int8_teacher") or {}
        figures.update(
            {
                "shipped": export["recommended"],
                "shipped_accuracy": versus.get("shipped", {}).get("accuracy"),
                "shipped_mb": versus.get("shipped", {}).get("file_mb"),
                "accuracy_kept": versus.get("accuracy_kept"),
                "size_vs_int8_teacher": versus.get("size_vs_int8_teacher"),
                "speedup_vs_int8_teacher": versus.get("speedup_vs_int8_teacher"),
                "int8_teacher_accuracy": versus.get("baseline", {}).get("accuracy"),
                "int8_teacher_mb": versus.get("baseline", {}).get("file_mb"),
                "vocab_trim": {k: export["vocab_trim"].get(k) for k in ("enabled", "kept_tokens", "before", "after")},
            }
        )
    return figures


def mean_sd(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def markdown(results: dict, header: dict) -> str:
    lines = [
        f"# Levers against the int8 teacher (`{header.get('config', 'bert_small')}`)",
        "",
        f"Command: `{header.get('command', 'python bench/levers.py')}`  ",
        f"Date: {header['date']}  ",
        f"Machine: {header['machine']}",
        "",
        "Rows accumulate over calls of `python bench/levers.py` (see its docstring): the command above is one of "
        "them, the date the last update. Every row is a full pipeline run sharing one teacher and split; seeds vary the student's training only "
        "(`distill.seed`). Accuracy: PyTorch student on the test split, mean ± standard deviation over "
        "the seeds listed (bert_small: 2,557 test sentences, a single run's standard error about 0.8 points). Shipped columns come from the export "
        "stage (int8 file, vocabulary trimmed unless the row says otherwise) measured against the int8 teacher "
        "in the same process, batch 1, 1 thread.",
        "",
        "| variant | seeds | params | accuracy | retention | shipped accuracy | accuracy kept | shipped MB | size vs int8 teacher | speed-up L=128 | speed-up sentences | distill s (threads) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, by_seed in results.items():
        rows = list(by_seed.values())
        if not rows:
            continue
        exported = [r for r in rows if r.get("accuracy_kept") is not None]

        def speed(key, exported=exported):
            values = [r["speedup_vs_int8_teacher"].get(key) for r in exported if r.get("speedup_vs_int8_teacher")]
            values = [v for v in values if v]
            return f"{statistics.mean(values):.2f}x" if values else "-"

        mb = [r["shipped_mb"] for r in exported]
        lines.append(
            f"| {VARIANTS.get(name, (name,))[0]} | {', '.join(sorted(by_seed))} | {rows[0]['parameters'] / 1e6:.1f}M | "
            f"{mean_sd([r['accuracy'] for r in rows])} | {mean_sd([r['retention'] for r in rows])} | "
            f"{mean_sd([r['shipped_accuracy'] for r in exported])} | {mean_sd([r['accuracy_kept'] for r in exported])} | "
            f"{(f'{statistics.mean(mb):.1f}' if mb else '-')} | {mean_sd([r['size_vs_int8_teacher'] for r in exported])} | "
            f"{speed('L=128')} | {speed('sentences')} | "
            f"{statistics.mean(r['distill_seconds'] for r in rows):.0f} ({rows[0]['torch_threads']}) |"
        )
    teacher = next((r for by_seed in results.values() for r in by_seed.values()), None)
    if teacher:
        lines += ["", f"Teacher (fine-tuned MiniLM-L6, fp32 PyTorch): test accuracy {teacher['teacher_accuracy']:.4f}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="bert_small", help="config every variant starts from")
    parser.add_argument("--only", nargs="*", choices=list(VARIANTS), default=[])
    parser.add_argument("--seeds", nargs="*", type=int, default=[42])
    parser.add_argument(
        "--upstream", default="runs/bert_small", help="a finished run whose prepare/teacher/capture are reused"
    )
    parser.add_argument("--runs-dir", default="runs/levers")
    parser.add_argument(
        "--export", action="store_true", help="also run export (int8, trimmed vocabulary, latency vs the int8 teacher)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="variants run at once (each with 2/jobs torch threads)")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides for every variant")
    parser.add_argument("--table", action="store_true", help="only rewrite levers.md from levers.json")
    args = parser.parse_args()
    stem = "levers" if args.config == "bert_small" else f"levers_{args.config}"
    store = RESULTS / f"{stem}.json"
    data = json.loads(store.read_text()) if store.exists() else {"header": {}, "results": {}}
    if not args.table:
        upstream, runs = Path(args.upstream), Path(args.runs_dir)
        if not (upstream / "teacher").is_dir():
            raise SystemExit(f"{upstream} has no finished teacher stage: run `make distill` (or pass --upstream) first")
        threads = max(1, (os.cpu_count() or 2) // args.jobs)
        jobs = [(name, seed) for name in args.only for seed in args.seeds]

        def one(job):
            name, seed = job
            figures = run_variant(args.config, name, seed, upstream, runs, args.export, threads, args.extra)
            print(
                f"{name} seed {seed}: accuracy {figures['accuracy']:.4f}"
                + (
                    f", kept {figures['accuracy_kept']:.3f}, speed-up {figures['speedup_vs_int8_teacher']}, "
                    f"size {figures['size_vs_int8_teacher']:.2f}"
                    if figures.get("accuracy_kept")
                    else ""
                ),
                flush=True,
            )
            return job, figures

        with ThreadPoolExecutor(args.jobs) as pool:
            for (name, seed), figures in pool.map(one, jobs):
                before = data["results"].get(name, {}).get(str(seed))
                if (
                    before and before["distill_seconds"] == figures["distill_seconds"]
                ):  # distill reused: keep its threads
                    figures["torch_threads"] = before["torch_threads"]
                data["results"].setdefault(name, {})[str(seed)] = figures
                data["header"] = {
                    "machine": machine(),
                    "date": time.strftime("%Y-%m-%d"),
                    "command": "python bench/levers.py " + " ".join(sys.argv[1:]),
                }
                store.write_text(json.dumps(data, indent=1))
    data["header"]["config"] = args.config
    (RESULTS / f"{stem}.md").write_text(markdown(data["results"], data["header"]))
    print(markdown(data["results"], data["header"]))


if __name__ == "__main__":
    main()
