"""The MLflow UI shows a pipeline run's result (issue 15 item 3): the page a user opens, read from the DOM.

Starts `mlflow server` on the tiny run's store (read only), opens the pipeline run's overview page in
headless Chromium through scripts/ui_screenshot.py's helpers and checks that the headline metrics,
their values and the description are on the page. Skipped, with the reason, only when no Chromium can
be found or installed.
"""

from __future__ import annotations

import importlib.util

import mlflow
import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.external  # headless Chromium

HEADLINE = [
    "teacher_accuracy",
    "student_accuracy",
    "retention",
    "shipped_accuracy",
    "shipped_mb",
    "accuracy_kept",
    "size_vs_int8_teacher",
    "speedup_vs_int8_teacher_L16",
    "shipped_latency_ms_L16",
]


def _ui_module():
    spec = importlib.util.spec_from_file_location("ui_screenshot", ROOT / "scripts" / "ui_screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shown(value: float) -> list[str]:
    """How the UI may print a metric value: as JavaScript prints the stored number (1.0 as "1"), or rounded."""
    exact = str(int(value)) if value.is_integer() else repr(value)
    return [exact, *(f"{round(value, digits)}" for digits in range(2, 8))]


def test_pipeline_run_page_shows_headline_metrics(tiny_run, tmp_path):
    ui = _ui_module()
    try:
        chromium = ui.find_chromium()
    except SystemExit as exc:
        pytest.skip(f"no Chromium: {exc}")
    uri = f"sqlite:///{tiny_run['runs_dir'] / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("tiny")
    (parent,) = [
        r
        for r in client.search_runs([experiment.experiment_id])
        if r.data.tags.get("attention_distill.role") == "pipeline"
    ]
    metrics = parent.data.metrics
    assert set(HEADLINE) <= set(metrics)
    with ui.mlflow_server(uri, tmp_path, 120) as base, ui.browser_page(chromium, tmp_path, 1600, 2400) as browser:
        shown = ui.open_run_page(
            browser, base, experiment.experiment_id, parent.info.run_id, HEADLINE, 90, unfold=False
        )
        text = browser.js("document.body.innerText")
    assert shown, text[:3000]
    heading = f"Metrics ({len(metrics)})"  # every metric of the run counted, none missing
    assert heading in text
    section = text[text.index(heading) :].splitlines()
    for key in HEADLINE:  # each name in the metrics table, its value on the same row
        at = next(i for i, line in enumerate(section) if line.strip().startswith(key))
        row = " ".join(section[at : at + 2])
        assert any(v in row for v in _shown(metrics[key])), (key, metrics[key], row)
    assert "tiny random BERT teacher" in text  # the description (config description + results table)
    assert "student ONNX" in text
