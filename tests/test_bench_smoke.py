"""`bench/run_all.py --quick`: the whole bench on the tiny config writes BENCHMARKS.md and bench.json.

Structure only: no assertion looks at how fast anything was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
from pipeline.runner import STAGES  # noqa: E402  (the runner's order)

pytestmark = pytest.mark.pipeline


def _spread_ok(d: dict, n: int | None = None) -> None:
    assert set(d) >= {"min", "median", "max", "n"}
    assert all(isinstance(d[k], (int, float)) and d[k] > 0 for k in ("min", "median", "max"))
    assert d["min"] <= d["median"] <= d["max"]
    if n is not None:
        assert d["n"] == n


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    committed = {
        p: p.stat().st_mtime_ns
        for p in (
            ROOT / "BENCHMARKS.md",
            ROOT / "bench" / "results" / "bench.json",
            ROOT / "bench" / "results" / "attention_kl.json",
        )
        if p.exists()
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "bench/run_all.py", "--quick", "--out-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return {
        "out": out,
        "json": json.loads((out / "bench.json").read_text()),
        "md": (out / "BENCHMARKS.md").read_text(),
        "committed": committed,
    }


def test_quick_bench_leaves_committed_results_alone(quick_bench):
    for path, mtime in quick_bench["committed"].items():
        assert path.stat().st_mtime_ns == mtime, f"--quick overwrote {path}"


def test_bench_json_header(quick_bench):
    data = quick_bench["json"]
    assert data["quick"] is True and data["config"] == "tiny" and data["errors"] == []
    machine = data["machine"]
    assert isinstance(machine["cpu_model"], str) and machine["cpu_model"]
    assert isinstance(machine["logical_cpus"], int) and machine["logical_cpus"] >= 1
    assert machine["versions"]["torch"] and machine["versions"]["onnxruntime"]
    assert data["date"] and data["command"].startswith("python bench/run_all.py --quick")
    from pipeline.config import load_config

    assert data["precision"]["configured"] == load_config("tiny").precision
    assert data["precision"]["used"] in ("auto", "bf16", "fp32")


def test_pipeline_section(quick_bench):
    pipeline = quick_bench["json"]["sections"]["pipeline"]
    assert list(pipeline["stages"]) == STAGES
    for stage in pipeline["stages"].values():
        assert isinstance(stage["seconds"], (int, float)) and stage["seconds"] >= 0
        assert isinstance(stage["summary"], dict)
    assert pipeline["stages"]["distill"]["samples_per_s"] > 0 and pipeline["stages"]["export"]["samples_per_s"] is None
    assert pipeline["fresh_wall_s"] > 0 and pipeline["command"].startswith("python -m pipeline run tiny")
    _spread_ok(pipeline["second_run_wall_s"], n=1)
    assert pipeline["second_run_did_no_stage_work"] is True


def test_quality_sections(quick_bench):
    sections = quick_bench["json"]["sections"]
    quality = sections["quality_run"]
    models = [r["model"] for r in quality["rows"]]
    assert models[:2] == ["teacher (PyTorch)", "distilled student (PyTorch)"]
    assert any("int8" in m for m in models)
    assert all(0 <= r["accuracy"] <= 1 and 0 <= r["macro_f1"] <= 1 for r in quality["rows"])
    assert 0 <= quality["agreement"] <= 1 and quality["retention"] > 0
    ablation = sections["ablation"]
    committed = json.loads((ROOT / "bench" / "results" / "ablation.json").read_text())
    assert [r["variant"] for r in ablation["rows"]] == list(committed["results"])
    assert ablation["measured_on"] == committed["header"]["machine"]
    assert {"ce_only", "kd", "depth2", "depth4"} <= {r["variant"] for r in ablation["rows"]}
    depth = [r for r in ablation["rows"] if r["table"] == "depth"]
    assert all(r["int8_ms"] > 0 and r["speedup_int8"] > 0 for r in depth)
    assert sum(r["current_default"] for r in ablation["rows"]) <= 1
    assert 0 < ablation["teacher"]["accuracy"] <= 1


def test_inference_section(quick_bench):
    inference = quick_bench["json"]["sections"]["inference"]
    assert inference["available"] is True
    rows = inference["rows"]
    models = {r["model"] for r in rows}
    assert {
        "teacher PyTorch fp32",
        "teacher ONNX fp32",
        "teacher ONNX int8",
        "student ONNX fp32",
        "student ONNX int8",
    } <= models
    assert {r["input"] for r in rows} == {"L=16", "sentences"}
    for r in rows:
        assert r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["batch"] == 1
        assert r["speedup_vs_teacher_int8"] > 0
        # the PyTorch teacher is timed at the fixed lengths only (pipeline/export/latency.py REFERENCE_ONLY)
        assert (
            r["speedup_vs_teacher_pytorch"] is None
            if r["input"] == "sentences"
            else r["speedup_vs_teacher_pytorch"] > 0
        )
    assert all(r["speedup_vs_teacher_pytorch"] == 1.0 for r in rows if r["model"] == "teacher PyTorch fp32")
    assert all(r["speedup_vs_teacher_int8"] == 1.0 for r in rows if r["model"] == "teacher ONNX int8")
    sizes = {s["model"]: s for s in inference["sizes"]}
    assert sizes["teacher PyTorch fp32"]["file_mb"] > 0 and sizes["student ONNX int8"]["file_mb"] > 0
    assert sizes["student ONNX int8"]["size_vs_teacher_pytorch"] < sizes["student ONNX fp32"]["size_vs_teacher_pytorch"]


def test_versus_section_has_every_seed(quick_bench):
    """The comparison with the int8 teacher: the fresh run plus --quick's one extra distillation seed, and a mean."""
    versus = quick_bench["json"]["sections"]["versus"]
    assert [r["seed"] for r in versus["rows"]] == ["config", 43]
    for r in versus["rows"]:
        assert (
            0 < r["accuracy_kept"]
            and 0 < r["size_vs_int8_teacher"]
            and set(r["speedup_vs_int8_teacher"]) == {"L=16", "sentences"}
        )
        assert r["baseline"]["model"] == "teacher ONNX int8"
    kept = [r["accuracy_kept"] for r in versus["rows"]]
    assert versus["mean"]["accuracy_kept"]["mean"] == pytest.approx(sum(kept) / len(kept))
    md = quick_bench["md"]
    assert "## 0. The shipped student against the int8 teacher" in md and "| **mean ± sd** |" in md


def test_micro_sections(quick_bench):
    sections = quick_bench["json"]["sections"]
    micro = sections["micro"]
    repeats = micro["setup"]["repeats"]
    assert micro["setup"]["config"] == "tiny" and micro["setup"]["batch_size"] == 16
    for kind in ("plain", "cached", "online"):
        _spread_ok(micro["training"]["variants"][kind]["samples_per_s"], n=repeats)
    for key in ("cached_vs_plain", "online_vs_plain", "cached_vs_online"):
        _spread_ok(micro["training"]["ratios"][key], n=repeats)
    assert isinstance(micro["training"]["goal"]["met"], bool)
    capture = micro["capture"]
    for kind in ("inference", "capture"):
        _spread_ok(capture["variants"][kind]["examples_per_s"], n=micro["setup"]["capture_repeats"])
    _spread_ok(capture["ratios"]["capture_vs_inference"])
    assert capture["cache"]["bytes_per_example"] > 0 and capture["cache"]["examples"] == micro["setup"]["examples"]
    run_cache = sections["capture_run"]
    assert run_cache["mode"] == "cached" and run_cache["bytes_per_example"] > 0 and run_cache["examples"] == 260


def test_grouping_section(quick_bench):
    grouping = quick_bench["json"]["sections"]["grouping"]
    for name in ("grouped", "ungrouped"):
        row = grouping[name]
        assert row["teacher_stage_s"] > 0 and 0 <= row["test_accuracy"] <= 1
        assert 0 < row["padding_efficiency"] <= 1
        assert f"teacher.group_by_length={str(name == 'grouped').lower()}" in row["command"]
    # Sorting within pools can only remove padding (a deterministic property, not a timing).
    assert grouping["grouped"]["padding_efficiency"] > grouping["ungrouped"]["padding_efficiency"]
    assert grouping["train_examples"] == 260 and grouping["speedup"] > 0
    assert "### Length-grouped batches" in quick_bench["md"]


def test_attention_kl_section(quick_bench):
    akl = quick_bench["json"]["sections"]["attention_kl"]
    assert akl["meta"]["quick"] is True
    assert {r["method"] for r in akl["results"]} == {"naive", "chunked"}
    for r in akl["results"]:
        assert r["n"] == 128 and r["peak_live_mib"] > 0
        assert set(r["time_ms"]) == {"min", "median", "max"}
    assert (quick_bench["out"] / "attention_kl.md").is_file()


def test_benchmarks_md_has_every_table(quick_bench):
    md = quick_bench["md"]
    assert md.startswith("# Benchmarks") and "--quick run" in md
    for heading in (
        "## Machine",
        "## 1. Quality",
        "## 2. Inference",
        "## 3. Training cost",
        "## 4. Capture",
        "## 5. Attention KL",
        "## 6. Pipeline wall time",
    ):
        assert heading in md, heading
    for header in (
        "| model | layers | parameters | accuracy | macro-F1 |",
        "| student | accuracy | macro-F1 | retention | distill time (s) |",
        "| student | parameters | accuracy | retention | int8 accuracy | int8 MB | int8 ms |",
        "| model | runtime | input | tokens | threads | ms min / median / max | speed-up vs teacher int8 | vs teacher PyTorch |",
        "| model | file | size MB | vs teacher PyTorch |",
        "| step | samples/s min / median / max |",
        "| pass | examples/s min / median / max |",
        "| N | head dim | method |",
        "| stage | seconds | samples/s | key figures |",
    ):
        assert header in md, header
    for stage in STAGES:
        assert f"\n| {stage} | " in md
    assert "bytes per example" in md and "Second run, nothing changed" in md and "Not available" not in md


# ---------------------------------------------------------------- failure paths (no bench run)


def _run_all():
    sys.path.insert(0, str(ROOT / "bench"))
    import run_all

    return run_all


def test_missing_latency_json_is_reported_not_fatal(tmp_path):
    run_all = _run_all()
    (tmp_path / "export" / "bundle").mkdir(parents=True)
    inference = run_all.inference_part(tmp_path)
    assert inference["available"] is False and "latency.json is missing" in inference["why"]
    report = {
        "command": "python bench/run_all.py",
        "quick": False,
        "config": "bert_small",
        "date": "today",
        "machine": run_all.machine_facts(),
        "load_average": {"start": None, "end": None},
        "bench_wall_s": 1.0,
        "torch_threads": 2,
        "precision": None,
        "files": {"json_rel": "bench.json", "logs": str(tmp_path)},
        "sections": {"inference": inference},
        "errors": [
            {"part": "pipeline", "error": "RuntimeError: the fresh pipeline run failed (exit 1)"},
            {"part": "micro", "error": "RuntimeError: boom"},
        ],
    }
    md = run_all.render(report)
    assert "**Not available in this run:**" in md and "latency.json is missing" in md
    assert "the fresh pipeline run failed" in md and "boom" in md
    assert "## 6. Pipeline wall time" in md


def test_runs_dir_not_made_by_the_bench_is_never_wiped(tmp_path):
    run_all = _run_all()
    (tmp_path / "precious.txt").write_text("keep")
    with pytest.raises(SystemExit):
        run_all.fresh_runs_dir(tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep"
    mine = tmp_path / "bench-runs"
    run_all.fresh_runs_dir(mine)
    (mine / "old").mkdir()
    run_all.fresh_runs_dir(mine)  # carries the marker: wiped and recreated
    assert not (mine / "old").exists() and (mine / run_all.MARKER).is_file()
