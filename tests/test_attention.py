import copy
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from pipeline.attention import attention_probs, capture_projections, relation_scores, split_heads
from pipeline.losses import relation_kl
from tests.helpers import max_diff_valid_rows, padded_batch


def tiny_config(**kw):
    args = dict(
        vocab_size=64,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=12,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    args.update(kw)
    return BertConfig(**args)


def tiny_bert(config, attn="eager", seed=0):
    torch.manual_seed(seed)
    model = BertForSequenceClassification(copy.deepcopy(config))  # deep copy: models never share a config
    model.set_attn_implementation(attn)
    return model.eval()


@pytest.fixture(scope="module")
def config():
    return tiny_config()


def test_recomputed_attention_matches_eager_output_attentions(config):
    model = tiny_bert(config, "eager")
    ids, mask = padded_batch()
    layers = [0, 1]
    with torch.no_grad(), capture_projections(model, layers) as cap:
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert len(out.attentions) == 2
    for i in layers:
        ref = out.attentions[i]
        probs = attention_probs(cap[i]["query"], cap[i]["key"], mask, config.num_attention_heads)
        assert probs.shape == ref.shape == (3, 12, 10, 10)
        assert probs.dtype == torch.float32
        assert max_diff_valid_rows(probs, ref, mask) <= 1e-6
        padded_keys = ~mask.bool()[:, None, None, :].expand_as(probs)
        assert probs[padded_keys].abs().max() == 0
        assert ref[padded_keys].abs().max() == 0


def test_capture_works_under_sdpa(config):
    eager = tiny_bert(config, "eager")
    sdpa = tiny_bert(config, "sdpa")  # same seed: same weights
    assert sdpa.config._attn_implementation == "sdpa"
    ids, mask = padded_batch()
    with torch.no_grad():
        ref = eager(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        with capture_projections(sdpa, [0, 1], kinds=("query", "key", "value")) as cap:
            logits = sdpa(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(logits, eager(input_ids=ids, attention_mask=mask).logits)
    for i in (0, 1):
        assert set(cap[i]) == {"query", "key", "value"}
        assert cap[i]["value"].shape == (3, 10, 48)
        probs = attention_probs(cap[i]["query"], cap[i]["key"], mask, 12)
        assert max_diff_valid_rows(probs, ref[i], mask) <= 1e-6


def hook_count(model):
    attn = model.base_model.encoder.layer
    return sum(
        len(getattr(layer.attention.self, k)._forward_hooks) for layer in attn for k in ("query", "key", "value")
    )


def test_hooks_removed_on_exit_and_on_exception(config):
    model = tiny_bert(config)
    with capture_projections(model, [0, 1]):
        assert hook_count(model) == 4
    assert hook_count(model) == 0
    with pytest.raises(RuntimeError, match="boom"):
        with capture_projections(model, [1]):
            assert hook_count(model) == 2
            raise RuntimeError("boom")
    assert hook_count(model) == 0


def test_capture_through_ddp_wrapper(config, tmp_path):
    import torch.distributed as dist

    model = tiny_bert(config, "sdpa")
    ids, mask = padded_batch()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        with torch.no_grad(), capture_projections(ddp, [1]) as cap:
            ddp(input_ids=ids, attention_mask=mask)
    finally:
        dist.destroy_process_group()
    assert cap[1]["query"].shape == (3, 10, 48)
    assert hook_count(model) == 0


def test_capture_keeps_graph_and_survives_gradient_checkpointing(config):
    """Hooks fire again on recompute; gradients equal those without checkpointing."""
    teacher = tiny_bert(config, "sdpa", seed=0)
    ids, mask = padded_batch()
    with torch.no_grad(), capture_projections(teacher, [1]) as t_cap:
        teacher(input_ids=ids, attention_mask=mask)

    def student_grads(checkpointing):
        student = tiny_bert(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), "sdpa", seed=3)
        if checkpointing:
            student.activation_checkpointing_enable()  # transformers default: use_reentrant=False
        student.train()
        calls = []
        q_lin = student.bert.encoder.layer[1].attention.self.query
        q_lin.register_forward_hook(lambda *_: calls.append(1))
        with capture_projections(student, [1]) as cap:
            student(input_ids=ids, attention_mask=mask)
            first = cap[1]["query"]
            assert first.requires_grad
            loss = relation_kl(t_cap[1]["query"], t_cap[1]["key"], cap[1]["query"], cap[1]["key"], mask, 12)
            loss.backward()
            # with checkpointing the recompute replaced the entry: last value kept, same numbers
            assert (cap[1]["query"] is not first) == checkpointing
            torch.testing.assert_close(cap[1]["query"], first)
        attn = student.bert.encoder.layer[1].attention.self
        return loss.detach(), attn.query.weight.grad.clone(), attn.key.weight.grad.clone(), len(calls)

    loss_ref, gq_ref, gk_ref, calls_ref = student_grads(False)
    loss_ck, gq_ck, gk_ck, calls_ck = student_grads(True)
    assert calls_ref == 1 and calls_ck == 2  # the recompute in backward fired the hook again
    assert gq_ref.abs().sum() > 0 and gk_ref.abs().sum() > 0
    torch.testing.assert_close(loss_ck, loss_ref)
    torch.testing.assert_close(gq_ck, gq_ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(gk_ck, gk_ref, atol=1e-6, rtol=1e-5)


def test_split_heads_layout_and_errors():
    x = torch.arange(2 * 3 * 8, dtype=torch.float32).view(2, 3, 8)
    h = split_heads(x, 4)
    assert h.shape == (2, 4, 3, 2)
    torch.testing.assert_close(h[1, 2, 0], x[1, 0, 4:6])  # head 2 = columns 4..5
    with pytest.raises(ValueError, match="not divisible"):
        split_heads(x, 3)
    with pytest.raises(ValueError, match=r"\[B, N, D\]"):
        split_heads(x[0], 4)


def test_relation_scores_float32_from_bf16():
    a = torch.randn(1, 5, 8)
    s = relation_scores(a.bfloat16(), a.bfloat16(), 2)
    assert s.dtype == torch.float32 and s.shape == (1, 2, 5, 5)
    torch.testing.assert_close(s, relation_scores(a, a, 2), atol=0.1, rtol=0.05)
