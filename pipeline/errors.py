"""User-facing errors: one clear paragraph, a non-zero exit, no traceback."""


class PipelineError(Exception):
    """An error the user can fix (bad config, bad data, a locked run folder...).

    The CLI prints the message without a traceback (``--debug`` shows it) and
    exits with ``exit_code``.
    """

    exit_code = 1


class ConfigError(PipelineError):
    """The config (file, ``extends`` chain, overrides or values) is invalid."""

    exit_code = 2


class DataError(PipelineError):
    """The dataset cannot be used as configured."""


class ModelError(PipelineError):
    """A model folder or model setting cannot be used."""


class LockedError(PipelineError):
    """Another pipeline holds the run folder."""


class TrainingError(PipelineError):
    """Training stopped on a non-finite loss or similar."""


class CacheError(PipelineError):
    """The teacher cache is missing, corrupted or too large."""


class DiskFullError(PipelineError):
    """The disk holding the run folder (or the MLflow store) ran out of space."""


_DISK_FULL_TEXT = ("no space left on device", "disk quota exceeded", "database or disk is full", "os error 28")


def disk_full_error(exc: BaseException, folder, doing: str) -> DiskFullError | None:
    """A DiskFullError for ``exc`` if it comes from a full disk, else None.

    Libraries report a full disk differently: OSError ENOSPC (Python writes,
    Arrow), "No space left on device (os error 28)" (safetensors), "database or
    disk is full" (sqlite), a bare RuntimeError from torch.save's zip writer.
    The last kind is recognised by the disk holding ``folder`` having (almost)
    nothing left.
    """
    import errno
    import shutil
    from pathlib import Path

    chain = _chain(exc)
    path = next((e.filename for e in chain if isinstance(e, OSError) and e.filename), None)
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        free = None
    full = any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in chain)
    full = full or any(marker in str(e).lower() for e in chain for marker in _DISK_FULL_TEXT)
    full = full or (free is not None and free < (1 << 20))
    if not full:
        return None
    left = f"{free / 1e6:.1f} MB free there now" if free is not None else "free space unknown"
    return DiskFullError(
        f"Disk full: {doing} could not write {path or folder} ({left}; {type(exc).__name__}: {str(exc)[:200]}). "
        "Free some space or point --runs-dir at a larger disk, then rerun the same command: complete stages are kept, "
        "and an interrupted stage resumes from its finished cache shards / last checkpoint."
    )


def _chain(exc: BaseException) -> list[BaseException]:
    chain, seen = [], exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def explain(exc: BaseException, runs_dir) -> PipelineError:
    """The one-paragraph error for an exception that is not one of the pipeline's own.

    The runner tags exceptions with the stage they came from (``pipeline_stage``).
    Known causes (full disk, permissions, the MLflow store, memory, a missing
    package) get their fix; anything else is named as unexpected, with --debug
    for the traceback.
    """
    import errno
    import os

    stage = getattr(exc, "pipeline_stage", None)
    doing = f"the {stage} stage" if stage else "the pipeline"
    kept = "Complete stages are kept; rerun the same command to continue."
    full = disk_full_error(exc, runs_dir, doing)
    if full is not None:
        return full
    chain = _chain(exc)
    denied = next((e for e in chain if isinstance(e, PermissionError) or
                   (isinstance(e, OSError) and e.errno == errno.EROFS)), None)
    if denied is not None:
        return PipelineError(
            f"Permission denied: {doing} cannot write {denied.filename or runs_dir} ({os.strerror(denied.errno or 13)}). "
            f"Make the runs folder writable or point --runs-dir at a folder you own. {kept}")
    if any(type(e).__module__.split(".")[0] in ("mlflow", "sqlalchemy", "sqlite3") for e in chain):
        from .tracking import store_error, tracking_uri

        store = store_error(exc, tracking_uri(runs_dir), before_work=False)
        return PipelineError(f"{doing.capitalize()} failed talking to MLflow: {store} {kept}")
    if any(isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()
           for e in chain):  # torch's OutOfMemoryError is a RuntimeError
        return PipelineError(
            f"Out of memory in {doing}. Lower the batch sizes (teacher.batch_size, distill.batch_size, capture.batch_size, "
            f"evaluate.batch_size) or data.max_length. {kept}")
    missing = next((e for e in chain if isinstance(e, ModuleNotFoundError)), None)
    if missing is not None:
        return PipelineError(f"{doing.capitalize()} needs the Python module '{missing.name}', which is not installed. "
                             f"Run 'make venv' (or pip install it). {kept}")
    text = str(exc)
    text = text if len(text) <= 300 else text[:300] + "..."
    return PipelineError(
        f"Unexpected error in {doing}: {type(exc).__name__}: {text}. The pipeline has no explanation for this one, "
        f"so it is most likely a bug: rerun with --debug for the traceback and report it with the config. {kept}")
