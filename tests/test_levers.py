"""The levers that make the student beat the int8 teacher: FFN pruning by importance,
teacher-labelled augmentation, and relation losses restricted to the rows that carry targets."""

from __future__ import annotations

import copy
import types

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from pipeline.augment import augment, nearest_words, word_spans
from pipeline.config import LossWeights
from pipeline.data import pad_batch
from pipeline.objective import DistillObjective, TargetPlan, teacher_targets
from pipeline.pruning import ffn_importance, kept_heads, prune_ffn, task_importance, top_neurons, width_importance
from stages.distill import IMPORTANCE_ROWS, IMPORTANCE_TOKENS, importance_batches


def bert(seed=0, layers=2, hidden=32, ffn=64):
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=100,
        hidden_size=hidden,
        num_attention_heads=4,
        num_hidden_layers=layers,
        intermediate_size=ffn,
        max_position_embeddings=64,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(copy.deepcopy(cfg)).eval()


def batch_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    ids, mask = pad_batch([list(rng.integers(5, 100, n)) for n in lengths], 0)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": torch.tensor([i % 3 for i in range(len(lengths))]),
        "indices": np.arange(len(lengths)),
    }


# ---------------------------------------------------------------- FFN pruning


def test_pruned_layer_equals_full_layer_without_the_dropped_neurons():
    model = bert()
    layer = model.bert.encoder.layer[0]
    x = torch.randn(2, 5, 32)
    keep = torch.tensor([3, 0, 10, 40, 63])  # unsorted on purpose
    reference = copy.deepcopy(layer)
    dropped = torch.ones(64, dtype=torch.bool)
    dropped[keep] = False
    with torch.no_grad():
        reference.output.dense.weight[:, dropped] = 0.0  # the dropped neurons contribute nothing
    prune_ffn(layer, keep)
    assert layer.intermediate.dense.out_features == 5 and layer.output.dense.in_features == 5
    with torch.no_grad():
        torch.testing.assert_close(layer(x)[0], reference(x)[0], atol=1e-6, rtol=1e-5)


def test_importance_is_zero_for_neurons_that_cannot_change_the_loss_and_top_neurons_skip_them():
    model = bert()
    dead = [1, 5, 7, 30]
    with torch.no_grad():
        for layer in model.bert.encoder.layer:
            layer.output.dense.weight[:, dead] = 0.0
    for p in model.parameters():
        p.requires_grad_(False)  # a frozen teacher, as in the distill stage
    scores = ffn_importance(model, [batch_of([6, 9, 3]), batch_of([4, 8], seed=1)], model.bert.encoder.layer)
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())  # left as found
    for layer_scores in scores.values():
        assert layer_scores.shape == (64,)
        assert torch.all(layer_scores[dead] == 0) and (np.delete(layer_scores.numpy(), dead) > 0).all()
        assert not set(top_neurons(layer_scores, 60).tolist()) & set(dead)


def test_importance_ignores_padding():
    model = bert()
    batch = batch_of([4, 9])
    padded = dict(batch)
    ids, mask = pad_batch([batch["input_ids"][0, :4].tolist(), batch["input_ids"][1, :9].tolist()], 0)
    wider_ids = torch.cat([ids, torch.zeros(2, 5, dtype=torch.long)], 1)
    padded.update(input_ids=wider_ids, attention_mask=torch.cat([mask, torch.zeros(2, 5, dtype=torch.long)], 1))
    a = ffn_importance(model, [batch], model.bert.encoder.layer)
    b = ffn_importance(model, [padded], model.bert.encoder.layer)
    for i in a:
        torch.testing.assert_close(a[i], b[i], rtol=1e-4, atol=1e-7)


def test_importance_batches_cap_rows_and_padded_tokens_and_keep_every_example():
    """Long texts get fewer rows a batch (the importance pass holds a batch's whole backward graph: 64 reviews of 128
    tokens through the base teacher ran a 24 GB machine out of memory); sentences keep batches of 64."""
    lengths = np.array([12] * 100 + [64] * 70 + [128] * 50)
    batches = importance_batches(np.arange(len(lengths)), lengths)
    assert np.array_equal(np.concatenate(batches), np.arange(len(lengths)))
    assert all(len(b) <= IMPORTANCE_ROWS and len(b) * lengths[b].max() <= IMPORTANCE_TOKENS for b in batches)
    assert [len(b) for b in batches] == [64, 64, 42, 32, 18]
    assert [len(b) for b in importance_batches(np.arange(130), np.full(130, 64))] == [64, 64, 2]


def test_importance_is_the_same_however_the_examples_are_batched():
    model = bert()
    batch = batch_of([5, 7, 7, 9])
    halves = [{key: value[rows] for key, value in batch.items()} for rows in (slice(0, 2), slice(2, 4))]
    together = ffn_importance(model, [batch], model.bert.encoder.layer)
    apart = ffn_importance(model, halves, model.bert.encoder.layer)
    for i in together:
        assert together[i].sum() > 0
        torch.testing.assert_close(together[i], apart[i], rtol=1e-4, atol=1e-7)


def test_student_from_pruned_teacher_layers_saves_and_loads(tmp_path):
    from pipeline.config import load_config
    from pipeline.models import build_student

    teacher = bert(layers=3)
    config = load_config("tiny", ["student.teacher_layers=[0,2]", "student.ffn_size=16"])
    scores = {i: torch.arange(64, dtype=torch.float32) for i in range(3)}  # the highest indices win
    student = build_student(config, teacher, scores)
    assert student.config.intermediate_size == 16
    kept = torch.arange(48, 64)
    for s_layer, t_index in zip(student.bert.encoder.layer, [0, 2]):
        t_layer = teacher.bert.encoder.layer[t_index]
        torch.testing.assert_close(s_layer.intermediate.dense.weight, t_layer.intermediate.dense.weight[kept])
        torch.testing.assert_close(s_layer.output.dense.weight, t_layer.output.dense.weight[:, kept])
    student.save_pretrained(tmp_path)
    again = BertForSequenceClassification.from_pretrained(tmp_path)
    batch = batch_of([5, 7])
    with torch.no_grad():
        torch.testing.assert_close(
            again(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
            student.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
        )


def test_ffn_size_needs_teacher_layers_and_fits_the_teacher():
    from pipeline.config import load_config
    from pipeline.errors import ConfigError
    from pipeline.models import check_against_models

    with pytest.raises(ConfigError, match="ffn_size"):
        load_config("tiny", ["student.init=random", "student.random={num_layers: 1}", "student.ffn_size=8"])
    with pytest.raises(ConfigError, match="student.ffn_size: 4096 is above the teacher's 64"):
        check_against_models(load_config("tiny", ["student.ffn_size=4096"]))


# ---------------------------------------------------------------- heads and width


def test_dead_heads_and_channels_score_zero_and_the_rest_score_above_zero():
    model = bert()  # 4 heads of width 8, hidden 32
    dead_head, dead_channels = 1, [3, 17]
    with torch.no_grad():
        for layer in model.bert.encoder.layer:
            layer.attention.output.dense.weight[:, dead_head * 8 : (dead_head + 1) * 8] = 0.0  # its output is dropped
        for norm in model.modules():
            if isinstance(norm, torch.nn.LayerNorm):
                norm.weight[dead_channels] = 0.0
                norm.bias[dead_channels] = 0.0
    for p in model.parameters():
        p.requires_grad_(False)
    heads, channels = width_importance(model, [batch_of([6, 9, 3]), batch_of([4, 8], seed=1)], [0, 1])
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())  # left as found
    for scores in heads.values():
        assert scores.shape == (4,) and scores[dead_head] == 0 and (np.delete(scores.numpy(), dead_head) > 0).all()
        assert dead_head not in kept_heads({0: scores}, [0], 3, shared=False)[0].tolist()
    assert channels.shape == (32,) and torch.all(channels[dead_channels] == 0)
    assert (np.delete(channels.numpy(), dead_channels) > 0).all()


def test_head_and_channel_importance_ignore_padding():
    model = bert()
    batch = batch_of([4, 9])
    padded = dict(batch)
    padded.update(  # the added ids are not pad ids: the mask alone must hide them
        input_ids=torch.cat([batch["input_ids"], torch.full((2, 5), 7)], 1),
        attention_mask=torch.cat([batch["attention_mask"], torch.zeros(2, 5, dtype=torch.long)], 1),
    )
    (a_heads, a_channels), (b_heads, b_channels) = (width_importance(model, [b], [0, 1]) for b in (batch, padded))
    torch.testing.assert_close(a_channels, b_channels, rtol=1e-4, atol=1e-7)
    for i in a_heads:
        torch.testing.assert_close(a_heads[i], b_heads[i], rtol=1e-4, atol=1e-9)


def test_one_backward_pass_gives_both_importances_as_two_separate_passes():
    model = bert()
    for p in model.parameters():
        p.requires_grad_(False)
    batches = [batch_of([6, 9, 3]), batch_of([4, 8], seed=1)]
    ffn, (heads, channels) = task_importance(model, batches, model.bert.encoder.layer, [0, 1])
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())
    ffn_alone = ffn_importance(model, batches, model.bert.encoder.layer)
    heads_alone, channels_alone = width_importance(model, batches, [0, 1])
    torch.testing.assert_close(channels, channels_alone)
    for i in ffn_alone:
        torch.testing.assert_close(ffn[i], ffn_alone[i])
    for i in heads_alone:
        torch.testing.assert_close(heads[i], heads_alone[i])
    assert task_importance(model, batches) == (None, None)


def test_shared_head_tables_keep_the_best_heads_by_summed_importance():
    scores = {0: torch.tensor([4.0, 1.0, 3.0, 0.0]), 2: torch.tensor([0.0, 5.0, 3.0, 0.5])}
    assert [h.tolist() for h in kept_heads(scores, [0, 2], 2, shared=False)] == [[0, 2], [1, 2]]
    assert [h.tolist() for h in kept_heads(scores, [0, 2], 2, shared=True)] == [[1, 2], [1, 2]]  # sums 4, 6, 6, .5


def test_attention_heads_needs_teacher_layers_fits_the_teacher_and_names_relation_heads():
    from pipeline.config import load_config
    from pipeline.errors import ConfigError
    from pipeline.models import check_against_models

    with pytest.raises(ConfigError, match="student.attention_heads prunes teacher layers"):
        load_config("tiny", ["student.init=random", "student.random={num_layers: 1}", "student.attention_heads=2"])
    with pytest.raises(ConfigError, match="student.attention_heads: 8 is above the teacher's 4 heads"):
        check_against_models(load_config("tiny", ["student.attention_heads=8"]))
    with pytest.raises(ConfigError, match="the student has 2 heads and the teacher 4; set distill.relation_heads"):
        check_against_models(load_config("tiny", ["student.attention_heads=2"]))
    check_against_models(load_config("tiny", ["student.attention_heads=2", "distill.relation_heads=2"]))


# ---------------------------------------------------------------- augmentation


CONTINUATION = np.zeros(100, dtype=bool)
CONTINUATION[90:] = True  # ids 90..99 are '##' pieces


def test_word_spans_join_continuation_pieces():
    assert word_spans([1, 10, 91, 92, 11, 12, 93, 2], CONTINUATION) == [(1, 4), (4, 5), (5, 7)]
    assert word_spans([1, 2], CONTINUATION) == []


def test_augment_is_deterministic_and_keeps_the_sentence_frame():
    sentences = [[1, 10, 91, 11, 12, 13, 14, 15, 2], [1, 20, 21, 2]]
    neighbours = {11: np.array([50, 51]), 20: np.array([60])}
    kwargs = dict(
        mask_id=3,
        continuation=CONTINUATION,
        neighbours=neighbours,
        mask_prob=0.3,
        replace_prob=0.3,
        ngram_prob=0.3,
        cls_id=1,
        sep_id=2,
    )
    first = augment(sentences, 20, seed=5, **kwargs)
    assert first == augment(sentences, 20, seed=5, **kwargs)
    assert first != augment(sentences, 20, seed=6, **kwargs)
    assert 0 < len(first) <= 40
    for variant in first:
        assert variant[0] == 1 and variant[-1] == 2 and len(variant) >= 3
        assert variant not in sentences
    tokens = {t for v in first for t in v}
    assert 3 in tokens and {50, 51, 60} & tokens  # masking and neighbour replacement both happen
    # a '##' piece is never replaced on its own: 91 only ever follows 10 (or the word became one [MASK])
    for variant in first:
        for i, t in enumerate(variant):
            if t == 91:
                assert variant[i - 1] == 10


def test_ngram_sampling_keeps_one_to_five_words():
    sentence = [1] + list(range(10, 30)) + [2]
    variants = augment(
        [sentence],
        50,
        seed=0,
        mask_id=3,
        continuation=CONTINUATION,
        neighbours={},
        mask_prob=0.0,
        replace_prob=0.0,
        ngram_prob=1.0,
        cls_id=1,
        sep_id=2,
    )
    assert variants and all(1 <= len(v) - 2 <= 5 for v in variants)
    for v in variants:  # a contiguous span of the original words
        start = sentence.index(v[1])
        assert v[1:-1] == sentence[start : start + len(v) - 2]


def test_nearest_words_are_the_most_similar_other_candidates():
    embeddings = torch.zeros(10, 3)
    embeddings[4] = torch.tensor([1.0, 0.0, 0.0])
    embeddings[5] = torch.tensor([0.9, 0.1, 0.0])
    embeddings[6] = torch.tensor([0.0, 1.0, 0.0])
    embeddings[7] = torch.tensor([0.0, 0.0, 1.0])
    found = nearest_words(embeddings, np.array([4, 5, 6, 7]), k=1, chunk=3)
    assert found[4].tolist() == [5] and found[5].tolist() == [4]
    assert set(nearest_words(embeddings, np.array([4, 5, 6, 7]), k=3)[4].tolist()) == {5, 6, 7}


# ---------------------------------------------------------------- objective on mixed batches


def test_relation_terms_use_only_rows_with_relation_targets():
    teacher, student = bert(0, layers=3), bert(1, layers=2)
    weights = LossWeights(ce=1.0, kd=1.0, attention=1.0, value_relation=1.0, hidden=1.0)
    plan = TargetPlan(
        pairs=[(0, 1), (1, 2)], relation_heads=4, attention=True, value_relation=True, hidden=True, kd=True
    )
    config = types.SimpleNamespace(distill=types.SimpleNamespace(loss=weights, temperature=2.0, attention_chunk=3))
    objective = DistillObjective(config, plan, 32, 32)
    mixed = batch_of([7, 4, 9, 2])
    mixed["relation_rows"] = torch.tensor([True, False, True, False])
    _, mixed_terms = objective(student, mixed, teacher_targets(teacher, mixed, plan))

    kept = {k: (v[[0, 2]] if k != "relation_rows" else v) for k, v in mixed.items() if k != "relation_rows"}
    kept["input_ids"], kept["attention_mask"] = kept["input_ids"][:, :9], kept["attention_mask"][:, :9]
    _, kept_terms = objective(student, kept, teacher_targets(teacher, kept, plan))
    for term in ("attention", "value_relation", "hidden"):
        torch.testing.assert_close(mixed_terms[term], kept_terms[term], atol=1e-5, rtol=1e-4)

    none = dict(mixed, relation_rows=torch.zeros(4, dtype=torch.bool))
    _, none_terms = objective(student, none, teacher_targets(teacher, none, plan))
    assert set(none_terms) == {"ce", "kd"}


# ---------------------------------------------------------------- through the pipeline


@pytest.fixture(scope="module")
def augmented_run(tiny_run, tmp_path_factory):
    """The tiny run's prepare and teacher, then capture with 2 augmented copies and a pruned 2-layer student."""
    import os
    import shutil

    from tests.helpers import run_cli

    runs_dir = tmp_path_factory.mktemp("augmented")
    for stage in ("prepare", "teacher"):  # shared upstream: the runner skips them (same fingerprints)
        shutil.copytree(tiny_run["run_dir"] / stage, runs_dir / "tiny" / stage, copy_function=os.link)
    result = run_cli(
        "run",
        "tiny",
        "capture.augment.copies=2",
        "student.teacher_layers=[0,1]",
        "student.ffn_size=16",
        "tracking.enabled=false",
        "--to",
        "evaluate",
        runs_dir=runs_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return runs_dir / "tiny", result


def test_augmentation_leaves_the_teacher_alone_and_labels_variants_with_logits_only(augmented_run):
    from pipeline.cache import TeacherCache
    from pipeline.config import load_config
    from pipeline.models import load_classifier
    from pipeline.runner import Distributed
    from pipeline.splits import TrainingData, pad_id
    from tests.helpers import read_json

    run_dir, result = augmented_run
    assert (
        "[prepare] up to date" in result.stderr + result.stdout
        and "[teacher] up to date" in result.stderr + result.stdout
    )
    capture = read_json(run_dir / "capture" / "capture.json")
    train = TrainingData(run_dir / "prepare", run_dir / "capture")
    assert train.names == ["train", "augmented"] and capture["augmented_examples"] == len(train.parts[1]) > 0
    assert capture["logits_only_examples"] == len(train.parts[1]) and train.relational == len(train.parts[0])
    cache = TeacherCache(run_dir / "capture" / "cache")
    augmented = np.arange(train.relational, len(train))[:24]
    batch = train.batch(augmented, pad_id(run_dir / "prepare"), "cpu")
    assert not batch["relation_rows"].any()
    teacher = load_classifier(str(run_dir / "teacher" / "model")).eval()
    with torch.no_grad(), Distributed(load_config("tiny")).accelerator.autocast():
        direct = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    cached = cache.batch(augmented, batch["input_ids"].shape[1], "cpu")
    assert (cached["logits"] - direct).abs().max().item() < 0.05
    assert not any(key.startswith(("attn.", "vrel.")) for key in cached)  # no relation targets stored for these rows
    student = read_json(run_dir / "distill" / "student" / "config.json")
    assert student["intermediate_size"] == 16 and student["num_hidden_layers"] == 2
    history = read_json(run_dir / "distill" / "history.json")
    assert history and all(np.isfinite(h["val_accuracy"]) for h in history)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_training_only_the_used_embedding_rows_trains_them_as_the_full_table_does(weight_decay):
    """distill.used_embedding_rows: the same AdamW steps on a table cut to the ids the data uses, written back, give
    the full-table model; the only difference is weight decay on the rows the data never uses (they stay as they
    started instead of shrinking)."""
    from pipeline.models import UsedRowsEmbedding, train_used_rows_only

    used = torch.tensor([0, 3, 7, 8, 20, 41, 42, 77])  # 0 is the pad id, with BERT's padding_idx
    full, cut = bert(seed=1), bert(seed=1)
    start = full.get_input_embeddings().weight.detach().clone()
    restore = train_used_rows_only(cut, used)
    assert isinstance(cut.get_input_embeddings(), UsedRowsEmbedding)
    assert sum(p.numel() for p in cut.parameters()) == sum(p.numel() for p in full.parameters()) - (100 - 8) * 32
    generator = torch.Generator().manual_seed(0)
    for model in (full, cut):
        torch.manual_seed(0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=weight_decay)
        model.train()
        for _ in range(3):
            ids = used[1:][torch.randint(0, 7, (4, 6), generator=generator.manual_seed(_))]
            ids[1, 4:] = 0  # padding
            loss = model(input_ids=ids, attention_mask=(ids != 0).long(), labels=torch.tensor([0, 1, 0, 1])).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    cut = restore()
    assert type(cut.get_input_embeddings()) is torch.nn.Embedding and cut.get_input_embeddings().padding_idx == 0
    trained, cut_table = full.get_input_embeddings().weight, cut.get_input_embeddings().weight
    unused = torch.ones(100, dtype=torch.bool)
    unused[used] = False
    torch.testing.assert_close(cut_table[used], trained[used], atol=1e-6, rtol=0)
    assert (cut_table[used] - start[used]).abs().max() > 1e-3  # the used rows did train
    torch.testing.assert_close(cut_table[unused], start[unused], atol=0, rtol=0)  # untouched
    if weight_decay == 0:  # no gradient, no decay: the full table left them alone too
        torch.testing.assert_close(trained[unused], start[unused], atol=0, rtol=0)
    else:
        assert (trained[unused] - start[unused]).abs().max() > 0
    for (name, a), (_, b) in zip(full.named_parameters(), cut.named_parameters()):
        if "word_embeddings" not in name:
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)


def test_fused_adamw_gives_the_multi_tensor_update():
    """TrainSettings.fused_adamw: the optimizer the pipeline builds is torch's fused AdamW on CPU, and a few steps of
    it (weight decay on weights, none on biases and LayerNorm) land where the multi-tensor AdamW does."""
    from pipeline.config import TrainSettings
    from pipeline.training import configure_optimizer

    models = {fused: bert(seed=2) for fused in (True, False)}
    optimizers = {
        fused: configure_optimizer({"model": m}, TrainSettings(lr=1e-2, weight_decay=0.01, fused_adamw=fused))[0]
        for fused, m in models.items()
    }
    assert optimizers[True].defaults["fused"] and not optimizers[False].defaults["fused"]
    for fused, model in models.items():
        model.train()
        generator = torch.Generator().manual_seed(0)
        for step in range(3):
            ids = torch.randint(1, 100, (4, 6), generator=generator)
            torch.manual_seed(step)  # the same dropout masks for both
            loss = model(input_ids=ids, labels=torch.tensor([0, 1, 0, 1])).loss
            optimizers[fused].zero_grad()
            loss.backward()
            optimizers[fused].step()
    start = bert(seed=2)
    for (name, a), (_, b), (_, _start) in zip(
        models[True].named_parameters(), models[False].named_parameters(), start.named_parameters()
    ):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)
    assert max((a - s).abs().max().item() for a, s in zip(models[True].parameters(), start.parameters())) > 1e-3


@pytest.mark.pipeline
def test_teacher_with_its_levers_on_saves_an_ordinary_full_table(tmp_path):
    """teacher.used_embedding_rows and teacher.fused_adamw (off by default): the stage trains the used rows and saves
    a teacher whose embedding table has every row again, loadable as any classifier."""
    from helpers import run_cli

    from pipeline.models import load_classifier

    result = run_cli(
        "run",
        "tiny",
        "teacher.used_embedding_rows=true",
        "teacher.fused_adamw=true",
        "--to",
        "teacher",
        runs_dir=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[teacher] fine-tuning" in result.stderr + result.stdout
    teacher = load_classifier(str(tmp_path / "tiny" / "teacher" / "model"))
    table = teacher.get_input_embeddings()
    assert type(table) is torch.nn.Embedding and table.weight.shape[0] == teacher.config.vocab_size
