"""Data at scale: how time and peak memory of the pipeline grow with the number of examples (issue 19).

    python bench/scale.py                        # 10k, 100k and 1M examples (about 40 minutes on 2 cores)
    python bench/scale.py --sizes 2000 5000 --steps 3 --out-dir /tmp/scale   # a quick smoke run

The packaged Rotten Tomatoes corpus (12.8k labelled sentences from 508 movies) is enlarged to each size by
repeating it with variations (copy c > 0 of a sentence drops one word and swaps two neighbouring words, both
at seeded random places, so the copies are not exact duplicates that prepare would drop) and written as a
local CSV with the movie as group column (every variant of a sentence stays in the split of its movie).
At each size, each stage runs in its own process (``python -m pipeline run <config> --only <stage>``) and
the bench records its wall time (the manifest's ``duration_s``: the stage's own work, without interpreter
start-up) and its peak resident memory (``ru_maxrss`` of that process, from ``os.wait4``):

- prepare   in full: read, clean, split, tokenize (max_length 64, the MiniLM WordPiece tokenizer);
- teacher   in full with a tiny random teacher and no fine-tuning: loading the splits and predicting
            validation and test (the stage's reading and batching at this size);
- capture   in full with the same tiny random teacher (hidden 32, 2 layers): what the pipeline itself costs
            per example (reading, batching, cache records, shard writing and checksums), not the teacher's
            arithmetic; the real MiniLM teacher over a million sentences would take hours on 2 cores;
- teacher step / distill step: one timed slice of optimizer steps on batches read from this size's data
  (a fresh process each): the real MiniLM-L6 teacher fine-tuning step (cross-entropy, batch 32), and the
  distillation step of the tiny config's student with targets from this size's teacher cache. Each step's
  time includes building the batch from the memory-mapped data (and the cache lookup). The distill slice
  also runs the same steps on the smallest size's data and cache, interleaved in the same process: the
  ratio of the two is the data-size effect, free of the machine's load changing between processes.

Goal (issue 19): every stage's peak resident memory <= 3 GB at 1M examples, prepare and capture time per
example within 1.2x of the 10k figure, distillation step time independent of the data size (here: within
1.2x of the smallest size's). Outputs: bench/results/scale.json, scale.md, scale.png (or --out-dir).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH, ROOT  # (also puts the repository on the path)

SIZES = (10_000, 100_000, 1_000_000)
SEED = 19
MAX_LENGTH = 64
RSS_GOAL_GB = 3.0
RATIO_GOAL = 1.2
STAGES = ("prepare", "teacher", "capture")
SLICES = ("teacher_step", "distill_step")
WHAT = {
    "prepare": "prepare (in full)",
    "teacher": "teacher stage (tiny random teacher, no fine-tuning: validation + test predictions)",
    "capture": "capture (in full, tiny random teacher)",
    "teacher_step": "teacher fine-tuning step (real MiniLM-L6, batch 32)",
    "distill_step": "distillation step (tiny student, cached targets, batch 16)",
}


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- data


def base_corpus():
    """The packaged corpus's labelled sentences: text, label (fresh / rotten), movie."""
    import pandas as pd

    from pipeline.data import rotten_tomatoes_path

    raw = pd.read_csv(rotten_tomatoes_path(), keep_default_na=False, dtype=str)
    raw = raw[raw["category"] != "plot"]
    return pd.DataFrame(
        {"text": raw["text"].to_numpy(), "label": raw["category"].to_numpy(), "movie": raw["movie_name"].to_numpy()}
    )


def variant(words: list[str], rng) -> str:
    """One variation of a sentence: a word dropped and two neighbours swapped, at seeded random places."""
    words = list(words)
    if len(words) > 3:
        del words[int(rng.integers(len(words)))]
    if len(words) > 2:
        i = int(rng.integers(len(words) - 1))
        words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words)


def write_corpus(path: Path, size: int) -> None:
    """``size`` rows: the corpus, then copies with variations, written in chunks to a CSV (temp file + rename)."""
    import numpy as np
    import pandas as pd

    base = base_corpus()
    words = [t.split() for t in base["text"]]
    tmp = path.with_suffix(".csv.tmp")
    written = 0
    with open(tmp, "w", encoding="utf-8", newline="") as fh:
        for copy in range(-(-size // len(base))):
            take = min(len(base), size - written)
            rng = np.random.default_rng([SEED, copy])
            texts = base["text"][:take] if copy == 0 else [variant(w, rng) for w in words[:take]]
            chunk = pd.DataFrame({"text": texts, "label": base["label"][:take], "movie": base["movie"][:take]})
            chunk.to_csv(fh, header=copy == 0, index=False)
            written += take
    os.replace(tmp, path)


def write_config(path: Path, csv: Path) -> None:
    """The tiny config on this CSV: the whole data set, max_length 64, no fine-tuning, no MLflow."""
    import yaml

    config = {
        "extends": "tiny",
        "description": f"bench/scale.py: tiny random teacher on {csv.name}",
        "data": {
            "source": "csv",
            "path": str(csv),
            "text_column": "text",
            "label_column": "label",
            "group_column": "movie",
            "max_examples": None,
            "max_length": MAX_LENGTH,
            "validation_fraction": 0.1,
            "test_fraction": 0.2,
        },
        "teacher": {"epochs": 0},
        "capture": {"shard_size": 2048, "max_cache_gb": 40.0},
        "tracking": {"enabled": False},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


# ---------------------------------------------------------------- measuring


THREADS = 1  # torch threads per process: on a shared 2-core machine two threads spin at barriers (several times slower)


def env() -> dict:
    out = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": str(THREADS),
        "MKL_NUM_THREADS": str(THREADS),
    }
    out.pop("MLFLOW_TRACKING_URI", None)
    return out


def measured(command: list[str], log_path: Path) -> dict:
    """Run ``command`` in its own process: wall seconds and that process's peak resident memory (GB)."""
    with open(log_path, "w") as fh:
        fh.write("$ " + " ".join(command) + "\n")
        fh.flush()
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, env=env(), stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"{' '.join(command[:6])} ... failed (exit {process.returncode}); log {log_path}:\n{tail}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,  # ru_maxrss is in KiB on Linux
        "load_average_after": os.getloadavg()[0],
    }


def stage_examples(run_dir: Path, stage: str) -> int:
    """Examples a stage processes: prepare every row read, teacher validation + test, capture the train split."""
    stats = json.loads((run_dir / "prepare" / "stats.json").read_text())
    splits = stats["splits"]
    return {
        "prepare": stats["rows"]["rows_read"],
        "teacher": splits["validation"]["examples"] + splits["test"]["examples"],
        "capture": splits["train"]["examples"],
    }[stage]


def measure_size(size: int, work: Path, steps: int, baseline: Path | None = None) -> dict:
    """Every row of the table for one data size; ``baseline``: the smallest size's run folder (its cache kept)."""
    folder = work / f"n{size}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    csv, config = folder / "data.csv", folder / "scale.yaml"
    started = time.perf_counter()
    write_corpus(csv, size)
    write_config(config, csv)
    log(f"{size} examples: corpus written in {time.perf_counter() - started:.0f} s ({csv.stat().st_size / 1e6:.0f} MB)")
    runs = folder / "runs"
    run_dir = runs / config.stem
    result = {"size": size, "stages": {}}
    for stage in STAGES:
        command = [sys.executable, "-m", "pipeline", "run", str(config), "--only", stage, "--runs-dir", str(runs)]
        figures = measured(command, folder / f"{stage}.log")
        manifest = json.loads((run_dir / stage / "manifest.json").read_text())
        examples = stage_examples(run_dir, stage)
        figures.update(
            seconds=manifest["duration_s"],
            examples=examples,
            us_per_example=1e6 * manifest["duration_s"] / examples,
            cpu_us_per_example=1e6 * figures["cpu_s"] / examples,
            summary=manifest["summary"],
        )
        result["stages"][stage] = figures
        log(
            f"{size} examples: {stage} {figures['seconds']:.1f} s ({figures['us_per_example']:.0f} us/example; CPU "
            f"{figures['cpu_s']:.1f} s, {figures['cpu_us_per_example']:.0f} us/example), peak RSS {figures['peak_rss_gb']:.2f} GB"
        )
    result["prepared_examples"] = stage_examples(run_dir, "prepare")
    result["train_examples"] = stage_examples(run_dir, "capture")
    for kind in SLICES:
        out = folder / f"{kind}.json"
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--slice",
            kind,
            "--run-dir",
            str(run_dir),
            "--config",
            str(config),
            "--steps",
            str(steps if kind == "teacher_step" else 3 * steps),
            "--slice-out",
            str(out),
            *(["--baseline", str(baseline)] if baseline is not None else []),
        ]
        figures = measured(command, folder / f"{kind}.log")
        figures.update(json.loads(out.read_text()))
        result["stages"][kind] = figures
        log(
            f"{size} examples: {kind} {figures['ms_per_step']:.1f} ms/step (median of {figures['steps']}), "
            f"peak RSS {figures['peak_rss_gb']:.2f} GB"
        )
    cache = run_dir / "capture" / "cache"
    result["cache_gb"] = sum(p.stat().st_size for p in cache.glob("shard-*.bin")) / 1e9
    result["run_dir"] = str(run_dir)
    if baseline is not None:
        shutil.rmtree(cache, ignore_errors=True)  # gigabytes at 1M: measured, then dropped (the smallest is kept)
    csv.unlink()
    return result


def time_slice(kind: str, run_dir: Path, config_path: Path, steps: int, baseline: Path | None = None) -> dict:
    """Wall time of ``steps`` optimizer steps (after 2 warm-up steps), each building its batch from the data.

    distill_step with ``baseline`` (the smallest size's run folder): the same steps also read from that run's
    data and cache, interleaved step by step in this process, so the ratio of the two compares data sizes
    under the same load (a shared machine's load moves between separate processes); ``read_ms`` is the part
    of a step that touches the data: building the batch and looking up its cached targets.
    """
    import numpy as np
    import torch

    sys.path.insert(0, str(BENCH))
    from micro import step_function

    from pipeline.cache import TeacherCache
    from pipeline.config import load_config
    from pipeline.data import global_batches
    from pipeline.models import (
        build_student,
        build_teacher_for_finetune,
        load_classifier,
        load_tokenizer,
        tokenizer_reference,
    )
    from pipeline.objective import target_plan
    from pipeline.runner import Distributed
    from pipeline.splits import TrainingData, label_names, pad_id

    config = load_config(str(config_path))
    started = time.perf_counter()
    folders = {"this": run_dir, **({"baseline": baseline} if baseline is not None and kind == "distill_step" else {})}
    setups = {}
    for name, folder in folders.items():
        data = TrainingData(folder / "prepare", folder / "capture")
        setup = {"data": data, "pad": pad_id(folder / "prepare"), "cache": None}
        if kind == "teacher_step":  # the real teacher: MiniLM-L6 as bert_small fine-tunes it
            real = load_config("bert_small", ["precision=fp32"])
            dist = Distributed(real)
            tokenizer = load_tokenizer(tokenizer_reference(real))
            model = build_teacher_for_finetune(real, label_names(folder / "prepare"), len(tokenizer))
            setup["step"] = step_function("plain", model, None, None, None, real, dist, len(data))
            batch_size = real.teacher.batch_size
        else:
            dist = Distributed(config)
            torch.manual_seed(0)
            teacher = load_classifier(str(folder / "teacher" / "model")).eval()
            plan = target_plan(config, teacher.config)
            setup["cache"] = TeacherCache(folder / "capture" / "cache")
            setup["step"] = step_function(
                "cached", build_student(config, teacher), teacher, plan, setup["cache"], config, dist, len(data)
            )
            batch_size = config.distill.batch_size
        # the first batch holds the longest example (fit puts it first): skipped, the next ones are typical
        setup["batches"] = global_batches(len(data), batch_size, config.seed, 0, lengths=data.lengths)[1 : steps + 3]
        setups[name] = setup
    ready_s = time.perf_counter() - started
    times = {name: {"step": [], "read": []} for name in setups}
    for i in range(len(setups["this"]["batches"])):
        for name, setup in list(setups.items()) if i % 2 == 0 else list(setups.items())[::-1]:
            indices = setup["batches"][i]
            torch.manual_seed(i)
            start = time.perf_counter()
            batch = setup["data"].batch(indices, setup["pad"], dist.device)
            if setup["cache"] is not None:
                setup["cache"].batch(indices, batch["input_ids"].shape[1], dist.device)
            read = time.perf_counter() - start
            start = time.perf_counter()
            setup["step"](setup["data"].batch(indices, setup["pad"], dist.device))
            times[name]["step"].append(time.perf_counter() - start)
            times[name]["read"].append(read)
    this = {k: v[2:] for k, v in times["this"].items()}
    out = {
        "steps": len(this["step"]),
        "batch_size": batch_size,
        "ms_per_step": 1e3 * statistics.median(this["step"]),
        "ms_per_step_min": 1e3 * min(this["step"]),
        "ms_per_step_max": 1e3 * max(this["step"]),
        "read_ms": 1e3 * statistics.median(this["read"]),
        "us_per_example": 1e6 * statistics.median(this["step"]) / batch_size,
        "setup_s": ready_s,
        "mean_tokens": float(np.mean(setups["this"]["data"].lengths)),
    }
    if "baseline" in times:
        base = {k: v[2:] for k, v in times["baseline"].items()}
        out["vs_baseline"] = {
            "baseline_examples": len(setups["baseline"]["data"]),
            "baseline_ms_per_step": 1e3 * statistics.median(base["step"]),
            "baseline_read_ms": 1e3 * statistics.median(base["read"]),
            "step_ratio": statistics.median(this["step"]) / statistics.median(base["step"]),
            "read_ratio": statistics.median(this["read"]) / statistics.median(base["read"]),
        }
    return out


# ---------------------------------------------------------------- report


def marginal(results: list[dict], stage: str) -> list[float]:
    """CPU microseconds per extra example between consecutive sizes (start-up and fixed costs cancel out)."""
    return [
        1e6
        * (b["stages"][stage]["cpu_s"] - a["stages"][stage]["cpu_s"])
        / (b["stages"][stage]["examples"] - a["stages"][stage]["examples"])
        for a, b in zip(results, results[1:])
    ]


def verdict(results: list[dict]) -> dict:
    """The issue's goal, checked on the largest size against the smallest.

    Time per example is the process's CPU time (user + system) per example: on a shared machine wall time
    moves with the other jobs' load, CPU time much less. It includes start-up, which flatters the large sizes,
    so the cost must also be linear: the CPU cost of the last extra examples within the factor of the first.
    """
    first, last = results[0], results[-1]
    rss = {stage: last["stages"][stage]["peak_rss_gb"] for stage in (*STAGES, *SLICES)}
    ratios = {
        stage: last["stages"][stage]["cpu_us_per_example"] / first["stages"][stage]["cpu_us_per_example"]
        for stage in ("prepare", "capture")
    }
    linear = {
        stage: (m[-1] / m[0] if len(m) > 1 else None, m)
        for stage in ("prepare", "capture")
        for m in [marginal(results, stage)]
    }
    ratios["distill_step"] = (
        last["stages"]["distill_step"]["vs_baseline"]["step_ratio"]  # interleaved, same process
        if "vs_baseline" in last["stages"]["distill_step"]
        else 1.0
    )
    misses = [f"{stage} peak RSS {gb:.2f} GB > {RSS_GOAL_GB} GB" for stage, gb in rss.items() if gb > RSS_GOAL_GB]
    misses += [
        f"{stage} {ratio:.2f}x the {first['size']:,}-example figure (goal <= {RATIO_GOAL}x)"
        for stage, ratio in ratios.items()
        if ratio > RATIO_GOAL
    ]
    misses += [
        f"{stage}: the last extra examples cost {ratio:.2f}x the first per example (goal <= {RATIO_GOAL}x)"
        for stage, (ratio, _) in linear.items()
        if ratio is not None and ratio > RATIO_GOAL
    ]
    return {
        "largest": last["size"],
        "smallest": first["size"],
        "peak_rss_gb": rss,
        "ratio_to_smallest": ratios,
        "marginal_cpu_us_per_example": {stage: m for stage, (_, m) in linear.items()},
        "marginal_ratio": {stage: r for stage, (r, _) in linear.items()},
        "met": not misses,
        "misses": misses,
    }


def markdown(report: dict) -> str:
    results = report["results"]
    sizes = [r["size"] for r in results]
    lines = [
        "# Data at scale (`bench/scale.py`)",
        "",
        f"Command: `{report['command']}`  ",
        f"Date: {report['date']}  ",
        f"Machine: {report['machine']}",
        "",
        "One torch thread per process. 1-minute load average after each stage is in scale.json "
        "(`load_average_after`): this machine is shared, so single timings move with its load.",
        "",
        "The packaged Rotten Tomatoes sentences enlarged with word-drop / word-swap variants, max_length "
        f"{MAX_LENGTH}; each stage in its own process. Time: the stage manifest's wall duration and the process's "
        "CPU time (user + system, start-up included) per example (prepare: rows read; teacher: validation + "
        "test; capture: train), or the median step (slices, each step building its batch from the memory-mapped "
        "data); peak "
        "RSS: `ru_maxrss` of that process. The teacher stage and capture use a tiny random teacher (hidden 32, "
        "2 layers): they measure the pipeline's own cost (reading, batching, cache writing), not MiniLM's "
        "arithmetic; the real MiniLM-L6 teacher is timed in the teacher step slice only.",
        "",
        "| stage | " + " | ".join(f"{n:,} examples" for n in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for stage in (*STAGES, *SLICES):
        cells = []
        for r in results:
            s = r["stages"][stage]
            time_cell = (
                f"{s['ms_per_step']:.1f} ms/step"
                if stage in SLICES
                else f"{s['seconds']:.1f} s, CPU {s['cpu_us_per_example']:.0f} us/ex"
            )
            cells.append(f"{time_cell}; {s['peak_rss_gb']:.2f} GB")
        lines.append(f"| {WHAT[stage]} | " + " | ".join(cells) + " |")
    lines.append(
        "| distill step: data reading (batch + cached targets) | "
        + " | ".join(f"{r['stages']['distill_step']['read_ms']:.1f} ms/step" for r in results)
        + " |"
    )
    lines.append(
        f"| distill step vs the same steps on the {sizes[0]:,}-example data, interleaved in one process | "
        + " | ".join(
            f"{r['stages']['distill_step']['vs_baseline']['step_ratio']:.2f}x (reading "
            f"{r['stages']['distill_step']['vs_baseline']['read_ratio']:.2f}x)"
            if "vs_baseline" in r["stages"]["distill_step"]
            else "1 (the reference)"
            for r in results
        )
        + " |"
    )
    lines.append(
        "| examples after cleaning (train) | "
        + " | ".join(f"{r['prepared_examples']:,} read, {r['train_examples']:,} train" for r in results)
        + " |"
    )
    lines.append("| teacher cache on disk | " + " | ".join(f"{r['cache_gb']:.2f} GB" for r in results) + " |")
    v = report["verdict"]
    lines += [
        "",
        f"Goal at {v['largest']:,} examples: every peak RSS <= {RSS_GOAL_GB} GB; prepare and capture time "
        f"per example, and the distillation step time, within {RATIO_GOAL}x of the {v['smallest']:,}-example "
        "figure. The step-time check compares steps on both data sets interleaved in one process (same "
        "student, same load); the per-size step times above come from separate processes and move with the "
        "machine's load.",
        "",
        "| check | figure | met |",
        "|---|---:|---|",
    ]
    for stage, gb in v["peak_rss_gb"].items():
        lines.append(f"| {stage} peak RSS | {gb:.2f} GB | {'yes' if gb <= RSS_GOAL_GB else 'NO'} |")
    for stage, ratio in v["ratio_to_smallest"].items():
        what = "step time" if stage in SLICES else "CPU time per example"
        lines.append(
            f"| {stage} {what} vs {v['smallest']:,} examples | {ratio:.2f}x | {'yes' if ratio <= RATIO_GOAL else 'NO'} |"
        )
    for stage, ratio in v["marginal_ratio"].items():
        if ratio is not None:
            steps = ", ".join(f"{m:.0f}" for m in v["marginal_cpu_us_per_example"][stage])
            lines.append(
                f"| {stage} linear: CPU us per extra example between sizes ({steps}), last / first | {ratio:.2f}x | "
                f"{'yes' if ratio <= RATIO_GOAL else 'NO'} |"
            )
    lines += [
        "",
        "**Goal met.**" if v["met"] else "**Missed:** " + "; ".join(v["misses"]) + ".",
        "",
        "![time and memory against data size](scale.png)",
        "",
    ]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    sizes = [r["size"] for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for stage in (*STAGES, *SLICES):
        axes[0].plot(sizes, [r["stages"][stage]["peak_rss_gb"] for r in results], marker="o", label=stage)
    axes[0].axhline(RSS_GOAL_GB, color="grey", linestyle="--", label=f"goal {RSS_GOAL_GB} GB")
    axes[0].set(title="peak resident memory per process", ylabel="GB")
    for stage in STAGES:
        axes[1].plot(sizes, [r["stages"][stage]["cpu_us_per_example"] for r in results], marker="o", label=stage)
    axes[1].set(title="stage CPU time per example (tiny teacher)", ylabel="CPU microseconds per example")
    for stage in SLICES:
        axes[2].plot(sizes, [r["stages"][stage]["ms_per_step"] for r in results], marker="o", label=WHAT[stage])
    axes[2].set(
        title="step time, separate processes (moves with load;\nsame-process comparison in scale.md)",
        ylabel="ms per step",
        yscale="log",
    )
    for ax in axes:
        ax.set(xscale="log", xlabel="examples in the data set")
        ax.set_ylim(bottom=0 if ax.get_yscale() == "linear" else None)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").is_file()
        else platform.processor()
    )
    return f"{model}, {cores} cores, {memory:.0f} GiB RAM, Python {platform.python_version()}"


def write_report(report: dict, out_dir: Path) -> None:
    report["verdict"] = verdict(report["results"])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("scale.json", json.dumps(report, indent=2) + "\n"), ("scale.md", markdown(report))):
        tmp = out_dir / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, out_dir / name)
    plot(report, out_dir / "scale.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="data sizes (examples), ascending")
    parser.add_argument("--steps", type=int, default=6, help="timed teacher steps per slice (distill: 3x as many)")
    parser.add_argument("--out-dir", type=Path, default=BENCH / "results", help="where scale.{json,md,png} go")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "bench-scale", help="data and runs (wiped)")
    parser.add_argument("--slice", choices=SLICES, help=argparse.SUPPRESS)  # internal: one timed slice
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--slice-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--baseline", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.slice:
        figures = time_slice(args.slice, args.run_dir, args.config, args.steps, args.baseline)
        args.slice_out.write_text(json.dumps(figures))
        return 0
    if sorted(args.sizes) != args.sizes or len(args.sizes) < 2 or min(args.sizes) < 500:
        parser.error(f"--sizes {args.sizes}: give at least two ascending sizes of 500 examples or more")
    import datetime as dt

    shutil.rmtree(args.work_dir, ignore_errors=True)
    args.work_dir.mkdir(parents=True)
    command = " ".join(["python bench/scale.py", *(sys.argv[1:] if argv is None else argv)])
    report = {
        "command": command,
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(),
        "torch_threads": THREADS,
        "seed": SEED,
        "max_length": MAX_LENGTH,
        "what": WHAT,
        "results": [],
    }
    for size in args.sizes:
        baseline = Path(report["results"][0]["run_dir"]) if report["results"] else None
        report["results"].append(measure_size(size, args.work_dir, args.steps, baseline))
        if len(report["results"]) > 1:  # written after every size: a long run that stops keeps what it measured
            write_report(report, args.out_dir)
    log(
        f"wrote {args.out_dir / 'scale.md'}, scale.json, scale.png; goal {'met' if report['verdict']['met'] else 'MISSED: ' + '; '.join(report['verdict']['misses'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
