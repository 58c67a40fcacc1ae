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

from . import text_model
from .onnx_graph import onnx_logits

log = logging.getLogger("pipeline")


def convert_and_check(
    graphs: list[tuple[Path, np.ndarray]],
    split,
    pad: int,
    text: dict,
    records: list[dict],
    target_platform: str,
    out: Path,
) -> dict:
    """ORT-format twins of ``graphs`` ((.onnx path, its one-text-per-call logits on ``split``)) and of the text-in
    model when it is shipped, in ``out``; each must agree with its .onnx (a disagreement is logged and recorded)."""
    text_path = out / text["file"] if text["shipped"] else None
    info = convert(
        [path for path, _ in graphs] + ([text_path] if text_path else []),
        out,
        target_platform,
        custom_op_library=text_model.extensions_library() if text_path else None,
    )
    for path, expected in graphs:
        ort_file = out / info["files"][path.name]
        agreement = float((onnx_logits(ort_file, split, pad).argmax(-1) == expected.argmax(-1)).mean())
        info.setdefault("agreement_with_onnx", {})[ort_file.name] = agreement
        if agreement < 1.0:
            log.warning(
                "[export] %s disagrees with %s on %.2f%% of the test split",
                ort_file.name,
                path.name,
                100 * (1 - agreement),
            )
    if text_path:
        texts = [record["text"] for record in records]
        ort_file = out / info["files"][text_path.name]
        agreement = float((text_model.run(ort_file, texts)[1] == text_model.run(text_path, texts)[1]).mean())
        info.setdefault("agreement_with_onnx", {})[ort_file.name] = agreement
        text["ort_file"] = ort_file.name
        if agreement < 1.0:
            log.warning(
                "[export] %s disagrees with %s on %.2f%% of the test split",
                ort_file.name,
                text_path.name,
                100 * (1 - agreement),
            )
    return info


def convert(
    models: list[Path], out_dir: Path, target_platform: str = "arm", custom_op_library: str | None = None
) -> dict:
    """ORT-format copies of ``models`` in ``out_dir`` plus one required_operators.config for all of them.

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
        (out_dir / "required_operators.config").write_text(re.sub(r"^# - .*/", "# - ", config, flags=re.M))
    return {
        "files": produced,
        "config": "required_operators.config",
        "optimization_style": "Fixed",
        "optimization_level": "all",
        "target_platform": target_platform,
    }
