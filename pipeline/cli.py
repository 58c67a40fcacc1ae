"""Command line: `python -m pipeline run|status|validate CONFIG [key=value ...]`, `python -m pipeline sweep CONFIG SWEEP.yaml`."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import signal
import sys
import threading
from functools import partial
from pathlib import Path

from .errors import ConfigError, PipelineError, disk_full_error, exception_chain
from .interrupts import interrupt
from .parent_death import end_with_parent

log = logging.getLogger("pipeline")

EPILOG = """\
examples:
  python -m pipeline run bert_small                       # all stages, skipping what is done
  python -m pipeline run bert_small distill.epochs=1 seed=3   # overrides (reruns what they touch)
  python -m pipeline run tiny --from distill              # rerun distill and everything after
  python -m pipeline run tiny --only evaluate --force     # one stage
  python -m pipeline status bert_small                    # done / stale / pending per stage
  python -m pipeline validate bert_small                  # check the config, run nothing
  python -m pipeline sweep bert_small configs/sweeps/depth.yaml --pick "retention>=0.98"   # variants, table, pick

Stages: prepare -> teacher -> peers -> capture -> distill -> evaluate -> export.
Outputs go to RUNS_DIR/<config>/<stage>/ (default runs/); MLflow data to
$MLFLOW_TRACKING_URI or sqlite RUNS_DIR/mlflow.db. Configs live in configs/<name>.yaml.
Exit codes: 0 ok, 1 run error, 2 config error, 130 interrupted by Ctrl-C or SIGTERM (rerun to resume).
status states: done, stale (inputs changed), damaged (an output file changed on disk), pending.
"""


SWEEP_HELP = """\
Run every variant of a sweep file as an ordinary pipeline run, compare them and pick one.

The sweep file lists named variants, each a set of config overrides:

  description: three student depths
  overrides: {export.latency_lengths: [128]}     # optional, for every variant
  pick: retention>=0.98                          # optional default for --pick
  shared_capture: true                           # optional: one capture for variants whose terms differ
  variants:
    depth1: {description: 1 layer, overrides: {student.teacher_layers: [5]}}
    depth2: {overrides: {student.teacher_layers: [0, 5]}}

Each variant runs in RUNS_DIR/<config>/sweeps/<sweep>/<variant>/. A stage whose
fingerprint matches a complete stage of the config's run folder or of an earlier
variant is hard-linked from there, not rerun: prepare, teacher, peers and capture run once.
In MLflow the variants' pipeline runs are nested under one sweep run.

The sweep ends with a table (sweep.md, sweep.csv, sweep.json) and a Pareto plot
(pareto.png: retention against latency and against size; where the export compared
the students with the peers, accuracy from raw text against ms per text and against
size, the peers and the int8 teacher drawn as reference points that are never picked)
in the sweep folder and on the sweep run. --pick chooses the fastest variant meeting the constraint and
moves the registry alias 'champion' to its registered version; when none meets it,
the sweep says how close each came, leaves the alias alone and exits 1.
Pick metrics: retention, accuracy_kept, accuracy, latency_ms, mb, speedup, size_ratio, text_ms (raw text
to label, one text per call), text_accuracy. Only students are picked, never a peer.
Rerunning an interrupted sweep continues where it stopped.

examples:
  python -m pipeline sweep bert_small configs/sweeps/depth.yaml --pick "retention>=0.98"
  python -m pipeline sweep bert_small configs/sweeps/depth.yaml --pick "latency_ms<=5" distill.epochs=1
  make sweep CONFIG=bert_small SWEEP=configs/sweeps/depth.yaml PICK="mb<=10"
  make sweep CONFIG=bert_small SWEEP=configs/sweeps/budget.yaml PICK="latency_ms<=0.3"   # static to 3 layers
"""


def build_parser() -> argparse.ArgumentParser:
    from .runner import STAGES

    parser = argparse.ArgumentParser(
        prog="python -m pipeline",
        description="Attention distillation pipeline for BERT-style classifiers.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("config", help="config name in configs/ (e.g. bert_small, tiny) or a path to a .yaml file")
    common.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. distill.epochs=1 seed=3"
    )
    common.add_argument(
        "--runs-dir",
        default=os.environ.get("RUNS_DIR", "runs"),
        help="root of run folders (default: runs, or $RUNS_DIR)",
    )
    common.add_argument("--debug", action="store_true", help="show full tracebacks and debug logs")
    run = sub.add_parser(
        "run",
        parents=[common],
        help="run the pipeline (skips stages that are complete and current)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # append, then checked once in _dispatch: a stage option given twice is an error, never "the last one wins"
    run.add_argument(
        "--from", dest="from_stage", choices=STAGES, action="append", help="rerun this stage and all later ones"
    )
    run.add_argument(
        "--only",
        choices=STAGES,
        action="append",
        help="run only this stage (its inputs must be complete; one that reads a stale input is recorded stale too)",
    )
    run.add_argument(
        "--to",
        dest="to_stage",
        choices=STAGES,
        action="append",
        help="stop after this stage (e.g. --to evaluate skips export)",
    )
    run.add_argument("--force", action="store_true", help="rerun stages even when their outputs are current")
    sweep = sub.add_parser(
        "sweep",
        help="run a sweep's variants (shared stages once), compare them, pick the one to ship",
        description=SWEEP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep.add_argument("config", help="config name in configs/ (e.g. bert_small, tiny) or a path to a .yaml file")
    sweep.add_argument("sweep", help="sweep file (YAML), e.g. configs/sweeps/depth.yaml")
    sweep.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides for every variant (applied after the sweep file's)",
    )
    sweep.add_argument(
        "--pick",
        help="constraint for the variant to ship, e.g. 'retention>=0.98', 'latency_ms<=5', "
        "'mb<=10' (several: comma-separated); default: the sweep file's pick, if any",
    )
    sweep.add_argument(
        "--to",
        dest="to_stage",
        choices=STAGES,
        help="stop every variant after this stage (e.g. --to evaluate: no export, so no latency, size "
        "or registered version to pick by)",
    )
    sweep.add_argument(
        "--runs-dir",
        default=os.environ.get("RUNS_DIR", "runs"),
        help="root of run folders (default: runs, or $RUNS_DIR)",
    )
    sweep.add_argument("--debug", action="store_true", help="show full tracebacks and debug logs")
    sub.add_parser("status", parents=[common], help="show done / stale / pending for each stage")
    sub.add_parser("validate", parents=[common], help="validate the config (and the model shapes) and print it")
    return parser


class OneLine(logging.Filter):
    """A library's log record as one line: no traceback, no stack, the first line of its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage().strip().splitlines()
        record.msg, record.args = (message[0] if message else ""), ()
        record.exc_info = record.exc_text = record.stack_info = None
        return True


def setup_logging(debug: bool, rank: int = 0) -> None:
    from .redaction import RedactingFilter

    handler = logging.StreamHandler(sys.stderr)
    prefix = f"[rank {rank}] " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(message)s", "%H:%M:%S"))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger("pipeline")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False
    # Third-party chatter (one line per model load) is noise for users.
    for noisy in ("transformers", "datasets", "accelerate", "mlflow", "alembic", "httpx"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # mlflow resets its logger level on import
    # MLflow's store logs every exception it catches with its traceback (10-12 blocks on a full disk) before the
    # pipeline's one-paragraph error: its loggers (and SQLAlchemy's) go through this handler, one line per record,
    # tracebacks only with --debug. MLFLOW_CONFIGURE_LOGGING=false: mlflow would install its own handler on import.
    os.environ["MLFLOW_CONFIGURE_LOGGING"] = "false"
    libraries = logging.StreamHandler(sys.stderr)
    libraries.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(name)s: %(message)s", "%H:%M:%S"))
    libraries.addFilter(RedactingFilter())
    if not debug:
        libraries.addFilter(OneLine())
    for library, level in (("mlflow", logging.WARNING), ("alembic", logging.ERROR), ("sqlalchemy", logging.ERROR)):
        logger = logging.getLogger(library)
        logger.handlers[:] = [libraries]
        logger.setLevel(level)
        logger.propagate = False
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    logging.getLogger("root").setLevel(logging.ERROR)  # onnxruntime.quantization logs via the root logger
    import transformers

    transformers.utils.logging.disable_progress_bar()  # per-file "Loading weights" bars
    import datasets

    datasets.disable_progress_bars()  # "Saving the dataset" bars


OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")  # key=value, as the overrides positional takes them


def parse(argv: list[str] | None):
    """The command line, with config overrides accepted anywhere after the config (argparse alone takes them only
    before the first option: `run tiny --to prepare seed=3` would be "unrecognized arguments")."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    late = [item for item in extra if OVERRIDE.match(item)]
    unknown = [item for item in extra if not OVERRIDE.match(item)]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if late:
        args.overrides = [*(getattr(args, "overrides", None) or []), *late]
    given: dict[str, list[str]] = {}
    for item in getattr(args, "overrides", None) or []:
        key, _, value = item.partition("=")
        given.setdefault(key.strip(), []).append(value.strip())
    clashes = {key: values for key, values in given.items() if len(set(values)) > 1}
    if clashes:  # the same value twice (composed scripts) is harmless; two values would silently keep the last
        parser.error(
            "; ".join(
                f"{key} is given {len(v)} times on the command line with different values ({', '.join(v)})"
                for key, v in sorted(clashes.items())
            )
            + ": give each key once (a section given as {...} merges into the config's section)"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank started by the launcher (torch elastic, through Accelerate)
        end_with_parent(os.getppid())  # a kill -9 of the launcher ends this rank too (it would run on, orphaned)
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(args.debug, rank)
    # Schedulers and containers stop jobs with SIGTERM: treat it as Ctrl-C (checkpoint, clear message, exit 130).
    previous = (
        signal.signal(signal.SIGTERM, interrupt) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        print("\nInterrupted. Completed stages are kept; rerun the same command to resume.", file=sys.stderr)
        return 130
    except Exception as exc:  # every failure ends as one paragraph; --debug adds the (redacted) traceback
        from .redaction import redact

        error = exc if isinstance(exc, PipelineError) else explain(exc, Path(args.runs_dir))
        if args.debug:
            log.exception("error")
        print(f"\nerror: {redact(str(error))}\n", file=sys.stderr)
        return error.exit_code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        _close_process_group()


def explain(exc: BaseException, runs_dir) -> PipelineError:
    """The one-paragraph error for an exception that is not one of the pipeline's own.

    The runner tags exceptions with the stage they came from (``pipeline_stage``).
    Known causes (full disk, permissions, the MLflow store, memory, a missing
    package) get their fix; anything else is named as unexpected, with --debug
    for the traceback.
    """
    stage = getattr(exc, "pipeline_stage", None)
    doing = f"the {stage} stage" if stage else "the pipeline"
    kept = "Complete stages are kept; rerun the same command to continue."
    full = disk_full_error(exc, runs_dir, doing)
    if full is not None:
        return full
    chain = exception_chain(exc)
    denied = next(
        (e for e in chain if isinstance(e, PermissionError) or (isinstance(e, OSError) and e.errno == errno.EROFS)),
        None,
    )
    if denied is not None:
        return PipelineError(
            f"Permission denied: {doing} cannot write {denied.filename or runs_dir} ({os.strerror(denied.errno or 13)}). "
            f"Make the runs folder writable or point --runs-dir at a folder you own. {kept}"
        )
    if any(type(e).__module__.split(".")[0] in ("mlflow", "sqlalchemy", "sqlite3") for e in chain):
        from .tracking import store_error, tracking_uri  # MLflow's store code: loaded only when it failed

        store = store_error(exc, tracking_uri(runs_dir), before_work=False)
        return PipelineError(f"{doing.capitalize()} failed talking to MLflow: {store} {kept}")
    if any(
        isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()
        for e in chain
    ):  # torch's OutOfMemoryError is a RuntimeError
        return PipelineError(
            f"Out of memory in {doing}. Lower the batch sizes (teacher.batch_size, distill.batch_size, capture.batch_size, "
            f"evaluate.batch_size) or data.max_length. {kept}"
        )
    lost = lost_peer(chain)
    if lost is not None:
        from .runner import DIST_TIMEOUT_VAR, dist_timeout_seconds

        return PipelineError(
            f"Lost contact with another process of this distributed job during {doing} ({lost}). A process on another "
            f"node (or on this one) stopped, was killed or became unreachable; one that stops answering is given up on "
            f"after {DIST_TIMEOUT_VAR} seconds ({dist_timeout_seconds():g} here). The first error is in the log of the "
            f"node that stopped. Complete stages are kept; once every node is back, start the same command on every node "
            "to continue."
        )
    missing = next((e for e in chain if isinstance(e, ModuleNotFoundError)), None)
    if missing is not None:
        return PipelineError(
            f"{doing.capitalize()} needs the Python module '{missing.name}', which is not installed. "
            f"Run 'make venv' (or pip install it). {kept}"
        )
    text = str(exc)
    text = text if len(text) <= 300 else text[:300] + "..."
    return PipelineError(
        f"Unexpected error in {doing}: {type(exc).__name__}: {text}. The pipeline has no explanation for this one, "
        f"so it is most likely a bug: rerun with --debug for the traceback and report it with the config. {kept}"
    )


# What a collective says when a peer is gone or silent, raised by torch as RuntimeError or DistBackendError: gloo's
# "Connection reset/closed by peer" and "Timed out waiting ... for recv" (tests/test_multinode.py); NCCL's watchdog
# timeouts and aborts (not run here: no two GPUs).
PEER_LOST = re.compile(
    r"Connection (closed|reset) by peer|timed out|communicator was aborted|Broken pipe|"
    r"Socket Timeout",
    re.IGNORECASE,
)


def lost_peer(chain) -> str | None:
    """A short description (one line) of a collective that failed because a peer is gone, else None."""
    for error in chain:
        name, text = type(error).__name__, str(error)
        distributed = name.startswith("Dist") or "gloo" in text or "NCCL" in text or "ProcessGroup" in text
        if distributed and PEER_LOST.search(text):
            first = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text.strip().splitlines()[0])  # gloo's source path
            first = first.split(". This is typically")[0].split(" GLHF")[0].rstrip(". ")
            return first if len(first) <= 200 else first[:200] + "..."
    return None


def _close_process_group() -> None:
    """Tear down the process group before the interpreter exits: left to exit-time destructors, gloo's worker
    threads can still be joinable and a rank aborts ("terminate called without an active exception")."""
    if "torch.distributed" not in sys.modules:  # no group without it; importing torch here cost a bad config 1-2 s
        return
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def stage_range(args) -> None:
    """--from / --only / --to each at most once, and a range that holds a stage; replaced by their single values."""
    from .runner import STAGES

    for option, dest in (("--from", "from_stage"), ("--only", "only"), ("--to", "to_stage")):
        given = getattr(args, dest) or []
        if len(given) > 1:
            raise ConfigError(
                f"{option} was given {len(given)} times ({', '.join(given)}); give it once. For several "
                "stages use a range: --from FIRST --to LAST"
            )
        setattr(args, dest, given[0] if given else None)
    if args.only and (args.from_stage or args.to_stage):
        raise ConfigError(f"--only {args.only} cannot be combined with --from/--to: --only runs exactly one stage")
    if args.from_stage and args.to_stage and STAGES.index(args.from_stage) > STAGES.index(args.to_stage):
        raise ConfigError(
            f"--from {args.from_stage} comes after --to {args.to_stage}, so the range holds no stage; the "
            f"stages run in the order {', '.join(STAGES)}"
        )


def _dispatch(args) -> int:
    from .config import load_config, to_yaml

    runs_dir = Path(args.runs_dir)
    if runs_dir.exists() and not runs_dir.is_dir():
        raise ConfigError(
            f"--runs-dir {runs_dir} is a file, not a folder. Give a folder (it is created if missing), "
            "e.g. --runs-dir runs."
        )
    if args.command == "sweep":
        return _sweep(args)
    if args.command == "run":
        stage_range(args)
    config = _resolved(load_config(args.config, args.overrides))
    if args.command == "validate":
        print(to_yaml(config), end="")
        return 0
    if args.command == "status":
        print_status(config, Path(args.runs_dir))
        return 0
    from .runner import run_pipeline

    result = run_pipeline(
        config,
        Path(args.runs_dir),
        force=args.force,
        from_stage=args.from_stage,
        only=args.only,
        to_stage=args.to_stage,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        from .summary import print_summary

        print_summary(Path(args.runs_dir) / config.name, result["ran"], result["states"])
    return 0


def _resolved(config):
    """A loaded config as it runs: precision auto resolved once (recorded in the run folder and MLflow), shapes checked."""
    from .models import check_against_models
    from .runner import resolve_precision

    if config.precision == "auto":
        config = config.model_copy(update={"precision": resolve_precision("auto")})
        log.debug("precision auto -> %s", config.precision)
    check_against_models(config)
    return config


def _sweep(args) -> int:
    from .sweep import load_sweep

    sweep = load_sweep(args.config, args.sweep, args.overrides, resolve=_resolved)  # every variant checked first
    from .sweep import run_sweep  # the runner and torch: only once the sweep file is known good

    result = run_sweep(
        sweep,
        Path(args.runs_dir),
        pick=args.pick,
        to_stage=args.to_stage,
        child_setup=partial(setup_logging, args.debug),
    )
    print()
    print((result["folder"] / "sweep.md").read_text())
    print(f"sweep folder: {result['folder']}  (sweep.md, sweep.csv, sweep.json, pareto.png)")
    return 0


def print_status(config, runs_dir: Path) -> None:
    from .runner import stage_status

    rows = stage_status(config, runs_dir)
    print(f"config {config.name}: run folder {runs_dir / config.name}")
    print(f"{'stage':<10} {'state':<20} {'completed':<20} {'seconds':>8}  key figure")
    for row in rows:
        m = row["manifest"] or {}
        figure = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in list((m.get("summary") or {}).items())[:2]
            if not isinstance(v, (dict, list))
        )
        print(
            f"{row['stage']:<10} {row['state']:<20} {m.get('completed_at', '-'):<20} {m.get('duration_s', '-'):>8}  {figure}"
        )
        for problem in row["problems"][:5]:
            print(f"{'':<10} ! {problem} (the next run reruns this stage and what depends on it)")
