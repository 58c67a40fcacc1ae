"""Sweeps (issue 15 item 2): three tiny variants, shared stages once, the table, the plot and the pick.

One sweep of configs/sweeps/tiny_depth.yaml is run for the module (about a minute of stage work);
the other tests rerun it with other picks, which must do no stage work, and (last) after removing
the last variant's evaluate and export, which must rerun only those.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
import re
import signal
import subprocess
import sys

import mlflow
import pytest

from pipeline.errors import ConfigError, PipelineError
from pipeline.plots import pareto_front
from pipeline.runner import STAGES
from pipeline.sweep import Constraint, choose, load_sweep, parse_pick
from pipeline.sweep.run import run_variant, stage_seconds
from tests.helpers import ROOT, read_json, run_cli

pytestmark = pytest.mark.pipeline

SWEEP = "configs/sweeps/tiny_depth.yaml"
# every sweep command of the module, as one user would repeat it: no .pte (~20 s an export, checked on the shared
# tiny run), sweeps are the point here
NO_PTE = "export.executorch=off"
VARIANTS = ["first", "last", "both"]
MODEL = "attention-distill-tiny"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("sweep_runs")
    result = run_cli("sweep", "tiny", SWEEP, NO_PTE, "--pick", "mb<=1000", runs_dir=runs_dir, timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    folder = runs_dir / "tiny" / "sweeps" / "tiny_depth"
    return {
        "runs_dir": runs_dir,
        "folder": folder,
        "first": result,
        "client": mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}"),
    }


def _runs(client, **tags):
    experiment = client.get_experiment_by_name("tiny")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return [r for r in runs if all(r.data.tags.get(f"attention_distill.{k}") == v for k, v in tags.items())]


def _champion(client) -> str:
    return str(client.get_model_version_by_alias(MODEL, "champion").version)


def _rows(folder) -> dict[str, dict]:
    return {row["variant"]: row for row in read_json(folder / "sweep.json")["variants"]}


def _stage_work(folder) -> dict:
    """Every variant's stage manifests: (completed_at, MLflow run) per stage, to show nothing reran."""
    return {
        (v, s): (m["completed_at"], m["mlflow_run_id"])
        for v in VARIANTS
        for s in STAGES
        if (m := read_json(folder / v / s / "manifest.json"))
    }


def test_shared_stages_run_once(sweep):
    folder, client = sweep["folder"], sweep["client"]
    for stage in ("prepare", "teacher", "capture"):
        assert len(_runs(client, stage=stage)) == 1, stage  # one MLflow stage run for the whole sweep
        manifests = [read_json(folder / v / stage / "manifest.json") for v in VARIANTS]
        assert len({m["mlflow_run_id"] for m in manifests}) == 1
        # the later variants hold hard links to the first one's files, not copies
        first = next(p for p in (folder / "first" / stage).rglob("*") if p.is_file() and p.name != "manifest.json")
        for v in VARIANTS[1:]:
            assert os.path.samefile(first, folder / v / stage / first.relative_to(folder / "first" / stage))
    for stage in ("distill", "evaluate", "export"):  # the variants' own stages: one each
        assert len(_runs(client, stage=stage)) == 3, stage
    students = {v: read_json(folder / v / "distill" / "student" / "config.json")["num_hidden_layers"] for v in VARIANTS}
    assert students == {"first": 1, "last": 1, "both": 2}
    # one teacher, so its fp32 graph is exported once: the later variants' exports take it from runs/.cache
    assert sweep["first"].stderr.count("the teacher's fp32 graph reused from") == len(VARIANTS) - 1
    assert len(list((sweep["runs_dir"] / ".cache").glob("teacher-*.onnx"))) == 1


def test_variants_are_children_of_one_sweep_run(sweep):
    client = sweep["client"]
    (sweep_run,) = _runs(client, role="sweep")
    pipelines = _runs(client, role="pipeline")
    assert sorted(r.info.run_name for r in pipelines) == sorted(f"tiny-{v}" for v in VARIANTS)
    assert {r.data.tags["mlflow.parentRunId"] for r in pipelines} == {sweep_run.info.run_id}
    assert "| variant | description | layers |" in sweep_run.data.tags["mlflow.note.content"]
    artifacts = {a.path for a in client.list_artifacts(sweep_run.info.run_id, "sweep")}
    assert {"sweep/sweep.md", "sweep/sweep.csv", "sweep/sweep.json", "sweep/pareto.png"} <= artifacts


def test_each_variant_runs_in_a_process_of_its_own(sweep):
    """A variant's memory goes back to the system when it ends (a base-size sweep run in one process grew to
    24 GB): each variant ran in a process of its own, started by the sweep's."""
    processes = dict(re.findall(r"\[sweep\] variant (\w+) runs in process (\d+)", sweep["first"].stderr))
    assert sorted(processes) == sorted(VARIANTS)
    assert len(set(processes.values())) == len(VARIANTS)


def _kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


class _Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.callback = lambda: None


def _fail_with_a_chain():
    try:
        raise ValueError("the root cause")
    except ValueError as cause:
        error = OSError(errno.ENOSPC, "No space left on device")
        error.pipeline_stage = "capture"
        raise error from cause


def _fail_unpicklable():
    error = _Unpicklable("cannot cross")
    error.pipeline_stage = "export"
    raise error


def test_a_variant_killed_by_the_system_is_named():
    with pytest.raises(PipelineError, match=r"variant 'v1' ended without finishing its run \(killed by SIGKILL\)"):
        run_variant("v1", {}, child_setup=_kill_self)


def test_a_variant_error_reaches_the_sweep_with_its_chain_and_stage():
    """The command line explains the error from its chain (a full disk, a missing module) and its stage."""
    with pytest.raises(OSError) as raised:
        run_variant("v2", {}, child_setup=_fail_with_a_chain)
    assert raised.value.errno == errno.ENOSPC and raised.value.pipeline_stage == "capture"
    assert isinstance(raised.value.__cause__, ValueError) and str(raised.value.__cause__) == "the root cause"
    with pytest.raises(RuntimeError, match="_Unpicklable: cannot cross") as raised:
        run_variant("v3", {}, child_setup=_fail_unpicklable)
    assert raised.value.pipeline_stage == "export"


def test_table_and_plot(sweep):
    folder = sweep["folder"]
    rows = _rows(folder)
    assert list(rows) == VARIANTS
    for name, row in rows.items():  # the table's figures are the variant's own stage outputs
        export = read_json(folder / name / "export" / "metrics.json")
        evaluate = read_json(folder / name / "evaluate" / "metrics.json")
        assert row["retention"] == evaluate["retention"]
        assert row["accuracy"] == export[f"onnx_{export['recommended']}"]["accuracy"]
        assert row["mb"] == export[f"onnx_{export['recommended']}"]["file_mb"]
        assert row["size_ratio"] == export["versus_int8_teacher"]["size_vs_int8_teacher"]
        assert row["speedup"] == export["versus_int8_teacher"]["speedup_vs_int8_teacher"]["L=16"]
        assert row["latency_ms"] > 0 and row["wall_s"] > 0
        assert row["registered"].startswith(f"{MODEL}/")
    assert len({row["registered"] for row in rows.values()}) == 3
    # wall time: the stages a variant ran itself; the first one also ran the shared ones
    seconds = {(v, s): read_json(folder / v / s / "manifest.json")["duration_s"] for v in VARIANTS for s in STAGES}
    assert rows["first"]["wall_s"] == pytest.approx(sum(seconds["first", s] for s in STAGES), abs=0.11)
    assert rows["both"]["wall_s"] == pytest.approx(
        sum(seconds["both", s] for s in STAGES[STAGES.index("distill") :]), abs=0.11
    )
    with open(folder / "sweep.csv") as handle:
        table = list(csv.DictReader(handle))
    assert [r["variant"] for r in table] == VARIANTS and float(table[2]["mb"]) == rows["both"]["mb"]
    markdown = (folder / "sweep.md").read_text()
    assert markdown.count("\n| ") >= 5 and "int8 teacher (baseline)" in markdown
    assert "Shared (run once" in markdown and "teacher (" in markdown
    assert (folder / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_stage_linked_from_another_sweep_is_not_this_sweeps_work(tmp_path):
    """A variant's wall time counts only the stages it ran: its manifest's ``ran_in`` (kept by every hard-linked copy)
    names the folder that did the work, so a stage linked from the config's run folder or from another sweep's variant
    is shared under that folder's name and counted for none of this sweep's variants (a 100-minute capture linked from
    another sweep once made a 20-minute variant read two hours). Manifests without ``ran_in``: the first holder."""

    def manifest(folder, stage, fingerprint, seconds, ran_in=None, completed="2026-12-07T04:04:20"):
        (folder / stage).mkdir(parents=True, exist_ok=True)
        fields = {"stage": stage, "fingerprint": fingerprint, "completed_at": completed, "duration_s": seconds}
        (folder / stage / "manifest.json").write_text(json.dumps({**fields, **({"ran_in": ran_in} if ran_in else {})}))

    base = tmp_path / "runs" / "cfg"
    manifest(base, "teacher", "t", 850.0, "cfg")
    folder = base / "sweeps" / "phone"
    for variant in ("s1", "s2"):
        manifest(folder / variant, "teacher", "t", 850.0, "cfg")
        manifest(folder / variant, "capture", "c", 6175.0, "cfg/sweeps/all/big_s42")
        manifest(folder / variant, "prepare", "p", 16.0, "cfg/sweeps/phone/s1")
        manifest(folder / variant, "distill", f"d-{variant}", 1000.0 + int(variant[1]), f"cfg/sweeps/phone/{variant}")
    seconds, shared = stage_seconds(folder, base, ["s1", "s2"])
    assert seconds == {"s1": 1017.0, "s2": 1002.0}
    assert shared == {
        "teacher": ("the config's run folder", 850.0),
        "prepare": ("s1", 16.0),
        "capture": ("sweep all, variant big_s42", 6175.0),
    }

    old = base / "sweeps" / "old"  # manifests from before ran_in: the first variant holding a stage ran it
    for variant in ("a", "b"):
        manifest(old / variant, "teacher", "t", 850.0, completed="then")
        manifest(old / variant, "capture", "c", 300.0)
        manifest(old / variant, "distill", f"d-{variant}", 100.0, completed=variant)
    (base / "teacher" / "manifest.json").write_text(
        json.dumps({"stage": "teacher", "fingerprint": "t", "completed_at": "then", "duration_s": 850.0})
    )
    seconds, shared = stage_seconds(old, base, ["a", "b"])
    assert seconds == {"a": 400.0, "b": 100.0}
    assert shared == {"teacher": ("the config's run folder", 850.0), "capture": ("a", 300.0)}


def test_pick_moves_champion_to_the_fastest_meeting_the_constraint(sweep):
    rows = _rows(sweep["folder"])
    fastest = min(rows.values(), key=lambda r: r["latency_ms"])
    assert read_json(sweep["folder"] / "sweep.json")["pick"]["picked"] == fastest["variant"]
    assert _champion(sweep["client"]) == fastest["registered"].rsplit("/", 1)[1]
    assert f"Picked '{fastest['variant']}'" in sweep["first"].stderr


def test_rerun_does_no_stage_work_and_a_new_pick_moves_the_alias(sweep):
    folder, client = sweep["folder"], sweep["client"]
    before, stage_runs = _stage_work(folder), len(_runs(client, role="stage"))
    rows = _rows(folder)
    slowest = max(rows.values(), key=lambda r: r["latency_ms"])
    # only the slowest variant meets a latency floor at its own latency: the alias must follow the constraint
    result = run_cli(
        "sweep", "tiny", SWEEP, NO_PTE, "--pick", f"latency_ms>={slowest['latency_ms']}", runs_dir=sweep["runs_dir"]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert _stage_work(folder) == before
    assert len(_runs(client, role="stage")) == stage_runs
    assert len(_runs(client, role="sweep")) == 1  # the same sweep run, re-attached
    assert _champion(client) == slowest["registered"].rsplit("/", 1)[1]
    assert "stages run now" not in result.stdout and "running (fingerprint" not in result.stderr


def test_no_variant_meets_the_constraint(sweep):
    client = sweep["client"]
    champion = _champion(client)
    result = run_cli("sweep", "tiny", SWEEP, NO_PTE, "--pick", "retention>=1.5", runs_dir=sweep["runs_dir"])
    assert result.returncode == 1
    assert "No variant meets retention>=1.5" in result.stderr
    for name, row in _rows(sweep["folder"]).items():
        assert (
            f"{name}: retention {row['retention']:.4g} (needs >= 1.5, off by {1.5 - row['retention']:.4g})"
            in result.stderr
        )
    assert "'champion' alias was not moved" in result.stderr
    assert _champion(client) == champion
    assert read_json(sweep["folder"] / "sweep.json")["pick"]["picked"] is None


def test_a_stopped_sweep_continues_where_it_stopped(sweep):
    """As if the sweep had been stopped after the last variant's distillation: the rerun runs only that
    variant's evaluate and export, touches nothing else, and ends with the table and the pick.
    (Resuming inside a stage from its checkpoints is the runner's, tested in tests/test_resume.py.)"""
    import shutil

    folder, client = sweep["folder"], sweep["client"]
    before = _stage_work(folder)
    for stage in ("evaluate", "export"):
        shutil.rmtree(folder / "both" / stage)
    result = run_cli("sweep", "tiny", SWEEP, NO_PTE, "--pick", "mb<=1000", runs_dir=sweep["runs_dir"])
    assert result.returncode == 0, result.stderr[-3000:]
    after = _stage_work(folder)
    reran = {key for key in after if after[key] != before.get(key)}
    assert reran == {("both", "evaluate"), ("both", "export")}
    assert result.stderr.count("running (fingerprint") == 2
    assert [row["variant"] for row in read_json(folder / "sweep.json")["variants"]] == VARIANTS
    assert read_json(folder / "sweep.json")["pick"]["picked"] in VARIANTS
    assert len(_runs(client, role="sweep")) == 1


def _start_sweep(runs_dir):
    """The tiny sweep in the background; returns (process, the first variant's pid) once that variant's process
    has started a stage."""
    import subprocess
    import sys
    import time

    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "sweep", "tiny", SWEEP, NO_PTE, "--runs-dir", str(runs_dir)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    variant, deadline, seen = None, time.monotonic() + 180, []
    for line in process.stderr:  # the sweep's log, line by line, until the variant is inside a stage
        seen.append(line)
        found = re.search(r"variant first runs in process (\d+)", line)
        variant = int(found.group(1)) if found else variant
        if variant and "running (fingerprint" in line:
            return process, variant
        assert time.monotonic() < deadline, "".join(seen[-30:])
    raise AssertionError("the sweep ended before its first variant ran a stage:\n" + "".join(seen[-30:]))


def _gone(pid: int, within_s: float = 30.0) -> bool:
    import time

    import psutil

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.2)
    return False


def test_a_kill9_of_the_sweep_ends_its_variant_process(tmp_path):
    process, variant = _start_sweep(tmp_path)
    try:
        process.kill()
        process.wait(timeout=30)
        assert _gone(variant), f"the variant's process {variant} outlived the sweep"
    finally:
        process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(variant, signal.SIGKILL)


def test_sigterm_to_the_sweep_stops_its_variant_once_and_leaves_no_running_run(tmp_path):
    """A scheduler's SIGTERM reaches the sweep's process only: it is passed on, the variant marks its MLflow
    runs as killed, and the sweep exits as after Ctrl-C (130, resumable)."""
    process, variant = _start_sweep(tmp_path)
    try:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, stderr[-3000:]
    assert "rerun the same command to resume" in stderr
    assert _gone(variant)
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny").experiment_id
    runs = client.search_runs([experiment])
    running = [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    assert runs and not running, f"left RUNNING: {running}; the sweep's log:\n{stderr[-3000:]}"
    assert "KILLED" in {r.info.status for r in runs if r.data.tags.get("attention_distill.role") == "pipeline"}


# ---------------------------------------------------------------- the sweep file and the pick, without running


def _write(tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, expected",
    [
        ("variant:\n  a: {}\n", "variant: unknown key. Did you mean 'variants'?"),
        ("variants:\n  a: {overides: {seed: 1}}\n", "variants.a.overides: unknown key. Did you mean 'overrides'?"),
        ("variants: {}\n", "variants: Dictionary should have at least 1 item"),
        ("variants:\n  'a b': {}\n", '"a b" is not a usable variant name'),
        ("variants:\n  a: {overrides: {student.teacher_layer: [0]}}\n", "variant 'a'"),
        ("variants:\n  a: {overrides: {distill.epochs: -1}}\n", "distill.epochs"),
        ("variants:\n  a: {overrides: {name: other}}\n", "sets 'name', which the variants must share"),
        ("pick: fast\nvariants:\n  a: {}\n", "'fast' is not a constraint"),
        ("- a\n- b\n", "must hold a mapping"),
    ],
)
def test_bad_sweep_file_is_one_clear_error(tmp_path, text, expected):
    with pytest.raises(ConfigError) as info:
        load_sweep("tiny", _write(tmp_path, text))
    assert expected in str(info.value)
    if "variant 'a'" in expected:
        assert "did you mean 'student.teacher_layers'?" in str(info.value)


def test_bad_sweep_exits_2_before_any_work(tmp_path):
    result = run_cli(
        "sweep", "tiny", str(_write(tmp_path, "variants:\n  a: {overides: {}}\n")), runs_dir=tmp_path / "r"
    )
    assert result.returncode == 2
    assert "overides: unknown key" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "r" / "tiny").exists()
    missing = run_cli("sweep", "tiny", "configs/sweeps/nope.yaml", runs_dir=tmp_path / "r")
    assert missing.returncode == 2 and "Sweep file configs/sweeps/nope.yaml not found" in missing.stderr
    # ... answered before torch is imported (seconds): the sweep package loads its runner on first use
    probe = "import sys, pipeline.sweep; print(sorted({'torch', 'pipeline.runner'} & set(sys.modules)))"
    imported = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]", imported.stdout


def test_sweep_file_resolves_every_variant(tmp_path):
    sweep = load_sweep("tiny", ROOT / SWEEP, ["seed=7"])
    assert sweep.variants == VARIANTS
    assert [c.student.teacher_layers for c in sweep.configs.values()] == [[0], [1], [0, 1]]
    assert {c.distill.epochs for c in sweep.configs.values()} == {1}  # the sweep's common overrides
    assert {c.seed for c in sweep.configs.values()} == {7}  # the command line's
    assert {c.name for c in sweep.configs.values()} == {"tiny"}


def test_pick_grammar_and_choice():
    assert parse_pick("retention>=0.98, latency_ms<5") == [
        Constraint("retention", ">=", 0.98),
        Constraint("latency_ms", "<", 5.0),
    ]
    for bad in ("retention=0.9", "speed>=2", "mb<=ten", ""):
        with pytest.raises(ConfigError, match="is not a constraint"):
            parse_pick(bad)
    rows = [
        {"variant": "a", "retention": 0.99, "latency_ms": 4.0, "mb": 9.0},
        {"variant": "b", "retention": 0.97, "latency_ms": 2.0, "mb": 5.0},
        {"variant": "c", "retention": 0.985, "latency_ms": 3.0, "mb": 12.0},
        {"variant": "d", "retention": 0.995, "latency_ms": None, "mb": 8.0},
    ]
    assert choose(rows, parse_pick("retention>=0.98"))[0]["variant"] == "c"  # fastest that meets it; unmeasured last
    assert choose(rows, parse_pick("retention>=0.98,mb<=10"))[0]["variant"] == "a"
    assert choose(rows, parse_pick("latency_ms<=2.5"))[0]["variant"] == "b"
    picked, lines = choose(rows, parse_pick("retention>=0.999"))
    assert picked is None and "a: retention 0.99 (needs >= 0.999, off by 0.009)" in "\n".join(lines)
    assert [r["variant"] for r in pareto_front(rows, "latency_ms")] == ["b", "c", "a"]
    assert [r["variant"] for r in pareto_front(rows, "mb")] == ["b", "d"]


def test_a_variant_with_unlabeled_text_links_the_teacher_after_its_own_prepare(tmp_path):
    """data.unlabeled_text reruns prepare (it writes the unlabelled rows) but not the teacher nor the peers, which
    never read them: the variant runs its own prepare, then links the first variant's teacher and peers (asked again
    before each stage, now that its upstream is there) and runs capture. Before, the teacher trained again."""
    spec = tmp_path / "unlabeled.yaml"
    spec.write_text(
        'description: "with and without unlabelled text"\n'
        "variants:\n"
        '  plain: {description: "labelled only", overrides: {}}\n'
        '  unlabeled: {description: "+ unlabelled text", overrides: {data.unlabeled_text: true}}\n'
    )
    runs_dir = tmp_path / "runs"
    result = run_cli("sweep", "tiny", str(spec), NO_PTE, "--to", "capture", runs_dir=runs_dir, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    folder = runs_dir / "tiny" / "sweeps" / "unlabeled"
    log = result.stderr
    assert "[teacher] reused from" in log and "[peers] reused from" in log, log[-3000:]
    assert log.count("[teacher] running") == 1 and log.count("[prepare] running") == 2, log[-3000:]
    assert (folder / "unlabeled" / "prepare" / "unlabeled.jsonl").is_file()
    for stage in ("teacher", "peers"):
        assert read_json(folder / "unlabeled" / stage / "manifest.json") == read_json(
            folder / "plain" / stage / "manifest.json"
        )
    assert (
        read_json(folder / "unlabeled" / "capture" / "manifest.json")["fingerprint"]
        != read_json(folder / "plain" / "capture" / "manifest.json")["fingerprint"]
    )
