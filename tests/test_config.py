"""Config loading and validation: every error class, reported at once, exit code 2."""

from __future__ import annotations

import re

import pytest

from pipeline.config import apply_overrides, load_config, parse_override
from pipeline.errors import ConfigError
from pipeline.models import check_against_models
from pipeline.sweep.spec import load_sweep
from tests.helpers import ROOT, run_cli


def write(tmp_path, name, text):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_shipped_configs_validate():
    for name in ("bert_small", "tiny"):
        config = load_config(name)
        check_against_models(config)
        assert config.name == name
    hub = load_config("sst2_bert_base")  # hub config: schema-valid even offline
    assert hub.data.source == "hub" and hub.student.teacher_layers == [0, 3, 7, 11]


def test_extends_merges_and_overrides_apply():
    config = load_config("tiny", ["distill.epochs=7", "seed=3", "distill.loss.kd=0.5"])
    assert config.distill.epochs == 7 and config.seed == 3 and config.distill.loss.kd == 0.5
    assert config.distill.temperature == 2.0  # inherited from bert_small
    assert config.teacher.model == "random"  # overridden by tiny


def test_all_problems_reported_at_once_with_suggestion(tmp_path):
    write(tmp_path, "bad", "distill:\n  epoch: 3\n  lr: fast\nseed: [1]\n")
    with pytest.raises(ConfigError) as err:
        load_config("bad", configs_dir=tmp_path)
    message = str(err.value)
    assert "distill.epoch: unknown key" in message and "did you mean 'distill.epochs'" in message
    assert "distill.lr" in message and "seed" in message
    assert "3 problem(s)" in message


def test_a_renamed_key_says_its_new_name(tmp_path):
    """The peers section was called `baselines` (and its list `peers`) before: a config of then is told the names."""
    write(tmp_path, "old", "baselines:\n  peers: [tfidf]\npeers:\n  peers: [fasttext]\n")
    with pytest.raises(ConfigError) as err:
        load_config("old", configs_dir=tmp_path)
    message = str(err.value)
    assert "baselines: unknown key. It was renamed: the section is 'peers' now" in message
    assert "'baselines.peers' is 'peers.train'" in message
    assert "peers.peers: unknown key. It was renamed: 'peers.train' lists the peers to train" in message
    write(tmp_path, "new", "peers:\n  train: [tfidf]\n")
    assert load_config("new", configs_dir=tmp_path).peers.train == ["tfidf"]


def test_a_static_students_word_model_files_are_checked_before_any_work(tmp_path):
    """export.word_list and export.word_corpus are read at the end of the export: a missing file or package fails at
    the start, for a static student; a transformer student (no word model) does not read them."""
    settings = ["export.word_list=package:no-such-package/words.txt", f"export.word_corpus={{path: {tmp_path}}}"]
    static = ["student.kind=static", "distill.loss.attention=0", "distill.loss.value_relation=0"]
    config = load_config("tiny", [*static, *settings])
    with pytest.raises(ConfigError) as err:
        check_against_models(config)
    message = str(err.value)
    assert "package 'no-such-package' is not installed" in message
    assert f"export.word_corpus.path: '{tmp_path}' is not a file" in message
    check_against_models(load_config("tiny", settings))  # the transformer student


def test_out_of_range_and_impossible_values():
    with pytest.raises(ConfigError, match="distill.temperature"):
        load_config("tiny", ["distill.temperature=0"])
    with pytest.raises(ConfigError, match="not divisible by num_heads"):
        load_config("tiny", ["teacher.random.num_heads=5"])


def test_model_shape_checks_are_reported_together():
    config = load_config(
        "bert_small", ["student.teacher_layers=[0,9]", "data.max_length=1024", "distill.layer_map=[[0,6]]"]
    )
    with pytest.raises(ConfigError) as err:
        check_against_models(config)
    message = str(err.value)
    assert "layer(s) [9] do not exist" in message
    assert "teacher layer 6 does not exist" in message
    assert "above the teacher's 512 position embeddings" in message


def test_copied_layer_map_pairs_each_student_layer_with_its_source():
    """'copied' distils student layer i from teacher layer student.teacher_layers[i], the layer it starts as."""
    from pipeline.models import layer_map
    from pipeline.objective import target_plan

    config = load_config("bert_small", ["student.teacher_layers=[0,3,5]", "distill.layer_map=copied"])
    assert layer_map(config, teacher_depth=6) == [(0, 0), (1, 3), (2, 5)]
    hidden = load_config(
        "bert_small", ["student.teacher_layers=[0,3,5]", "distill.layer_map=copied", "distill.loss.hidden=1"]
    )
    assert target_plan(hidden).needed()["teacher_layers"] == [0, 3, 5]
    with pytest.raises(ConfigError, match="distill.layer_map 'copied'.*student.init 'random' copies none"):
        load_config("tiny", ["distill.layer_map=copied", "student.init=random"])


def test_rows_without_a_label_need_the_logit_kd_term():
    """Augmented copies and unlabelled text carry the teacher's logits and no label: without kd a batch of them has
    nothing to learn from (a static student's first step failed so). Refused up front, for every student kind,
    naming what adds the rows and how to turn each off; the attention terms do not count (they skip such rows)."""
    message = r"capture.augment.copies add rows without a label.*Set distill.loss.kd above 0, or set capture.augment.copies: 0"
    with pytest.raises(ConfigError, match=message):
        load_config("tiny", ["capture.augment.copies=2", "distill.loss.kd=0"])
    with pytest.raises(ConfigError, match=message):
        load_config("tiny", ["capture.augment.copies=2", "distill.loss.kd=0", "distill.loss.attention=1"])
    static = [
        "student.kind=static",
        "student.ffn_size=null",
        "distill.loss={ce: 1, kd: 0, attention: 0, value_relation: 0}",
    ]
    with pytest.raises(ConfigError, match="data.unlabeled_text and capture.augment.copies add rows") as err:
        load_config("tiny", [*static, "capture.augment.copies=2", "data.unlabeled_text=true"])
    assert "data.unlabeled_text: false, capture.augment.copies: 0" in str(err.value)
    assert load_config("tiny", [*static, "capture.augment.copies=0"]).distill.loss.kd == 0
    assert load_config("tiny", ["capture.augment.copies=2", "distill.loss.kd=0.5"]).capture.augment.copies == 2


def test_extends_missing_and_cycle(tmp_path):
    write(tmp_path, "child", "extends: nowhere\n")
    with pytest.raises(ConfigError, match="'nowhere'.*not found"):
        load_config("child", configs_dir=tmp_path)
    write(tmp_path, "a", "extends: b\n")
    write(tmp_path, "b", "extends: a\n")
    with pytest.raises(ConfigError, match="cycle: a -> b -> a"):
        load_config("a", configs_dir=tmp_path)


def test_malformed_yaml_names_file_and_line(tmp_path):
    write(tmp_path, "broken", "seed: 1\ndistill:\n  epochs: [1, 2\n")
    with pytest.raises(ConfigError) as err:
        load_config("broken", configs_dir=tmp_path)
    assert "broken.yaml, line" in str(err.value)


@pytest.mark.parametrize("item", ["distill.epochs", "=3", "distill..epochs=1"])
def test_bad_override_syntax(item):
    with pytest.raises(ConfigError, match="Override"):
        parse_override(item)


def test_override_values_are_typed():
    raw = apply_overrides({}, ["a.b=3", "c=[0, 5]", "d=null", "e=true"])
    assert raw == {"a": {"b": 3}, "c": [0, 5], "d": None, "e": True}


def test_on_off_settings_read_as_the_words_yaml_turns_into_booleans(tmp_path):
    """export.executorch is auto|on|off; YAML (and so the command line) reads an unquoted on/off as a boolean."""
    assert load_config("tiny", ["export.executorch=off"]).export.executorch == "off"
    assert load_config("tiny", ["export.executorch=on"]).export.executorch == "on"
    (tmp_path / "mine.yaml").write_text("extends: tiny\nexport:\n  executorch: off\n")
    assert load_config(str(tmp_path / "mine.yaml")).export.executorch == "off"
    with pytest.raises(ConfigError, match="export.executorch"):
        load_config("tiny", ["export.executorch=sometimes"])


@pytest.mark.process
def test_cli_exit_code_2_without_traceback():
    result = run_cli("validate", "tiny", "distill.epohcs=1")
    assert result.returncode == 2
    assert "did you mean 'distill.epochs'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.process
def test_cli_validate_prints_resolved_config():
    result = run_cli("validate", "tiny", "seed=5")
    assert result.returncode == 0, result.stderr
    assert "seed: 5" in result.stdout and "name: tiny" in result.stdout


@pytest.mark.parametrize(
    "overrides",
    [[], ["student.kind=static", "student.ffn_size=null", "distill.loss.attention=0", "distill.loss.value_relation=0"]],
    ids=["transformer", "static"],
)
def test_a_resolved_config_loads_back_as_the_same_config(tmp_path, overrides):
    """A run's config.yaml (to_yaml) holds every key that means something for its student kind and none that would
    be refused when the file is loaded again (student.static for a transformer, layers for a static student)."""
    from pipeline.config import to_yaml

    config = load_config("bert_small", overrides)
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(config))
    again = load_config(str(path))
    assert to_yaml(again) == path.read_text()
    assert again.student.kind == config.student.kind and again.distill.loss == config.distill.loss
    assert again.teacher == config.teacher and again.data == config.data and again.export == config.export


def _sweep_commands() -> set[tuple[str, str]]:
    """(config, sweep file) of every `make sweep CONFIG=... SWEEP=...` the sweep files, the docs and the README give."""
    texts = [
        p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "configs").rglob("*.yaml")]
    ]
    pattern = re.compile(r"make sweep CONFIG=([\w.-]+) SWEEP=(configs/sweeps/[\w.-]+\.yaml)")
    return {found for text in texts for found in pattern.findall(text)}


def test_every_config_file_validates():
    """A config file that no longer fits the schema (a key renamed, a value out of range) fails here, not when a user
    runs it: every file of configs/ loads (schema only: the hub and package models are not fetched)."""
    names = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert {"bert_small", "tiny", "mpnet_base", "clothing"} <= set(names)
    for name in names:
        assert load_config(name).name == name


def test_every_sweep_command_in_the_docs_loads():
    """Each `make sweep CONFIG=x SWEEP=y` written in the sweep files, docs/ and the README names a sweep file that
    exists and whose every variant validates on that config; every sweep file is named by at least one."""
    commands = _sweep_commands()
    assert ("mpnet_base", "configs/sweeps/base_minilm.yaml") in commands
    for config, sweep in sorted(commands):
        assert load_sweep(config, ROOT / sweep).variants, (config, sweep)
    named = {sweep for _, sweep in commands}
    unnamed = {
        f"configs/sweeps/{p.name}" for p in (ROOT / "configs" / "sweeps").glob("*.yaml") if p.name != "tiny_depth.yaml"
    } - named  # tiny_depth is the tests' own sweep (tests/test_sweep.py)
    assert not unnamed, f"sweep files no command names: {sorted(unnamed)}"
