"""The CPU image (docker/Dockerfile.cpu) runs the pipeline (issue 28 item 1).

`make distill CONFIG=tiny` in the container, on a runs folder mounted from the host: the bundle it writes passes
the host's `predict.py --verify`, a second container run on the same folder finds every stage up to date, and so
does the host's `pipeline status` (fingerprints and manifests depend neither on the absolute path, /app/runs in the
container, nor on the user). The image is built once per session (conftest.docker_images); set DOCKER_LOCAL=1
where Docker Hub and the PyTorch index are unreachable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipeline.runner import STAGES
from tests.helpers import read_json, run_cli

pytestmark = [pytest.mark.pipeline, pytest.mark.external]  # a Docker engine

# ExecuTorch's lowering is the slowest part of tiny's export and has its own tests on the host.
TINY_ARGS = ["export.executorch=off"]
RUN_TIMEOUT_S = 900


def docker_run(image: str, runs: Path, *make_vars: str, timeout: int = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    """`docker run` the image's entrypoint (`make distill`) on ``runs`` mounted as /app/runs.

    The image's user (uid 1000) must write the mounted folder: as root the folder is given to it, otherwise the
    container runs as the caller (`--user uid:gid`, as docker/README.md says)."""
    user = [] if os.geteuid() == 0 else ["--user", f"{os.getuid()}:{os.getgid()}"]
    command = ["docker", "run", "--rm", *user, "-v", f"{runs}:/app/runs", image, *make_vars]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(command)} took over {timeout} s:\n{(e.stderr or b'')[-3000:]}")


@pytest.fixture(scope="module")
def container_runs(docker_images):
    """A runs folder on the host, written by two container runs of tiny; yields (runs, first, second, seconds)."""
    runs = Path(tempfile.mkdtemp(prefix="ad-docker-runs-"))
    if os.geteuid() == 0:
        os.chown(runs, 1000, 1000)  # the image's user `app`
    try:
        started = time.monotonic()
        first = docker_run(docker_images["cpu"], runs, "CONFIG=tiny", f"ARGS={' '.join(TINY_ARGS)}")
        seconds = time.monotonic() - started
        assert first.returncode == 0, f"container run failed:\n{first.stdout[-2000:]}\n{first.stderr[-4000:]}"
        second = docker_run(docker_images["cpu"], runs, "CONFIG=tiny", f"ARGS={' '.join(TINY_ARGS)}")
        assert second.returncode == 0, f"second container run failed:\n{second.stderr[-4000:]}"
        yield runs, first, second, seconds
    finally:
        shutil.rmtree(runs, ignore_errors=True)


def test_image_runs_as_a_non_root_user(docker_images):
    res = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "id", docker_images["cpu"], "-u"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1000"


def test_postgres_image_refuses_an_empty_password(docker_images):
    """The server accepts password logins only: without one it stops at once and says so (not a silent crash loop)."""
    res = subprocess.run(
        ["docker", "run", "--rm", "-e", "POSTGRES_PASSWORD=", docker_images["postgres"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1 and "POSTGRES_PASSWORD is empty" in res.stderr, res.stderr


def test_container_bundle_passes_the_hosts_verify(container_runs):
    runs, first, _, seconds = container_runs
    bundle = runs / "tiny" / "export" / "bundle"
    assert (bundle / "predict.py").is_file(), f"no bundle after {seconds:.0f} s:\n{first.stderr[-3000:]}"
    res = subprocess.run(
        [sys.executable, "-I", "predict.py", "--verify"], cwd=bundle, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["verified"] == len(read_json(bundle / "metadata.json")["files"])


def test_second_container_run_finds_every_stage_up_to_date(container_runs):
    _, _, second, _ = container_runs
    log = second.stdout + second.stderr
    assert "All stages are complete and current; nothing to do" in log, log[-3000:]
    assert "running (fingerprint" not in log


def test_host_sees_the_container_run_as_done(container_runs):
    """Same fingerprints from /app/runs as uid 1000 in the container and from a temp folder as this user here."""
    runs, _, _, _ = container_runs
    res = run_cli("status", "tiny", *TINY_ARGS, runs_dir=runs)  # `make status`, on the host
    assert res.returncode == 0, res.stderr[-3000:]
    states = {line.split()[0]: line.split()[1] for line in res.stdout.splitlines()[2:] if line.split()}
    assert states == {name: "done" for name in STAGES}, res.stdout
