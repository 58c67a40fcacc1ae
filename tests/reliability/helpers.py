"""Helpers of the reliability suite (its fixtures are in conftest.py).

Most cases call the real command line entry point (``pipeline.cli.main``) in this process (:func:`cli`): same
argument parsing, error handling and exit codes as ``python -m pipeline``, without paying the ~5-15 s interpreter +
torch start-up per case on a busy 2-core machine. Cases that need a separate process (SIGINT, a second pipeline
holding the lock, the plain ``python -m pipeline`` output) use subprocesses.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tests.helpers import ROOT

CONFIG_NAME = "rel"

# A cheap variant of `tiny`: fewer examples, a teacher that is not fine-tuned,
# one short distillation epoch with frequent checkpoints.
BASE_CONFIG = f"""\
extends: {ROOT / "configs" / "tiny.yaml"}
description: reliability suite base run
data:
  max_examples: 120
teacher:
  epochs: 0
distill:
  epochs: 1
  checkpoint_every: 2
capture:
  shard_size: 32
"""

BASE_STAGES = ("prepare", "teacher", "peers", "capture")

# The finished tiny run the reliability cases read or copy (conftest.py finished_run), and every command they run on
# it: `tiny` without the ExecuTorch programs, whose lowering was most of the build (tests/test_bundle_runtimes.py and
# the main suite's tiny run check the .pte files).
NO_PTE = "export.executorch=off"
FINISHED = ("tiny", NO_PTE)

# The machine is shared: one torch thread per process is several times faster
# than two threads fighting other jobs for two cores (and changes no behaviour).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextlib.contextmanager
def one_torch_thread():
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, env: dict | None = None) -> CliResult:
    """Run ``python -m pipeline ARGS`` in-process and capture its output.

    Returns the exit code and what the command printed (stdout, stderr:
    log lines, the error paragraph, tracebacks with --debug).
    """
    from pipeline.cli import main

    out, err = io.StringIO(), io.StringIO()
    # A fresh process per command would start from this environment; the
    # pipeline (and mlflow.set_tracking_uri) export variables, so restore it.
    saved_env = dict(os.environ)
    saved_logging = _logging_state()
    for key, value in (env or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        if "mlflow" in sys.modules:  # the pipeline sets mlflow's process-wide tracking URI
            sys.modules["mlflow"].set_tracking_uri(None)
        os.environ.clear()
        os.environ.update(saved_env)
        _restore_logging(saved_logging)
        _reset_accelerate()
    return CliResult(code, out.getvalue(), err.getvalue())


def _logging_state():
    import logging

    loggers = [
        logging.getLogger(name)
        for name in (
            "pipeline",
            "transformers",
            "datasets",
            "accelerate",
            "mlflow",
            "alembic",
            "sqlalchemy",
            "httpx",
            "torch.onnx",
        )
    ] + [logging.getLogger()]
    return [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]


def _restore_logging(state) -> None:
    """Undo what setup_logging did to process-wide loggers (other test modules share them)."""
    for logger, handlers, level, propagate in state:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def _reset_accelerate() -> None:
    """Each in-process run creates its own Accelerator, as a fresh process would."""
    with contextlib.suppress(Exception):
        from accelerate.state import AcceleratorState, PartialState

        AcceleratorState._reset_state(True)
        PartialState._reset_state()


def expect_error(*args: str, code: int, phrases: tuple[str, ...] = (), env: dict | None = None) -> CliResult:
    """The user-error contract: exit code, message phrases, no traceback. (That --debug adds the traceback is
    one code path for every error, tested once: test_config_errors.py::test_debug_adds_the_traceback...)"""
    result = cli(*args, env=env)
    assert result.returncode == code, f"exit {result.returncode}, stderr:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    message = error_message(result.stderr)
    if os.environ.get("REL_SHOW"):  # REL_SHOW=1 pytest -s: print each message, to review the wording
        print(f"\n[{' '.join(args)}]\n  {message}")
    for phrase in phrases:
        assert phrase.lower() in message.lower(), f"{phrase!r} not in message:\n{message}"
    return result


def error_message(stderr: str) -> str:
    """The 'error: ...' paragraph the CLI prints (one per failure)."""
    assert stderr.count("\nerror: ") == 1, f"expected exactly one error message:\n{stderr[-3000:]}"
    return stderr.split("\nerror: ", 1)[1].strip()


def assert_resumable_interrupt(process, stderr: str) -> None:
    """A stopped pipeline process (Ctrl-C, SIGTERM): exit 130, no traceback, the resume hint."""
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "rerun the same command to resume" in error_message(stderr).lower()


def stop(process) -> None:
    """Kill a test's child pipeline if it is still running (always, in a finally)."""
    if process.poll() is None:
        process.kill()
        process.wait()


def planned(config_path: str, runs_dir: Path, *overrides: str) -> list[str]:
    from pipeline.config import load_config
    from pipeline.runner import plan, resolve_precision

    config = load_config(config_path, list(overrides))
    config = config.model_copy(update={"precision": resolve_precision(config.precision)})  # as the CLI does
    return [name for name, run in plan(config, Path(runs_dir) / config.name, False, None, None).items() if run]


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under a folder, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def snapshot(run_dir: Path) -> dict:
    """Complete stages of a run folder: manifest + file digests."""
    from pipeline.runner import STAGES, read_manifest

    return {s: (read_manifest(run_dir / s), tree_digest(run_dir / s)) for s in STAGES if read_manifest(run_dir / s)}


def assert_complete_stages_untouched(before: dict, run_dir: Path) -> None:
    after = snapshot(run_dir)
    for stage, (manifest, files) in before.items():
        assert stage in after, f"stage {stage} was complete and no longer is"
        assert after[stage][0] == manifest, f"manifest of {stage} changed"
        assert after[stage][1] == files, f"files of {stage} changed"


def nothing_written(run_dir: Path) -> dict:
    """Digest of a whole run folder, for errors that must stop before writing anything."""
    return tree_digest(run_dir) if run_dir.exists() else {}


@dataclass
class Run:
    """A private copy of the prepared base run."""

    runs_dir: Path
    config: str  # path of the base config file

    @property
    def run_dir(self) -> Path:
        return self.runs_dir / CONFIG_NAME

    def snapshot(self) -> dict:
        return snapshot(self.run_dir)


def write_config(folder: Path, name: str, text: str) -> Path:
    path = Path(folder) / f"{name}.yaml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- data files


def rows(n: int, labels=("pos", "neg")) -> list[dict]:
    return [
        {"text": f"review number {i} says it was {labels[i % len(labels)]}", "label": labels[i % len(labels)]}
        for i in range(n)
    ]


def write(path: Path, records: list[dict]) -> Path:
    frame = pd.DataFrame(records)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_parquet(path)
    return path


def prepare_with(run, path: Path | str, *overrides: str) -> tuple:
    source = Path(path).suffix.lstrip(".") or "csv"
    return (
        "run",
        run.config,
        f"data.source={source}",
        f"data.path={path}",
        "data.group_column=null",
        *overrides,
        "--only",
        "prepare",
        "--runs-dir",
        str(run.runs_dir),
    )


def check(run, path, *overrides, phrases):
    before = run.snapshot()
    result = expect_error(*prepare_with(run, path, *overrides), code=1, phrases=phrases)
    assert_complete_stages_untouched(before, run.run_dir)
    return result
