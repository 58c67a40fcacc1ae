"""Every bench script's ``--help`` in this one interpreter, as ``python SCRIPT --help`` would run it; prints one JSON
line {script: [exit code, stdout, stderr tail]} (tests/test_bench_scripts.py).

    python tests/bench_help.py ROOT bench/report.py bench/run_all.py ...

Each script runs as __main__ with its own folder first on sys.path; sys.path is restored and the bench modules it
imported are dropped before the next, so one script's imports cannot hide another's missing one. The heavy imports
(torch, transformers) are paid once instead of once a script.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
from pathlib import Path


def main(root: Path, scripts: list[str]) -> dict[str, list]:
    base_path, answers = list(sys.path), {}
    for script in scripts:
        path = root / script
        sys.path[:] = [str(path.parent), *base_path[1:]]  # base_path[0] is this file's folder, as a script's would be
        sys.argv = [str(path), "--help"]
        out, err = io.StringIO(), io.StringIO()
        code = 0
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                runpy.run_path(str(path), run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:  # noqa: BLE001 - any failure of one script is its answer, not the others' end
            code, err = 1, io.StringIO(f"{type(exc).__name__}: {exc}")
        answers[script] = [code, out.getvalue(), err.getvalue()[-600:]]
        for name, module in list(sys.modules.items()):
            if (getattr(module, "__file__", None) or "").startswith(str(root / "bench")):
                del sys.modules[name]
    sys.path[:] = base_path
    return answers


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2:])))
