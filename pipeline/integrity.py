"""Results follow their inputs, and outputs are what their manifest says.

Two kinds of digest:

* input digests, part of a stage's fingerprint: the local files a stage reads
  (the data file, a local teacher / tokenizer / student folder). Editing the
  data file changes prepare's fingerprint, so it and everything after rerun.
* output digests, listed in each stage's manifest: every file the stage wrote,
  with its size and sha256. The runner and `status` verify them, and a
  missing, truncated or altered file reruns that stage and what depends on it.

Hashing is the slow part (a 90 MB model folder, a GB-sized cache), so a file
is re-hashed only when its size or modification time changed: input digests
are remembered in ``<runs>/.digests.json``, output digests carry the mtime
they were taken at.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("pipeline")

MANIFEST = "manifest.json"
_SKIP_NAMES = {MANIFEST, "__pycache__", ".fingerprint"}
# A stage's resume state (pipeline.training's ``checkpoints-<tag>`` folders: weights, optimizer, RNG): needed only while
# the stage is partial, so the runner deletes it when the stage completes (2.9 GB per base-size teacher trained).
# Manifests written before that listed it: it is not an output, and its absence does not damage a stage.
RESUME_STATE_PREFIX = "checkpoints-"


def is_resume_state(name: str) -> bool:
    """Whether ``name`` (a path relative to a stage's folder) lies in the stage's resume state."""
    return name.startswith(RESUME_STATE_PREFIX)


def discard_resume_state(folder: Path) -> int:
    """Delete ``folder``'s resume state (a completed stage's checkpoints); returns the bytes freed."""
    freed = 0
    for state in folder.glob(RESUME_STATE_PREFIX + "*"):
        if state.is_dir():
            freed += sum(f.stat().st_size for f in state.rglob("*") if f.is_file())
            shutil.rmtree(state, ignore_errors=True)
    return freed


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


class DigestCache:
    """sha256 of files keyed by (path, size, mtime); persisted as JSON when given a path."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else None
        self.entries: dict[str, dict] = {}
        self.dirty = False
        if self.path and self.path.is_file():
            try:
                self.entries = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self.entries = {}  # a damaged cache only costs re-hashing

    def digest(self, path: Path) -> str:
        path = Path(path).resolve()
        stat = path.stat()
        key, known = str(path), self.entries.get(str(path))
        if known and known["size"] == stat.st_size and known["mtime_ns"] == stat.st_mtime_ns:
            return known["sha256"]
        value = sha256_file(path)
        self.entries[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": value}
        self.dirty = True
        return value

    def save(self) -> None:
        if not (self.path and self.dirty):
            return
        try:
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.entries))
            os.replace(tmp, self.path)
            self.dirty = False
        except OSError as exc:  # a read-only runs folder: digests are recomputed next time
            log.debug("digest cache not saved: %s", exc)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not _SKIP_NAMES & set(p.relative_to(folder).parts))


def path_digest(path: Path, cache: DigestCache) -> str:
    """Digest of a file, or of a folder's files (names and contents)."""
    path = Path(path)
    if path.is_file():
        return cache.digest(path)
    digest = hashlib.sha256()
    for file in _files(path):
        digest.update(f"{file.relative_to(path).as_posix()}\0{cache.digest(file)}\n".encode())
    return digest.hexdigest()


# ------------------------------------------------------------------ outputs


def output_listing(folder: Path) -> dict[str, dict]:
    """Every file a stage wrote: relative path -> bytes, sha256, mtime_ns (for cheap re-checks)."""
    listing = {}
    for file in _files(folder):
        stat = file.stat()
        listing[file.relative_to(folder).as_posix()] = {
            "bytes": stat.st_size,
            "sha256": sha256_file(file),
            "mtime_ns": stat.st_mtime_ns,
        }
    return listing


def damaged_outputs(folder: Path, listing: dict[str, dict] | None) -> tuple[list[str], bool]:
    """(what no longer matches a stage's output listing, as short phrases; whether ``listing`` was refreshed).

    Size first (truncation, a missing file); the content is re-hashed only when
    the modification time moved, so an untouched folder costs one stat per file.
    A file whose mtime moved but whose content matches (a copied runs folder)
    gets its new mtime in ``listing``, so the caller can save it and not hash again.
    """
    if listing is None:
        return [], False  # manifests written before output listings existed
    problems, refreshed = [], False
    for name, expected in listing.items():
        path = folder / name
        if is_resume_state(name):  # an older manifest's checkpoints: deleted on completion since
            continue
        if not path.is_file():
            problems.append(f"{name} is missing")
            continue
        stat = path.stat()
        if stat.st_size != expected["bytes"]:
            problems.append(f"{name} has {stat.st_size} bytes, {expected['bytes']} were written")
        elif stat.st_mtime_ns != expected.get("mtime_ns"):
            if sha256_file(path) != expected["sha256"]:
                problems.append(f"{name} was modified after the stage wrote it")
            else:
                expected["mtime_ns"], refreshed = stat.st_mtime_ns, True
    return problems, refreshed


def output_identity(manifest: dict, ignored: tuple[str, ...] = ()) -> str:
    """A digest of what a stage produced (its files' contents): a later stage records it for each stage it read.
    ``ignored``: path prefixes of files that reader never reads (left out of the digest)."""
    outputs = manifest.get("outputs")
    if outputs is None:
        return f"{manifest.get('fingerprint')}@{manifest.get('completed_at')}"
    kept = sorted((k, v["sha256"]) for k, v in outputs.items() if not k.startswith(ignored))
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:16]
