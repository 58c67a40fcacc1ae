"""Distillation losses.

Each loss is a small function; its docstring gives the formula and the paper.
Every loss computes in (at least) float32, whatever the input dtype, and
detaches teacher inputs, so no gradient ever reaches the teacher.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipeline.attention import split_heads, window_mask

# Query rows per chunk for the attention / relation KL: peak memory of forward +
# backward grows with N * chunk per head instead of N^2 (see bench/attention_kl.py).
DEFAULT_CHUNK_SIZE = 128


def _compute_dtype(*xs: torch.Tensor) -> torch.dtype:
    # At least float32 (bf16/fp16 log-softmax is too coarse for a KL); float64 stays float64.
    dtype = torch.float32
    for x in xs:
        dtype = torch.promote_types(dtype, x.dtype)
    return dtype


def _masks(attention_mask: torch.Tensor | None, b: int, n: int, device: torch.device, dtype: torch.dtype):
    """Key mask [B,1,1,N] (bool) and query-row weights [B,1,N] (0/1 in ``dtype``)."""
    if attention_mask is None:
        valid = torch.ones(b, n, dtype=torch.bool, device=device)
    else:
        if attention_mask.shape != (b, n):
            raise ValueError(f"attention_mask must be [B, N] = {(b, n)}, got {tuple(attention_mask.shape)}")
        valid = attention_mask.to(device=device, dtype=torch.bool)
    return valid[:, None, None, :], valid[:, None, :].to(dtype)


def _windowed(key_valid: torch.Tensor, window: int | None) -> torch.Tensor:
    """The key mask of a sliding-window layer: [B,1,1,N] & |i - j| <= window -> [B,1,N,N] (unchanged without a window)."""
    band = window_mask(key_valid.size(-1), window, key_valid.device)
    return key_valid if band is None else key_valid & band


def _log_probs(a_c: torch.Tensor, b: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """log softmax_j(a_c[i] . b[j] / sqrt(d)) over valid keys j -> [B,R,c,N]."""
    scores = torch.matmul(a_c, b.transpose(-1, -2)) * (a_c.size(-1) ** -0.5)
    # masked_fill (not an additive bias): padded keys get exactly finfo.min whatever
    # their content, and log-probs stay finite, so no inf/NaN reaches the gradient.
    scores = scores.masked_fill(~key_valid, torch.finfo(scores.dtype).min)
    return torch.log_softmax(scores, dim=-1)


def _kl_chunk_from_vectors(t_a_c, s_a_c, t_valid_c, s_valid_c, t_b, s_b, row_w_c):
    """Sum over valid rows and heads of KL(teacher row || student row), for one chunk of query rows."""
    t_logp = _log_probs(t_a_c, t_b, t_valid_c)  # teacher inputs are detached: no graph kept
    s_logp = _log_probs(s_a_c, s_b, s_valid_c)
    # Masked formula: padded (or out-of-window) teacher keys contribute exactly 0 (no 0 * log 0).
    kl = torch.where(t_valid_c, t_logp.exp() * (t_logp - s_logp), 0.0).sum(-1)  # [B,R,c]
    return (kl * row_w_c).sum()


def _kl_chunk_from_probs(t_probs_c, s_a_c, key_valid, s_b, row_w_c):
    """Same as ``_kl_chunk_from_vectors`` with cached teacher probabilities [B,R,c,N]."""
    s_logp = _log_probs(s_a_c, s_b, key_valid)
    p_t = torch.where(key_valid, t_probs_c.to(s_logp.dtype), 0.0)
    # Cached fp16 rows sum to 1 only within ~1e-3: renormalise each row to a
    # distribution again, so the KL stays >= 0 (and ~0 when the student matches).
    p_t = p_t / p_t.sum(-1, keepdim=True).clamp_min(torch.finfo(p_t.dtype).tiny)
    pos = p_t > 0  # entries that underflowed to 0 contribute 0 (0 * log 0 = 0)
    log_pt = torch.log(torch.where(pos, p_t, 1.0))
    kl = torch.where(pos, p_t * (log_pt - s_logp), 0.0).sum(-1)
    return (kl * row_w_c).sum()


def _chunked_sum(fn, chunk_size, sliced, shared, row_w, use_ckpt):
    """Sum ``fn(*sliced_chunk, *shared, row_w_chunk)`` over chunks of query rows.

    ``sliced`` tensors have the query row on dim 2 and are sliced per chunk (views,
    no copy), unless that dim is 1 (a key mask the same for every row); ``shared`` are passed whole. Each chunk runs under non-reentrant
    checkpoint: its [B,R,c,N] intermediates are freed right after its forward and
    recomputed one chunk at a time in backward.
    """
    n = row_w.size(-1)
    if chunk_size is None:
        return fn(*sliced, *shared, row_w)
    if not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    total = 0.0
    for start in range(0, n, chunk_size):
        rows = slice(start, start + chunk_size)
        args = [x[:, :, rows] if x.size(2) > 1 else x for x in sliced] + list(shared) + [row_w[:, :, rows]]
        total = total + (checkpoint(fn, *args, use_reentrant=False) if use_ckpt else fn(*args))
    return total


def _check_pair(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    if a.dim() != 3 or a.shape != b.shape:
        raise ValueError(
            f"{name}: expected two [B, N, D] tensors of the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def _needs_ckpt(*xs: torch.Tensor) -> bool:
    # Without a backward there is nothing to save, so chunks run plainly.
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def relation_kl(
    t_a: torch.Tensor,
    t_b: torch.Tensor,
    s_a: torch.Tensor,
    s_b: torch.Tensor,
    attention_mask: torch.Tensor | None,
    num_heads: int,
    chunk_size: int | None = None,
    teacher_window: int | None = None,
    student_window: int | None = None,
) -> torch.Tensor:
    """Relation KL(teacher || student), MiniLM / MiniLMv2 style.

    Both concatenated projections are re-split into R = ``num_heads`` relation heads
    (teacher [B,N,Dt] -> [B,R,N,Dt/R], student [B,N,Ds] -> [B,R,N,Ds/R]), so teacher
    and student head counts and widths may differ. Per head r and valid query row i:

        P_r[i] = softmax_j( a_r[i] . b_r[j] / sqrt(d_r) )      (padded keys j: P = 0)
        loss   = sum_{r, valid i} KL(P^T_r[i] || P^S_r[i]) / (R * #valid rows)

    (a, b) = (query, key) with R = the models' head count is exactly attention KL
    (MiniLM, Wang et al. 2020, arXiv:2002.10957); (value, value) is MiniLM's
    value-relation KL; other R are MiniLMv2 relation heads (Wang et al. 2021,
    arXiv:2012.15828). Padded query rows are excluded.

    ``teacher_window`` / ``student_window``: a sliding-window layer's keys are
    limited to |i - j| <= window on that side (ModernBERT's local layers), so
    each side's P is that layer's own attention; the student's window must hold
    the teacher's (pipeline.families.check_layer_windows).

    ``chunk_size``: compute in chunks of query rows, each under non-reentrant
    checkpoint, so forward+backward peak memory grows with N * chunk_size per head,
    not N^2 (None = all rows at once, no checkpoint). Same value and gradients.
    Teacher inputs are detached; math runs in float32 (float64 stays float64).
    """
    _check_pair(t_a, t_b, "teacher")
    _check_pair(s_a, s_b, "student")
    if t_a.shape[:2] != s_a.shape[:2]:
        raise ValueError(f"teacher and student disagree on [B, N]: {tuple(t_a.shape[:2])} vs {tuple(s_a.shape[:2])}")
    b, n = s_a.shape[:2]
    dtype = _compute_dtype(s_a, t_a)
    key_valid, row_w = _masks(attention_mask, b, n, s_a.device, dtype)
    t_a_h, t_b_h = (split_heads(x.detach(), num_heads).to(dtype) for x in (t_a, t_b))
    s_a_h, s_b_h = (split_heads(x, num_heads).to(dtype) for x in (s_a, s_b))
    total = _chunked_sum(
        _kl_chunk_from_vectors,
        chunk_size,
        sliced=(t_a_h, s_a_h, _windowed(key_valid, teacher_window), _windowed(key_valid, student_window)),
        shared=(t_b_h, s_b_h),
        row_w=row_w,
        use_ckpt=_needs_ckpt(s_a, s_b),
    )
    return total / (num_heads * row_w.sum().clamp_min(1.0))


def relation_kl_from_probs(
    t_probs: torch.Tensor,
    s_a: torch.Tensor,
    s_b: torch.Tensor,
    attention_mask: torch.Tensor | None,
    num_heads: int,
    chunk_size: int | None = None,
    student_window: int | None = None,
) -> torch.Tensor:
    """``relation_kl`` with the teacher's relation distributions read from a cache.

    ``t_probs`` [B,R,N,N] (fp16 allowed; padded entries 0) are the teacher's P^T_r,
    e.g. ``pipeline.attention.attention_probs(q, k, mask, R)``. Same formula and
    normalisation as ``relation_kl`` (MiniLM / MiniLMv2); each teacher row is
    renormalised over valid keys in float32 to undo fp16 rounding, and entries
    that are 0 contribute 0 (a sliding-window teacher layer's keys outside its
    window among them). Chunked the same way: a chunk casts only its own
    [B,R,c,N] slice of the cache to float32.
    """
    _check_pair(s_a, s_b, "student")
    b, n = s_a.shape[:2]
    if t_probs.dim() != 4 or t_probs.shape != (b, num_heads, n, n):
        raise ValueError(f"t_probs must be [B, R, N, N] = {(b, num_heads, n, n)}, got {tuple(t_probs.shape)}")
    dtype = _compute_dtype(s_a)
    key_valid, row_w = _masks(attention_mask, b, n, s_a.device, dtype)
    s_a_h, s_b_h = (split_heads(x, num_heads).to(dtype) for x in (s_a, s_b))
    total = _chunked_sum(
        _kl_chunk_from_probs,
        chunk_size,
        sliced=(t_probs.detach(), s_a_h, _windowed(key_valid, student_window)),
        shared=(s_b_h,),
        row_w=row_w,
        use_ckpt=_needs_ckpt(s_a, s_b),
    )
    return total / (num_heads * row_w.sum().clamp_min(1.0))


def logit_kd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Soft-target KD (Hinton, Vinyals & Dean 2015, arXiv:1503.02531).

        loss = T^2 * (1/B) * sum_b KL( softmax(t_b / T) || softmax(s_b / T) )

    The T^2 factor keeps gradient magnitudes comparable across temperatures.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    dtype = _compute_dtype(student_logits)
    s_logp = torch.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    t_logp = torch.log_softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)
    return F.kl_div(s_logp, t_logp, reduction="batchmean", log_target=True) * temperature**2


def hidden_mse(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    attention_mask: torch.Tensor | None,
    projection: nn.Module | None = None,
) -> torch.Tensor:
    """Hidden-state MSE over valid tokens (TinyBERT, Jiao et al. 2020, arXiv:1909.10351).

        loss = sum_{valid tokens i} || W h^S_i (+ b) - h^T_i ||^2 / (#valid tokens * Dt)

    ``projection`` is the learned nn.Linear(Ds, Dt) that maps the student width to
    the teacher's (TinyBERT's W_h); without it the widths must match. Padded
    tokens are excluded via ``attention_mask`` [B, N] (None = all valid).
    """
    s = projection(student_hidden) if projection is not None else student_hidden
    t = teacher_hidden.detach()
    if s.shape != t.shape:
        raise ValueError(
            f"student {tuple(s.shape)} and teacher {tuple(t.shape)} hidden shapes differ"
            + ("" if projection is not None else "; pass projection=nn.Linear(Ds, Dt)")
        )
    dtype = _compute_dtype(s, t)
    per_token = (s.to(dtype) - t.to(dtype)).pow(2).mean(-1)  # [B, N]
    if attention_mask is None:
        return per_token.mean()
    w = attention_mask.to(dtype)
    return (per_token * w).sum() / w.sum().clamp_min(1.0)


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "hidden_mse",
    "logit_kd",
    "relation_kl",
    "relation_kl_from_probs",
]
