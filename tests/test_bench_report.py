"""bench/report.py: BENCHMARKS.md is rendered from the committed results, and only from files whose origin is known.

No measuring and no model: a few file reads.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from tests.helpers import ROOT, run_bench

RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402 (bench/ is put on sys.path above: report.py is a script there)


def test_committed_benchmarks_md_is_what_the_committed_results_render():
    rendered = report.render(RESULTS, ROOT / "BENCHMARKS.md")
    assert rendered == (ROOT / "BENCHMARKS.md").read_text(), (
        "BENCHMARKS.md differs from what bench/report.py renders: run `make bench-report` and commit it"
    )


def test_readme_table_is_the_committed_budget_sweep():
    table = report.readme_table(RESULTS)
    assert table in (ROOT / "README.md").read_text(), (
        "README.md's table differs from `python bench/report.py --readme-table`: paste the new one"
    )
    sweep = json.loads((RESULTS / "sweep_budget_bert_small.json").read_text())
    assert len(table.strip().splitlines()) == 2 + len(sweep["variants"]) + len(sweep["references"])


def test_every_results_file_is_listed_and_every_section_names_command_date_machine():
    text = (ROOT / "BENCHMARKS.md").read_text()
    listed = {s.file for s in report.SECTIONS} | {d for s in report.SECTIONS for d in s.data}
    assert {p.name for p in RESULTS.iterdir() if p.is_file()} <= listed
    sections = text.split("\n### ")[1:]
    assert len(sections) == sum((RESULTS / s.file).is_file() for s in report.SECTIONS)
    for section in sections:
        assert "\nCommand: `" in section and "\nDate: " in section and "\nMachine: " in section, section[:80]


def test_results_of_an_earlier_default_are_labelled():
    text = (ROOT / "BENCHMARKS.md").read_text()
    earlier = text.split("\n## Earlier defaults\n", 1)[1]
    assert "### `make bench`" in earlier  # bench.json measured the 2-layer default
    assert earlier.count("> **Earlier default** (") == earlier.count("\n### ")
    assert "> **Earlier default**" not in text.split("\n## Earlier defaults\n", 1)[0]


@pytest.fixture()
def results_copy(tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    return copy


def test_a_results_file_without_header_is_refused(results_copy, tmp_path):
    path = results_copy / "phone_table_bert_small.md"
    path.write_text(
        "".join(
            line
            for line in path.read_text().splitlines(keepends=True)
            if not line.startswith(("Command: ", "Date: ", "Machine: "))
        )
    )
    with pytest.raises(report.ReportError, match="phone_table_bert_small.md: no header"):
        report.render(results_copy, tmp_path / "BENCHMARKS.md")


def test_a_results_json_without_header_is_refused(results_copy, tmp_path):
    path = results_copy / "debates.json"
    data = json.loads(path.read_text())
    del data["machine"]
    path.write_text(json.dumps(data))
    with pytest.raises(report.ReportError, match="debates.json: no header"):
        report.render(results_copy, tmp_path / "BENCHMARKS.md")


def test_an_unlisted_results_file_is_refused(results_copy, tmp_path):
    (results_copy / "new_bench.md").write_text("Command: `python x.py`  \nDate: 2026-12-02  \nMachine: here\n")
    with pytest.raises(report.ReportError, match="new_bench.md not listed"):
        report.render(results_copy, tmp_path / "BENCHMARKS.md")


def test_a_partial_results_folder_renders_what_it_has(results_copy, tmp_path):
    for name in (
        "bench.json",
        "sweep_depth_bert_small.md",
        "sweep_depth_bert_small.json",
        "sweep_depth_bert_small.png",
    ):
        (results_copy / name).unlink()
    text = report.render(results_copy, tmp_path / "BENCHMARKS.md")
    assert "### Depth sweep" not in text and "`make bench`:" not in text and "### A student for every budget" in text


def test_stamp_adds_the_header_once(tmp_path):
    path = tmp_path / "sweep.md"
    path.write_text("# Sweep `budget` on `bert_small`\n\n| a |\n|---|\n")
    report.stamp(
        path, "make sweep CONFIG=bert_small SWEEP=configs/sweeps/budget.yaml", "a test machine", "2026-12-02", "abc1234"
    )
    from common import read_header

    assert read_header(path.read_text()) == {
        "command": "make sweep CONFIG=bert_small SWEEP=configs/sweeps/budget.yaml",
        "date": "2026-12-02",
        "machine": "a test machine",
        "commit": "abc1234",
    }
    assert path.read_text().startswith("# Sweep `budget` on `bert_small`\n\nCommand: `make sweep")
    with pytest.raises(report.ReportError, match="already has a header"):
        report.stamp(path, "again")


@pytest.mark.process
def test_check_command_exits_0_on_the_committed_files():
    result = run_bench("report.py", "--check", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_run_report_reads_a_clone_per_stage_and_its_seeds(tiny_run, tmp_path):
    """bench/default_run.py --report and --seeds on a completed clone (here the tiny run, with itself as a seed):
    every stage's manifest seconds, the set-up left over, the teacher's and the shipped accuracy."""
    import default_run

    clone = tmp_path / "clone"
    (clone / "runs").mkdir(parents=True)
    shutil.copytree(tiny_run["run_dir"], clone / "runs" / "tiny", symlinks=True)
    seeds = clone / "runs" / "tiny" / "sweeps" / "distill_seeds"
    seeds.mkdir(parents=True)
    (seeds / "seed1").symlink_to(clone / "runs" / "tiny")
    (clone / default_run.TIMING).write_text(json.dumps({"rev": "0123456789abcdef", "config": "tiny", "wall_s": 500.0}))
    row = default_run.row(clone)
    manifests = {
        s: json.loads((tiny_run["run_dir"] / s / "manifest.json").read_text())["duration_s"]
        for s in ("prepare", "teacher", "distill", "export")
    }
    assert all(row["stages"][s] == seconds for s, seconds in manifests.items())
    export = json.loads((tiny_run["run_dir"] / "export" / "metrics.json").read_text())
    assert (
        row["shipped_accuracy"]
        == export[{"fp32": "onnx_fp32", "int8": "onnx_int8", "int8_static": "onnx_int8_static"}[export["recommended"]]][
            "accuracy"
        ]
    )
    lines = default_run.table([row])
    overhead = 500.0 - sum(row["stages"].values())
    assert lines[4].startswith(f"| 0123456 | 8.3 min (500 s) | {overhead:.0f} s | ")
    seed_lines = default_run.seeds_table([clone], "tiny")
    assert [line.split(" | ")[1] for line in seed_lines[4:7]] == ["the run (config seed)", "seed1", "mean of 2 (sd)"]
    assert seed_lines[6].endswith(f"{row['shipped_accuracy']:.4f} (0.0000) |")


def test_text_latency_measures_shipped_students_on_the_same_texts(tiny_run, tmp_path):
    """bench/text_latency.py: each run's text-in model gives, one text per call, the accuracy its export recorded
    (same graph, same texts); one row per run, the first the reference; runs of other test texts are refused."""
    run = tiny_run["run_dir"]
    twin = tmp_path / "twin"  # a second run folder: the same bundle and split, so the same accuracy
    for part in ("prepare", "export"):
        shutil.copytree(run / part, twin / part, symlinks=True)
    out = tmp_path / "text_latency.md"
    result = run_bench("text_latency.py", str(run), str(twin), "--texts", "4", "--rounds", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    export = json.loads((run / "export" / "metrics.json").read_text())
    recorded = export[f"onnx_{export['recommended']}"]["accuracy"]
    rows = [
        line for line in out.read_text().splitlines() if line.startswith(f"| {run}") or line.startswith(f"| {twin}")
    ]
    assert len(rows) == 2 and rows[0].endswith("| 1 |") and rows[1].split(" | ")[5] == "+0.00", rows
    assert all(row.split(" | ")[3] == f"{recorded:.4f}" for row in rows), (recorded, rows)

    test = twin / "prepare" / "test.jsonl"
    lines = test.read_text().splitlines()
    test.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")  # the same texts in another order
    refused = run_bench("text_latency.py", str(run), str(twin), "--texts", "4", "--rounds", "2")
    assert refused.returncode != 0 and "other test texts" in refused.stderr, refused.stderr[-2000:]


def test_capture_levers_times_every_setting_on_a_run(tiny_run, tmp_path):
    """bench/capture_levers.py on the tiny run: one row per setting, each a positive rate, the stage's settings 1.00x,
    and the stage's own figure from its manifest."""
    out = tmp_path / "capture_levers.md"
    result = run_bench("capture_levers.py", str(tiny_run["run_dir"]), "--examples", "48", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Capture levers") and "Command: `python bench/capture_levers.py" in text
    rows = {
        line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ") and "x |" in line
    }
    assert "the stage's settings" in rows and rows["the stage's settings"].endswith("| 1.00x |"), rows
    for label in (
        "capture.batch_size 16",
        "batches in data order (not by length)",
        "torch.inference_mode",
        "1 torch thread",
    ):
        rate = float(rows[label].split(" | ")[1])
        assert rate > 0, rows[label]
    assert "The stage itself (manifest): 260 examples" in text, text


def test_ablation_table_averages_seeds_and_differences_on_common_seeds(tmp_path):
    import ablation_table

    sweep = tmp_path / "base_ablation"
    figures = {"ce_s1": 0.80, "ce_s2": 0.82, "kd_s1": 0.83, "kd_s2": 0.83, "kd_s3": 0.90, "notes": 0.5}
    for name, accuracy in figures.items():
        (sweep / name / "evaluate").mkdir(parents=True)
        (sweep / name / "distill").mkdir()
        metrics = {"student": {"accuracy": accuracy, "macro_f1": accuracy - 0.01}, "teacher": {"accuracy": 0.9}}
        (sweep / name / "evaluate" / "metrics.json").write_text(json.dumps({**metrics, "retention": accuracy / 0.9}))
        (sweep / name / "distill" / "manifest.json").write_text(json.dumps({"duration_s": 100.0}))
    (sweep / "kd_s4").mkdir()  # not evaluated yet: left out
    variants = [{"variant": v, "description": f"{v.split('_')[0]} losses, seed {v[-1]}"} for v in ("kd_s1", "ce_s1")]
    (sweep / "sweep.json").write_text(json.dumps({"variants": variants}))  # kd first: the sweep file's order wins
    rows = ablation_table.table(*ablation_table.collect(sweep))[2:]
    assert rows[0].startswith("| kd losses | 3 | 0.8533 (0.8300-0.9000) | 0.8433 |")
    assert rows[1].startswith("| ce losses | 2 (fewer) | 0.8100 (0.8000-0.8200) |")
    assert "| -2.00 (-3.00 to -1.00) | 100 |" in rows[1]  # ce - kd on seeds 1 and 2 only
    assert rows[2].startswith("| teacher (fine-tuned, PyTorch) | - | 0.9000 |")
    assert ablation_table.main([str(tmp_path / "missing")]) == 2
    (sweep / "sweep.json").unlink()  # a sweep stopped part way: labels and order from the sweep file
    spec = tmp_path / "ablation.yaml"
    spec.write_text("variants:\n  ce_s1: {description: 'CE only, seed 1'}\n  kd_s1: {description: 'CE + KD, seed 1'}\n")
    rows = ablation_table.table(*ablation_table.collect(sweep, spec))[2:]
    assert rows[0].startswith("| CE only | 2 (fewer) |") and rows[1].startswith("| CE + KD | 3 |"), rows
    assert ablation_table.main([str(sweep), "--spec", str(tmp_path / "nope.yaml")]) == 2


def test_ablation_table_against_first_compares_every_lever_with_the_default(tmp_path):
    import ablation_table

    sweep = tmp_path / "levers"
    figures = {"default_s1": 0.80, "default_s2": 0.82, "hidden_s1": 0.81, "hidden_s2": 0.81, "long_s1": 0.84}
    for name, accuracy in figures.items():
        (sweep / name / "evaluate").mkdir(parents=True)
        metrics = {"student": {"accuracy": accuracy, "macro_f1": accuracy}, "teacher": {"accuracy": 0.9}}
        (sweep / name / "evaluate" / "metrics.json").write_text(json.dumps({**metrics, "retention": accuracy / 0.9}))
    spec = tmp_path / "levers.yaml"
    spec.write_text("variants:\n  default_s1: {}\n  hidden_s1: {}\n  long_s1: {}\n")
    one_after_another = ablation_table.table(*ablation_table.collect(sweep, spec))
    each_alone = ablation_table.table(*ablation_table.collect(sweep, spec), against_first=True)
    assert "points over the row above" in one_after_another[0] and "points over the first row" in each_alone[0]
    assert "| +3.00 | - |" in one_after_another[4]  # long - hidden, seed 1
    assert "| +4.00 | - |" in each_alone[4]  # long - default, seed 1
    assert "| +0.00 (-1.00 to +1.00) |" in each_alone[3]  # hidden - default, seeds 1 and 2
