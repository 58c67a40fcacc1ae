"""The bundle's plain files: templates from pipeline/bundle_files, predict.py, the browser demo, the sha256
table of metadata.json, and the registered MLflow model."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import warnings
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from pathlib import Path

import numpy as np
import onnx

from ..integrity import sha256_file
from .onnx_graph import INPUT_NAMES, OUTPUT_NAMES

BUNDLE_TEMPLATES = Path(__file__).resolve().parent.parent / "bundle_files"


def render_template(name: str, values: dict) -> str:
    """A file from pipeline/bundle_files with {{key}} placeholders filled (Kotlin/Swift braces stay intact)."""
    text = (BUNDLE_TEMPLATES / name).read_text(encoding="utf-8")
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    left = re.findall(r"\{\{(\w+)\}\}", text)
    if left:
        raise KeyError(f"template {name} has unfilled placeholders: {sorted(set(left))}")
    return text


def copy_predict_script(target: Path) -> None:
    shutil.copy2(BUNDLE_TEMPLATES / "predict.py", target)


# The browser demo's runtime: installed by `npm ci --ignore-scripts` in pipeline/bundle_files/web (package-lock.json).
WEB_RUNTIME = BUNDLE_TEMPLATES / "web" / "node_modules"


WEB_FILES = {  # file in the bundle's demo/ folder: where it comes from
    "ort.wasm.min.mjs": "onnxruntime-web/dist/ort.wasm.min.mjs",
    "ort-wasm-simd-threaded.mjs": "onnxruntime-web/dist/ort-wasm-simd-threaded.mjs",
    "ort-wasm-simd-threaded.wasm": "onnxruntime-web/dist/ort-wasm-simd-threaded.wasm",
    "tokenizers.min.mjs": "@huggingface/tokenizers/dist/tokenizers.min.mjs",
}


def write_demo(out: Path, title: str, model_file: str, max_length: int) -> dict:
    """demo.html (type a sentence, see the label and probabilities) and the onnxruntime-web and tokenizer files it
    runs on, in ``out``/demo/; without the installed web runtime, nothing is written and the reason is returned."""
    missing = [source for source in WEB_FILES.values() if not (WEB_RUNTIME / source).is_file()]
    if missing:
        return {
            "shipped": False,
            "why": (
                f"the browser runtime is not installed ({', '.join(missing)} missing under "
                f"{WEB_RUNTIME}); run `npm ci --ignore-scripts` in {WEB_RUNTIME.parent} and "
                "export again to get demo.html"
            ),
        }
    demo = Path(out) / "demo"
    demo.mkdir()
    for name, source in WEB_FILES.items():
        shutil.copy2(WEB_RUNTIME / source, demo / name)
    (Path(out) / "demo.html").write_text(
        render_template("demo.html", {"title": title, "model_file": model_file, "max_length": max_length}),
        encoding="utf-8",
    )
    versions = {
        package: json.loads((WEB_RUNTIME / package / "package.json").read_text())["version"]
        for package in ("onnxruntime-web", "@huggingface/tokenizers")
    }
    return {
        "shipped": True,
        "file": "demo.html",
        "model": model_file,
        "runtime": versions,
        "files": ["demo.html", *(f"demo/{name}" for name in WEB_FILES)],
        "bytes": sum((demo / name).stat().st_size for name in WEB_FILES),
        "serve": "python -m http.server (in the bundle folder), then open http://127.0.0.1:8000/demo.html",
    }


def file_table(folder: Path, skip: tuple[str, ...] = ("metadata.json",)) -> dict:
    """{file: {sha256, bytes}} for every file in the bundle folder (and its demo/ folder, as "demo/<name>") except ``skip``."""
    folder = Path(folder)
    return {
        p.relative_to(folder).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.relative_to(folder).as_posix() not in skip
    }


def package_version(package: str) -> str:
    """The installed version of ``package`` (metadata.json "runtime"), "unknown" when it is not installed."""
    try:
        return installed_version(package)
    except PackageNotFoundError:
        return "unknown"


def register_onnx(model_path: Path, run_id: str, registered_name: str, alias: str, tags: dict) -> dict:
    """Log the ONNX graph as an MLflow model under ``run_id``, register it, point ``alias`` at the new version."""
    import mlflow  # seconds to import, and only a tracked export registers: imported here
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    signature = ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.int64), (-1, -1), name) for name in INPUT_NAMES]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, -1), OUTPUT_NAMES[0])]),
    )
    active = mlflow.active_run()
    context = contextlib.nullcontext() if active and active.info.run_id == run_id else mlflow.start_run(run_id=run_id)
    with context, warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):  # "Created version ..." lines
        warnings.simplefilter("ignore")
        info = mlflow.onnx.log_model(
            onnx.load(str(model_path)),
            name="onnx_model",
            registered_model_name=registered_name,
            save_as_external_data=False,
            signature=signature,
            # what MLflow infers by loading the model in a child process (3-5 s an export), given; it adds mlflow
            pip_requirements=[
                f"{package}=={installed_version(package)}" for package in ("numpy", "onnx", "onnxruntime")
            ],
        )
    version = str(info.registered_model_version)
    client = mlflow.MlflowClient()
    client.set_registered_model_alias(registered_name, alias, version)
    for key, value in tags.items():
        client.set_model_version_tag(registered_name, version, key, str(value))
    return {"registered_model": registered_name, "version": version, "alias": alias, "model_uri": info.model_uri}
