"""bench/gpu_throughput.py (issue 17): the GPU throughput script, run here in its --smoke form on the CPU.

One smoke run (tiny random model, batches 2 and 4, length 16) is shared by the tests; they check its structure,
the product behaviour it reports (the SDPA op that ran, whether a mask was passed) and the model-FLOPs formula
against a hand computation. No assertion looks at how fast anything was.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_throughput.py"
STAGES = ("teacher", "capture", "distill-cached", "distill-online")
KINDS = ("full", "padded")
PRECISIONS = ("fp32", "bf16", "fp16")
BATCHES = (2, 4)
LENGTH = 16


def _module():
    spec = importlib.util.spec_from_file_location("gpu_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_throughput")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--budget-seconds", "0", "--out", str(out)],  # structure: no budget
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return {
        "json": json.loads((out / "gpu_throughput.json").read_text()),
        "md": (out / "gpu_throughput.md").read_text(),
        "stdout": result.stdout,
    }


def bert_forward(hidden, layers, ffn, labels, batch, length):
    """Forward FLOPs of a BERT classifier counted by hand: per token the encoder's Q, K, V, O (4 H^2) and FFN
    (2 H F) weights, per sequence the pooler (H^2) and classifier (H C), attention 4 L^2 H per layer."""
    per_token = layers * (4 * hidden * hidden + 2 * hidden * ffn)
    per_sequence = hidden * hidden + hidden * labels
    return 2 * per_token * batch * length + 2 * per_sequence * batch + 4 * length**2 * hidden * layers * batch


def test_forward_flops_match_a_hand_count():
    from transformers import BertConfig, BertForSequenceClassification

    gt = _module()
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            num_labels=3,
        )
    )
    assert gt.forward_flops(model, 3, 16) == bert_forward(32, 2, 64, 3, 3, 16)
    student = BertForSequenceClassification(
        BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
            num_labels=3,
        )
    )
    f_t, f_s = bert_forward(32, 2, 64, 3, 5, 8), bert_forward(32, 1, 64, 3, 5, 8)
    assert gt.stage_flops("teacher", model, student, 5, 8) == 3 * f_t
    assert gt.stage_flops("capture", model, student, 5, 8) == f_t
    assert gt.stage_flops("distill-cached", model, student, 5, 8) == 3 * f_s
    assert gt.stage_flops("distill-online", model, student, 5, 8) == f_t + 3 * f_s


def test_peaks_by_device_name():
    gt = _module()
    assert gt.device_peaks("NVIDIA H200")["bf16"] == 989.0
    assert gt.device_peaks("NVIDIA H100 80GB HBM3")["tf32"] == 494.0
    assert gt.device_peaks("NVIDIA H100 PCIe")["bf16"] == 756.0  # not the SXM figure
    assert gt.device_peaks("NVIDIA A100-SXM4-80GB")["fp32"] == 19.5
    assert gt.device_peaks("CPU (x86_64)") is None and gt.peak_tflops(None, "bf16") == (None, None)


def test_every_row_is_a_figure_or_an_error(smoke):
    import torch

    rows = smoke["json"]["rows"]
    keys = [(r["stage"], r["kind"], r["batch"], r["precision"]) for r in rows]
    assert sorted(keys) == sorted(itertools.product(STAGES, KINDS, BATCHES, PRECISIONS))
    for r in rows:
        if r.get("error"):
            assert isinstance(r["error"], str) and r["error"].strip()
            continue
        s = r["samples_per_s"]
        assert 0 < s["min"] <= s["median"] <= s["max"] and s["n"] == 2
        assert r["step_ms"]["median"] > 0 and r["flops_per_step"] > 0 and r["tflops"] > 0
        assert r["padded"] is (r["kind"] == "padded")
        assert r["peak_memory_bytes"] > 0
    assert all("error" not in r for r in rows if r["precision"] == "fp32"), [r["error"] for r in rows if "error" in r]
    if not torch.cuda.is_available():  # the runner refuses fp16 without CUDA; fp32 and bf16 must have run
        odd = [r for r in rows if ("error" in r) != (r["precision"] == "fp16")]
        assert not odd, [(r["stage"], r["kind"], r["batch"], r["precision"], r.get("error")) for r in odd]
        assert all("fp16" in r["error"] for r in rows if r["precision"] == "fp16")
        assert all(r["mfu"] is None for r in rows if "error" not in r)  # no made-up peak for a CPU
        assert all("ru_maxrss" in r["memory_kind"] for r in rows if "error" not in r)


def test_flops_in_the_results_follow_the_formula(smoke):
    data = smoke["json"]
    t = data["teacher"]
    for r in data["rows"]:
        if r["stage"] == "teacher" and "error" not in r:
            assert r["flops_per_step"] == 3 * bert_forward(t["hidden"], t["layers"], t["ffn"], 2, r["batch"], LENGTH)
            assert r["tflops"] == pytest.approx(r["flops_per_step"] / (r["step_ms"]["median"] / 1000) / 1e12)


def test_sdpa_op_reported_with_and_without_padding(smoke):
    sdpa = smoke["json"]["sdpa"]
    ran = [e for e in sdpa if "error" not in e]
    assert {(e["precision"], e["kind"]) for e in ran} >= {("fp32", "full"), ("fp32", "padded")}
    for e in ran:
        assert any("scaled_dot_product" in op for op in e["ops"]), e
        assert e["kernels"] and all(op in e["ops"] for op in e["kernels"])
        # the product's model_inputs: a batch without padding is run without an attention mask
        assert e["mask_passed"] is e["padded"] is (e["kind"] == "padded")


def test_reports_written(smoke):
    md, data = smoke["md"], smoke["json"]
    assert md.startswith("Command: `python bench/gpu_throughput.py --smoke")
    assert f"Ran on **{data['device']}**" in md and smoke["stdout"].startswith("Ran on **")
    assert data["versions"]["torch"] and data["versions"]["transformers"]
    table = [line for line in md.splitlines() if line.startswith("| ") and line.split(" | ")[0][2:] in STAGES]
    assert len(table) >= len(data["rows"])  # the main table, then the speed-up table
    assert "Cached vs online teacher" in md and "Which SDPA kernel ran" in md
    assert data["settings"]["batches"] == list(BATCHES) and data["settings"]["length"] == LENGTH
