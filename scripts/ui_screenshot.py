#!/usr/bin/env python3
"""Screenshot the MLflow UI: the runs table, a pipeline run's overview and a sweep run.

    python scripts/ui_screenshot.py [--backend-store-uri sqlite:///runs/mlflow.db]
                                    [--experiment bert_small] [--out-dir docs]

Starts `mlflow server` on 127.0.0.1 (free port, --workers 1) on the given store,
opens pages in headless Chromium (installs the Debian package `chromium` with
apt-get when it is missing and we are root), writes the PNGs and stops the server
by process id:

* mlflow-ui.png: the experiment's runs table (pipeline runs with their stages);
* mlflow-run.png: the latest top-level pipeline run's overview page (its
  description with the results table, headline metrics, datasets, registered model);
* mlflow-sweep.png: the latest sweep run's overview page (the comparison table
  and the pick), when the experiment has a sweep.

The functions (server, browser, run pages) are also used by tests/test_mlflow_ui.py.

The page is driven over the DevTools protocol (--remote-debugging-pipe, no extra
packages) rather than with a bare `--screenshot`: the stage runs are nested under
their pipeline run and are only visible once the parent row is expanded, which is
per-browser UI state. The script seeds that state (expanded parents, metric
columns, assistant panel closed) in the page's localStorage, reloads, waits for
the runs table and captures the viewport.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--remote-debugging-pipe",
]
ROLE_TAG = "attention_distill.role"
# Metrics shown first when present; the rest follow alphabetically up to --max-metrics.
PREFERRED_METRICS = ["student/accuracy", "student/macro_f1", "teacher/accuracy", "retention", "train/loss"]


def log(msg: str) -> None:
    print(f"ui_screenshot: {msg}", file=sys.stderr)


def die(msg: str):
    sys.exit(f"ui_screenshot: ERROR: {msg}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_chromium() -> str:
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log("installing chromium with apt-get (one-time) ...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
        if subprocess.run(cmd, env=env, stdout=sys.stderr).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, stdout=sys.stderr, check=True)
            subprocess.run(cmd, env=env, stdout=sys.stderr, check=True)
        if path := shutil.which("chromium"):
            return path
    die("no chromium found; install it (Debian: apt-get install -y chromium)")


def api(base: str, endpoint: str, body: dict | None = None, **params) -> dict:
    url = f"{base}/api/2.0/mlflow/{endpoint}" + ("?" + urllib.parse.urlencode(params) if params else "")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


class DevTools:
    """Minimal Chrome DevTools Protocol client over --remote-debugging-pipe (fd 3 in, fd 4 out)."""

    def __init__(self, chromium: str, flags: list[str], stderr):
        to_chrome_r, self._to_chrome_w = os.pipe()
        self._from_chrome_r, from_chrome_w = os.pipe()

        def child_fds():  # dup first: os.pipe() fds are close-on-exec, even if already 3 or 4
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([chromium, *flags], preexec_fn=child_fds, close_fds=False,
                                     stdout=stderr, stderr=stderr, start_new_session=True)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf, self._id, self.session = b"", 0, None

    def __call__(self, method: str, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self._to_chrome_w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._from_chrome_r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium exited (see the log above)")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def js(self, expression: str):
        res = self("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.js(expression):
                return True
            time.sleep(0.5)
        return False

    def close(self) -> None:
        try:
            self("Browser.close")
            self.proc.wait(timeout=10)
        except Exception:
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self._to_chrome_w)
        os.close(self._from_chrome_r)


def stop_server(proc: subprocess.Popen) -> None:
    """Stop `mlflow server` and its uvicorn child: the process group we created for it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=10)


def wait_ready(base: str, proc: subprocess.Popen, server_log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            die(f"mlflow server exited ({proc.returncode}):\n{server_log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    die(f"mlflow server not ready after {timeout:.0f} s:\n{server_log.read_text()[-3000:]}")


def ui_state(base: str, exp_id: str, max_metrics: int) -> tuple[dict, list[str], list[str]]:
    """The runs table's persisted state (parents expanded, metric columns), all and top-level run names."""
    runs = api(base, "runs/search", {"experiment_ids": [exp_id], "max_results": 1000}).get("runs", [])
    parents, metrics, top = set(), set(), []
    for r in runs:
        tags = {t["key"]: t["value"] for t in r["data"].get("tags", [])}
        if "mlflow.parentRunId" in tags:
            parents.add(tags["mlflow.parentRunId"])
        else:
            top.append(r["info"]["run_name"])
        metrics.update(m["key"] for m in r["data"].get("metrics", []))
    keys = [m for m in PREFERRED_METRICS if m in metrics] + sorted(metrics - set(PREFERRED_METRICS))
    columns = [f"metrics.`{k}`" for k in keys[:max_metrics]]
    state = {
        "selectedColumns": ["attributes.`Models`", *columns],
        # widths are applied only to the columns named in columnOrder
        "columnOrder": ["attributes.`Run Name`", "runDateAndNestInfo", "duration", "attributes.`Models`", *columns],
        "columnWidths": {"attributes.`Run Name`": 190, "runDateAndNestInfo": 150, "duration": 80,
                         "attributes.`Models`": 140, **{c: 130 for c in columns}},
        "runsExpanded": {p: True for p in parents},
    }
    return state, [r["info"]["run_name"] for r in runs], top


@contextlib.contextmanager
def mlflow_server(uri: str, tmp: Path, timeout: float):
    """`mlflow server` on a free local port for ``uri``; yields its base URL and stops it on exit."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server_log = tmp / "server.log"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(server_log, "w") as f:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
             "--artifacts-destination", str(tmp / "artifacts"),
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=f, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True,
        )
    try:
        wait_ready(base, server, server_log, timeout)
        yield base
    finally:
        stop_server(server)


@contextlib.contextmanager
def browser_page(chromium: str, tmp: Path, width: int, height: int):
    """Headless Chromium with one page attached; yields the DevTools client."""
    browser = None
    clog_path = tmp / "chromium.log"
    try:
        with open(clog_path, "w") as clog:
            browser = DevTools(chromium, CHROMIUM_FLAGS + [
                f"--user-data-dir={tmp / 'chromium'}", f"--window-size={width},{height}"], clog)
            target = browser("Target.createTarget", url="about:blank")["targetId"]
            browser.session = browser("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            browser("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
            yield browser
    except RuntimeError as e:
        die(f"{e}\n{clog_path.read_text()[-3000:] if clog_path.exists() else ''}")
    finally:
        if browser is not None:
            browser.close()


def experiment(base: str, name: str | None) -> dict:
    if name:
        try:
            return api(base, "experiments/get-by-name", experiment_name=name)["experiment"]
        except urllib.error.HTTPError:
            die(f"no experiment {name!r} in the store; run the pipeline first (make distill CONFIG={name})")
    exps = api(base, "experiments/search", {"max_results": 1000, "order_by": ["last_update_time DESC"]})
    exps = [e for e in exps.get("experiments", []) if e["name"] != "Default"]
    return exps[0] if exps else die("the store has no experiment besides 'Default'")


def latest_run(base: str, exp_id: str, role: str) -> dict | None:
    """The most recent run with attention_distill.role = ``role``: a top-level one (`make distill`) when there is
    one, else one nested under a sweep."""
    runs = api(base, "runs/search", {"experiment_ids": [exp_id], "max_results": 1000,
                                     "filter": f"tags.`{ROLE_TAG}` = '{role}'",
                                     "order_by": ["attributes.start_time DESC"]}).get("runs", [])
    top = [r for r in runs if not any(t["key"] == "mlflow.parentRunId" for t in r["data"].get("tags", []))]
    runs = top or runs
    finished = [r for r in runs if r["info"]["status"] == "FINISHED"]
    return (finished or runs or [None])[0]


def open_run_page(browser: DevTools, base: str, exp_id: str, run_id: str, must_show: list[str], timeout: float,
                  unfold: bool = True) -> bool:
    """Navigate to a run's overview page; True once every text in ``must_show`` is on the page."""
    browser("Page.navigate", url=f"{base}/#/experiments/{exp_id}/runs/{run_id}")
    shown = " && ".join(f"document.body.innerText.includes({json.dumps(t)})" for t in must_show) or "true"
    ok = browser.wait_for(f"document.body && {shown}", timeout)
    browser.js("""document.querySelectorAll('[data-component-id="mlflow.assistant.chat_panel.close"]')
                  .forEach(b => b.click())""")
    # Unfold the description (its results table is below the fold) once it has rendered.
    toggle = "document.querySelector('[data-testid=\"show-comment-toggle\"]')"
    if unfold and browser.wait_for(f"{toggle} && {toggle}.innerText.includes('Show more')", 15):
        browser.js(f"{toggle}.click()")
        browser.wait_for(f"{toggle}.innerText.includes('Show less')", 10)
    return ok


def screenshot(browser: DevTools, out: Path) -> None:
    """The viewport as a PNG, written whole then renamed. (Not captureBeyondViewport: its re-layout folds the
    run page's description again; run pages get a taller viewport instead, see set_viewport.)"""
    time.sleep(2)  # let charts/icons settle
    png = browser("Page.captureScreenshot", format="png")["data"]
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(base64.b64decode(png))
    os.replace(tmp, out)
    log(f"wrote {out} ({out.stat().st_size // 1024} KiB)")


def set_viewport(browser: DevTools, width: int, height: int) -> None:
    browser("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)


def runs_table(browser: DevTools, base: str, exp: dict, max_metrics: int, timeout: float) -> None:
    """The experiment's runs table with the pipeline runs expanded and metric columns chosen."""
    exp_id = exp["experiment_id"]
    state, run_names, top_level = ui_state(base, exp_id, max_metrics)
    if not run_names:
        die(f"experiment {exp['name']!r} has no runs")
    url = f"{base}/#/experiments/{exp_id}/runs?workflowType=machine_learning"
    log(f"experiment {exp['name']!r} ({len(run_names)} runs): {url}")
    browser("Page.navigate", url=url)
    table_ready = f"document.body && document.body.innerText.includes({json.dumps(top_level[0])})"
    if not browser.wait_for(table_ready, timeout):
        die("the runs table did not render; is the experiment empty?")
    # Seed the persisted UI state (merged into what the page just wrote), then reload.
    key = f'MLflowLocalStorage-1.1-ExperimentPage-["{exp_id}"]-ReactComponentState'
    browser.js(f"""(() => {{
        const key = {json.dumps(key)}, seed = {json.dumps(state)};
        let cur = {{}}; try {{ cur = JSON.parse(localStorage.getItem(key)) || {{}}; }} catch (e) {{}}
        localStorage.setItem(key, JSON.stringify({{...cur, ...seed}}));
        localStorage.setItem("mlflow.assistant.panelOpen_v1", "false");
        localStorage.setItem("mlflow.workflowType_v1", '"machine_learning"');
        localStorage.setItem("mlflow.assistant.fab.autoOpenedOnFirstLoad_v1", "true");
    }})()""")
    browser("Page.reload", ignoreCache=False)
    time.sleep(1)
    all_names = " && ".join(f"document.body.innerText.includes({json.dumps(n)})" for n in run_names[:30])
    if not browser.wait_for(f"document.body && {all_names}", timeout):
        log("WARNING: not every run is visible (UI state keys changed?); capturing anyway")
    # Close the assistant panel if this MLflow version still opens it.
    browser.js("""document.querySelectorAll('[data-component-id="mlflow.assistant.chat_panel.close"]')
                  .forEach(b => b.click())""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend-store-uri", default=f"sqlite:///{REPO / 'runs' / 'mlflow.db'}")
    ap.add_argument("--experiment", help="experiment name (default: the most recently updated one)")
    ap.add_argument("--out-dir", default=str(REPO / "docs"), help="folder for mlflow-ui.png, mlflow-run.png, mlflow-sweep.png")
    ap.add_argument("--window-size", default="1600,1000", help="W,H in CSS pixels")
    ap.add_argument("--run-page-height", type=int, default=1700, help="viewport height for the run pages, CSS pixels")
    ap.add_argument("--max-metrics", type=int, default=5, help="metric columns to show in the runs table")
    ap.add_argument("--timeout", type=float, default=120, help="server / page readiness timeout, s")
    args = ap.parse_args()

    uri = args.backend_store_uri
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        die(f"no MLflow store at {uri[len('sqlite:///'):]}; run the pipeline first (make distill CONFIG=tiny)")
    width, height = (int(v) for v in args.window_size.split(","))
    chromium = find_chromium()
    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="ui-screenshot-") as tmp:
        tmp = Path(tmp)
        with mlflow_server(uri, tmp, args.timeout) as base, browser_page(chromium, tmp, width, height) as browser:
            exp = experiment(base, args.experiment)
            exp_id = exp["experiment_id"]
            runs_table(browser, base, exp, args.max_metrics, args.timeout)
            screenshot(browser, out_dir / "mlflow-ui.png")
            set_viewport(browser, width, args.run_page_height)  # description, metrics, datasets in one picture
            pipeline = latest_run(base, exp_id, "pipeline")
            if pipeline is None:
                die(f"experiment {exp['name']!r} has no pipeline run")
            if not open_run_page(browser, base, exp_id, pipeline["info"]["run_id"], ["retention", "Description"],
                                 args.timeout):
                log("WARNING: the pipeline run's page did not show its metrics in time; capturing anyway")
            screenshot(browser, out_dir / "mlflow-run.png")
            sweep = latest_run(base, exp_id, "sweep")
            if sweep is None:
                log(f"experiment {exp['name']!r} has no sweep run; no mlflow-sweep.png (make sweep CONFIG=...)")
                return
            if not open_run_page(browser, base, exp_id, sweep["info"]["run_id"], ["variant", "wall time"], args.timeout):
                log("WARNING: the sweep run's page did not show its table in time; capturing anyway")
            screenshot(browser, out_dir / "mlflow-sweep.png")


if __name__ == "__main__":
    main()
