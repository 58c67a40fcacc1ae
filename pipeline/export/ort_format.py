"""ORT format: the graphs ONNX Runtime Mobile loads, converted with onnxruntime's own tool, each checked
against its .onnx, plus the required_operators.config of a reduced build."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

from . import text_model, word_model
from .onnx_graph import onnx_logits

log = logging.getLogger("pipeline")


def convert_and_check(
    graphs: list[tuple[Path, np.ndarray]], split, pad: int, target_platform: str, out: Path, info: dict | None = None
) -> dict:
    """ORT-format twins of ``graphs`` ((.onnx path, its one-text-per-call logits on ``split``)) in ``out``, each
    checked against its .onnx (a disagreement is logged and recorded); added to ``info`` of an earlier call when
    given. The int8 graphs are converted beside the ExecuTorch lowering, the fp32 graph (when recommended) and the
    text-in model (:func:`convert_and_check_text`) once the recommended graph is chosen."""
    info = info or {"files": {}, **_settings(target_platform)}
    if graphs:
        info["files"].update(convert([path for path, _ in graphs], out, target_platform)["files"])
    for path, expected in graphs:
        ort_file = out / info["files"][path.name]
        agreement = float((onnx_logits(ort_file, split, pad).argmax(-1) == expected.argmax(-1)).mean())
        _record(info, ort_file, path, agreement)
    return info


def convert_and_check_text(
    info: dict, text: dict, onnx_labels: np.ndarray | None, records: list[dict], target_platform: str, out: Path
) -> dict:
    """The text-in model's ORT twin (when it is shipped) added to ``info`` of :func:`convert_and_check`, checked on
    the test texts one text per call against its .onnx (``onnx_labels``: the .onnx's labels, from its own check)."""
    if not text["shipped"]:
        return info
    assert onnx_labels is not None  # text_model.ship returns them with every shipped model
    text_path = out / text["file"]
    added = convert([text_path], out, target_platform, custom_op_library=text_model.extensions_library())
    info["files"].update(added["files"])
    ort_file = out / added["files"][text_path.name]
    agreement = float((text_model.run(ort_file, [record["text"] for record in records])[1] == onnx_labels).mean())
    _record(info, ort_file, text_path, agreement)
    text["ort_file"] = ort_file.name
    return info


def convert_and_check_words(
    info: dict, words: dict, onnx_labels: np.ndarray | None, records: list[dict], target_platform: str, out: Path
) -> dict:
    """The static student's word model's ORT twin (when it is shipped) added to ``info``, checked on the test texts
    one text per call against its .onnx (``onnx_labels``: the .onnx's labels, from its own check)."""
    if not words["shipped"]:
        return info
    assert onnx_labels is not None  # word_model.ship returns them with every shipped model
    path = out / words["file"]
    added = convert([path], out, target_platform, custom_op_library=text_model.extensions_library())
    info["files"].update(added["files"])
    ort_file = out / added["files"][path.name]
    texts = [record["text"] for record in records]
    agreement = float((word_model.run(ort_file, texts)[1] == onnx_labels).mean())
    _record(info, ort_file, path, agreement)
    words["ort_file"] = ort_file.name
    return info


def _record(info: dict, ort_file: Path, onnx_file: Path, agreement: float) -> None:
    info.setdefault("agreement_with_onnx", {})[ort_file.name] = agreement
    if agreement < 1.0:
        log.warning(
            "[export] %s disagrees with %s on %.2f%% of the test split",
            ort_file.name,
            onnx_file.name,
            100 * (1 - agreement),
        )


def merged_operators(first: str, second: str) -> str:
    """Two required_operators.config texts as one: the models of both in the header, and per (domain, opset) the
    union of the operators, in the converter's own order and format."""
    models: list[str] = []
    ops: dict[tuple[str, int], set[str]] = {}
    for text in (first, second):
        for line in text.splitlines():
            if line.startswith("# - "):
                models.append(line)
            elif line and not line.startswith("#"):
                domain, opset, names = line.split(";")
                ops.setdefault((domain, int(opset)), set()).update(names.split(","))
    body = [f"{domain};{opset};{','.join(sorted(ops[domain, opset]))}" for domain, opset in sorted(ops)]
    return "\n".join(["# Generated from model/s:", *sorted(models), *body]) + "\n"


def convert(
    models: list[Path], out_dir: Path, target_platform: str = "arm", custom_op_library: str | None = None
) -> dict:
    """ORT-format copies of ``models`` in ``out_dir`` plus one required_operators.config for all of them (and for
    the models of a config already in ``out_dir``, merged).

    The config lists the operators (and opsets) the models use: the input of an
    onnxruntime reduced build (build.sh --include_ops_by_config) for mobile.
    ``custom_op_library`` (the onnxruntime-extensions library) is needed when a
    model uses its operators (the text-in model); they appear in the config
    under the ai.onnx.contrib domain.
    """
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        work = Path(tmp) / "models"
        work.mkdir()
        for model in models:
            shutil.copy2(model, work / Path(model).name)
        chatter = io.StringIO()  # the converter prints progress lines and logs one INFO line
        logging.getLogger("ort_format_model.utils").setLevel(logging.WARNING)  # set to DEBUG at its import
        with contextlib.redirect_stdout(chatter):
            convert_onnx_models_to_ort(
                work,
                output_dir=Path(tmp) / "ort",
                optimization_styles=[OptimizationStyle.Fixed],
                target_platform=target_platform,
                custom_op_library_path=Path(custom_op_library) if custom_op_library else None,
            )
        produced = {}
        for model in models:
            ort_file = Path(tmp) / "ort" / (Path(model).name[: -len(".onnx")] + ".ort")
            shutil.move(str(ort_file), out_dir / ort_file.name)
            produced[Path(model).name] = ort_file.name
        config = (Path(tmp) / "ort" / "required_operators.config").read_text()
        # the converter lists each model by its path on this machine (a temporary folder): name the bundle's files instead
        config = re.sub(r"^# - .*/", "# - ", config, flags=re.M)
        earlier = out_dir / "required_operators.config"
        earlier.write_text(merged_operators(earlier.read_text(), config) if earlier.exists() else config)
    return {"files": produced, **_settings(target_platform)}


def _settings(target_platform: str) -> dict:
    """How the converter was run (metadata.json's ``ort_format`` beside the files)."""
    return {
        "config": "required_operators.config",
        "optimization_style": "Fixed",
        "optimization_level": "all",
        "target_platform": target_platform,
    }
