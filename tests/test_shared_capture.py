"""A capture shared by variants that ask the teacher for different targets (a sweep's ``shared_capture: true``,
capture.extra_terms / capture.extra_teacher_layers): the teacher runs once, and each variant's student is exactly
the one its own capture would have given."""

from __future__ import annotations

import os
import shutil

import pytest
from safetensors.torch import load_file

from pipeline.cache import TeacherCache
from pipeline.config import load_config, read_yaml
from pipeline.errors import CacheError, ConfigError
from pipeline.objective import TargetPlan
from tests.helpers import read_json, run_cli

pytestmark = pytest.mark.pipeline

SWEEP = "configs/sweeps/tiny_shared_capture.yaml"
# the sweep file's overrides, and each variant's, as a standalone run takes them
COMMON = ["data.max_examples=240", "distill.epochs=1", "tracking.enabled=false"]
OWN = {
    "kd": ['distill.loss={"ce": 1.0, "kd": 1.0, "attention": 0.0, "value_relation": 0.0}'],
    "relations": ['distill.loss={"ce": 1.0, "kd": 1.0, "attention": 1.0, "value_relation": 1.0}'],
    "hidden": [
        'distill.loss={"ce": 1.0, "kd": 1.0, "attention": 0.0, "value_relation": 0.0, "hidden": 1.0}',
        "distill.layer_map=[[0,0]]",
    ],
}


def _runs_dir_with_teacher(tiny_run, path):
    for stage in ("prepare", "teacher"):  # the tiny teacher of the session, linked: not trained again
        shutil.copytree(tiny_run["run_dir"] / stage, path / "tiny" / stage, copy_function=os.link)
    return path


@pytest.fixture(scope="module")
def shared(tiny_run, tmp_path_factory):
    runs_dir = _runs_dir_with_teacher(tiny_run, tmp_path_factory.mktemp("shared_capture"))
    result = run_cli("sweep", "tiny", SWEEP, "tracking.enabled=false", "--to", "distill", runs_dir=runs_dir)
    assert result.returncode == 0, result.stderr[-4000:]
    return runs_dir / "tiny" / "sweeps" / "tiny_shared_capture", result.stderr + result.stdout


def test_the_teacher_runs_once_for_variants_with_different_targets(shared):
    folder, log = shared
    assert log.count("[capture] running") == 1
    captures = {name: read_json(folder / name / "capture" / "manifest.json")["fingerprint"] for name in OWN}
    assert len(set(captures.values())) == 1
    stored = read_json(folder / "kd" / "capture" / "cache" / "index.json")["layout"]
    assert stored["targets"] == ["logits", "attn", "vrel", "hidden"]
    # relations asked at layer 1, hidden states at layer 0: the cache holds the grid, every target at both
    assert sorted({t for _, t in stored["pairs"]}) == [0, 1]
    recorded = read_yaml(folder / "kd" / "config.yaml")["capture"]  # the run folder says what its cache holds
    assert recorded["extra_terms"] == ["attention", "value_relation", "hidden"]
    assert recorded["extra_teacher_layers"] == [0, 1]


@pytest.mark.parametrize("variant", sorted(OWN))
def test_a_variant_reading_the_shared_capture_trains_the_student_its_own_capture_gives(
    shared, variant, tiny_run, tmp_path
):
    folder, _ = shared
    runs_dir = _runs_dir_with_teacher(tiny_run, tmp_path)
    result = run_cli("run", "tiny", *COMMON, *OWN[variant], "--to", "distill", runs_dir=runs_dir)
    assert result.returncode == 0, result.stderr[-4000:]
    own_index = read_json(runs_dir / "tiny" / "capture" / "cache" / "index.json")["layout"]
    own = {"kd": ["logits"], "relations": ["logits", "attn", "vrel"], "hidden": ["logits", "hidden"]}[variant]
    assert own_index["targets"] == own  # its own cache holds only its own targets
    alone = load_file(runs_dir / "tiny" / "distill" / "student" / "model.safetensors")
    in_sweep = load_file(folder / variant / "distill" / "student" / "model.safetensors")
    assert alone.keys() == in_sweep.keys()
    assert all((alone[k] == in_sweep[k]).all() for k in alone), f"{variant}: another student from the shared cache"


def test_a_cache_without_a_target_the_run_needs_is_refused(shared):
    folder, _ = shared
    cache = folder / "kd" / "capture" / "cache"
    TeacherCache(cache, reader=TargetPlan([(0, 1)], relation_heads=4, terms=("kd", "hidden")))  # held: no error
    for plan in (
        TargetPlan([(0, 1)], relation_heads=4, terms=("kd", "penultimate")),  # a target the cache does not hold
        TargetPlan([(0, 2)], relation_heads=4, terms=("kd", "attention")),  # a layer it does not hold
    ):
        with pytest.raises(CacheError, match="does not hold every target"):
            TeacherCache(cache, reader=plan)


def test_extra_terms_are_checked():
    with pytest.raises(ConfigError, match="not distillation terms"):
        load_config("tiny", ["capture.extra_terms=[attention,hiden]"])
    with pytest.raises(ConfigError, match="capture.extra_teacher_layers names none"):
        load_config("tiny", ["capture.extra_terms=[hidden]"])
    with pytest.raises(ConfigError, match="capture.extra_terms is empty"):
        load_config("tiny", ["capture.extra_teacher_layers=[1]"])


def test_extra_targets_change_the_capture_fingerprint_only_when_they_add_a_target():
    from pipeline.runner import fingerprints

    plain = fingerprints(load_config("tiny"), save=False)
    logits_only = fingerprints(load_config("tiny", ["capture.extra_terms=[kd]"]), save=False)
    assert logits_only == plain  # kd's logits are stored anyway: the same cache, nothing reruns
    more = fingerprints(
        load_config("tiny", ["capture.extra_terms=[hidden]", "capture.extra_teacher_layers=[0]"]), False
    )
    assert more["capture"] != plain["capture"] and more["teacher"] == plain["teacher"]


def test_extra_teacher_layers_must_exist_in_the_teacher():
    from pipeline.models import check_against_models

    config = load_config("tiny", ["capture.extra_terms=[hidden]", "capture.extra_teacher_layers=[0,5]"])
    with pytest.raises(ConfigError, match=r"capture.extra_teacher_layers: layer\(s\) \[5\] do not exist"):
        check_against_models(config)


def test_the_sweep_merges_only_captures_that_differ_in_targets_and_store_something(tmp_path):
    from pipeline.sweep.shared_capture import shared_capture_configs

    kd = ['distill.loss={"ce": 1.0, "kd": 1.0, "attention": 0.0, "value_relation": 0.0}']
    configs = {
        "kd": load_config("tiny", kd),
        "kd_again": load_config("tiny", [*kd, "distill.seed=7"]),  # the same targets: nothing to merge
        "relations": load_config("tiny"),  # tiny's own terms: attention and value relations at layer 1
        "online_kd": load_config("tiny", [*kd, "capture.mode=online"]),
        "online_relations": load_config("tiny", ["capture.mode=online"]),
        "other_data": load_config("tiny", [*kd, "data.max_examples=300"]),
    }
    shared = shared_capture_configs(configs, tmp_path)
    for name in ("kd", "relations"):  # one group, different targets: merged
        assert shared[name].capture.extra_terms == ["attention", "value_relation"]
        assert shared[name].capture.extra_teacher_layers == [1]
    assert shared["kd_again"].capture.extra_terms == ["attention", "value_relation"]  # in the same group
    for name in ("online_kd", "online_relations", "other_data"):  # nothing stored, or a group of its own
        assert shared[name] is configs[name]
    alone = {"kd": configs["kd"], "kd_again": configs["kd_again"]}
    assert shared_capture_configs(alone, tmp_path) == alone  # one set of targets: unchanged, fingerprints too


def test_a_shared_cache_over_its_budget_stops_instead_of_keeping_a_subset(tiny_run, tmp_path):
    runs_dir = _runs_dir_with_teacher(tiny_run, tmp_path)
    extra = ["capture.extra_terms=[hidden]", "capture.extra_teacher_layers=[0]", "capture.max_cache_gb=0.0001"]
    result = run_cli("run", "tiny", *COMMON, *extra, "--to", "capture", runs_dir=runs_dir)
    assert result.returncode != 0
    assert "shared teacher cache" in result.stderr and "shared_capture: false" in result.stderr
    assert not (runs_dir / "tiny" / "capture").exists()  # nothing half-written in place
