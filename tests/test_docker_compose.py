"""The team server in containers (issue 28 item 2): docker/compose.yaml's PostgreSQL and MLflow, the pipeline in
the trainer-cpu container tracking into them.

Brings the stack up under its own project name and a free loopback port, runs tiny in the trainer-cpu container,
reads the pipeline run, its stage runs, metrics, an artifact (proxied: the trainer has no shared disk with the
server) and the registered model version back through the REST API (tests/test_mlflow_server.py's client), then
recreates the MLflow and PostgreSQL containers (new containers on the same volumes) and checks that the same
answers come back and that the run page opens in headless Chromium (scripts/ui_screenshot.py's helpers, as
tests/test_mlflow_ui.py uses them). `down -v` removes containers and volumes at the end, passed or not.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time

import pytest

from pipeline.runner import STAGES
from tests.helpers import ROOT, answers_health, free_port
from tests.test_mlflow_server import Api, _runs, _split_runs
from tests.test_mlflow_ui import HEADLINE, _ui_module
from tests.tiers import COMPOSE, docker_or_skip

pytestmark = [pytest.mark.pipeline, pytest.mark.external]  # Docker + Compose, headless Chromium

COMPOSE_FILE = ROOT / "docker" / "compose.yaml"
READY_TIMEOUT_S = 240
RUN_TIMEOUT_S = 900
CONFIG = "tiny"
MODEL = f"attention-distill-{CONFIG}"


class Stack:
    def __init__(self, project: str, port: int, password: str):
        self.project, self.base = project, f"http://127.0.0.1:{port}"
        self.env = {**os.environ, "POSTGRES_PASSWORD": password, "MLFLOW_PORT": str(port), "MLFLOW_WORKERS": "1"}

    def compose(self, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        command = [*COMPOSE, "-p", self.project, "-f", str(COMPOSE_FILE), *args]
        try:
            return subprocess.run(command, env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{' '.join(command)} took over {timeout} s:\n{(e.stderr or b'')[-3000:]}\n{self.logs()}")

    def must(self, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        res = self.compose(*args, timeout=timeout)
        assert res.returncode == 0, f"compose {' '.join(args)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        return res

    def logs(self) -> str:
        res = subprocess.run(
            [*COMPOSE, "-p", self.project, "-f", str(COMPOSE_FILE), "logs", "--tail", "30"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return res.stdout[-5000:]

    def container_ids(self) -> dict[str, str]:
        return {s: self.must("ps", "-q", s).stdout.strip() for s in ("postgres", "mlflow")}

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if answers_health(self.base):
                return
            time.sleep(1)
        pytest.fail(f"the MLflow container did not answer on {self.base} within {READY_TIMEOUT_S} s:\n{self.logs()}")


@pytest.fixture(scope="module")
def stack(request):
    docker_or_skip(compose=True)  # before the image build: a missing Compose says so at once
    request.getfixturevalue("docker_images")
    stack = Stack(f"ad-test-{os.getpid()}", free_port(), secrets.token_hex(12))
    try:
        stack.must("up", "-d", "postgres", "mlflow")
        stack.wait_ready()
        yield stack
    finally:
        stack.compose("down", "-v", "--remove-orphans", timeout=300)


def snapshot(api: Api) -> dict:
    """What the server knows about the tiny run: run ids and states, metrics, an artifact, the model version."""
    exp_id = api.get("experiments/get-by-name", experiment_name=CONFIG)["experiment"]["experiment_id"]
    parent, stages = _split_runs(api, exp_id)
    run_id = parent["info"]["run_id"]
    version = api.get("registered-models/alias", name=MODEL, alias="candidate")["model_version"]
    return {
        "experiment": exp_id,
        "runs": sorted((r["info"]["run_id"], r["info"]["status"]) for r in _runs(api, exp_id)),
        "parent": (run_id, parent["info"]["status"], sorted((m["key"], m["value"]) for m in parent["data"]["metrics"])),
        "stages": {name: (r["info"]["run_id"], r["info"]["status"]) for name, r in stages.items()},
        "loss_history": [
            (m["step"], m["value"])
            for m in api.get(
                "metrics/get-history",
                run_id=stages["distill"]["info"]["run_id"],
                metric_key="train/loss",
                max_results=10000,
            )["metrics"]
        ],
        "resolved_yaml": api.raw("get-artifact", run_uuid=run_id, path="config/resolved.yaml").decode(),
        "version": (version["version"], version["status"], version.get("run_id"), sorted(version.get("aliases", []))),
    }


@pytest.fixture(scope="module")
def tracked(stack):
    """tiny in the trainer-cpu container, tracking to http://mlflow:5000; returns the server's snapshot."""
    res = stack.compose(
        "run", "--rm", "-T", "trainer-cpu", f"CONFIG={CONFIG}", "ARGS=export.executorch=off", timeout=RUN_TIMEOUT_S
    )
    assert res.returncode == 0, f"tiny in trainer-cpu failed:\n{res.stdout[-3000:]}\n{res.stderr[-4000:]}"
    return snapshot(Api(stack.base))


def test_pipeline_run_stage_runs_metrics_and_model_version(tracked):
    run_id, status, metrics = tracked["parent"]
    assert status == "FINISHED"
    assert sorted(tracked["stages"]) == sorted(STAGES), tracked["stages"]
    assert all(state == "FINISHED" for _, state in tracked["stages"].values()), tracked["stages"]
    assert set(HEADLINE) <= {key for key, _ in metrics}
    assert tracked["loss_history"], "distill run has no train/loss history"
    assert tracked["resolved_yaml"].strip(), "config/resolved.yaml came back empty through the artifact proxy"
    version, state, version_run, aliases = tracked["version"]
    assert state == "READY" and "candidate" in aliases
    assert version_run is None or version_run in {r for r, _ in tracked["runs"]}


def test_artifacts_live_in_the_server_volume(stack, tracked):
    """Proxied artifacts: the bytes are under the mlflow container's /mlartifacts, not in the trainer's."""
    run_id = tracked["parent"][0]
    res = stack.must(
        "exec", "-T", "mlflow", "sh", "-c", f"ls -d /mlartifacts/*/{run_id}/artifacts/config/resolved.yaml"
    )
    assert run_id in res.stdout


def test_recreated_server_containers_lose_nothing_and_the_run_page_opens(stack, tracked, tmp_path):
    before = stack.container_ids()
    stack.must("up", "-d", "--force-recreate", "postgres", "mlflow")  # new containers, same volumes
    after = stack.container_ids()
    assert all(before[s] != after[s] for s in before), (before, after)
    stack.wait_ready()
    api = Api(stack.base)
    assert snapshot(api) == tracked

    ui = _ui_module()
    try:
        chromium = ui.find_chromium()
    except SystemExit as exc:
        pytest.skip(f"no Chromium: {exc}")
    with ui.browser_page(chromium, tmp_path, 1600, 2400) as browser:
        shown = ui.open_run_page(
            browser, stack.base, tracked["experiment"], tracked["parent"][0], HEADLINE, 120, unfold=False
        )
        text = browser.js("document.body.innerText")
    assert shown, text[:3000]
    assert "tiny random BERT teacher" in text
