"""User-facing errors: one clear paragraph, a non-zero exit, no traceback."""

import errno
import re
import shutil
from pathlib import Path


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
    nothing left; without a filename from the library, the file named is the
    one written last under ``folder``.
    """
    chain = exception_chain(exc)
    path = next((e.filename for e in chain if isinstance(e, OSError) and e.filename), None)
    folder = Path(folder)
    if path is None and any("database or disk is full" in str(e) for e in chain):  # sqlite: MLflow's database
        database = next((d / "mlflow.db" for d in (folder, *folder.parents[:2]) if (d / "mlflow.db").is_file()), None)
        path = f"{database} (MLflow's database)" if database else None
    if path is None and folder.is_dir():  # a library that hid its filename (torch's zip writer, ORT's C++ writer):
        path = newest_file(folder)  # the file written last is the one the disk filled under
    free = free_bytes(folder)
    full = any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in chain)
    full = full or any(marker in str(e).lower() for e in chain for marker in _DISK_FULL_TEXT)
    full = full or (free is not None and free < (1 << 20))
    if not full:
        return None
    left = f"{free / 1e6:.1f} MB free there now" if free is not None else "free space unknown"
    return _disk_full(doing, path or folder, f"{left}; {brief(exc)}")


def _disk_full(doing: str, path, detail: str) -> DiskFullError:
    return DiskFullError(
        f"Disk full: {doing} could not write {path} ({detail}). "
        "Free some space or point --runs-dir at a larger disk, then rerun the same command: complete stages are kept, "
        "and an interrupted stage resumes from its finished cache shards / last checkpoint."
    )


def require_room(path: Path, needed: int, doing: str, writer: str) -> None:
    """Refuse, naming ``path``, before a library writes it with a writer that reports no error on a full disk (it
    leaves a truncated file and carries on, and what reads the file back fails with a parse error): when the disk
    holding ``path`` has less than ``needed`` bytes free, the full disk is raised here, where it would happen."""
    free = free_bytes(Path(path).parent)
    if free is not None and free < needed:
        raise _disk_full(
            doing, path, f"{writer} needs about {needed / 1e6:.1f} MB there and {free / 1e6:.1f} MB are free"
        )


def free_bytes(folder) -> int | None:
    """Free bytes on the disk that holds ``folder`` (its nearest existing parent, for a folder not made yet), or None."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def newest_file(folder: Path) -> Path | None:
    """The most recently modified file under ``folder``, or None when it holds none."""
    newest, when = None, -1.0
    for candidate in folder.rglob("*"):
        try:
            if candidate.is_file() and (mtime := candidate.stat().st_mtime) > when:
                newest, when = candidate, mtime
        except OSError:  # vanished while walking
            continue
    return newest


def brief(exc: BaseException) -> str:
    """One line for an exception: its type and first line, or for an SQLAlchemy error the database driver's own line
    ("(sqlite3.OperationalError) database or disk is full"), never the SQL it ran."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    driver = next((line for line in lines if re.match(r"^\([\w.]+\) ", line)), None)
    return f"{type(exc).__name__}: {(driver or (lines[0] if lines else ''))[:200]}"


def exception_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain
