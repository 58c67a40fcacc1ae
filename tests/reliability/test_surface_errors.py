"""Bad input on the surfaces added since the first reliability pass (issue 42): the multi-node launcher, the bundle's
--verify and damaged model files, the static student's config, optional ExecuTorch, the baselines stage's library
errors and its fastText workers. Each case: one paragraph naming the bad value and what is expected, the documented
exit code, no traceback, no process left behind.

Most cases need no pipeline run: the launcher runs with --dry-run, the bundle cases use a small bundle written here
(a two-input ONNX graph, a word-level tokenizer and metadata.json as the export writes it), the config cases only
validate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT


# ---------------------------------------------------------------- launcher


def launch(capsys, *args: str) -> tuple[int, str, str]:
    """``python -m pipeline.launch ARGS`` in this process (always with --dry-run: nothing is started)."""
    from pipeline.launch import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args, says", [
    (["--node-rank", "1"], "NODE_RANK=1 was given with NNODES=1"),
    (["--node-rank", "1", "--master-addr", "10.0.0.1"], "NODE_RANK=1 and MASTER_ADDR=10.0.0.1 were given with NNODES=1"),
    (["--master-addr", "10.0.0.1"], "MASTER_ADDR=10.0.0.1 was given with NNODES=1"),
    (["--nproc", "2", "--master-addr", "node0.cluster.example"], "MASTER_ADDR=node0.cluster.example was given"),
], ids=["rank", "rank-and-address", "address", "address-several-processes"])
def test_node_settings_without_several_nodes_are_refused(capsys, args, says):
    """The node that forgot NNODES=2 used to run a whole single-node job of its own."""
    code, out, err = launch(capsys, "--nnodes", "1", *args, "--dry-run", "--", "tiny")
    assert code == 2, err
    assert says in err and "give NNODES=<nodes> on every node" in err
    assert err.strip().startswith("error:") and err.strip().count("\n") == 0  # one paragraph
    assert "launch:" not in err and not out  # nothing started


def test_one_node_naming_itself_is_a_plain_run(capsys):
    """A one-node Slurm allocation or Kubernetes job exports MASTER_ADDR naming the node itself: that is consistent."""
    import socket

    for address in ("localhost", "127.0.0.1", socket.gethostname()):
        code, _, err = launch(capsys, "--master-addr", address, "--dry-run", "--", "tiny", "--runs-dir", "r")
        assert code == 0, err
        assert err.strip().endswith("-m pipeline run tiny --runs-dir r"), err
        assert "accelerate" not in err  # one process: the plain run `make distill` starts


@pytest.mark.pipeline  # runs `make -n` (a subprocess; nothing is built or run)
def test_make_distill_sends_node_settings_to_the_launcher():
    """`make distill NODE_RANK=1 MASTER_ADDR=...` with NNODES left at 1 used to bypass the launcher's checks."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MASTER_ADDR",
                                                            "NODE_RANK", "NNODES", "NPROC")}

    def dry(*settings):
        result = subprocess.run(["make", "-n", "-o", ".venv/.installed", "distill", "CONFIG=tiny", *settings], cwd=ROOT,
                                env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return " ".join(result.stdout.replace("\\\n", " ").split())

    assert "pipeline.launch" not in dry()
    assert '-m pipeline.launch --nproc "1" --nnodes "1" --node-rank "1"' in dry("NODE_RANK=1")
    assert '--master-addr "10.0.0.1"' in dry("MASTER_ADDR=10.0.0.1")


# ---------------------------------------------------------------- the bundle's predict.py


def write_small_bundle(folder: Path) -> Path:
    """A bundle as the export writes it, small: predict.py, a word-level tokenizer, labels, a two-input ONNX graph
    (logits = +-sum of the ids under the mask) and metadata.json with every file's sha256 (pipeline.export.files)."""
    import onnx
    from onnx import TensorProto, helper
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from pipeline.export.files import file_table

    folder.mkdir(parents=True)
    shutil.copy(ROOT / "pipeline" / "bundle_files" / "predict.py", folder / "predict.py")
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "good": 4, "bad": 5}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                             special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "labels.json").write_text(json.dumps({"0": "fresh", "1": "rotten"}))
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["ids"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["ids", "mask"], ["kept"]),
         helper.make_node("ReduceSum", ["kept", "axis"], ["total"], keepdims=1),
         helper.make_node("Neg", ["total"], ["negative"]),
         helper.make_node("Concat", ["total", "negative"], ["logits"], axis=1)],
        "small", [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "length"])
                  for name in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor("axis", TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "model.onnx")
    shutil.copy(folder / "model.onnx", folder / "model.int8.onnx")
    metadata = {"max_length": 16, "tokenizer": {"special_tokens": {"pad": {"token": "[PAD]", "id": 0}}},
                "recommended": "onnx_fp32", "text_pairs": False,
                "variants": {"onnx_fp32": {"file": "model.onnx"}, "onnx_int8": {"file": "model.int8.onnx"}},
                "files": file_table(folder)}
    (folder / "metadata.json").write_text(json.dumps(metadata, indent=1))
    return folder


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory) -> Path:
    return write_small_bundle(tmp_path_factory.mktemp("surface") / "bundle")


@pytest.fixture
def bundle(small_bundle, tmp_path) -> Path:
    """This test's own copy of the small bundle, free to change."""
    shutil.copytree(small_bundle, tmp_path / "bundle")
    return tmp_path / "bundle"


def predict(bundle: Path, *args: str):
    """The bundle's predict.py ``main(argv)`` in this process (tests/reliability/test_predict_errors.py's way)."""
    from tests.reliability.test_predict_errors import predict as predict_in_process

    return predict_in_process(bundle, *args)


def assert_one_error(result, *phrases: str, code: int = 2) -> str:
    assert result.returncode == code, f"exit {result.returncode}, stderr:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr and not result.stdout, result.stderr[-3000:]
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr[-3000:]
    for phrase in phrases:
        assert phrase in result.stderr, f"{phrase!r} not in:\n{result.stderr}"
    return result.stderr


def test_the_small_bundle_classifies_and_verifies(bundle):
    """The bytecode Python writes for the listed predict.py (an app importing it) is not a stray file; other
    bytecode is."""
    import importlib.util
    import py_compile

    py_compile.compile(str(bundle / "predict.py"), cfile=importlib.util.cache_from_source(str(bundle / "predict.py")))
    assert list((bundle / "__pycache__").glob("predict.*.pyc"))
    result = predict(bundle, "--verify", "good bad good")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["label"] == "fresh"
    shutil.copy(next((bundle / "__pycache__").glob("predict.*.pyc")), bundle / "__pycache__" / "sitecustomize.cpython-311.pyc")
    assert_one_error(predict(bundle, "--verify"), "__pycache__/sitecustomize.cpython-311.pyc in")


@pytest.mark.parametrize("stray", ["model.int8.onnx.new", "notes.txt", ".hidden", "demo/extra.js", "model.onnx.bak"])
def test_verify_names_every_file_metadata_does_not_list(bundle, stray):
    """--verify used to pass a bundle holding a stray file unless its name ended in .onnx, .ort or .pte."""
    (bundle / stray).parent.mkdir(exist_ok=True)
    shutil.copy(bundle / "model.onnx", bundle / stray)
    assert_one_error(predict(bundle, "--verify"), f"--verify: {stray} in {bundle} is a file metadata.json does not list",
                     "remove it or re-download or re-export the bundle")


def test_verify_names_all_the_unlisted_files_at_once(bundle):
    for name in ("model.int8.onnx.new", "zz.txt"):
        (bundle / name).write_text("x")
    assert_one_error(predict(bundle, "--verify", "good"), "--verify: model.int8.onnx.new, zz.txt in",
                     "are files metadata.json does not list")
