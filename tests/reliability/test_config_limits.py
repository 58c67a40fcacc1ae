"""Config values that used to validate and then fail minutes later (or do harm), refused up front.

Each case goes through the command line (`validate`, or `run ... --only prepare`
where writing is the harm): exit code 2, one message naming the key path or the
file and line, no traceback, nothing written. Covers numeric ranges and list
lengths, the run name (a folder, an MLflow experiment, a registered model name),
pretrained-student depth, the ONNX opset, and YAML that could exhaust memory
(aliases, size, nesting) or carry dates into the JSON writers.
"""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from tests.helpers import ROOT
from tests.reliability.helpers import cli, expect_error, write_config

TINY = str(ROOT / "configs" / "tiny.yaml")


def validate(*args):
    return ("validate", TINY, *args)


# ---------------------------------------------------------------- ranges and list lengths


@pytest.mark.parametrize(
    "overrides,phrases",
    [
        (["seed=-1"], ("seed: input should be greater than or equal to 0",)),
        (["seed=4294967296"], ("seed: input should be less than or equal to 4294967295",)),
        (["distill.seed=4294967296"], ("distill.seed: input should be less than or equal to 4294967295",)),
        (["distill.layer_map=[]"], ("distill.layer_map: an empty list distils no layer", "'last' or 'uniform'")),
        (["distill.layer_map=[[0,-1]]"], ("distill.layer_map: [0, -1] is not a [student layer, teacher layer] pair",)),
        (["export.latency_threads=[0]"], ("export.latency_threads.0: input should be greater than or equal to 1",)),
        (["export.latency_threads=[]"], ("export.latency_threads: list should have at least 1 item",)),
        (["export.latency_lengths=[0]"], ("export.latency_lengths.0: input should be greater than or equal to 2",)),
        (["export.latency_lengths=[16,16]"], ("export.latency_lengths: [16, 16] repeats a value",)),
        (["student.teacher_layers=[-1]"], ("student.teacher_layers.0: input should be greater than or equal to 0",)),
        (["data.hub_splits=[]"], ("data.hub_splits: list should have at least 1 item",)),
        (["teacher.batch_size=10000000"], ("teacher.batch_size: input should be less than or equal to 65536",)),
        (
            ["distill.loss={ce: 0, kd: 0, attention: 0, value_relation: 0, hidden: 0}"],
            ("distill.loss: every loss weight is 0",),
        ),
        (
            ["distill.temperature=.inf", "distill.lr=.nan"],
            (
                "2 problem(s)",
                "distill.temperature: input should be a finite number",
                "distill.lr: input should be a finite number",
            ),
        ),
        (
            ["seed=true", "distill.epochs=yes"],
            ("2 problem(s)", "seed: got the boolean true", "distill.epochs: got the boolean true", "quote text"),
        ),
    ],
    ids=[
        "seed-negative",
        "seed-too-big",
        "distill-seed",
        "layer-map-empty",
        "layer-map-negative",
        "threads-zero",
        "threads-empty",
        "length-zero",
        "length-repeated",
        "teacher-layer-negative",
        "hub-splits-empty",
        "batch-huge",
        "no-loss",
        "inf-nan",
        "boolean-for-number",
    ],
)
def test_values_that_cannot_run(overrides, phrases):
    expect_error(*validate(*overrides), code=2, phrases=phrases)


def test_text_fields_refuse_other_scalars():
    """Pydantic's lax mode already refuses 12 for a str field; the message now says how to keep it text."""
    expect_error(
        *validate("description=12", "data.text_column=5"),
        code=2,
        phrases=(
            "2 problem(s)",
            "description: input should be a valid string (got 12)",
            "data.text_column",
            "put the value in quotes",
        ),
    )


def test_bad_experiment_name():
    expect_error(
        *validate('tracking.experiment="a\\tb"'),
        code=2,
        phrases=("tracking.experiment:", "not a usable mlflow experiment name", "printable"),
    )


# ---------------------------------------------------------------- the run name


@pytest.mark.parametrize(
    "name",
    ["../x", "a/b", "x:y", ".hidden", "a b", "x" * 65],
    ids=["parent", "slash", "colon", "dot-first", "space", "too-long"],
)
def test_unsafe_run_name(name):
    expect_error(
        *validate(f"name='{name}'"),
        code=2,
        phrases=("name:", "not a usable run name", "registered model", "letters, digits, '.', '_' and '-'"),
    )


def test_run_name_cannot_escape_the_runs_folder(tmp_path):
    runs = tmp_path / "runs"
    expect_error(
        "run",
        TINY,
        "name=../escaped",
        "--only",
        "prepare",
        "--runs-dir",
        str(runs),
        code=2,
        phrases=("not a usable run name",),
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "something was written"


def test_config_file_name_is_checked_as_the_run_name(tmp_path):
    path = write_config(tmp_path, "my run", f"extends: {TINY}\n")
    expect_error("validate", str(path), code=2, phrases=('"my run" is not a usable run name', "set name:"))


# ---------------------------------------------------------------- students, opset


def test_pretrained_student_with_num_layers():
    """build_student cut a pretrained student's layers with a slice assignment ModuleList refuses: a crash in capture."""
    expect_error(
        *validate("student.init=pretrained", f"student.pretrained={TINY}", "student.num_layers=1"),
        code=2,
        phrases=("student.num_layers: not supported", "pretrained student keeps all its layers"),
    )


@pytest.fixture(scope="module")
def one_layer_model(tmp_path_factory):
    """config.json of a 1-layer BERT as deep and wide as nothing else: all validate reads."""
    folder = tmp_path_factory.mktemp("one_layer")
    BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    ).save_pretrained(folder)
    return folder


def test_pretrained_student_shallower_than_teacher(one_layer_model):
    """'last' is resolved with the teacher's depth (2) for a pretrained student: its layer 1 does not exist."""
    expect_error(
        *validate("student.init=pretrained", f"student.pretrained={one_layer_model}"),
        code=2,
        phrases=(
            "distill.layer_map: 'last' needs a student as deep as the teacher",
            "has 1 layers, the teacher 2",
            "distill.layer_map=[[0,1]]",
        ),
    )
    ok = cli(*validate("student.init=pretrained", f"student.pretrained={one_layer_model}", "distill.layer_map=[[0,1]]"))
    assert ok.returncode == 0, ok.stderr[-3000:]


@pytest.mark.parametrize("opset", [14, 16, 17])
def test_opset_the_exporter_does_not_write(opset):
    expect_error(
        *validate(f"export.opset={opset}"), code=2, phrases=(f"export.opset: opset {opset} is not supported", "18..23")
    )


def test_export_refuses_a_graph_with_another_opset(tmp_path):
    """torch exports opset 16 as 18 (its down-conversion fails for LayerNormalization) and only logs it."""
    from pipeline.errors import ModelError
    from pipeline.export.onnx_graph import LogitsOnly, export_onnx

    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=64,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
        )
    )
    with pytest.raises(ModelError, match="wrote opset 18, not the requested export.opset 16"):
        export_onnx(LogitsOnly(model), tmp_path / "model.onnx", 16)


# ---------------------------------------------------------------- YAML


def test_dates_stay_text_in_files_and_overrides(tmp_path):
    path = write_config(tmp_path, "dated", f"extends: {TINY}\ndescription: 2024-01-01\n")
    for args in (("validate", str(path)), validate("description=2024-01-01")):
        result = cli(*args)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "description: '2024-01-01'" in result.stdout


def billion_laughs(levels: int = 7, fan: int = 10) -> str:
    """`levels` lines of `fan` aliases each: fan**levels values from a few hundred bytes."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * fan) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_in_a_file(tmp_path):
    text = billion_laughs()
    assert len(text) < 600 and text.count("*") < 100  # under the alias count: the expanded size stops it
    path = write_config(tmp_path, "bomb", f"extends: {TINY}\n" + text)
    expect_error("validate", str(path), code=2, phrases=(f"{path}, line", "more than 100000 values", "aliases"))


def test_alias_bomb_in_an_override():
    value = (
        "[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], "
        "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]]"
    )
    expect_error(
        *validate(f"description={value}"), code=2, phrases=("override 'description=", "more than 100000 values")
    )


def test_too_many_aliases(tmp_path):
    path = write_config(tmp_path, "aliases", f"extends: {TINY}\nx: &x 1\ny: [" + ", ".join(["*x"] * 101) + "]\n")
    expect_error("validate", str(path), code=2, phrases=(f"{path}, line 3", "more than 100 yaml aliases", "needs none"))


def test_alias_that_contains_itself(tmp_path):
    path = write_config(tmp_path, "loop", f"extends: {TINY}\nx: &x [1, *x]\n")
    expect_error("validate", str(path), code=2, phrases=(str(path), "would contain itself"))


def test_deep_nesting(tmp_path):
    path = write_config(tmp_path, "deep", f"extends: {TINY}\nx: " + "[" * 100 + "]" * 100 + "\n")
    expect_error("validate", str(path), code=2, phrases=(f"{path}, line 2", "nested more than 50 levels"))


def test_oversized_file(tmp_path):
    path = write_config(tmp_path, "huge", f"extends: {TINY}\n" + "# padding\n" * 110_000)
    size = path.stat().st_size
    expect_error("validate", str(path), code=2, phrases=(str(path), f"is {size:,} bytes", "at most 1,048,576 bytes"))


@pytest.mark.parametrize("value", ["!!binary aGVsbG8=", "!!set {a, b}"], ids=["binary", "set"])
def test_non_json_yaml_types(tmp_path, value):
    path = write_config(tmp_path, "typed", f"extends: {TINY}\ndescription: {value}\n")
    expect_error("validate", str(path), code=2, phrases=(f"{path}, line 2", "is not allowed in a config"))
