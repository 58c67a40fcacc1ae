"""The bundle's predict.py on bad input: one "error: ..." message naming the bad value
and what is expected, exit 2, no traceback; a model whose sha256 is not the one in
metadata.json draws a warning, or with --verify an error.

Most cases call the bundle's own predict.py ``main(argv)`` in this process (the
script's start-up, ~1-2 s, is onnxruntime and tokenizers imports); an uncaught
exception is printed as the interpreter would, so "no traceback" still means
something. The --verify cases run the script as users do, in a subprocess.
Bundles come from the session's tiny run and are copied before any damage.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def exported(finished_run, tmp_path_factory) -> Path:
    """A copy of the tiny run's bundle, for the cases that damage nothing."""
    copy = tmp_path_factory.mktemp("predict") / "bundle"
    shutil.copytree(finished_run["run_dir"] / "export" / "bundle", copy)
    return copy


@pytest.fixture
def bundle(exported, tmp_path) -> Path:
    """This test's own copy of the bundle, free to damage."""
    copy = tmp_path / "bundle"
    shutil.copytree(exported, copy)
    return copy


def predict(bundle: Path, *args: str) -> Result:
    """``python predict.py --bundle BUNDLE ARGS`` in-process: exit code and output as the interpreter would give them."""
    spec = importlib.util.spec_from_file_location("bundle_predict", bundle / "predict.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = module.main(["--bundle", str(bundle), *args])
        except SystemExit as exc:  # argparse; SystemExit("message") prints the message and exits 1
            code = exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except Exception:
            traceback.print_exc()
            code = 1
    return Result(code, out.getvalue(), err.getvalue())


def predict_process(bundle: Path, *args: str) -> Result:
    proc = subprocess.run(
        [sys.executable, str(bundle / "predict.py"), *args], cwd=bundle, capture_output=True, text=True, timeout=120
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_error(result: Result, *phrases: str, code: int = 2) -> None:
    assert result.returncode == code, f"exit {result.returncode}, stderr:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("error:") == 1 and not result.stdout, result.stderr[-3000:]
    for phrase in phrases:
        assert phrase in result.stderr, f"{phrase!r} not in:\n{result.stderr}"


@pytest.mark.parametrize(
    "args, phrases",
    [
        (["--batch-size", "0"], ["argument --batch-size: expected a positive integer, got '0'"]),
        (["--batch-size", "-1"], ["argument --batch-size: expected a positive integer, got '-1'"]),
        (["--threads", "0"], ["argument --threads: expected a positive integer, got '0'"]),
        (["--threads", "-2"], ["argument --threads: expected a positive integer, got '-2'"]),
        (
            ["--model", "nope.onnx"],
            [
                "nope.onnx does not exist",
                "this bundle's models: model.int8.onnx, model.int8.ort, model.int8.static.onnx, "
                "model.int8.static.ort, model.onnx",
            ],
        ),
        (["--model", "labels.json"], ["labels.json is not an ONNX or ORT-format model"]),
    ],
    ids=["batch-size-0", "batch-size-negative", "threads-0", "threads-negative", "missing-model", "model-not-onnx"],
)
def test_bad_arguments(exported, args, phrases):
    assert_error(predict(exported, *args, "a fine film"), *phrases)


def test_bundle_folder_missing(tmp_path, exported):
    result = predict(exported, "--bundle", str(tmp_path / "nowhere"), "a fine film")  # the last --bundle wins
    assert_error(result, f"bundle folder {tmp_path / 'nowhere'} does not exist")


def test_model_of_garbage_bytes(bundle):
    (bundle / "model.onnx").write_bytes(bytes(range(256)) * 8)
    assert_error(
        predict(bundle, "--model", "model.onnx", "a fine film"),
        "model.onnx is not an ONNX or ORT-format model",
        "its sha256 differs from metadata.json",
    )


@pytest.mark.parametrize("name", ["metadata.json", "labels.json", "tokenizer.json"])
@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_damaged_bundle_file(bundle, name, damage):
    if damage == "missing":
        (bundle / name).unlink()
    else:
        (bundle / name).write_text('{"cut off', encoding="utf-8")
    expected = (
        "is missing"
        if damage == "missing"
        else "is not a tokenizers file"
        if name == "tokenizer.json"
        else "is not readable JSON"
    )
    assert_error(predict(bundle, "a fine film"), f"{name} {expected}", "re-download or re-export the bundle")


EVAL_CASES = {  # content, phrases (PATH: the file's path)
    "not-json-line": (
        '{"text": "fine", "label": "fresh"}\n\n{"text": "dull", "label": \n',
        ["--eval file PATH line 3 is not JSON", '{"text": <string>, "label": <label name>}'],
    ),
    "no-text": ('{"label": "fresh"}\n', ['--eval file PATH line 1 has no "text"']),
    "no-label": ('{"text": "fine"}\n', ['--eval file PATH line 1 has no "label"']),
    "number-text": ('{"text": 3, "label": "fresh"}\n', ['--eval file PATH line 1 has a number as "text"']),
    "unknown-label": (
        '{"text": "fine", "label": "fresh"}\n{"text": "meh", "label": "lukewarm"}\n',
        ["labels ['lukewarm'] in the --eval file are not in labels.json", "['fresh', 'rotten']"],
    ),
    "empty-file": ("", ["--eval file PATH has no records"]),
}


@pytest.mark.parametrize("case", list(EVAL_CASES))
def test_bad_eval_file(exported, tmp_path, case):
    content, phrases = EVAL_CASES[case]
    path = tmp_path / "records.jsonl"
    path.write_text(content, encoding="utf-8")
    assert_error(predict(exported, "--eval", str(path)), *(p.replace("PATH", str(path)) for p in phrases))


def test_eval_file_missing_or_not_utf8(exported, tmp_path):
    assert_error(
        predict(exported, "--eval", str(tmp_path / "none.jsonl")),
        f"--eval file {tmp_path / 'none.jsonl'} does not exist",
    )
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"text": "caf\u00e9", "label": "fresh"}\n'.encode("latin-1"))
    assert_error(predict(exported, "--eval", str(latin)), f"--eval file {latin} is not UTF-8 text")


def test_changed_model_warns_by_default_and_fails_with_verify(bundle):
    shutil.copy(bundle / "model.int8.onnx", bundle / "model.onnx")  # a loadable model, just not the exported one
    args = ("--model", "model.onnx", "a fine film")
    warned = predict_process(bundle, *args)
    assert warned.returncode == 0 and "Traceback" not in warned.stderr, warned.stderr
    assert json.loads(warned.stdout)["text"] == "a fine film"
    assert warned.stderr.startswith("warning: model.onnx has sha256 ") and warned.stderr.count("\n") == 1
    assert "--verify makes this an error" in warned.stderr
    assert_error(
        predict_process(bundle, "--verify", *args),
        "error: --verify: model.onnx has sha256",
        "but metadata.json records",
        "the file changed after export",
    )


def test_verify_passes_an_intact_bundle_and_names_an_unlisted_model(bundle, tmp_path):
    # An empty text is valid input: it is classified as "[CLS] [SEP]".
    ok = predict_process(bundle, "--verify", "")
    assert ok.returncode == 0 and not ok.stderr, ok.stderr
    assert json.loads(ok.stdout)["text"] == ""
    outside = tmp_path / "elsewhere.onnx"
    shutil.copy(bundle / "model.onnx", outside)
    assert_error(
        predict(bundle, "--verify", "--model", str(outside), "a fine film"),
        f"--verify: metadata.json records no sha256 for {outside}",
    )


def test_metadata_naming_a_file_outside_the_bundle_is_refused(bundle, tmp_path):
    """predict.py loads only the bundle's own files as metadata.json names them, and --verify checks only those."""
    shutil.copy(bundle / "model.onnx", tmp_path / "x.onnx")
    metadata = json.loads((bundle / "metadata.json").read_text())
    recommended = metadata["recommended"]
    metadata["variants"][recommended]["file"] = "../x.onnx"
    metadata["files"]["../x.onnx"] = metadata["files"]["model.onnx"]
    (bundle / "metadata.json").write_text(json.dumps(metadata))
    assert_error(
        predict(bundle, "a fine film"),
        "metadata.json names '../x.onnx' as the recommended model",
        "not a file inside the bundle folder",
        "refusing to load it",
    )
    assert_error(
        predict_process(bundle, "--verify"), "--verify: metadata.json lists '../x.onnx', outside the bundle folder"
    )


def test_verify_names_a_model_file_the_export_did_not_write(bundle):
    shutil.copy(bundle / "model.onnx", bundle / "extra.onnx")
    assert_error(
        predict_process(bundle, "--verify"), "--verify: extra.onnx in", "is a file metadata.json does not list"
    )


def test_a_pair_for_a_single_text_model_is_refused(exported, tmp_path):
    assert json.loads((exported / "metadata.json").read_text())["text_pairs"] is False
    assert_error(predict(exported, "a fine film", "--pair", "another"), "classifies single texts", "drop it")
    records = tmp_path / "pairs.jsonl"
    records.write_text('{"text": "a fine film", "text_pair": "b", "label": "fresh"}\n')
    assert_error(predict(exported, "--eval", str(records)), "classifies single texts")


def test_bytes_that_are_not_utf8_become_the_replacement_character(exported):
    """A shell passes bytes; Python keeps invalid ones as lone surrogates, which used to end in a traceback."""
    text = b"bad \xff\xfe bytes".decode("utf-8", "surrogateescape")
    result = predict(exported, text)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    line = json.loads(result.stdout)
    assert line["text"] == "bad \ufffd\ufffd bytes"
    reference = predict(exported, "bad \ufffd\ufffd bytes")
    assert json.loads(reference.stdout)["probabilities"] == line["probabilities"]
