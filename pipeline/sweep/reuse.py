"""Stages the variants share: a stage complete elsewhere with the same fingerprint, read from the same upstream
files, is hard-linked into the variant's folder instead of run again."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import LockedError
from ..runner import STAGES, check_stage, read_identity, read_manifest, replace_folder, run_lock, stage_module

log = logging.getLogger("pipeline")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links refused: a copy (mtime kept, so the manifest check passes)
        shutil.copy2(src, dst)


def link_stage(source: Path, target: Path) -> None:
    """Put a hard-linked copy of the complete stage folder ``source`` at ``target``, atomically."""
    staging = target.with_name(f".{target.name}.linking")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, copy_function=_link_or_copy, symlinks=True)
    replace_folder(staging, target)


def reuse_stages(run_dir: Path, current: dict[str, str], sources: list[Path]) -> dict[str, Path]:
    """Link into ``run_dir`` every stage it lacks that a source folder has complete with the same fingerprint.

    A stage is taken from a source only when the upstream outputs it read there are the same files
    as the ones in ``run_dir`` (compared by their recorded identity), so a linked stage is exactly
    what the runner would have produced here. Returns stage -> the folder it came from.
    """
    reused: dict[str, Path] = {}
    for name in STAGES:
        source = reuse_stage(run_dir, name, current, sources)
        if source is not None:
            reused[name] = source
    return reused


def reuse_stage(run_dir: Path, name: str, current: dict[str, str], sources: list[Path]) -> Path | None:
    """Link stage ``name`` into ``run_dir`` from the first source that has it complete with the same fingerprint and
    read the same upstream files (see reuse_stages); the source, or None (also when ``run_dir`` has it done)."""
    if check_stage(run_dir, name, current[name])[0] == "done":
        return None
    deps = stage_module(name).AFTER
    mine = {dep: read_identity(name, dep, read_manifest(run_dir / dep) or {}) for dep in deps}
    for source in sources:
        if not source.is_dir() or source.resolve() == run_dir.resolve():
            continue
        try:
            with run_lock(source):  # never copy a folder while a pipeline is writing it
                state, _, _ = check_stage(source, name, current[name])
                if state != "done" or any(
                    read_identity(name, dep, read_manifest(source / dep) or {}) != mine[dep] for dep in deps
                ):
                    continue
                link_stage(source / name, run_dir / name)
        except LockedError:
            log.info("[sweep] %s is in use by another pipeline; not reusing its stages", source)
            continue
        log.info("[%s] reused from %s (same fingerprint %s)", name, source, current[name])
        return source
    return None


@dataclass(frozen=True)
class StageReuse:
    """What a variant's pipeline asks before it runs a stage (run_pipeline's ``reuse``): can a finished copy be
    linked instead? Before the variant starts, only stages whose upstream is linked too can be; a stage after one
    that had to run here (prepare with data.unlabeled_text, which the teacher does not read) only once it has run."""

    run_dir: Path
    sources: tuple[Path, ...]

    def __call__(self, name: str, current: dict[str, str]) -> bool:
        return reuse_stage(self.run_dir, name, current, list(self.sources)) is not None
