"""Stages the variants share: a stage complete elsewhere with the same fingerprint, read from the same upstream
files, is hard-linked into the variant's folder instead of run again."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ..errors import LockedError
from ..integrity import output_identity
from ..runner import STAGES, check_stage, read_manifest, replace_folder, run_lock, stage_module

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
        if check_stage(run_dir, name, current[name])[0] == "done":
            continue
        deps = stage_module(name).AFTER
        mine = {dep: output_identity(read_manifest(run_dir / dep) or {}) for dep in deps}
        for source in sources:
            if not source.is_dir() or source.resolve() == run_dir.resolve():
                continue
            try:
                with run_lock(source):  # never copy a folder while a pipeline is writing it
                    state, _, _ = check_stage(source, name, current[name])
                    if state != "done" or any(
                        output_identity(read_manifest(source / dep) or {}) != mine[dep] for dep in deps
                    ):
                        continue
                    link_stage(source / name, run_dir / name)
            except LockedError:
                log.info("[sweep] %s is in use by another pipeline; not reusing its stages", source)
                continue
            reused[name] = source
            log.info("[%s] reused from %s (same fingerprint %s)", name, source, current[name])
            break
    return reused
