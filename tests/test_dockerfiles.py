"""The Dockerfiles and the compose file, read as text (no Docker needed; issue 28 items 1, 2 and 5).

The GPU image cannot be built on these machines (its CUDA base is on Docker Hub), so what keeps it honest is that
it takes the CPU image's build arguments and ends the same way (user, volume, entrypoint). No Dockerfile pulls a
frontend image (`# syntax=`), every build can be pointed at another base, and what the repository-root Dockerfiles
COPY is in the build context (.dockerignore is an allowlist).
"""

from __future__ import annotations

import fnmatch
import re

import pytest
import yaml

from tests.helpers import ROOT

DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*Dockerfile*"))
IMAGE_ARGS = {"BASE_IMAGE", "TORCH_INDEX_URL", "TORCH_WHEELS", "CA_CERTS"}


def instructions(path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined and comment lines dropped."""
    lines, out, pending = path.read_text().splitlines(), [], ""
    for line in lines:
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def final_stage(path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def arg_names(path) -> set[str]:
    return {rest.split("=")[0] for word, rest in instructions(path) if word == "ARG"}


def test_found_the_dockerfiles():
    names = {p.name for p in DOCKERFILES}
    assert {"Dockerfile.cpu", "Dockerfile.gpu", "mlflow.Dockerfile", "postgres.Dockerfile"} <= names, names


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_no_frontend_pull_and_a_configurable_base(path):
    first = path.read_text().splitlines()[0]
    assert not re.match(r"#\s*syntax\s*=", first, re.I), f"{path.name}: a `# syntax=` line pulls a frontend image"
    froms = [rest for word, rest in instructions(path) if word == "FROM"]
    assert froms[0].startswith("${BASE_IMAGE}"), f"{path.name}: the first FROM is not the BASE_IMAGE argument"
    assert "BASE_IMAGE" in arg_names(path)


def test_gpu_image_takes_the_cpu_images_arguments_and_ends_the_same_way():
    cpu, gpu = DOCKER / "Dockerfile.cpu", DOCKER / "Dockerfile.gpu"
    assert IMAGE_ARGS <= arg_names(cpu) and IMAGE_ARGS <= arg_names(gpu), (arg_names(cpu), arg_names(gpu))

    def ending(path):
        return {word: rest for word, rest in final_stage(path) if word in {"USER", "VOLUME", "ENTRYPOINT", "CMD"}}

    assert ending(cpu) == ending(gpu)
    assert ending(cpu)["USER"] not in {"root", "0"}
    assert ending(cpu)["ENTRYPOINT"] == '["make", "distill"]'


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_what_the_dockerfile_copies_is_in_the_build_context(name):
    allowed = [
        line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    path = DOCKER / name
    defaults = dict(rest.split("=", 1) for word, rest in instructions(path) if word == "ARG" and "=" in rest)
    for word, rest in instructions(path):
        if word != "COPY" or rest.startswith("--from"):
            continue
        for source in rest.split()[:-1]:
            source = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m[1]], source).rstrip("/")
            source = source.replace("[d]", "d")  # README.m[d]: optional file
            assert any(source == a or source.startswith(a + "/") or fnmatch.fnmatch(source, a) for a in allowed), (
                f"{name} copies {source}, which .dockerignore keeps out of the build context"
            )


def test_compose_builds_every_image_on_the_configurable_base_with_the_hosts_network():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert "name" not in compose, "a top-level `name:` breaks Debian's Compose 1.29 (the docs use -p instead)"
    services = compose["services"]
    for name in ("postgres", "mlflow", "trainer-cpu"):
        build = services[name]["build"]
        assert build["network"] == "host", name
        assert build["args"]["BASE_IMAGE"].startswith("${BASE_IMAGE"), name
    assert "image" in services["postgres"] and "postgres.Dockerfile" == services["postgres"]["build"]["dockerfile"]
    assert "--serve-artifacts" in (DOCKER / "mlflow.Dockerfile").read_text()
    assert "mlartifacts:/mlartifacts" in services["mlflow"]["volumes"]
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_the_environment_layer_depends_only_on_the_install_inputs(name):
    """The build stage (the venv: minutes) copies only what `make venv` reads, so editing docs or code reuses it."""
    steps = instructions(DOCKER / name)
    froms = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    build = steps[froms[1] : froms[2]]
    copied = {source for word, rest in build if word == "COPY" for source in rest.split()[:-1]}
    assert copied == {
        "${TORCH_WHEELS}/",
        "${CA_CERTS}/",
        "pyproject.toml",
        "Makefile",
        "pipeline/bundle_files/web/package-lock.json",
        "tests/node/package-lock.json",
    }, copied


@pytest.mark.process
def test_build_inputs_refuse_a_wheel_folder_without_the_pinned_torch_and_keep_the_old_inputs(tmp_path):
    import subprocess

    before = sorted(p.name for p in (DOCKER / "wheels").iterdir())
    res = subprocess.run(
        ["make", "-s", "docker-build-inputs", f"TORCH_WHEELS_FROM={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode != 0 and f"TORCH_WHEELS_FROM={tmp_path} holds no torch-" in res.stderr, res.stderr
    assert sorted(p.name for p in (DOCKER / "wheels").iterdir()) == before
    res = subprocess.run(
        ["make", "-s", "docker-build-inputs", f"CA_BUNDLE={tmp_path / 'none.pem'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode != 0 and "is not a file" in res.stderr, res.stderr


@pytest.mark.process
def test_docker_base_script_says_what_is_missing(tmp_path):
    import subprocess

    res = subprocess.run(
        ["/bin/bash", str(ROOT / "scripts" / "docker_base.sh")],
        env={"PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "no 'docker' command: install Docker" in res.stderr, res.stderr
