"""Config mistakes, through the command line: exit code 2, one message naming the
key / file / line and the fix, no traceback (--debug shows one), nothing written.

Each bad config file is called rel.yaml (in its own folder) so it targets the
same run folder as the prepared base run, whose stages must stay untouched.
"""

from __future__ import annotations

import pytest

from tests.reliability.helpers import CONFIG_NAME, error_message, expect_error, nothing_written, write_config


def run_args(run, *extra):
    return ("run", *extra, "--runs-dir", str(run.runs_dir))


def test_missing_config_file(run_copy):
    before = nothing_written(run_copy.run_dir)
    result = expect_error(
        *run_args(run_copy, "tinny"),
        code=2,
        phrases=("config 'tinny'", "not found", "did you mean 'tiny'", "available configs"),
    )
    assert "configs/tinny.yaml" in result.stderr
    assert nothing_written(run_copy.run_dir) == before


def test_missing_config_path(run_copy, tmp_path):
    missing = tmp_path / "nowhere" / f"{CONFIG_NAME}.yaml"
    expect_error(*run_args(run_copy, str(missing)), code=2, phrases=("not found", str(missing)))


def test_malformed_yaml_names_file_and_line(run_copy, tmp_path):
    before = nothing_written(run_copy.run_dir)
    path = write_config(
        tmp_path, CONFIG_NAME, f"extends: {run_copy.config}\nseed: 3\ndistill:\n  epochs: [1, 2\n  lr: 0.1\n"
    )
    result = expect_error(
        *run_args(run_copy, str(path)), code=2, phrases=(f"{path}, line", "not valid yaml", "fix the syntax")
    )
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
    expect_error(
        *run_args(run_copy, run_copy.config, "distill.temperatur=3"),
        code=2,
        phrases=("distill.temperatur: unknown key", "did you mean 'distill.temperature'", "valid keys here"),
    )
    assert nothing_written(run_copy.run_dir) == before


def test_unknown_key_in_file_suggests_nearest(run_copy, tmp_path):
    path = write_config(tmp_path, CONFIG_NAME, f"extends: {run_copy.config}\ndata:\n  max_lenght: 16\n")
    expect_error(
        *run_args(run_copy, str(path)),
        code=2,
        phrases=("data.max_lenght: unknown key", "did you mean 'data.max_length'"),
    )


def test_wrong_type(run_copy):
    before = nothing_written(run_copy.run_dir)
    expect_error(
        *run_args(run_copy, run_copy.config, "distill.epochs=three", "capture.mode=[1]"),
        code=2,
        phrases=("2 problem(s)", "distill.epochs", "valid integer", '(got "three")', "capture.mode"),
    )
    assert nothing_written(run_copy.run_dir) == before


@pytest.mark.parametrize(
    "override,phrase",
    [
        ("distill.temperature=0", "distill.temperature: input should be greater than 0"),
        ("data.validation_fraction=0.7", "data.validation_fraction: input should be less than 0.5"),
        ("teacher.lr=5", "teacher.lr: input should be less than or equal to 1"),
    ],
    ids=["temperature-zero", "fraction-too-big", "lr-too-big"],
)
def test_out_of_range_value(run_copy, override, phrase):
    before = nothing_written(run_copy.run_dir)
    expect_error(*run_args(run_copy, run_copy.config, override), code=2, phrases=(phrase,))
    assert nothing_written(run_copy.run_dir) == before


def test_extends_missing_config(run_copy, tmp_path):
    path = write_config(tmp_path, CONFIG_NAME, "extends: tinyy\nseed: 1\n")
    expect_error(
        *run_args(run_copy, str(path)),
        code=2,
        phrases=("config 'tinyy' (extended by 'rel') not found", "did you mean 'tiny'"),
    )


def test_extends_cycle(run_copy, tmp_path):
    write_config(tmp_path, "other", f"extends: {tmp_path / (CONFIG_NAME + '.yaml')}\n")
    path = write_config(tmp_path, CONFIG_NAME, f"extends: {tmp_path / 'other.yaml'}\n")
    expect_error(
        *run_args(run_copy, str(path)),
        code=2,
        phrases=("cycle: rel -> other -> rel", "remove one of the 'extends' lines"),
    )


@pytest.mark.parametrize(
    "override,phrase",
    [
        ("distill.epochs", "not of the form key=value"),
        ("=3", "empty key"),
        ("distill..epochs=1", "empty key"),
        ("seed.value=1", "'seed' is a value, not a section"),
        ("distill.epochs=[1", "is not valid yaml"),
    ],
    ids=["no-equals", "no-key", "empty-part", "into-a-value", "bad-value"],
)
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
    from tests.helpers import run_cli

    path = write_config(tmp_path, CONFIG_NAME, "seed: [1\n")
    plain = run_cli("run", str(path), runs_dir=run_copy.runs_dir)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr, plain.stderr
    assert f"{path}, line 2" in error_message(plain.stderr) and plain.stdout == ""


@pytest.mark.parametrize(
    "extra, phrases",
    [
        (("--only", "prepare", "--only", "teacher"), ("--only was given 2 times (prepare, teacher)", "give it once")),
        (("--from", "export", "--to", "prepare"), ("--from export comes after --to prepare", "holds no stage")),
        (("--to", "capture", "--to", "distill"), ("--to was given 2 times (capture, distill)",)),
        (("--only", "prepare", "--to", "teacher"), ("--only prepare cannot be combined with --from/--to",)),
    ],
    ids=["only-twice", "empty-range", "to-twice", "only-with-to"],
)
def test_stage_options_that_cannot_mean_what_they_say_are_refused(run_copy, extra, phrases):
    """Never "the last --only wins" or an empty range that exits 0 having done nothing."""
    from tests.reliability.helpers import cli

    before = nothing_written(run_copy.run_dir)
    result = cli(*run_args(run_copy, run_copy.config, *extra))
    assert result.returncode == 2, result.stderr[-2000:]
    message = error_message(result.stderr)
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in message, message
    assert nothing_written(run_copy.run_dir) == before


@pytest.mark.pipeline
def test_only_on_a_new_folder_never_calls_later_stages_up_to_date(tmp_path):
    from tests.reliability.helpers import cli

    result = cli("run", "tiny", "tracking.enabled=false", "--only", "prepare", "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[teacher] up to date" not in result.stderr + result.stdout
    assert "[teacher] not run: outside the stages asked for (--only / --to)" in result.stderr + result.stdout


def test_overrides_are_taken_after_options_too(tmp_path):
    """`run tiny --to prepare seed=3` and the README's `sweep ... --pick ... distill.epochs=3` used to end in
    "unrecognized arguments"; an override is now taken wherever it stands, and a stray word is still refused."""
    import yaml

    from pipeline.cli import parse
    from tests.reliability.helpers import cli

    args = parse(["run", "tiny", "--to", "prepare", "seed=3", "--runs-dir", str(tmp_path), "distill.epochs=1"])
    assert args.overrides == ["seed=3", "distill.epochs=1"] and args.to_stage == ["prepare"]
    args = parse(["sweep", "bert_small", "configs/sweeps/depth.yaml", "--pick", "latency_ms<=5", "distill.epochs=3"])
    assert args.overrides == ["distill.epochs=3"] and args.pick == "latency_ms<=5"
    printed = cli("validate", "tiny", "--runs-dir", str(tmp_path), "seed=3")
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert yaml.safe_load(printed.stdout)["seed"] == 3
    stray = cli("validate", "tiny", "--runs-dir", str(tmp_path), "oops")
    assert stray.returncode == 2 and "unrecognized arguments: oops" in stray.stderr


@pytest.mark.parametrize(
    "command, text, line",
    [
        (
            "run",
            "extends: tiny\ndistill:\n  epochs: 1\nseed: 3\ndistill:\n  lr: 0.01\n",
            "the key 'distill' is given twice (first on line 2)",
        ),
        (
            "sweep",
            "variants:\n  a: {overrides: {seed: 1}}\n  a: {overrides: {seed: 2}}\n",
            "the key 'a' is given twice (first on line 2)",
        ),
    ],
    ids=["config-section-twice", "sweep-variant-twice"],
)
def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path, command, text, line):
    """YAML keeps the last of two equal keys; the product would silently drop the first section or variant."""
    from tests.reliability.helpers import cli

    path = write_config(tmp_path, "dup", text)
    args = ("run", str(path)) if command == "run" else ("sweep", "tiny", str(path))
    result = cli(*args, "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 2, result.stderr[-2000:]
    message = error_message(result.stderr)
    assert line in message, message
    assert f"line {5 if command == 'run' else 3}" in message, message  # the second occurrence
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.partial"))


def test_a_section_override_merges_into_the_section(tmp_path):
    """`distill={epochs: 1}` (command line or sweep variant) changes epochs and keeps the config's other distill
    keys; before, the whole section fell back to the schema's defaults without a word."""
    from pipeline.config import PipelineConfig, load_config
    from pipeline.sweep import load_sweep

    base, schema = load_config("tiny"), PipelineConfig.model_fields["distill"].default
    merged = load_config("tiny", ["distill={epochs: 1}"])
    assert merged.distill.epochs == 1
    kept = (merged.distill.batch_size, merged.distill.lr)
    assert kept == (base.distill.batch_size, base.distill.lr) and kept != (schema.batch_size, schema.lr)
    sweep = write_config(tmp_path, "merge", "variants:\n  one: {overrides: {distill: {epochs: 1}}}\n")
    variant = load_sweep("tiny", sweep).configs["one"]
    assert variant.distill.epochs == 1 and variant.distill.lr == base.distill.lr


def test_an_override_key_given_twice_on_the_command_line_is_refused(tmp_path):
    from tests.reliability.helpers import cli

    result = cli("validate", "tiny", "seed=1", "--runs-dir", str(tmp_path), "seed=2")
    assert (
        result.returncode == 2
        and "seed is given 2 times on the command line with different values (1, 2)" in result.stderr
    )
    same = cli(
        "validate", "tiny", "seed=1", "--runs-dir", str(tmp_path), "seed=1"
    )  # a composed script repeating itself
    assert same.returncode == 0, same.stderr[-2000:]


@pytest.mark.parametrize(
    "args, code",
    [
        (("run", "tinny"), 2),  # refused while reading the config
        (
            (
                "run",
                "tiny",
                "data.source=csv",
                "data.path=/nonexistent/reviews.csv",
                "tracking.enabled=false",
                "--only",
                "prepare",
            ),
            1,
        ),  # refused inside a stage
    ],
    ids=["config", "stage"],
)
def test_debug_adds_the_traceback_and_keeps_the_exit_code(tmp_path, args, code):
    """Every user-facing error goes through cli.main's one handler: without --debug one paragraph and no
    traceback (expect_error checks that in every case), with --debug the same exit code and the traceback."""
    from tests.reliability.helpers import cli

    plain = cli(*args, "--runs-dir", str(tmp_path))
    debug = cli(*args, "--runs-dir", str(tmp_path), "--debug")
    assert plain.returncode == debug.returncode == code, debug.stderr[-3000:]
    assert "Traceback" not in plain.stderr and "Traceback" in debug.stderr
    assert error_message(debug.stderr) == error_message(plain.stderr)  # the same paragraph, after the traceback
