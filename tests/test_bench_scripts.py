"""Every script in bench/ (and bench/probes/, the frozen one-off experiments) starts and answers --help: an import
that broke, or a script that does its work when asked for help, fails here."""

from __future__ import annotations

import json
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
    """Every one exits 0 and prints its usage, all in one interpreter (tests/bench_help.py: each script mostly
    imports torch and transformers; 20 CPU-seconds instead of 81 for 25 interpreters)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "bench_help.py"), str(ROOT), *SCRIPTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(answers) == SCRIPTS
    failed = {
        script: f"rc={code}: {(err or out)[-600:]}"
        for script, (code, out, err) in answers.items()
        if code != 0 or not out.lstrip().startswith("usage:")
    }
    assert not failed, failed


def test_truncation_head_and_tail_keeps_both_ends_and_the_budget():
    sys.path.insert(0, str(ROOT / "bench"))
    import truncation

    ids = [101, *range(1000, 1300), 102]  # [CLS] 300 word pieces [SEP]
    cut = truncation.head_and_tail(ids, 128)
    assert len(cut) == 128
    assert cut[:64] == ids[:64] and cut[64:] == ids[-64:]
    assert cut[0] == 101 and cut[-1] == 102
    assert truncation.head_and_tail(ids, 129)[:64] == ids[:64] and len(truncation.head_and_tail(ids, 129)) == 129
    short = [101, 5, 6, 102]
    assert truncation.head_and_tail(short, 128) == short
