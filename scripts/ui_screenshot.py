#!/usr/bin/env python3
"""Screenshot the MLflow UI's experiment page (docs/mlflow-ui.png).

    python scripts/ui_screenshot.py [--backend-store-uri sqlite:///runs/mlflow.db]
                                    [--experiment tiny] [--out docs/mlflow-ui.png]

Starts `mlflow server` on 127.0.0.1 (free port, --workers 1) on the given store,
opens the experiment's runs page in headless Chromium (installs the Debian package
`chromium` with apt-get when it is missing and we are root), writes the PNG and
stops the server by process id.

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
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend-store-uri", default=f"sqlite:///{REPO / 'runs' / 'mlflow.db'}")
    ap.add_argument("--experiment", help="experiment name (default: the most recently updated one)")
    ap.add_argument("--out", default=str(REPO / "docs" / "mlflow-ui.png"))
    ap.add_argument("--window-size", default="1600,1000", help="W,H in CSS pixels")
    ap.add_argument("--max-metrics", type=int, default=5, help="metric columns to show")
    ap.add_argument("--timeout", type=float, default=120, help="server / page readiness timeout, s")
    args = ap.parse_args()

    uri = args.backend_store_uri
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        die(f"no MLflow store at {uri[len('sqlite:///'):]}; run the pipeline first (make distill CONFIG=tiny)")
    width, height = (int(v) for v in args.window_size.split(","))
    chromium = find_chromium()
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    with tempfile.TemporaryDirectory(prefix="ui-screenshot-") as tmp:
        tmp = Path(tmp)
        server_log = tmp / "server.log"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(server_log, "w") as f:
            server = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
                 "--artifacts-destination", str(tmp / "artifacts"),
                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                stdout=f, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True,
            )
        browser = None
        try:
            wait_ready(base, server, server_log, args.timeout)
            if args.experiment:
                exp = api(base, "experiments/get-by-name", experiment_name=args.experiment)["experiment"]
            else:
                exps = api(base, "experiments/search", {"max_results": 1000, "order_by": ["last_update_time DESC"]})
                exps = [e for e in exps.get("experiments", []) if e["name"] != "Default"]
                exp = exps[0] if exps else die("the store has no experiment besides 'Default'")
            exp_id = exp["experiment_id"]
            state, run_names, top_level = ui_state(base, exp_id, args.max_metrics)
            if not run_names:
                die(f"experiment {exp['name']!r} has no runs")
            url = f"{base}/#/experiments/{exp_id}/runs?workflowType=machine_learning"
            log(f"experiment {exp['name']!r} ({len(run_names)} runs): {url}")

            with open(tmp / "chromium.log", "w") as clog:
                browser = DevTools(chromium, CHROMIUM_FLAGS + [
                    f"--user-data-dir={tmp / 'chromium'}", f"--window-size={width},{height}"], clog)
                target = browser("Target.createTarget", url="about:blank")["targetId"]
                browser.session = browser("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
                browser("Emulation.setDeviceMetricsOverride", width=width, height=height,
                        deviceScaleFactor=1, mobile=False)
                browser("Page.navigate", url=url)
                table_ready = f"document.body && document.body.innerText.includes({json.dumps(top_level[0])})"
                if not browser.wait_for(table_ready, args.timeout):
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
                all_names = " && ".join(f"document.body.innerText.includes({json.dumps(n)})" for n in run_names)
                if not browser.wait_for(f"document.body && {all_names}", args.timeout):
                    log("WARNING: not every run is visible (UI state keys changed?); capturing anyway")
                # Close the assistant panel if this MLflow version still opens it.
                browser.js("""document.querySelectorAll('[data-component-id="mlflow.assistant.chat_panel.close"]')
                              .forEach(b => b.click())""")
                time.sleep(2)  # let charts/icons settle
                png = browser("Page.captureScreenshot", format="png")["data"]
                out.write_bytes(base64.b64decode(png))
        except RuntimeError as e:
            die(f"{e}\n{(tmp / 'chromium.log').read_text()[-3000:] if (tmp / 'chromium.log').exists() else ''}")
        finally:
            if browser is not None:
                browser.close()
            stop_server(server)
    log(f"wrote {out} ({out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
