"""The distillation objective: cached and online teacher targets give the same loss;
students with other head counts and widths distil through relation heads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.utils.class_weight import compute_class_weight

from pipeline.cache import CacheLayout, TeacherCache
from pipeline.config import LossWeights
from pipeline.objective import DistillObjective, TargetPlan, balanced_class_weights, teacher_targets
from tests.helpers import batch_of, bert, fake_config, write_cache


@pytest.mark.parametrize(
    "store,dtype,tolerance",
    [
        ("probs", "float32", 1e-5),
        ("vectors", "float32", 1e-5),
        ("probs", "float16", 2e-3),
        ("vectors", "float16", 2e-3),
    ],
)
def test_cached_and_online_targets_give_the_same_loss(tmp_path, store, dtype, tolerance):
    teacher, student = bert(32, 4, 3, seed=0), bert(32, 4, 2, seed=1)
    weights = LossWeights(ce=1.0, kd=1.0, attention=1.0, value_relation=1.0, hidden=1.0)
    plan = TargetPlan(
        pairs=[(0, 1), (1, 2)], relation_heads=4, attention=True, value_relation=True, hidden=True, kd=True
    )
    objective = DistillObjective(fake_config(weights), plan, 32, 32)
    batch = batch_of([7, 4, 9, 2])
    online = teacher_targets(teacher, batch, plan)
    online_loss, online_terms = objective(student, batch, online)

    # Write the same targets the way the capture stage does, then read them back.
    write_cache(
        tmp_path,
        online,
        batch,
        CacheLayout(plan, num_labels=3, hidden=32, stores={"attn": store, "vrel": store}, dtype=dtype),
    )
    cache = TeacherCache(tmp_path)
    cached = cache.batch(batch["indices"], batch["input_ids"].shape[1], "cpu")
    cached_loss, cached_terms = objective(student, batch, cached)
    assert torch.isfinite(cached_loss) and cached_loss > 0
    for term in online_terms:
        assert abs(online_terms[term] - cached_terms[term]) <= tolerance * max(1.0, abs(online_terms[term])), term
    assert abs(online_loss.item() - cached_loss.item()) <= tolerance * 5


def test_corrupted_shard_is_named(tmp_path):
    teacher = bert(32, 4, 2, seed=0)
    plan = TargetPlan(pairs=[(0, 1)], relation_heads=4, attention=True, value_relation=False, hidden=False, kd=True)
    batch = batch_of([5, 3])
    write_cache(
        tmp_path,
        teacher_targets(teacher, batch, plan),
        batch,
        CacheLayout(plan, 3, 32, {"attn": "probs", "vrel": "probs"}, "float16"),
    )
    data = tmp_path / "shard-00000.bin"
    raw = bytearray(data.read_bytes())
    raw[10] ^= 0xFF
    data.write_bytes(bytes(raw))
    from pipeline.errors import CacheError

    with pytest.raises(CacheError, match="shard-00000.bin is corrupted"):
        TeacherCache(tmp_path)


def test_student_with_other_heads_and_width_distils_through_relation_heads():
    """Teacher 32 wide / 4 heads, student 24 wide / 2 heads, 4 relation heads (MiniLMv2)."""
    teacher, student = bert(32, 4, 2, seed=0), bert(24, 2, 1, seed=1).train()
    weights = LossWeights(ce=0.0, kd=0.0, attention=1.0, value_relation=1.0, hidden=1.0)
    plan = TargetPlan(pairs=[(0, 1)], relation_heads=4, attention=True, value_relation=True, hidden=True, kd=False)
    objective = DistillObjective(fake_config(weights), plan, teacher_hidden=32, student_hidden=24)
    assert len(objective.projections) == 1  # hidden-state loss learns a 24 -> 32 projection
    batch = batch_of([6, 3, 8])
    loss, terms = objective(student, batch, teacher_targets(teacher, batch, plan))
    assert set(terms) == {"attention", "value_relation", "hidden"} and loss > 0
    loss.backward()
    attention = student.bert.encoder.layer[0].attention.self
    for module in (attention.query, attention.key, attention.value):
        assert module.weight.grad is not None and module.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
    # A few steps of attention-only distillation move the student's relations towards the teacher's.
    optimizer = torch.optim.Adam(list(student.parameters()) + list(objective.parameters()), lr=1e-2)
    targets = teacher_targets(teacher, batch, plan)
    first = objective(student, batch, targets)[1]["attention"].item()
    for _ in range(30):
        optimizer.zero_grad()
        objective(student, batch, targets)[0].backward()
        optimizer.step()
    assert objective(student, batch, targets)[1]["attention"].item() < 0.7 * first


def test_balanced_class_weights_are_scikit_learns_over_the_labelled_rows():
    labels = np.array([0, 0, 0, 1, 2, 2, -1, -1])  # -1: augmented rows, labelled by the teacher alone
    weights = balanced_class_weights(labels, num_classes=4)
    expected = compute_class_weight("balanced", classes=np.array([0, 1, 2]), y=labels[labels >= 0])
    assert torch.allclose(weights[:3], torch.tensor(expected, dtype=torch.float32))
    assert weights[3] == 0  # a class without rows has no cross-entropy to weigh


def test_class_weights_weigh_the_cross_entropy_as_the_naive_formula():
    """distill.class_weight: the ce term is sum_i w[y_i] * -log p(y_i | x_i) / sum_i w[y_i] over the labelled rows."""
    teacher, student = bert(32, 4, 2, seed=0), bert(32, 4, 2, seed=1).eval()
    weights = LossWeights(ce=1.0, kd=0.0, attention=0.0, value_relation=0.0, hidden=0.0)
    plan = TargetPlan(pairs=[], relation_heads=4, kd=False)
    class_weights = torch.tensor([0.5, 2.0, 1.0])
    batch = batch_of([6, 3, 8, 5])
    batch["labels"] = torch.tensor([0, 1, -1, 1])
    targets = teacher_targets(teacher, batch, plan)
    weighted = DistillObjective(fake_config(weights), plan, 32, 32, class_weights)(student, batch, targets)[1]["ce"]
    plain = DistillObjective(fake_config(weights), plan, 32, 32)(student, batch, targets)[1]["ce"]
    with torch.no_grad():
        log_p = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.log_softmax(-1)
    rows = [(0, 0), (1, 1), (3, 1)]
    naive = -sum(class_weights[y] * log_p[i, y] for i, y in rows) / sum(class_weights[y] for _, y in rows)
    assert torch.allclose(weighted, naive, atol=1e-6)
    assert torch.allclose(plain, -sum(log_p[i, y] for i, y in rows) / 3, atol=1e-6)
    assert not torch.allclose(weighted, plain)


def test_a_batch_with_nothing_to_learn_from_is_named_not_summed_to_zero():
    """CE alone on a batch of augmented rows (label -1): no term has a row, so the step says so instead of handing
    the trainer the integer 0 (it failed with "'int' object has no attribute 'detach'"; the config now refuses
    unlabelled rows without kd, tests/test_config.py)."""
    teacher, student = bert(32, 4, 2, seed=0), bert(32, 4, 2, seed=1)
    weights = LossWeights(ce=1.0, kd=0.0, attention=0.0, value_relation=0.0, hidden=0.0)
    plan = TargetPlan(pairs=[], relation_heads=4, kd=False)
    objective = DistillObjective(fake_config(weights), plan, 32, 32)
    batch = batch_of([6, 3])
    batch["labels"] = torch.tensor([-1, -1])
    with pytest.raises(RuntimeError, match=r"no active distillation term \(ce\) has a row to learn from"):
        objective(student, batch, teacher_targets(teacher, batch, plan))
