"""The term registry (pipeline/terms.py): everything else is derived from the declarations.

The embedding-layer MSE (TinyBERT) was added as one registered target and one
registered term; these tests check its value against a naive implementation and
that switching it on adds exactly its target to the plan, the teacher targets,
the cache layout and the capture fingerprint.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from pipeline.cache import CacheLayout, TeacherCache, choose_stores
from pipeline.config import LossWeights, load_config
from pipeline.errors import ConfigError
from pipeline.objective import DistillObjective, TargetPlan, teacher_targets
from pipeline.terms import TARGETS, TERMS
from tests.helpers import batch_of, bert, fake_config, write_cache

LENGTHS = [7, 4, 9, 2]


def naive_embedding_mse(student, teacher, batch, lengths, projection=None):
    """Reference: per example, slice off the padding, project, squared error averaged over tokens and width."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    s_emb = student(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[0]
    with torch.no_grad():
        t_emb = teacher(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[0]
    total, count = 0.0, 0
    for i, n in enumerate(lengths):
        s = s_emb[i, :n].double()
        if projection is not None:
            s = s @ projection.weight.double().T + projection.bias.double()
        diff = s - t_emb[i, :n].double()
        total = total + (diff * diff).sum()
        count += n * diff.shape[-1]
    return total / count


@pytest.mark.parametrize("student_width", [32, 24])
def test_embedding_mse_matches_a_naive_implementation(student_width):
    teacher, student = bert(32, 4, 2, seed=0), bert(student_width, 4, 1, seed=1)
    weights = LossWeights(ce=0.0, kd=0.0, attention=0.0, embedding=1.0)
    plan = TargetPlan(pairs=[(0, 1)], relation_heads=4, embedding=True)
    objective = DistillObjective(fake_config(weights), plan, 32, student_width)
    assert set(objective.projections) == ({"embedding"} if student_width != 32 else set())
    batch = batch_of(LENGTHS)
    targets = teacher_targets(teacher, batch, plan)
    assert set(targets) == {"logits", "embedding"}
    loss, terms = objective(student, batch, targets)
    assert set(terms) == {"embedding"}
    projection = objective.projections["embedding"] if student_width != 32 else None
    expected = naive_embedding_mse(student, teacher, batch, LENGTHS, projection)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-7)
    loss.backward()
    assert student.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
    if projection is not None:
        assert projection.weight.grad.abs().sum() > 0


def test_embedding_mse_from_the_cache_and_on_relation_rows_only(tmp_path):
    teacher, student = bert(32, 4, 2, seed=0), bert(24, 4, 1, seed=1)
    weights = LossWeights(ce=1.0, kd=1.0, attention=1.0, embedding=2.0)
    plan = TargetPlan(pairs=[(0, 1)], relation_heads=4, ce=True, kd=True, attention=True, embedding=True)
    objective = DistillObjective(fake_config(weights), plan, 32, 24)
    batch = batch_of(LENGTHS)
    online = teacher_targets(teacher, batch, plan)
    write_cache(
        tmp_path, online, batch, CacheLayout(plan, 3, 32, choose_stores(plan, np.array(LENGTHS), 32, "auto"), "float32")
    )
    cached = TeacherCache(tmp_path).batch(batch["indices"], batch["input_ids"].shape[1], "cpu")
    assert set(cached) == set(online)
    online_terms, cached_terms = objective(student, batch, online)[1], objective(student, batch, cached)[1]
    torch.testing.assert_close(online_terms["embedding"], cached_terms["embedding"], rtol=1e-5, atol=1e-6)

    # Augmented (logits-only) rows carry no embedding target: the term sees the other rows only ...
    mixed = dict(batch, relation_rows=torch.tensor([True, False, True, False]))
    kept = {k: v[[0, 2]] for k, v in batch.items()}
    expected = naive_embedding_mse(student, teacher, kept, [7, 9], objective.projections["embedding"])
    torch.testing.assert_close(
        objective(student, mixed, online)[1]["embedding"].double(), expected, rtol=1e-5, atol=1e-7
    )
    # ... and with none of them, the term is left out.
    none = dict(batch, relation_rows=torch.zeros(4, dtype=torch.bool))
    assert set(objective(student, none, online)[1]) == {"ce", "kd"}


def test_turning_on_a_term_adds_exactly_its_target_to_the_plan_and_the_cache_layout():
    base = TargetPlan(pairs=[(0, 1), (1, 2)], relation_heads=4, ce=True, kd=True, attention=True)
    plus = TargetPlan(pairs=[(0, 1), (1, 2)], relation_heads=4, ce=True, kd=True, attention=True, embedding=True)
    assert [t.name for t in base.targets] == ["logits", "attn"]
    assert [t.name for t in plus.targets] == ["logits", "attn", "embedding"]
    assert plus.hidden_states and not base.hidden_states and plus.projections == base.projections == ("query", "key")
    assert base.needed() == {"targets": ["logits", "attn"], "teacher_layers": [1, 2], "relation_heads": 4}
    assert plus.needed() == {**base.needed(), "targets": ["logits", "attn", "embedding"]}
    stores = {"attn": "probs", "vrel": "probs"}
    n, width = 6, 32
    base_fields = CacheLayout(base, 3, width, stores, "float16").fields(n)
    plus_fields = CacheLayout(plus, 3, width, stores, "float16").fields(n)
    assert [f for f in plus_fields if f not in base_fields] == [("embedding", (n, width))]
    assert [f for f in plus_fields if f in base_fields] == base_fields == [("attn.1", (4, n, n)), ("attn.2", (4, n, n))]
    teacher = bert(32, 4, 3, seed=0)
    batch = batch_of(LENGTHS)
    assert set(teacher_targets(teacher, batch, plus)) - set(teacher_targets(teacher, batch, base)) == {"embedding"}
    # Augmented rows keep only the terms on logits; the embedding target is dropped with the relations.
    assert plus.logits_only().terms == ("ce", "kd") and [t.name for t in plus.logits_only().targets] == ["logits"]
    assert CacheLayout(plus.logits_only(), 3, width, stores, "float16").fields(n) == []


def test_a_plan_takes_term_flags_or_names_and_refuses_unknown_ones():
    by_flags = TargetPlan(pairs=[(0, 1)], relation_heads=4, attention=True, value_relation=False, hidden=True, kd=True)
    assert by_flags == TargetPlan(pairs=[(0, 1)], relation_heads=4, terms=["hidden", "kd", "attention"])
    assert by_flags.terms == ("kd", "attention", "hidden")  # registration order
    with pytest.raises(ValueError, match="unknown distillation terms"):
        TargetPlan(pairs=[(0, 1)], relation_heads=4, embeddings=True)


@pytest.mark.process
def test_config_weights_follow_the_registry():
    assert list(LossWeights.model_fields) == list(TERMS)
    assert {name: f.default for name, f in LossWeights.model_fields.items()} == {
        name: t.default for name, t in TERMS.items()
    }
    assert LossWeights().embedding == 0.0 and set(TERMS["embedding"].needs) == {"embedding"} <= set(TARGETS)
    assert load_config("tiny", ["distill.loss.embedding=0.5"]).distill.loss.embedding == 0.5
    # The declarations import nothing heavy: the config (and the CLI's checks) stay fast.
    code = "import sys, pipeline.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_capture_fingerprint_follows_the_needed_targets_not_the_weights():
    from pipeline.runner import fingerprints

    base = fingerprints(load_config("tiny"))
    on = fingerprints(load_config("tiny", ["distill.loss.embedding=1"]))
    heavier = fingerprints(load_config("tiny", ["distill.loss.embedding=3"]))
    assert base["capture"] != on["capture"]  # a new target to store
    assert on["capture"] == heavier["capture"] and on["distill"] != heavier["distill"]  # only a weight changed
    # A term on targets already stored (logits) changes nothing upstream of distill.
    ce_off = fingerprints(load_config("tiny", ["distill.loss.ce=0"]))
    assert ce_off["capture"] == base["capture"]


def test_what_the_stages_ask_of_the_loss_is_answered_by_the_registry():
    from pipeline.config import LossWeights
    from pipeline.terms import active_terms, some_parameters_may_get_no_gradient, uses_model_attention

    assert [t.name for t in active_terms(LossWeights(ce=1, kd=0, attention=0))] == ["ce"]
    assert some_parameters_may_get_no_gradient(LossWeights(kd=0, attention=1))  # CE skips unlabelled rows
    assert not some_parameters_may_get_no_gradient(LossWeights(kd=0.5))
    assert uses_model_attention(LossWeights(attention=0.1))
    assert not uses_model_attention(LossWeights(attention=0, value_relation=1))  # values have no window


def naive_penultimate_mse(student, teacher, batch, projection=None):
    """Reference: BERT's classifier reads its pooler output (no dropout in these models); project, squared error
    averaged over examples and width."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    s = student.bert(input_ids=ids, attention_mask=mask).pooler_output.double()
    with torch.no_grad():
        t = teacher.bert(input_ids=ids, attention_mask=mask).pooler_output.double()
    if projection is not None:
        s = s @ projection.weight.double().T + projection.bias.double()
    return ((s - t) ** 2).mean()


@pytest.mark.parametrize("student_width", [32, 24])
def test_penultimate_mse_matches_a_naive_implementation(student_width):
    teacher, student = bert(32, 4, 2, seed=0), bert(student_width, 4, 1, seed=1)
    weights = LossWeights(ce=0.0, kd=0.0, attention=0.0, penultimate=1.0)
    plan = TargetPlan(pairs=[(0, 1)], relation_heads=4, penultimate=True)
    assert plan.classifier_input and not plan.hidden_states and plan.projections == ()
    objective = DistillObjective(fake_config(weights), plan, 32, student_width)
    assert set(objective.projections) == ({"penultimate"} if student_width != 32 else set())
    batch = batch_of(LENGTHS)
    targets = teacher_targets(teacher, batch, plan)
    assert set(targets) == {"logits", "penultimate"} and targets["penultimate"].shape == (4, 32)
    loss, terms = objective(student, batch, targets)
    assert set(terms) == {"penultimate"}
    projection = objective.projections["penultimate"] if student_width != 32 else None
    expected = naive_penultimate_mse(student, teacher, batch, projection)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-7)
    loss.backward()
    assert student.bert.pooler.dense.weight.grad.abs().sum() > 0
    assert student.classifier.weight.grad is None  # the term reads the classifier's input, not its output
    assert all(p.grad is None for p in teacher.parameters())


def test_penultimate_from_the_cache_one_vector_per_example_and_on_relation_rows_only(tmp_path):
    teacher, student = bert(32, 4, 2, seed=0), bert(24, 4, 1, seed=1)
    weights = LossWeights(ce=1.0, kd=1.0, attention=1.0, penultimate=2.0)
    plan = TargetPlan(pairs=[(0, 1)], relation_heads=4, ce=True, kd=True, attention=True, penultimate=True)
    layout = CacheLayout(plan, 3, 32, choose_stores(plan, np.array(LENGTHS), 32, "auto"), "float32")
    without = CacheLayout(TargetPlan(pairs=[(0, 1)], relation_heads=4, attention=True), 3, 32, layout.stores, "float32")
    assert ("penultimate", (32,)) in layout.fields(7)  # no token axis: 32 numbers whatever the length
    assert all(layout.record_size(n) - without.record_size(n) == 32 for n in (2, 9))
    objective = DistillObjective(fake_config(weights), plan, 32, 24)
    batch = batch_of(LENGTHS)
    online = teacher_targets(teacher, batch, plan)
    write_cache(tmp_path, online, batch, layout)
    cached = TeacherCache(tmp_path).batch(batch["indices"], batch["input_ids"].shape[1], "cpu")
    torch.testing.assert_close(cached["penultimate"], online["penultimate"])
    online_terms, cached_terms = objective(student, batch, online)[1], objective(student, batch, cached)[1]
    torch.testing.assert_close(online_terms["penultimate"], cached_terms["penultimate"], rtol=1e-5, atol=1e-6)

    # Augmented (logits-only) rows carry no penultimate target: the term sees the other rows only.
    mixed = dict(batch, relation_rows=torch.tensor([True, False, True, False]))
    kept = {k: v[[0, 2]] for k, v in batch.items()}
    expected = naive_penultimate_mse(student, teacher, kept, objective.projections["penultimate"])
    torch.testing.assert_close(
        objective(student, mixed, online)[1]["penultimate"].double(), expected, rtol=1e-5, atol=1e-7
    )


def test_the_penultimate_term_leaves_earlier_fingerprints_alone_and_is_refused_for_a_static_student():
    from pipeline.runner import fingerprints

    base = fingerprints(load_config("tiny"))
    assert fingerprints(load_config("tiny", ["distill.loss.penultimate=0"])) == base  # runs made before it stay current
    on = fingerprints(load_config("tiny", ["distill.loss.penultimate=1"]))
    assert on["capture"] != base["capture"] and on["teacher"] == base["teacher"]
    with pytest.raises(ConfigError, match="penultimate"):
        load_config("tiny", ["student.kind=static", "distill.loss.penultimate=1"])
