"""Every script in bench/ (and bench/probes/, the frozen one-off experiments) starts and answers --help: an import
that broke, or a script that does its work when asked for help, fails here."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.process

SCRIPTS = sorted(
    p.relative_to(ROOT).as_posix()
    for p in [*(ROOT / "bench").glob("*.py"), *(ROOT / "bench" / "probes").glob("*.py")]
    if p.stem != "common"
)  # common.py is the scripts' shared module, not a script


def test_the_scripts_are_found():
    assert {"bench/report.py", "bench/run_all.py", "bench/probes/fusion.py"} <= set(SCRIPTS)


def test_every_bench_script_answers_help():
    """All at once (each mostly imports torch and transformers): every one exits 0 and prints its usage."""
    started = {
        script: subprocess.Popen(
            [sys.executable, script, "--help"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for script in SCRIPTS
    }
    failed = {}
    for script, proc in started.items():
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0 or not out.lstrip().startswith("usage:"):
            failed[script] = f"rc={proc.returncode}: {(err or out)[-600:]}"
    assert not failed, failed
