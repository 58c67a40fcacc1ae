"""Config mistakes, through the command line: exit code 2, one message naming the
key / file / line and the fix, no traceback (--debug shows one), nothing written.

Each bad config file is called rel.yaml (in its own folder) so it targets the
same run folder as the prepared base run, whose stages must stay untouched.
"""

from __future__ import annotations


import pytest

from tests.reliability.conftest import CONFIG_NAME, error_message, expect_error, nothing_written, write_config


def run_args(run, *extra):
    return ("run", *extra, "--runs-dir", str(run.runs_dir))


def test_missing_config_file(run_copy):
    before = nothing_written(run_copy.run_dir)
    result = expect_error(*run_args(run_copy, "tinny"), code=2,
                          phrases=("config 'tinny'", "not found", "did you mean 'tiny'", "available configs"))
    assert "configs/tinny.yaml" in result.stderr
    assert nothing_written(run_copy.run_dir) == before


def test_missing_config_path(run_copy, tmp_path):
    missing = tmp_path / "nowhere" / f"{CONFIG_NAME}.yaml"
    expect_error(*run_args(run_copy, str(missing)), code=2, phrases=("not found", str(missing)))


def test_malformed_yaml_names_file_and_line(run_copy, tmp_path):
    before = nothing_written(run_copy.run_dir)
    path = write_config(tmp_path, CONFIG_NAME, f"extends: {run_copy.config}\nseed: 3\ndistill:\n  epochs: [1, 2\n  lr: 0.1\n")
    result = expect_error(*run_args(run_copy, str(path)), code=2, phrases=(f"{path}, line", "not valid yaml", "fix the syntax"))
    assert "line 5" in result.stderr or "line 4" in result.stderr, result.stderr
    assert nothing_written(run_copy.run_dir) == before


def test_tab_indentation_is_reported_with_line(run_copy, tmp_path):
    path = write_config(tmp_path, CONFIG_NAME, "seed: 1\ndistill:\n\tepochs: 2\n")
    expect_error(*run_args(run_copy, str(path)), code=2, phrases=(f"{path}, line 3", "not valid yaml"))


def test_config_that_is_not_a_mapping(run_copy, tmp_path):
    path = write_config(tmp_path, CONFIG_NAME, "- just\n- a list\n")
    expect_error(*run_args(run_copy, str(path)), code=2, phrases=(str(path), "must hold a mapping"))


def test_unknown_key_suggests_nearest(run_copy):
    before = nothing_written(run_copy.run_dir)
    expect_error(*run_args(run_copy, run_copy.config, "distill.temperatur=3"), code=2,
                 phrases=("distill.temperatur: unknown key", "did you mean 'distill.temperature'", "valid keys here"))
    assert nothing_written(run_copy.run_dir) == before


def test_unknown_key_in_file_suggests_nearest(run_copy, tmp_path):
    path = write_config(tmp_path, CONFIG_NAME, f"extends: {run_copy.config}\ndata:\n  max_lenght: 16\n")
    expect_error(*run_args(run_copy, str(path)), code=2, phrases=("data.max_lenght: unknown key", "did you mean 'data.max_length'"))


def test_wrong_type(run_copy):
    before = nothing_written(run_copy.run_dir)
    expect_error(*run_args(run_copy, run_copy.config, "distill.epochs=three", "capture.mode=[1]"), code=2,
                 phrases=("2 problem(s)", "distill.epochs", "valid integer", '(got "three")', "capture.mode"))
    assert nothing_written(run_copy.run_dir) == before


@pytest.mark.parametrize("override,phrase", [
    ("distill.temperature=0", "distill.temperature: input should be greater than 0"),
    ("data.validation_fraction=0.7", "data.validation_fraction: input should be less than 0.5"),
    ("teacher.lr=5", "teacher.lr: input should be less than or equal to 1"),
], ids=["temperature-zero", "fraction-too-big", "lr-too-big"])
def test_out_of_range_value(run_copy, override, phrase):
    before = nothing_written(run_copy.run_dir)
    expect_error(*run_args(run_copy, run_copy.config, override), code=2, phrases=(phrase,))
    assert nothing_written(run_copy.run_dir) == before


def test_extends_missing_config(run_copy, tmp_path):
    path = write_config(tmp_path, CONFIG_NAME, "extends: tinyy\nseed: 1\n")
    expect_error(*run_args(run_copy, str(path)), code=2,
                 phrases=("config 'tinyy' (extended by 'rel') not found", "did you mean 'tiny'"))


def test_extends_cycle(run_copy, tmp_path):
    write_config(tmp_path, "other", f"extends: {tmp_path / (CONFIG_NAME + '.yaml')}\n")
    path = write_config(tmp_path, CONFIG_NAME, f"extends: {tmp_path / 'other.yaml'}\n")
    expect_error(*run_args(run_copy, str(path)), code=2, phrases=("cycle: rel -> other -> rel", "remove one of the 'extends' lines"))


@pytest.mark.parametrize("override,phrase", [
    ("distill.epochs", "not of the form key=value"),
    ("=3", "empty key"),
    ("distill..epochs=1", "empty key"),
    ("seed.value=1", "'seed' is a value, not a section"),
    ("distill.epochs=[1", "is not valid yaml"),
], ids=["no-equals", "no-key", "empty-part", "into-a-value", "bad-value"])
def test_bad_override_syntax(run_copy, override, phrase):
    before = nothing_written(run_copy.run_dir)
    expect_error(*run_args(run_copy, run_copy.config, override), code=2, phrases=(f"override '{override}'", phrase))
    assert nothing_written(run_copy.run_dir) == before


def test_validate_command_reports_the_same_errors(run_copy):
    """`validate` (what `make` users run to check a config) exits 2 with the message too."""
    expect_error("validate", run_copy.config, "distill.epohcs=1", code=2, phrases=("did you mean 'distill.epochs'",))


def test_python_launcher_prints_no_traceback(run_copy, tmp_path):
    """The real `python -m pipeline` process: exit 2, one message, no traceback (a plain
    process, so nothing of the test harness can hide one). --debug is checked in-process above."""
    from tests.conftest import run_cli

    path = write_config(tmp_path, CONFIG_NAME, "seed: [1\n")
    plain = run_cli("run", str(path), runs_dir=run_copy.runs_dir)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr, plain.stderr
    assert f"{path}, line 2" in error_message(plain.stderr) and plain.stdout == ""
