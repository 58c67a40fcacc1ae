import copy
import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification

from pipeline.attention import attention_probs, capture_projections
from pipeline.losses import hidden_mse, logit_kd, relation_kl, relation_kl_from_probs

B, N = 3, 10
LENGTHS = (10, 7, 3)


def make_mask(lengths=LENGTHS, n=N):
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    return mask


def rand(*shape, seed, dtype=torch.float32, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


def naive_relation_kl(t_a, t_b, s_a, s_b, lengths, r, t_window=None, s_window=None):
    """Reference: loop over examples, drop padding by slicing, full softmax, plain KL; a window drops the keys
    further than it from each query row, row by row."""
    total, rows = 0.0, 0
    for i, length in enumerate(lengths):

        def probs(a, b, window, i=i, length=length):
            a = a[i, :length].view(length, r, -1).transpose(0, 1)
            b = b[i, :length].view(length, r, -1).transpose(0, 1)
            scores = a @ b.transpose(-1, -2) / math.sqrt(a.size(-1))
            if window is not None:
                for q in range(length):
                    for k in range(length):
                        if abs(q - k) > window:
                            scores[:, q, k] = -math.inf
            return torch.softmax(scores, dim=-1)

        p_t, p_s = probs(t_a.detach(), t_b.detach(), t_window), probs(s_a, s_b, s_window)
        kept = p_t > 0
        total = total + (p_t[kept] * (p_t[kept].log() - p_s[kept].log())).sum()
        rows += length
    return total / (r * rows)


@pytest.fixture
def qk():
    """Teacher and student Q/K, 4 heads of width 8, padded batch."""
    t_q, t_k = rand(B, N, 32, seed=0), rand(B, N, 32, seed=1)
    s_q, s_k = rand(B, N, 32, seed=2, requires_grad=True), rand(B, N, 32, seed=3, requires_grad=True)
    return t_q, t_k, s_q, s_k


def value_and_grads(fn, s_q, s_k):
    loss = fn()
    gq, gk = torch.autograd.grad(loss, (s_q, s_k))
    return loss.detach(), gq, gk


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 7, N, 64])
def test_chunked_matches_naive_value_and_grads(qk, chunk_size):
    t_q, t_k, s_q, s_k = qk
    mask = make_mask()
    ref = value_and_grads(lambda: naive_relation_kl(t_q, t_k, s_q, s_k, LENGTHS, 4), s_q, s_k)
    full = value_and_grads(lambda: relation_kl(t_q, t_k, s_q, s_k, mask, 4), s_q, s_k)
    chunked = value_and_grads(lambda: relation_kl(t_q, t_k, s_q, s_k, mask, 4, chunk_size=chunk_size), s_q, s_k)
    assert ref[0] > 0
    for got in (full, chunked):
        for a, b in zip(got, ref):
            assert (a - b).abs().max().item() <= 1e-6


def test_gradcheck_float64_chunked():
    mask = make_mask((5, 3), 5)
    t_q, t_k = rand(2, 5, 8, seed=4, dtype=torch.float64), rand(2, 5, 8, seed=5, dtype=torch.float64)
    s_q = rand(2, 5, 8, seed=6, dtype=torch.float64, requires_grad=True)
    s_k = rand(2, 5, 8, seed=7, dtype=torch.float64, requires_grad=True)
    loss = relation_kl(t_q, t_k, s_q, s_k, mask, 2, chunk_size=2)
    assert loss.dtype == torch.float64
    assert torch.autograd.gradcheck(lambda q, k: relation_kl(t_q, t_k, q, k, mask, 2, chunk_size=2), (s_q, s_k))


def test_zero_when_student_equals_teacher_positive_otherwise(qk):
    t_q, t_k, s_q, s_k = qk
    mask = make_mask()
    same = relation_kl(t_q, t_k, t_q.clone().requires_grad_(), t_k.clone(), mask, 4, chunk_size=3)
    assert same.abs().item() < 1e-7
    assert relation_kl(t_q, t_k, s_q, s_k, mask, 4, chunk_size=3).item() > 0


def test_padded_positions_do_not_matter(qk):
    t_q, t_k, s_q, s_k = qk
    mask = make_mask()
    pad = ~mask.bool()[..., None]
    noisy = [torch.where(pad, x.detach() * 100 + 7, x.detach()) for x in (t_q, t_k, s_q, s_k)]
    base = relation_kl(t_q, t_k, s_q, s_k, mask, 4, chunk_size=4)
    changed = relation_kl(*noisy, mask, 4, chunk_size=4)
    assert torch.isfinite(changed)
    assert (base - changed).abs().item() <= 1e-6
    gq, gk = torch.autograd.grad(base, (s_q, s_k))
    assert gq[pad.expand_as(gq)].abs().max() == 0 and gk[pad.expand_as(gk)].abs().max() == 0


def test_no_gradient_to_teacher_and_float32_from_bf16(qk):
    t_q, t_k, s_q, s_k = qk
    mask = make_mask()
    t_q = t_q.clone().requires_grad_()
    loss = relation_kl(t_q, t_k, s_q, s_k, mask, 4, chunk_size=3)
    loss.backward()
    assert t_q.grad is None and s_q.grad is not None
    low = relation_kl(*(x.detach().bfloat16() for x in (t_q, t_k, s_q, s_k)), mask, 4, chunk_size=3)
    assert low.dtype == torch.float32
    assert abs(low.item() - loss.item()) < 0.05 * loss.item()


def test_chunking_saves_no_full_score_matrix(qk):
    """Forward+backward memory: the chunked graph keeps nothing of size N x N."""
    t_q, t_k, s_q, s_k = qk
    mask = make_mask()

    def largest_saved(chunk_size):
        sizes = []

        def pack(x):
            sizes.append(x.numel())
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            loss = relation_kl(t_q, t_k, s_q, s_k, mask, 4, chunk_size=chunk_size)
        loss.backward()
        return max(sizes, default=0)

    assert largest_saved(None) >= B * 4 * N * N
    assert largest_saved(2) < B * 4 * N * N


def test_relation_heads_different_widths_reach_student_weights():
    """Teacher D=48 / 12 heads, student D=32 / 4 heads, distilled through R=4 relation heads."""
    base = dict(vocab_size=64, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=32, num_labels=2)
    torch.manual_seed(0)
    teacher = BertForSequenceClassification(BertConfig(hidden_size=48, num_attention_heads=12, **base)).eval()
    student = BertForSequenceClassification(BertConfig(hidden_size=32, num_attention_heads=4, **copy.deepcopy(base)))
    teacher.set_attn_implementation("sdpa")
    student.set_attn_implementation("sdpa")
    mask = make_mask()
    ids = torch.randint(1, 64, (B, N)) * mask
    kinds = ("query", "key", "value")
    with torch.no_grad(), capture_projections(teacher, [1], kinds) as t:
        teacher(input_ids=ids, attention_mask=mask)
    with capture_projections(student, [1], kinds) as s:
        student(input_ids=ids, attention_mask=mask)
    t, s = t[1], s[1]
    assert t["query"].shape[-1] == 48 and s["query"].shape[-1] == 32
    qk = relation_kl(t["query"], t["key"], s["query"], s["key"], mask, 4, chunk_size=3)
    vv = relation_kl(t["value"], t["value"], s["value"], s["value"], mask, 4, chunk_size=3)
    ref = naive_relation_kl(t["query"], t["key"], s["query"], s["key"], LENGTHS, 4)
    assert abs(qk.item() - ref.item()) <= 1e-6
    (qk + vv).backward()
    attn = student.bert.encoder.layer[1].attention.self
    for lin in (attn.query, attn.key, attn.value):
        assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
    with pytest.raises(ValueError, match="not divisible"):
        relation_kl(t["query"], t["key"], s["query"], s["key"], mask, 5)


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_from_probs_matches_relation_kl(qk, chunk_size):
    t_q, t_k, s_q, s_k = qk
    mask = make_mask()
    t_probs = attention_probs(t_q, t_k, mask, 4)
    t_probs = t_probs * mask[:, None, :, None]  # a cache stores padded query rows as 0
    ref = value_and_grads(lambda: relation_kl(t_q, t_k, s_q, s_k, mask, 4, chunk_size), s_q, s_k)
    got = value_and_grads(lambda: relation_kl_from_probs(t_probs, s_q, s_k, mask, 4, chunk_size), s_q, s_k)
    for a, b in zip(got, ref):
        assert (a - b).abs().max().item() <= 1e-6
    fp16 = relation_kl_from_probs(t_probs.half(), s_q, s_k, mask, 4, chunk_size)
    assert fp16.dtype == torch.float32
    assert abs(fp16.item() - ref[0].item()) < 1e-3
    same = relation_kl_from_probs(t_probs.half(), t_q, t_k, mask, 4, chunk_size)
    assert 0 <= same.item() < 1e-3


def test_logit_kd():
    s, t = rand(5, 3, seed=8, requires_grad=True), rand(5, 3, seed=9)
    for temp in (1.0, 2.0, 4.0):
        p_t = torch.softmax(t / temp, -1)
        manual = (p_t * (p_t.log() - torch.log_softmax(s / temp, -1))).sum() / 5 * temp**2
        torch.testing.assert_close(logit_kd(s, t, temp), manual)
    assert logit_kd(t, t, 2.0).abs().item() < 1e-7
    # T^2 scaling: the same distributions at T=1 and T=3 differ exactly by 9
    torch.testing.assert_close(logit_kd(s * 3, t * 3, 3.0), 9 * logit_kd(s, t, 1.0))
    logit_kd(s, t.requires_grad_(), 2.0).backward()
    assert s.grad is not None and t.grad is None


def test_hidden_mse_projection_and_mask():
    mask = make_mask()
    s_h, t_h = rand(B, N, 32, seed=10, requires_grad=True), rand(B, N, 48, seed=11)
    proj = torch.nn.Linear(32, 48)
    loss = hidden_mse(s_h, t_h, mask, proj)
    valid = mask.bool()
    manual = F.mse_loss(proj(s_h)[valid], t_h[valid])
    torch.testing.assert_close(loss, manual)
    # padded tokens do not count
    noisy = torch.where(valid[..., None], t_h, t_h + 50)
    torch.testing.assert_close(hidden_mse(s_h, noisy, mask, proj), loss)
    loss.backward()
    assert proj.weight.grad.abs().sum() > 0 and s_h.grad.abs().sum() > 0
    assert hidden_mse(t_h, t_h, mask).item() == 0
    with pytest.raises(ValueError, match="projection"):
        hidden_mse(s_h, t_h, mask)


@pytest.mark.parametrize("chunk_size", [None, 1, 3])
@pytest.mark.parametrize("windows", [(2, 2), (1, 3), (2, None)])  # (teacher, student): ModernBERT's sliding layers
def test_windowed_relation_kl_matches_naive_and_the_cached_path(qk, chunk_size, windows):
    t_q, t_k, s_q, s_k = qk
    mask = make_mask()
    t_window, s_window = windows
    ref = value_and_grads(lambda: naive_relation_kl(t_q, t_k, s_q, s_k, LENGTHS, 4, t_window, s_window), s_q, s_k)
    got = value_and_grads(
        lambda: relation_kl(t_q, t_k, s_q, s_k, mask, 4, chunk_size, teacher_window=t_window, student_window=s_window),
        s_q,
        s_k,
    )
    for a, b in zip(got, ref):
        assert (a - b).abs().max().item() <= 1e-6
    unwindowed = relation_kl(t_q, t_k, s_q, s_k, mask, 4, chunk_size)
    assert abs(unwindowed.item() - ref[0].item()) > 1e-3  # the window changes the loss
    # the cache's path: teacher probabilities computed with the teacher layer's window, as capture stores them
    t_probs = attention_probs(t_q, t_k, mask, 4, t_window) * mask[:, None, :, None]
    assert t_probs[0, :, 0, t_window + 1 :].abs().max() == 0
    cached = value_and_grads(
        lambda: relation_kl_from_probs(t_probs, s_q, s_k, mask, 4, chunk_size, student_window=s_window), s_q, s_k
    )
    for a, b in zip(cached, ref):
        assert (a - b).abs().max().item() <= 1e-6
