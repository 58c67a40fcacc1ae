"""Model problems: missing / unsupported teacher folders, label-count mismatch,
layer maps and shapes that do not fit. Exit 2 for what `validate` can see from
the config and the teacher's config.json, exit 1 for what only loading shows;
complete stages stay untouched either way."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from tests.reliability.helpers import assert_complete_stages_untouched, expect_error, nothing_written


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    """Small save_pretrained folders: a 3-label classifier, one with pickle-only weights."""
    from pipeline.config import PACKAGED_TEACHER
    from pipeline.models import load_tokenizer, resolve_reference

    root = tmp_path_factory.mktemp("models")
    tokenizer = load_tokenizer(resolve_reference(PACKAGED_TEACHER))
    cfg = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=3,
    )
    model = BertForSequenceClassification(cfg)
    three = root / "three_labels"
    model.save_pretrained(three)
    tokenizer.save_pretrained(three)
    pickled = root / "pickle_only"
    model.config.save_pretrained(pickled)
    tokenizer.save_pretrained(pickled)
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    return {"three_labels": three, "pickle_only": pickled, "root": root}


def run_args(run, *overrides, only=None):
    extra = ("--only", only) if only else ()
    return ("run", run.config, *overrides, *extra, "--runs-dir", str(run.runs_dir))


def test_missing_teacher_path(run_copy, tmp_path):
    before = nothing_written(run_copy.run_dir)
    missing = tmp_path / "no_such_teacher"
    expect_error(
        *run_args(run_copy, f"teacher.model={missing}"),
        code=2,
        phrases=("teacher.model", f"model folder '{missing}' does not exist", "save_pretrained"),
    )
    assert nothing_written(run_copy.run_dir) == before


def test_folder_that_is_not_a_model(run_copy, tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "README.txt").write_text("not a model")
    expect_error(
        *run_args(run_copy, f"teacher.model={folder}"),
        code=2,
        phrases=("is not a supported model folder", "no config.json"),
    )


def test_folder_with_an_unknown_architecture(run_copy, tmp_path):
    folder = tmp_path / "alien"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "alien-transformer"}))
    expect_error(
        *run_args(run_copy, f"teacher.model={folder}"),
        code=2,
        phrases=("teacher.model", "could not read the teacher config", "alien-transformer"),
    )


def test_teacher_without_weights(run_copy, saved_models, tmp_path):
    folder = tmp_path / "config_only"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((saved_models["three_labels"] / name).read_bytes())
    before = run_copy.snapshot()
    expect_error(
        *run_args(run_copy, f"teacher.model={folder}", only="teacher"),
        code=1,
        phrases=(f"could not load a classifier from '{folder}'",),
    )
    assert_complete_stages_untouched(before, run_copy.run_dir)


def test_pickle_only_weights_are_refused(run_copy, saved_models):
    """pytorch_model.bin is a pickle: never loaded (use_safetensors=True)."""
    before = run_copy.snapshot()
    folder = saved_models["pickle_only"]
    expect_error(
        *run_args(run_copy, f"teacher.model={folder}", only="teacher"),
        code=1,
        phrases=(f"could not load a classifier from '{folder}'", "safetensors"),
    )
    assert_complete_stages_untouched(before, run_copy.run_dir)


def test_a_truncated_weights_file_is_named_not_called_a_bug(run_copy, saved_models, tmp_path):
    import shutil

    folder = tmp_path / "cut"
    shutil.copytree(saved_models["three_labels"], folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # an interrupted copy
    before = run_copy.snapshot()
    result = expect_error(
        *run_args(run_copy, f"teacher.model={folder}", "teacher.finetune=true", only="teacher"),
        code=1,
        phrases=(f"the weights file {weights} is damaged", "copy or download it again"),
    )
    assert "most likely a bug" not in result.stderr
    assert_complete_stages_untouched(before, run_copy.run_dir)


def test_teacher_label_count_disagrees_with_data(run_copy, saved_models):
    before = run_copy.snapshot()
    folder = saved_models["three_labels"]
    expect_error(
        *run_args(run_copy, f"teacher.model={folder}", "teacher.finetune=false", only="teacher"),
        code=1,
        phrases=("has 3 output labels but the data has 2 (fresh, rotten)", "teacher.finetune: true"),
    )
    assert_complete_stages_untouched(before, run_copy.run_dir)
    assert not (run_copy.run_dir / "teacher.partial" / "model").exists()


@pytest.mark.parametrize(
    "overrides,phrases",
    [
        (
            ["student.teacher_layers=[0,5]"],
            ("student.teacher_layers: layer(s) [5] do not exist", "the teacher has 2 layers (0..1)"),
        ),
        (["distill.layer_map=[[0,3]]"], ("distill.layer_map: teacher layer 3 does not exist",)),
        (["distill.layer_map=[[2,1]]"], ("distill.layer_map: student layer 2 does not exist", "student has 1 layers")),
        (["teacher.random.num_heads=5"], ("teacher.random: hidden_size 32 is not divisible by num_heads 5",)),
        (
            ["student.init=random", "student.random={num_layers: 1, hidden_size: 30, num_heads: 4}"],
            ("student.random: hidden_size 30 is not divisible by num_heads 4",),
        ),
        (["data.max_length=128"], ("data.max_length: 128 is above the teacher's 64 position embeddings",)),
    ],
    ids=[
        "student-layer-past-depth",
        "layer-map-teacher",
        "layer-map-student",
        "teacher-heads",
        "student-heads",
        "max-length",
    ],
)
def test_shapes_that_do_not_fit(run_copy, overrides, phrases):
    before = nothing_written(run_copy.run_dir)
    expect_error(*run_args(run_copy, *overrides), code=2, phrases=phrases)
    assert nothing_written(run_copy.run_dir) == before
