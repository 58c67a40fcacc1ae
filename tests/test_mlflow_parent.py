"""The `<config>-pipeline` parent run carries the result (issue 15 item 1).

Headline metrics equal to the stage outputs, a description with the results table and the command that
reproduces the run, tags, the splits as dataset inputs, the experiment marked as model training, the
registered version's figures; a no-op rerun fills a parent that lacks its result; nothing when tracking
is off, and MLflow refusing something never fails the pipeline.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess

import mlflow
import pandas as pd
import pytest

from pipeline.config import load_config, to_yaml
from pipeline.run_record import override_args
from pipeline.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, NOTE_DIGEST_TAG, NOTE_TAG, RESULT_TAG, Tracker
from tests.helpers import ROOT, read_json, run_cli

REGISTERED = "attention-distill-tiny"


def _client(tiny_run):
    return mlflow.MlflowClient(f"sqlite:///{tiny_run['runs_dir'] / 'mlflow.db'}")


def _parent(client):
    experiment = client.get_experiment_by_name("tiny")
    runs = [
        r
        for r in client.search_runs([experiment.experiment_id])
        if r.data.tags.get("attention_distill.role") == "pipeline"
    ]
    assert len(runs) == 1
    return experiment, runs[0]


def expected_metrics(run_dir) -> dict:
    """The headline figures, recomputed here from evaluate/metrics.json and export/metrics.json."""
    evaluate, export = read_json(run_dir / "evaluate" / "metrics.json"), read_json(run_dir / "export" / "metrics.json")
    variant = export["recommended"]
    shipped, comparison = export[f"onnx_{variant}"], export["versus_int8_teacher"]
    expected = {
        "teacher_accuracy": evaluate["teacher"]["accuracy"],
        "teacher_macro_f1": evaluate["teacher"]["macro_f1"],
        "student_accuracy": evaluate["student"]["accuracy"],
        "student_macro_f1": evaluate["student"]["macro_f1"],
        "retention": evaluate["retention"],
        "shipped_accuracy": shipped["accuracy"],
        "shipped_macro_f1": shipped["macro_f1"],
        "shipped_mb": shipped["file_mb"],
        "accuracy_kept": comparison["accuracy_kept"],
        "size_vs_int8_teacher": comparison["size_vs_int8_teacher"],
    }
    for name, value in comparison["speedup_vs_int8_teacher"].items():
        expected[f"speedup_vs_int8_teacher_{name.replace('=', '')}"] = value
    # tiny times L=16 on 1 thread (the summary's latency setting) and real sentences
    for row in export["latency"]:
        if (
            row["model"] == f"student ONNX {variant.replace('_', ' ')}"
            and row["threads"] == 1
            and row["input"] in ("L=16", "sentences")
        ):
            expected[f"shipped_latency_ms_{row['input'].replace('=', '')}"] = row["median_ms"]
    assert {"shipped_latency_ms_L16", "shipped_latency_ms_sentences", "speedup_vs_int8_teacher_L16"} <= set(expected)
    return expected


def test_parent_run_has_the_headline_metrics(tiny_run):
    _, parent = _parent(_client(tiny_run))
    expected = expected_metrics(tiny_run["run_dir"])
    assert {k: v for k, v in parent.data.metrics.items() if k in expected} == pytest.approx(expected, rel=1e-12)
    assert set(expected) <= set(parent.data.metrics)


def test_parent_description_has_the_results_table_and_the_command(tiny_run):
    _, parent = _parent(_client(tiny_run))
    note = parent.data.tags[NOTE_TAG]
    config = load_config("tiny")
    assert note.startswith(config.description)
    assert "| model | accuracy | macro-F1 | params | size MB |" in note
    evaluate = read_json(tiny_run["run_dir"] / "evaluate" / "metrics.json")
    assert (
        f"| teacher (PyTorch) | {evaluate['teacher']['accuracy']:.4f} | {evaluate['teacher']['macro_f1']:.4f} |" in note
    )
    assert re.search(r"\| student ONNX (int8|int8 static|fp32) \*\*\(shipped\)\*\* \|", note)
    assert "config/resolved.yaml" in note
    # The command in the description rebuilds exactly the resolved config the run used.
    command = re.search(r"^python -m pipeline run tiny(.*)$", note, re.M)
    assert command, note
    rebuilt = load_config("tiny", shlex.split(command.group(1)))
    assert to_yaml(rebuilt) == (tiny_run["run_dir"] / "config.yaml").read_text()
    make = re.search(r'^make distill CONFIG=tiny(?: ARGS="(.*)")?$', note, re.M)
    assert make and shlex.split(make.group(1) or "") == shlex.split(command.group(1))


def test_parent_tags_and_registered_version_link(tiny_run):
    _, parent = _parent(_client(tiny_run))
    tags = parent.data.tags
    assert tags["attention_distill.teacher"].startswith("random")
    assert tags["attention_distill.student_layers"] == "1"
    student = read_json(tiny_run["run_dir"] / "distill" / "student" / "config.json")
    assert tags["attention_distill.student_ffn"] == str(student["intermediate_size"])
    assert tags["attention_distill.data"].startswith("rotten_tomatoes")
    assert tags["attention_distill.precision"] == load_config(str(tiny_run["run_dir"] / "config.yaml")).precision
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert tags["mlflow.source.git.commit"] == head.stdout.strip()
    version = read_json(tiny_run["run_dir"] / "export" / "export.json")["registered_version"]
    assert tags["attention_distill.registered_model"] == f"{REGISTERED}/{version}"
    assert f"#/models/{REGISTERED}/versions/{version}" in tags[NOTE_TAG]


def test_parent_has_the_splits_as_dataset_inputs(tiny_run):
    _, parent = _parent(_client(tiny_run))
    inputs = {
        next(t.value for t in d.tags if t.key == "mlflow.data.context"): d.dataset for d in parent.inputs.dataset_inputs
    }
    assert set(inputs) == {"training", "validation", "test"}
    for split, context in (("train", "training"), ("validation", "validation"), ("test", "test")):
        path = tiny_run["run_dir"] / "prepare" / f"{split}.jsonl"
        frame = pd.DataFrame.from_records([json.loads(line) for line in path.open()])
        dataset = inputs[context]
        assert dataset.name == f"tiny-{split}"
        assert dataset.digest == mlflow.data.from_pandas(frame, source=str(path), targets="label").digest
        assert json.loads(dataset.profile)["num_rows"] == len(frame)
        assert json.loads(dataset.source)["uri"] == str(path.resolve())


def test_experiment_is_marked_model_training(tiny_run):
    experiment, _ = _parent(_client(tiny_run))
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"


def test_registered_version_has_the_headline_figures(tiny_run):
    client = _client(tiny_run)
    _, parent = _parent(client)
    version = read_json(tiny_run["run_dir"] / "export" / "export.json")["registered_version"]
    model_version = client.get_model_version(REGISTERED, str(version))
    expected = {
        k: v
        for k, v in expected_metrics(tiny_run["run_dir"]).items()
        if not k.startswith(("teacher_", "student_")) and k != "retention"
    }
    tags = model_version.tags
    assert {k: float(tags[k]) for k in expected} == pytest.approx(expected, rel=1e-5)
    assert tags["pipeline_run_id"] == parent.info.run_id
    assert "test accuracy" in model_version.description and parent.info.run_id in model_version.description


def test_rerun_with_nothing_to_do_fills_a_parent_lacking_its_result(tiny_run):
    client = _client(tiny_run)
    experiment, parent = _parent(client)
    run_id, note = parent.info.run_id, parent.data.tags[NOTE_TAG]
    history = len(client.get_metric_history(run_id, "shipped_accuracy"))
    # a parent recorded before the result was (or by an older version): no description, no result, no kind
    for tag in (RESULT_TAG, NOTE_TAG, NOTE_DIGEST_TAG):
        client.delete_tag(run_id, tag)
    client.delete_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG)
    result = run_cli("run", "tiny", runs_dir=tiny_run["runs_dir"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nothing to do" in result.stderr and "result recorded" in result.stderr
    experiment, parent = _parent(client)
    assert parent.data.tags[NOTE_TAG] == note and RESULT_TAG in parent.data.tags
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert len(client.get_metric_history(run_id, "shipped_accuracy")) == history + 1
    # A description edited in the UI is kept; a rerun with the result already recorded logs nothing again.
    client.set_tag(run_id, NOTE_TAG, "edited by hand")
    result = run_cli("run", "tiny", runs_dir=tiny_run["runs_dir"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "result recorded" not in result.stderr
    _, parent = _parent(client)
    assert parent.data.tags[NOTE_TAG] == "edited by hand"
    assert len(client.get_metric_history(run_id, "shipped_accuracy")) == history + 1
    client.set_tag(run_id, NOTE_TAG, note)  # the shared run as it was


def test_disabled_tracking_records_nothing(tmp_path):
    tracker = Tracker(tmp_path, tmp_path / "tiny", "tiny", enabled=False)
    tracker.record_result(load_config("tiny"), {}, set())
    assert list(tmp_path.iterdir()) == []


class RefusingClient:
    """An MLflow client that refuses every call."""

    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            raise RuntimeError("INVALID_PARAMETER_VALUE: refused")

        return refuse


def test_mlflow_refusing_the_result_is_a_warning(tiny_run):
    tracker = Tracker(tiny_run["runs_dir"], tiny_run["run_dir"], "tiny", enabled=False)
    tracker.enabled, tracker.client, tracker.parent_id, tracker.uri = True, RefusingClient(), "0" * 32, "sqlite:///x"
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("pipeline")
    logger.addHandler(handler)
    try:
        tracker.record_result(load_config("tiny"), {}, set())  # raises nothing
    finally:
        logger.removeHandler(handler)
    assert any(r.levelno == logging.WARNING and "result was not recorded" in r.getMessage() for r in records)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["distill.epochs=1", "student.teacher_layers=[0,1]", "precision=fp32"],
        ['description="42: it\'s $HOME"', "seed=7", "export.latency_lengths=[8, 16]"],
    ],
)
def test_reproduce_overrides_rebuild_the_config(overrides):
    config = load_config("tiny", overrides)
    args = override_args(config)
    assert args is not None
    assert load_config("tiny", [shlex.split(a)[0] for a in args]) == config


@pytest.mark.parametrize("where", ["create_run", "log_batch"])
def test_a_ctrl_c_as_a_stage_run_starts_leaves_no_running_run(tmp_path, monkeypatch, where):
    """A signal can land inside MLflow's create_run (the run exists, its id never comes back) or while the stage's
    params are logged: the pipeline run's end marks the stage run KILLED either way (the sweep's SIGTERM test found
    a stage run left RUNNING)."""
    tracker = Tracker(tmp_path, tmp_path / "tiny", "tiny")
    (tmp_path / "tiny").mkdir()
    tracker.start_pipeline("name: tiny\n", {}, "hash")
    client = tracker.client
    original = getattr(client, where)

    def interrupted(*args, **kwargs):
        if where == "log_batch" and not kwargs.get("params"):
            return original(*args, **kwargs)
        original(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(client, where, interrupted)
    with pytest.raises(KeyboardInterrupt):
        with tracker.stage("prepare", "f" * 16, {"seed": 42}):
            raise AssertionError("the stage body never runs")
    monkeypatch.undo()
    tracker.end_pipeline("KILLED")
    runs = client.search_runs([tracker.experiment_id])
    assert {r.info.run_name: r.info.status for r in runs if r.data.tags.get("attention_distill.role") == "stage"} == {
        "prepare": "KILLED"
    }
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
