"""`make bench`: measure bench/results/bench.json (and attention_kl.*) from scratch, then render BENCHMARKS.md.

    python bench/run_all.py            # full: bert_small on this machine (about 20 minutes on 2 quiet CPU cores)
    python bench/run_all.py --quick    # smoke test: tiny config, minimal repeats, about a minute;
                                       # writes under runs/bench-quick/ (never over the committed results)

BENCHMARKS.md is rendered by bench/report.py (the only writer) from every results file in the folder bench.json
goes to: this run's figures beside the committed ones (`make bench-report` renders without measuring).

What runs, in this order (each part's figures are measured in this run unless said otherwise):

6. pipeline   a fresh `python -m pipeline run <config> --runs-dir <runs>` (the runs folder is wiped first),
              stage wall times from its manifests; then the same command again with nothing changed,
              timed with time.perf_counter around the subprocess (3 times; --quick: once)
1. quality    teacher / distilled student (and its ONNX variants) of that run on the test split, plus the
              committed ablation bench/results/ablation.json (bench/ablation.py: losses, depth, tuning)
2. inference  the export stage's batch-1 latency table of that run (bundle/latency.json) and file sizes,
              ratios against the teacher in PyTorch
3. training   bench/micro.py: samples/s of plain CE vs distillation steps (cached / online teacher)
4. capture    bench/micro.py: teacher inference vs capture; cache bytes per example of the run
5. attention  bench/attention_kl.py (chunked vs naive attention KL, time and peak memory)
7. scale      the committed bench/results/scale.{json,md,png} (bench/scale.py: time and peak memory per stage
              at 10k / 100k / 1M examples; about 40 minutes, run on its own)

Precision: --precision auto (default) keeps the config's precision, except that a configured bf16 is
measured in fp32 on a CPU where bf16 is not native (a timed matmul decides; AVX2-only CPUs run bf16
emulated, several to tens of times slower than fp32). The choice and its evidence are in both outputs;
--precision config always uses the config's.

The exit status is 1 when any part failed; the files are written anyway, naming what is missing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report as report_module  # (BENCHMARKS.md: bench/report.py renders every results file)
from common import BENCH, ROOT, STAGES, link_upstream, machine_facts, spread  # (also puts the repository on the path)
from report import LATENCY_MODELS

MARKER = ".bench-runs-dir"  # only a runs folder carrying this file is ever wiped
ABLATION_FILE = BENCH / "results" / "ablation.json"  # written by bench/ablation.py (header + results)
SCALE_FILE = BENCH / "results" / "scale.json"  # written by bench/scale.py (about 40 minutes: run on its own)
REFERENCE = "teacher PyTorch fp32"

FULL = {
    "config": "bert_small",
    "overrides": [],
    "second_runs": 3,
    "attention_kl": [],
    "threads": None,
    "extra_seeds": [43, 44],
}
# --quick: the tiny config without MLflow (the tracking store costs seconds per stage), one repeat of everything,
# attention KL at N=128 / head dim 32 only, one torch thread everywhere (on a shared 2-core machine two threads
# spin at barriers and take several times longer). The figures are not meaningful; the structure is the full one.
QUICK = {
    "config": "tiny",
    "overrides": ["tracking.enabled=false", "export.executorch=off"],
    "second_runs": 1,
    "attention_kl": ["--quick", "--head-dims", "32"],
    "threads": 1,
    "extra_seeds": [43],
}


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def read_json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def file_mb(path: Path) -> float | None:
    return Path(path).stat().st_size / 1e6 if Path(path).is_file() else None


# ---------------------------------------------------------------- machine


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


# ---------------------------------------------------------------- pipeline (item 6)


def fresh_runs_dir(runs_dir: Path) -> None:
    """Empty ``runs_dir`` for a fresh run; refuses a non-empty folder this script did not create."""
    if runs_dir.exists() and any(runs_dir.iterdir()) and not (runs_dir / MARKER).is_file():
        raise SystemExit(
            f"error: {runs_dir} is not empty and was not made by bench/run_all.py (no {MARKER} file); "
            "refusing to wipe it. Pass another --runs-dir."
        )
    shutil.rmtree(runs_dir, ignore_errors=True)
    runs_dir.mkdir(parents=True)
    (runs_dir / MARKER).write_text("made by bench/run_all.py; wiped at the start of every bench run\n")


THREADS: int | None = None  # torch threads in the bench's subprocesses (None: torch's default)


def pipeline_env() -> dict:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    if THREADS:
        env.update({"OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)})
    env.pop("MLFLOW_TRACKING_URI", None)  # the bench tracks into its own runs folder (sqlite), never a team server
    return env


def timed_subprocess(command: list[str], log_path: Path) -> tuple[float, int, str]:
    """Run ``command`` from the repo root; (wall seconds by perf_counter, return code, output tail)."""
    with open(log_path, "w") as fh:
        fh.write("$ " + " ".join(command) + "\n")
        fh.flush()
        start = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, env=pipeline_env(), stdout=fh, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - start
    tail = "\n".join(Path(log_path).read_text(errors="replace").splitlines()[-25:])
    return wall, result.returncode, tail


def run_pipeline_part(config: str, overrides: list[str], runs_dir: Path, logs: Path, second_runs: int) -> dict:
    from stage_rates import rates

    command = [sys.executable, "-m", "pipeline", "run", config, *overrides, "--runs-dir", str(runs_dir)]
    log(f"pipeline: fresh run of {config} ({' '.join(command[1:])}); log {logs / 'pipeline-fresh.log'}")
    wall, rc, tail = timed_subprocess(command, logs / "pipeline-fresh.log")
    if rc != 0:
        raise RuntimeError(
            f"the fresh pipeline run failed (exit {rc}); last lines of {logs / 'pipeline-fresh.log'}:\n{tail}"
        )
    log(f"pipeline: fresh run done in {wall:.1f} s")
    run_dir = runs_dir / config
    stage_rates = {}
    try:
        stage_rates = rates(run_dir)["stages"]
    except (OSError, KeyError, TypeError, ValueError):
        pass
    stages = {}
    for stage in STAGES:
        manifest = read_json(run_dir / stage / "manifest.json")
        if manifest is None:
            raise RuntimeError(f"stage {stage} has no manifest after the fresh run ({run_dir / stage})")
        stages[stage] = {
            "seconds": manifest["duration_s"],
            "summary": manifest.get("summary", {}),
            "samples_per_s": (stage_rates.get(stage) or {}).get("samples_per_s"),
        }
    second, did_nothing = [], []
    for i in range(second_runs):
        path = logs / f"pipeline-second-{i + 1}.log"
        wall2, rc2, tail2 = timed_subprocess(command, path)
        if rc2 != 0:
            raise RuntimeError(f"the second pipeline run failed (exit {rc2}); last lines of {path}:\n{tail2}")
        second.append(wall2)
        did_nothing.append("nothing to do" in path.read_text(errors="replace"))
        log(f"pipeline: second run {i + 1}/{second_runs} (nothing changed) {wall2:.1f} s")
    return {
        "command": " ".join(["python", *command[1:]]),
        "run_dir": str(run_dir),
        "fresh_wall_s": wall,
        "stages": stages,
        "stage_seconds_total": sum(s["seconds"] for s in stages.values()),
        "second_run_wall_s": spread(second),
        "second_run_raw_s": second,
        "second_run_did_no_stage_work": all(did_nothing),
    }


# ---------------------------------------------------------------- length grouping (training speed)


def grouping_part(config: str, overrides: list[str], runs_dir: Path, logs: Path) -> dict:
    """One teacher epoch with and without length-grouped batches (same seed, data, model), and the
    padding efficiency (real tokens / tokens computed) of the train split's batches either way."""
    import numpy as np

    from pipeline.config import load_config
    from pipeline.data import global_batches, padding_efficiency
    from pipeline.splits import TokenizedSplit

    rows = {}
    for grouped in (True, False):
        name = "grouped" if grouped else "ungrouped"
        command = [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            config,
            *overrides,
            "teacher.epochs=1",
            f"teacher.group_by_length={str(grouped).lower()}",
            "tracking.enabled=false",
            "--to",
            "teacher",
            "--runs-dir",
            str(runs_dir / f"grouping-{name}"),
        ]
        log(f"grouping: one teacher epoch, {name} batches")
        wall, rc, tail = timed_subprocess(command, logs / f"grouping-{name}.log")
        if rc != 0:
            raise RuntimeError(f"the {name} teacher epoch failed (exit {rc}):\n{tail}")
        run_dir = runs_dir / f"grouping-{name}" / config
        manifest, metrics = (
            read_json(run_dir / "teacher" / "manifest.json"),
            read_json(run_dir / "teacher" / "metrics.json"),
        )
        rows[name] = {
            "teacher_stage_s": manifest["duration_s"],
            "validation_accuracy": metrics["validation_accuracy"],
            "test_accuracy": metrics["test_accuracy"],
            "command": " ".join(["python", *command[1:]]),
        }
    settings = load_config(config, overrides)
    lengths = TokenizedSplit(runs_dir / "grouping-grouped" / config / "prepare", "train").lengths
    for name, grouped in (("grouped", True), ("ungrouped", False)):
        batches = global_batches(
            len(lengths), settings.teacher.batch_size, settings.seed, 0, lengths=lengths if grouped else None
        )
        rows[name]["padding_efficiency"] = padding_efficiency(batches, lengths)
    return {
        **rows,
        "speedup": rows["ungrouped"]["teacher_stage_s"] / rows["grouped"]["teacher_stage_s"],
        "train_examples": int(len(lengths)),
        "mean_tokens": float(np.mean(lengths)),
    }


# ---------------------------------------------------------------- against the int8 teacher, 3 seeds


def versus_part(config: str, overrides: list[str], run_dir: Path, runs_dir: Path, logs: Path, seeds: list[int]) -> dict:
    """The shipped student against the int8 teacher for the fresh run (its own seed) and for more distillation
    seeds (`distill.seed`: the teacher, split and cache are the fresh run's, hard-linked, so only distill,
    evaluate and export rerun)."""

    def figures(folder: Path, seed) -> dict:
        evaluate, export = (
            read_json(folder / "evaluate" / "metrics.json"),
            read_json(folder / "export" / "metrics.json"),
        )
        versus = (export or {}).get("versus_int8_teacher")
        if not versus:
            raise RuntimeError(f"{folder / 'export' / 'metrics.json'} has no int8-teacher comparison")
        return {
            "seed": seed,
            "student_accuracy": evaluate["student"]["accuracy"],
            "teacher_accuracy": evaluate["teacher"]["accuracy"],
            "shipped": versus["shipped"],
            "baseline": versus["baseline"],
            "accuracy_kept": versus["accuracy_kept"],
            "speedup_vs_int8_teacher": versus["speedup_vs_int8_teacher"],
            "size_vs_int8_teacher": versus["size_vs_int8_teacher"],
            "meets": versus["meets"],
            "distill_s": read_json(folder / "distill" / "manifest.json")["duration_s"],
        }

    rows = [figures(run_dir, "config")]
    for seed in seeds:
        target = runs_dir / f"seed-{seed}" / config
        link_upstream(run_dir, target)
        for stage in ("distill", "evaluate", "export"):
            shutil.rmtree(target / stage, ignore_errors=True)
        # the same teacher: its ONNX graph in the fresh run's runs/.cache serves this export too
        cache = target.parent / ".cache"
        if not cache.exists() and (runs_dir / ".cache").is_dir():
            cache.symlink_to((runs_dir / ".cache").resolve(), target_is_directory=True)
        command = [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            config,
            *overrides,
            f"distill.seed={seed}",
            "--runs-dir",
            str(target.parent),
        ]
        log(f"versus: distillation seed {seed} through export")
        wall, rc, tail = timed_subprocess(command, logs / f"seed-{seed}.log")
        if rc != 0:
            raise RuntimeError(f"the seed-{seed} run failed (exit {rc}):\n{tail}")
        rows.append(figures(target, seed))

    def mean(get):
        values = [get(r) for r in rows]
        values = [v for v in values if v is not None]
        return (
            {"mean": statistics.mean(values), "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}
            if values
            else None
        )

    return {
        "rows": rows,
        "targets": read_json(run_dir / "export" / "metrics.json")["versus_int8_teacher"]["targets"],
        "mean": {
            "shipped_accuracy": mean(lambda r: r["shipped"]["accuracy"]),
            "accuracy_kept": mean(lambda r: r["accuracy_kept"]),
            "speedup_L128": mean(lambda r: r["speedup_vs_int8_teacher"].get("L=128")),
            "speedup_sentences": mean(lambda r: r["speedup_vs_int8_teacher"].get("sentences")),
            "size_vs_int8_teacher": mean(lambda r: r["size_vs_int8_teacher"]),
        },
    }


# ---------------------------------------------------------------- quality (item 1)


def ablation_part(config: str) -> dict:
    """The committed ablation (losses, depth, tuning), each variant marked when it equals the current default."""
    from ablation import VARIANTS, markdown

    data = read_json(ABLATION_FILE)
    if data is None or "results" not in data:
        raise RuntimeError(f"{ABLATION_FILE} is missing or unreadable")
    results, header = data["results"], data["header"]
    current = default_variant(config, VARIANTS, list(results))
    results = {name: r for name, r in results.items() if name in VARIANTS}  # a variant since renamed is left out
    rows = [
        {
            "variant": name,
            "description": VARIANTS[name][1],
            "table": VARIANTS[name][0],
            **r,
            "current_default": name == current,
        }
        for name, r in results.items()
    ]
    teacher = next(iter(results.values()), {})
    tables = markdown(results, header).split("\n## ", 1)[1]  # the tables, without the title block
    return {
        "source": str(ABLATION_FILE.relative_to(ROOT)),
        "measured_on": header["machine"],
        "config": header["config"],
        "command": header["command"],
        "date": header["date"],
        "header": header,
        "rows": rows,
        "current_default_variant": current,
        "markdown": "### " + tables.replace("\n## ", "\n### "),
        "teacher": {"accuracy": teacher.get("teacher_accuracy"), "macro_f1": teacher.get("teacher_macro_f1")},
    }


def scale_part() -> dict:
    """The committed scale benchmark (bench/scale.py: the corpus enlarged to 10k / 100k / 1M examples)."""
    data = read_json(SCALE_FILE)
    markdown = SCALE_FILE.with_suffix(".md")
    if data is None or "results" not in data or not markdown.is_file():
        raise RuntimeError(f"{SCALE_FILE} (or scale.md) is missing or unreadable; run python bench/scale.py")
    body = markdown.read_text().split("\n", 1)[1].lstrip("\n")  # without its title
    return {
        "source": str(SCALE_FILE.relative_to(ROOT)),
        "command": data["command"],
        "date": data["date"],
        "machine": data["machine"],
        "verdict": data["verdict"],
        "markdown": body.replace("](scale.png)", "](bench/results/scale.png)"),
    }


def default_variant(config: str, variants: dict, names: list[str]) -> str | None:
    """The ablation variant whose distill / student settings equal the current config's (if any)."""
    try:
        from pipeline.config import load_config

        base = load_config("bert_small")
        key = lambda c: (c.distill.model_dump_json(), c.student.model_dump_json())  # noqa: E731 (a one-line sort key)
        for name in names:
            if name in variants and key(load_config("bert_small", variants[name][2])) == key(base):
                return name
    except Exception:
        return None
    return None


def run_quality_part(run_dir: Path) -> dict:
    evaluate = read_json(run_dir / "evaluate" / "metrics.json")
    if evaluate is None:
        raise RuntimeError(f"no evaluate/metrics.json in {run_dir}")
    export = read_json(run_dir / "export" / "metrics.json") or {}
    rows = []
    for who, label in (("teacher", "teacher (PyTorch)"), ("student", "distilled student (PyTorch)")):
        m = evaluate[who]
        rows.append(
            {
                "model": label,
                "accuracy": m["accuracy"],
                "macro_f1": m["macro_f1"],
                "parameters": m.get("parameters"),
                "layers": m.get("layers"),
            }
        )
    for key, label in (("onnx_fp32", "distilled student, ONNX fp32"), ("onnx_int8", "distilled student, ONNX int8")):
        if key in export:
            rows.append(
                {
                    "model": label,
                    "accuracy": export[key]["accuracy"],
                    "macro_f1": export[key]["macro_f1"],
                    "parameters": export[key].get("parameters"),
                    "layers": evaluate["student"].get("layers"),
                }
            )
    return {
        "split": evaluate.get("split", "test"),
        "examples": evaluate.get("examples"),
        "rows": rows,
        "retention": evaluate.get("retention"),
        "agreement": evaluate.get("agreement"),
        "majority_class_accuracy": evaluate.get("majority_class_accuracy"),
        "recommended_variant": export.get("recommended"),
    }


# ---------------------------------------------------------------- inference (item 2)


def inference_part(run_dir: Path) -> dict:
    bundle = run_dir / "export" / "bundle"
    latency = read_json(bundle / "latency.json")
    if latency is None:
        return {"available": False, "why": f"{bundle / 'latency.json'} is missing (export stage not run or failed)"}
    sizes = {  # what each model is as a file; the export stage does not keep the teacher's ONNX graph
        "teacher PyTorch fp32": file_mb(run_dir / "teacher" / "model" / "model.safetensors"),
        "student PyTorch fp32": file_mb(run_dir / "distill" / "student" / "model.safetensors"),
        "student ONNX fp32": file_mb(bundle / "model.onnx"),
        "student ONNX int8": file_mb(bundle / "model.int8.onnx"),
        "teacher ONNX fp32": None,
        "teacher ONNX int8": ((read_json(run_dir / "export" / "metrics.json") or {}).get("versus_int8_teacher") or {})
        .get("baseline", {})
        .get("file_mb"),
    }
    size_source = {
        "teacher PyTorch fp32": "teacher/model/model.safetensors",
        "student PyTorch fp32": "distill/student/model.safetensors",
        "student ONNX fp32": "export/bundle/model.onnx",
        "student ONNX int8": "export/bundle/model.int8.onnx",
        "teacher ONNX int8": "export/metrics.json (measured, not kept)",
    }
    rows = []
    for r in latency.get("rows", []):
        row = {
            k: r.get(k)
            for k in (
                "model",
                "runtime",
                "batch",
                "input",
                "length",
                "threads",
                "min_ms",
                "median_ms",
                "max_ms",
                "runs",
                "warmup",
                "speedup_vs_teacher_int8",
                "speedup_vs_teacher_pytorch",
            )
        }
        for key in ("file_mb", "size_mb"):  # a size recorded by the export stage wins over the file lookup
            if r.get(key) is not None:
                sizes[r["model"]] = r[key]
                size_source[r["model"]] = "latency.json"
        rows.append(row)
    order = {m: i for i, m in enumerate(LATENCY_MODELS)}
    inputs = list(dict.fromkeys(r["input"] for r in rows))  # in measuring order: L=32, L=128, sentences
    rows.sort(key=lambda r: (inputs.index(r["input"]), r["threads"], order.get(r["model"], 99), r["model"]))
    ref_size = sizes.get(REFERENCE)
    size_rows = [
        {
            "model": m,
            "file_mb": sizes.get(m),
            "source": size_source.get(m),
            "size_vs_teacher_pytorch": (sizes[m] / ref_size) if sizes.get(m) and ref_size else None,
        }
        for m in LATENCY_MODELS
        if any(r["model"] == m for r in rows) or sizes.get(m)
    ]
    extra = {k: v for k, v in latency.items() if k not in ("rows",)}
    return {"available": True, "source": str(bundle / "latency.json"), "rows": rows, "sizes": size_rows, "meta": extra}


# ---------------------------------------------------------------- attention KL (item 5)


def attention_kl_part(out: Path, extra_args: list[str], logs: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(BENCH / "attention_kl.py"), *extra_args, "--out", str(out)]
    log(f"attention KL: {' '.join(command[1:])}; log {logs / 'attention_kl.log'}")
    wall, rc, tail = timed_subprocess(command, logs / "attention_kl.log")
    if rc != 0:
        raise RuntimeError(f"bench/attention_kl.py failed (exit {rc}):\n{tail}")
    data = read_json(out / "attention_kl.json")
    md = (out / "attention_kl.md").read_text()
    log(f"attention KL: done in {wall:.1f} s")
    return {
        "wall_s": wall,
        "files": [str(out / "attention_kl.json"), str(out / "attention_kl.md")],
        "meta": data["meta"],
        "results": data["results"],
        "markdown": md,
    }


# ---------------------------------------------------------------- markdown (bench/report.py)


def render(report: dict) -> str:
    """This run alone as a document (bench/report.py renders it with every committed result)."""
    return report_module.standalone_bench(report)


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="tiny config, minimal repeats (smoke test, about a minute)"
    )
    parser.add_argument("--config", help="config to benchmark (default bert_small; --quick: tiny)")
    parser.add_argument(
        "--runs-dir",
        type=Path,
        help="runs folder for the bench's pipeline run (wiped first; "
        "default runs/bench, --quick: runs/bench-quick/runs)",
    )
    parser.add_argument(
        "--precision",
        choices=["auto", "config", "bf16", "fp32"],
        default="auto",
        help="auto (default): the config's precision, except fp32 where bf16 is not native (CPUs "
        "without AVX512-BF16/AMX run bf16 emulated, many times slower); config: always the config's",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides for the pipeline run and the micro-benchmarks",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        help="write BENCHMARKS.md, bench.json and attention_kl.* here instead "
        "of the repo root / bench/results (default with --quick: runs/bench-quick)",
    )
    args = parser.parse_args(argv)
    global THREADS
    started = time.perf_counter()
    preset = QUICK if args.quick else FULL
    THREADS = preset["threads"]
    config = args.config or preset["config"]
    if args.out_dir is None and args.quick:
        args.out_dir = ROOT / "runs" / "bench-quick"
    if args.out_dir is not None:
        md_path, json_path, akl_out = args.out_dir / "BENCHMARKS.md", args.out_dir / "bench.json", args.out_dir
    else:
        md_path, json_path, akl_out = ROOT / "BENCHMARKS.md", BENCH / "results" / "bench.json", BENCH / "results"
    import micro

    from pipeline.config import load_config
    from pipeline.errors import PipelineError

    try:
        base = load_config(config, [*preset["overrides"], *args.overrides])
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    runs_dir = (args.runs_dir or ((args.out_dir / "runs") if args.quick else ROOT / "runs" / "bench")).resolve()
    fresh_runs_dir(runs_dir)
    logs = runs_dir / "logs"
    logs.mkdir()
    os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    log(
        "quick bench (tiny config, about a minute)"
        if args.quick
        else f"full bench of {config}: expect about 15-20 minutes on 2 quiet cores (pipeline run ~8, length-grouping check ~4, attention KL ~2, "
        "micro-benchmarks ~2, second runs ~1)"
    )

    command = " ".join(["python bench/run_all.py", *(sys.argv[1:] if argv is None else argv)])
    report = {
        "schema": 1,
        "command": command,
        "quick": args.quick,
        "config": config,
        "root": str(ROOT),
        "torch_threads": preset["threads"] or "torch default (one per core)",
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "load_average": {"start": load_average()},
        "runs_dir": str(runs_dir),
        "seed": base.seed,
        "files": {
            "markdown": str(md_path),
            "json": str(json_path),
            "json_rel": report_module.display_path(json_path),
            "logs": str(logs),
        },
        "sections": {},
        "errors": [],
    }
    precision = micro.resolve_precision(base.precision, args.precision)
    overrides = [*preset["overrides"], *args.overrides]
    if precision["used"] != precision["configured"]:
        overrides.append(f"precision={precision['used']}")
        log(f"precision {precision['used']} instead of the configured {precision['configured']}: {precision['why']}")
    report["precision"] = precision
    report["pipeline_overrides"] = overrides
    sections, errors = report["sections"], report["errors"]

    def part(name: str, fn):
        try:
            sections[name] = fn()
        except BaseException as exc:  # noqa: BLE001 - one failed part must not lose the others
            if isinstance(exc, KeyboardInterrupt):
                raise
            errors.append({"part": name, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
            log(f"{name}: FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")

    part("pipeline", lambda: run_pipeline_part(config, overrides, runs_dir, logs, preset["second_runs"]))
    run_dir = runs_dir / config
    if run_dir.is_dir():  # also after a failed run: report what its completed stages wrote
        part("quality_run", lambda: run_quality_part(run_dir))
        part("inference", lambda: inference_part(run_dir))
        capture = read_json(run_dir / "capture" / "capture.json")
        if capture is not None:
            sections["capture_run"] = capture
        part("versus", lambda: versus_part(config, overrides, run_dir, runs_dir, logs, preset["extra_seeds"]))
    part("ablation", lambda: ablation_part(config))
    part("scale", scale_part)
    part("grouping", lambda: grouping_part(config, overrides, runs_dir, logs))

    def micro_part():
        log(f"micro: training-cost and capture micro-benchmarks ({'quick, ' if args.quick else ''}config {config})")
        t0 = time.perf_counter()
        result = micro.run(
            config, quick=args.quick, work_dir=runs_dir, overrides=overrides, threads=preset["threads"], log=log
        )
        result["wall_s"] = time.perf_counter() - t0
        return result

    part("micro", micro_part)
    part("attention_kl", lambda: attention_kl_part(akl_out, preset["attention_kl"], logs))

    report["load_average"]["end"] = load_average()
    report["bench_wall_s"] = time.perf_counter() - started
    md_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    try:  # BENCHMARKS.md: this run beside every other results file of its folder (bench/report.py)
        report_module.write(json_path.parent, md_path)
    except report_module.ReportError as exc:
        errors.append({"part": "report", "error": f"ReportError: {exc}", "traceback": ""})
        log(f"report: FAILED: {exc}; {md_path} holds this run alone")
        md_path.write_text(render(report))
    log(
        f"wrote {md_path} and {json_path} in {report['bench_wall_s'] / 60:.1f} min"
        + (f"; FAILED parts: {', '.join(e['part'] for e in errors)}" if errors else "")
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
