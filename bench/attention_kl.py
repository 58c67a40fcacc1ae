"""Time and peak memory of forward+backward: chunked vs naive attention KL.

    python bench/attention_kl.py [--quick] [--out DIR] [--chunk-size 128] [--repeats 5] [--threads 1] [--head-dims 32 64]

Cases: N = 128, 512, 2048; 12 heads; head dim 32 and 64; batch 1; CPU.
"naive" is ``relation_kl(..., chunk_size=None)`` (all rows at once, the full
[B,H,N,N] score matrices live through backward); "chunked" is the same loss
with ``chunk_size`` query rows per checkpointed chunk.

Peak memory is read from the kernel, each case in a fresh subprocess: after
imports, input creation and a tiny warm-up (lazy one-time allocations), the
child resets the peak-RSS counter (write "5" to /proc/self/clear_refs), reads
VmRSS as the baseline, runs one forward+backward and reports VmHWM - baseline
(fallback where clear_refs is unavailable: ru_maxrss delta, a lower bound).

Two figures per case, from two subprocesses:
- live peak: run with MALLOC_MMAP_THRESHOLD_=65536, so glibc serves every
  tensor >= 64 KiB by its own mmap and unmaps it on free: RSS tracks the live
  tensor bytes. This is the algorithm's footprint (the 1/8 target).
- default-glibc RSS peak: the same run with the default allocator, as a plain
  process shows it. glibc keeps freed heap blocks below its dynamic mmap
  threshold (up to 32 MiB), so the many short-lived per-chunk tensors inflate
  RSS with retained, reusable memory; this figure is noisier.
Timing comes from the default-allocator subprocess (mmap-per-tensor is slow).
--quick: N=128 only, one repeat (smoke test); --head-dims narrows the head dims
(bench/run_all.py --quick uses 32 only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEQ_LENS = (128, 512, 2048)
HEAD_DIMS = (32, 64)
HEADS = 12
MIB = 1024 * 1024


# ---------------------------------------------------------------- child: one case


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> str:
    """Reset the peak-RSS counter; return the measurement method used."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _status_kib("VmHWM")
        return "VmHWM after clear_refs reset"
    except OSError:
        return "ru_maxrss delta"


def _peak_kib(method: str) -> int:
    if method.startswith("VmHWM"):
        return _status_kib("VmHWM")
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def run_case(n: int, head_dim: int, chunk_size: int | None, repeats: int, threads: int) -> dict:
    """One case in this process: peak of the first forward+backward, then ``repeats`` timed ones."""
    import gc

    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(ROOT))
    from pipeline.losses import relation_kl

    def inputs(n_):
        g = torch.Generator().manual_seed(0)
        d = HEADS * head_dim
        xs = [torch.randn(1, n_, d, generator=g) for _ in range(4)]
        xs[2].requires_grad_()
        xs[3].requires_grad_()
        return xs, torch.ones(1, n_, dtype=torch.long)

    def step(xs, mask):
        loss = relation_kl(*xs, mask, HEADS, chunk_size=chunk_size)
        loss.backward()
        xs[2].grad = xs[3].grad = None
        return loss.item()

    step(*inputs(16))  # warm-up: autograd/threads/checkpoint lazy init, outside the measurement
    xs, mask = inputs(n)
    gc.collect()

    method = _reset_peak()
    base_kib = _status_kib("VmRSS") if method.startswith("VmHWM") else _peak_kib(method)
    loss = step(xs, mask)
    peak_kib = _peak_kib(method) - base_kib

    times, cpu = ([float("nan")], [float("nan")]) if repeats == 0 else ([], [])
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        step(xs, mask)
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)  # all threads; less hurt by a busy machine
    return {
        "n": n,
        "heads": HEADS,
        "head_dim": head_dim,
        "batch": 1,
        "method": "naive" if chunk_size is None else "chunked",
        "chunk_size": chunk_size,
        "peak_mib": peak_kib / 1024,
        "memory_method": method,
        "score_matrix_mib": HEADS * n * n * 4 / MIB,  # one fp32 [1,H,N,N] tensor, for scale
        "time_ms": {"min": min(times), "median": statistics.median(times), "max": max(times)},
        "cpu_ms_median": statistics.median(cpu),
        "repeats": repeats,
        "loss": loss,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


# ---------------------------------------------------------------- parent: all cases


LIVE_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # every tensor >= 64 KiB is its own mmap: RSS = live bytes


def spawn(n, head_dim, chunk_size, repeats, threads, env=None) -> dict:
    case = json.dumps({"n": n, "head_dim": head_dim, "chunk_size": chunk_size, "repeats": repeats, "threads": threads})
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | (env or {})
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--case", case],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(n: int, head_dim: int, chunk_size: int | None, repeats: int, threads: int) -> dict:
    live = spawn(n, head_dim, chunk_size, 0, threads, LIVE_ENV)
    r = spawn(n, head_dim, chunk_size, repeats, threads)
    r["peak_rss_default_mib"] = r.pop("peak_mib")
    r["peak_live_mib"] = live["peak_mib"]
    assert live["loss"] == r["loss"]
    return r


def to_markdown(results: list[dict], meta: dict) -> str:
    lines = [
        "# Attention KL: chunked vs naive, forward+backward",
        "",
        f"Command: `{meta.get('command', 'python bench/attention_kl.py')}`  ",
        f"Date: {meta.get('date', '-')}  ",
        f"Machine: {meta.get('machine_line', meta['machine'])}",
        "",
        f"On {meta['machine']}, {meta['cpus']} CPUs, torch {meta['torch']}, {meta['threads']} threads "
        f"(1-min load average at the start / end: {meta['loadavg_1min_at_start']} / "
        f"{meta['loadavg_1min_at_end']}). Times use {meta['threads']} torch thread(s): "
        "on a machine shared with other jobs, multi-thread barriers spin and inflate both wall and CPU "
        "time; one thread keeps CPU time (process time) a steady measure of the work. Read wall times by their min.",
        "",
        f"Batch 1, {HEADS} heads, fp32 inputs, no padding. Loss: `pipeline.losses.relation_kl` with "
        f"(a, b) = (query, key); naive = `chunk_size=None`; chunked = `chunk_size={meta['chunk_size']}` "
        "(`DEFAULT_CHUNK_SIZE`), each chunk under non-reentrant checkpoint. At N <= chunk size the "
        "chunked path is a single checkpointed chunk: no saving, only recompute.",
        "",
        f"Peak memory: {meta['memory_method']} over a baseline taken after imports, input creation "
        "and a tiny warm-up, fresh subprocess per figure. *Live peak*: glibc told to mmap every "
        "allocation >= 64 KiB (`MALLOC_MMAP_THRESHOLD_=65536`), so RSS follows live tensor bytes; "
        "this is the footprint of the algorithm. *Default-glibc RSS*: the same with the default "
        "allocator, which keeps freed heap blocks (its dynamic mmap threshold rises to 32 MiB) "
        "and so counts retained, reusable memory. "
        f"Time: {meta['repeats']} repeat(s) of forward+backward after the measured run, default allocator.",
        "",
        "| N | head dim | method | live peak MiB | vs naive | default-glibc RSS peak MiB | vs naive "
        "| one [1,H,N,N] fp32 MiB | wall ms min / median / max | CPU ms median | loss |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    naive = {(r["n"], r["head_dim"]): r for r in results if r["method"] == "naive"}

    def ratio(r, key):
        ref = naive.get((r["n"], r["head_dim"]))
        return f"{r[key] / ref[key]:.3f}" if ref and ref[key] > 0 else "-"

    for r in results:
        t = r["time_ms"]
        name = r["method"] + (f" ({r['chunk_size']})" if r["chunk_size"] else "")
        lines.append(
            f"| {r['n']} | {r['head_dim']} | {name} | {r['peak_live_mib']:.1f} | {ratio(r, 'peak_live_mib')} | "
            f"{r['peak_rss_default_mib']:.1f} | {ratio(r, 'peak_rss_default_mib')} | "
            f"{r['score_matrix_mib']:.1f} | {t['min']:.1f} / {t['median']:.1f} / {t['max']:.1f} | "
            f"{r['cpu_ms_median']:.1f} | {r['loss']:.6f} |"
        )
    lines.append("")
    for r in results:
        ref = naive[(r["n"], r["head_dim"])]
        if abs(r["loss"] - ref["loss"]) > 1e-5 * max(1.0, abs(ref["loss"])):
            lines.append(f"- WARNING: N={r['n']} head dim {r['head_dim']}: chunked loss differs from naive.")
    target = [(r, naive[(r["n"], r["head_dim"])]) for r in results if r["method"] == "chunked" and r["n"] == 2048]
    for r, ref in target:
        frac = r["peak_live_mib"] / ref["peak_live_mib"]
        verdict = "met" if frac <= 1 / 8 else "NOT met"
        lines.append(
            f"- Target (N=2048, {HEADS} heads, head dim {r['head_dim']}): chunked live peak <= 1/8 of naive: "
            f"{verdict} ({r['peak_live_mib']:.1f} / {ref['peak_live_mib']:.1f} MiB = {frac:.3f})."
        )
    if not target:
        lines.append("- Target (N=2048) not measured in this run (--quick).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from pipeline.losses import DEFAULT_CHUNK_SIZE

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N=128 only, one repeat")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads per case (default 1: steady figures on a shared machine)"
    )
    p.add_argument(
        "--head-dims", type=int, nargs="+", default=list(HEAD_DIMS), help="head dims to measure (default 32 64)"
    )
    p.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case in this process
    args = p.parse_args(argv)

    if args.case:
        c = json.loads(args.case)
        print(json.dumps(run_case(c["n"], c["head_dim"], c["chunk_size"], c["repeats"], c["threads"])))
        return 0

    import datetime as dt

    sys.path.insert(0, str(ROOT / "bench"))
    from common import command_line, machine_line

    load_start = round(os.getloadavg()[0], 2)
    seq_lens = (128,) if args.quick else SEQ_LENS
    repeats = 1 if args.quick else args.repeats
    results = []
    for n in seq_lens:
        for hd in args.head_dims:
            for chunk in (None, args.chunk_size):
                r = measure(n, hd, chunk, repeats, args.threads)
                print(
                    f"N={n:5d} head_dim={hd} {r['method']:8s} live peak {r['peak_live_mib']:7.1f} MiB, "
                    f"default-glibc RSS peak {r['peak_rss_default_mib']:7.1f} MiB, "
                    f"median {r['time_ms']['median']:8.1f} ms",
                    file=sys.stderr,
                    flush=True,
                )
                results.append(r)

    meta = {
        "quick": args.quick,
        "head_dims": args.head_dims,
        "chunk_size": args.chunk_size,
        "repeats": repeats,
        "memory_method": results[0]["memory_method"],
        "torch": results[0]["torch"],
        "threads": results[0]["torch_threads"],
        "cpus": os.cpu_count(),
        "loadavg_1min_at_start": load_start,
        "loadavg_1min_at_end": round(os.getloadavg()[0], 2),
        "machine": f"{platform.system()} {platform.machine()} ({platform.processor() or 'cpu'})",
        "machine_line": machine_line(),
        "date": dt.date.today().isoformat(),
        "command": command_line("bench/attention_kl.py", argv),
    }
    md = to_markdown(results, meta)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention_kl.md").write_text(md)
    (args.out / "attention_kl.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
