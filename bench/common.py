"""What the bench scripts share, kept once: the import path, the product's stage order, the machine (one line for
headers, ``machine_facts`` for JSON), ``emit`` and the header every results file carries, ``spread`` and ``link_upstream``.

Importing this module is cheap: the pipeline's own names (``STAGES``, ``link_stage``) are loaded on first use,
so bench/report.py renders BENCHMARKS.md without importing torch.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
for _path in (str(ROOT), str(BENCH)):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def __getattr__(name: str):
    if name == "STAGES":  # the runner's order: the bench keeps no copy
        from pipeline.runner import STAGES

        return STAGES
    if name == "link_stage":
        from pipeline.sweep import link_stage

        return link_stage
    raise AttributeError(f"module 'common' has no attribute {name!r}")


# ---------------------------------------------------------------- the header of every results file

HEADER_KEYS = ("command", "date", "machine")  # required; "commit" is read when present (files before it lack it)
_HEADER = {
    "command": re.compile(r"^Command: `(.+)`\s*$"),
    "date": re.compile(r"^Date: (.+?)\s*$"),
    "machine": re.compile(r"^Machine: (.+?)\s*$"),
    "commit": re.compile(r"^Commit: (.+?)\s*$"),
}
HEADER_SEARCH_LINES = 12  # the header sits at the top (after an optional "# " title)


def cpu_flags() -> str:
    """What decides CPU speed here: native bf16 (AVX512-BF16, which `precision: auto` trains in) or AVX2 only."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    return "AVX512-BF16" if "avx512_bf16" in flags else "AVX2 only" if "avx2" in flags else platform.machine()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def machine_line() -> str:
    """This machine in one line, as results headers give it: '2-core AMD EPYC (AVX512-BF16)' (+ GPUs)."""
    line = f"{os.cpu_count()}-core {cpu_model()} ({cpu_flags()})"
    gpus = gpu_names()
    return line + (f", {len(gpus)} x {gpus[0]}" if gpus else "")


def machine_facts() -> dict:
    cpu = platform.processor() or platform.machine()
    physical = None
    try:
        with open("/proc/cpuinfo") as fh:
            info = fh.read()
        for line in info.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and cpu in (platform.processor(), platform.machine()):
                cpu = value.strip()
            if key.strip() == "cpu cores" and physical is None:
                physical = int(value.strip())
    except OSError:
        pass
    memory_gb = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    memory_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    versions = {}
    for package in ("torch", "onnxruntime", "transformers", "accelerate", "onnx", "numpy", "mlflow"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu_model": cpu,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "cores_per_socket": physical,
        "memory_gb": memory_gb,
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "python": platform.python_version(),
        "versions": versions,
        "git": git_revision(),
    }


def git_revision() -> str | None:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return head.stdout.strip() + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def command_line(script: str, argv: list[str] | None = None) -> str:
    """'python bench/x.py <args>' as it was called (``argv`` defaults to sys.argv[1:])."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", script, *(shlex.quote(str(a)) for a in args)])


def header_lines(
    command: str, machine: str | None = None, date: str | None = None, commit: str | None = None
) -> list[str]:
    """The lines bench/report.py reads: the command that made the file, the date, the machine and the commit it
    ran at (with "+ uncommitted changes" when the tree differed)."""
    return [
        f"Command: `{command}`  ",
        f"Date: {date or dt.date.today().isoformat()}  ",
        f"Machine: {machine or machine_line()}  ",
        f"Commit: {commit or git_revision() or 'unknown (no git)'}",
        "",
    ]


def with_header(
    lines: list[str], command: str, machine: str | None = None, date: str | None = None, commit: str | None = None
) -> list[str]:
    """``lines`` with the header inserted after their "# " title (or first, without one)."""
    head = header_lines(command, machine, date, commit)
    if lines and lines[0].startswith("# "):
        rest = lines[1:]
        while rest and not rest[0].strip():
            rest = rest[1:]
        return [lines[0], "", *head, *rest]
    return [*head, *lines]


def read_header(text: str) -> dict | None:
    """{command, date, machine[, commit]} from a results file's top lines, or None when one of the first three is
    missing."""
    found = {}
    for line in text.splitlines()[:HEADER_SEARCH_LINES]:
        for key, pattern in _HEADER.items():
            match = pattern.match(line)
            if match and key not in found:
                found[key] = match.group(1)
    return found if all(key in found for key in HEADER_KEYS) else None


def emit(lines: list[str], out: Path | None, command: str | None = None, machine: str | None = None) -> None:
    """Print a markdown report and, with ``out``, write it there too (the committed copy in bench/results),
    headed by the command, today's date and this machine when ``command`` is given."""
    if command:
        lines = with_header(lines, command, machine)
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)


# ---------------------------------------------------------------- figures and run folders


def spread(values: list[float]) -> dict:
    """min / median / max / n of repeated measurements (the form every bench JSON uses)."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def link_upstream(source: Path, target: Path) -> None:
    """Hard-link a base run's complete stages into another run folder (the sweep's ``link_stage``); the runner
    reruns exactly those whose fingerprints differ (a rerun writes <stage>.partial and renames it, so the base
    files are never modified)."""
    from pipeline.runner import STAGES
    from pipeline.sweep import link_stage

    target.mkdir(parents=True, exist_ok=True)
    for stage in STAGES:
        if (source / stage).is_dir() and not (target / stage).exists():
            link_stage(source / stage, target / stage)
