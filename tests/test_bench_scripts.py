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


# Runs in one fresh interpreter: each script as `python SCRIPT --help` would run it (runpy as __main__, its own
# folder first on sys.path, sys.path restored and the bench modules it imported dropped before the next script, so
# one script's imports cannot hide another's missing one); the heavy imports (torch, transformers) are paid once
# instead of 25 times (about 60 CPU-seconds of the suite).
HELP_ALL = """
import contextlib, io, json, runpy, sys
from pathlib import Path
root, scripts = Path(sys.argv[1]), sys.argv[2:]
base_path, answers = list(sys.path), {}
for script in scripts:
    path = root / script
    sys.path[:] = [str(path.parent), *base_path[1:]]
    sys.argv = [str(path), "--help"]
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:
        code, err = 1, io.StringIO(f"{type(exc).__name__}: {exc}")
    answers[script] = [code, out.getvalue(), err.getvalue()[-600:]]
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(str(root / "bench")):
            del sys.modules[name]
sys.path[:] = base_path
print(json.dumps(answers))
"""


def test_every_bench_script_answers_help():
    """Every one exits 0 and prints its usage (all in one interpreter: each mostly imports torch and transformers)."""
    done = subprocess.run(
        [sys.executable, "-c", HELP_ALL, str(ROOT), *SCRIPTS], cwd=ROOT, capture_output=True, text=True, timeout=600
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
