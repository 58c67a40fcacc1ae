"""Attention recomputation from captured projections.

Fast kernels (SDPA, FlashAttention) never materialise attention probabilities,
and with ``output_attentions=True`` transformers 5.x SDPA returns an empty tuple.
So we never ask the model for attentions: forward hooks on the self-attention
``query`` / ``key`` / ``value`` Linear layers capture the projections under any
backend, and the losses recompute only the scores they need.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch
from torch import nn


def unwrap_model(model: nn.Module) -> nn.Module:
    """Strip DDP / accelerate (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        for attr in ("module", "_orig_mod"):
            inner = getattr(model, attr, None)
            if isinstance(inner, nn.Module):  # not truthiness: an empty ModuleList is falsy
                model = inner
                break
        else:
            return model


def self_attention(model: nn.Module, layer: int) -> nn.Module:
    """The ``BertSelfAttention``-style module of encoder layer ``layer``."""
    return unwrap_model(model).base_model.encoder.layer[layer].attention.self


@contextlib.contextmanager
def capture_projections(
    model: nn.Module,
    layers: Iterable[int],
    kinds: Iterable[str] = ("query", "key"),
) -> Iterator[dict[int, dict[str, torch.Tensor]]]:
    """Capture the Q/K/V projection outputs of the given encoder layers.

    Yields ``{layer: {kind: tensor [B, N, D]}}`` (D = all heads concatenated),
    filled by the next forward pass. Tensors keep their autograd graph, so a
    student loss can backprop through them; capture a teacher under
    ``torch.no_grad()``.

    Independent of ``attn_implementation`` (sdpa, eager, flash): only the Linear
    outputs are read, never ``output_attentions``.

    Gradient checkpointing: with non-reentrant checkpointing (the transformers
    default) the backward pass re-runs the layer and the hooks fire again; each
    entry holds the LAST value seen, i.e. the recomputed one after backward.
    Compute the loss from the entries before calling ``backward()``. With
    ``use_reentrant=True`` the first forward runs without grad, so captured
    tensors carry no graph: use non-reentrant checkpointing with this capture.

    Hooks are removed on exit, also when the body raises.
    """
    layers = list(layers)
    kinds = tuple(kinds)
    captured: dict[int, dict[str, torch.Tensor]] = {i: {} for i in layers}
    handles = []

    def make_hook(slot: dict[str, torch.Tensor], kind: str):
        def hook(_module, _inputs, output):
            slot[kind] = output  # overwrite: the last call (e.g. a checkpoint recompute) wins

        return hook

    try:
        for i in layers:
            attn = self_attention(model, i)
            for kind in kinds:
                proj = getattr(attn, kind)
                handles.append(proj.register_forward_hook(make_hook(captured[i], kind)))
        yield captured
    finally:
        for h in handles:
            h.remove()


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, N, D] -> [B, H, N, D/H], the same head layout as BERT self-attention."""
    if x.dim() != 3:
        raise ValueError(f"expected a [B, N, D] tensor, got shape {tuple(x.shape)}")
    b, n, d = x.shape
    if num_heads <= 0 or d % num_heads != 0:
        raise ValueError(f"width D={d} is not divisible by num_heads={num_heads}")
    return x.view(b, n, num_heads, d // num_heads).transpose(1, 2)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    # At least float32 (bf16/fp16 softmax/log are too coarse for a KL); float64 stays float64.
    return torch.promote_types(x.dtype, torch.float32)


def relation_scores(a: torch.Tensor, b: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Scaled dot products a_h @ b_h^T / sqrt(d_h) per head, in (at least) float32 -> [B, H, N, N]."""
    dtype = _compute_dtype(a)
    a_h = split_heads(a, num_heads).to(dtype)
    b_h = split_heads(b, num_heads).to(dtype)
    # Multiply by the scale after the matmul, exactly as HF eager attention does.
    return torch.matmul(a_h, b_h.transpose(-1, -2)) * (a_h.size(-1) ** -0.5)


def attention_probs(
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    num_heads: int,
) -> torch.Tensor:
    """Attention probabilities [B, H, N, N] as HF eager attention computes them (eval mode).

    ``attention_mask`` is the usual [B, N] 0/1 tensor; padded keys get an additive
    ``finfo.min`` and therefore probability 0. Padded query rows are computed like
    HF does (they attend to the valid keys); losses must mask them out.
    """
    scores = relation_scores(query, key, num_heads)
    if attention_mask is not None:
        keep = attention_mask[:, None, None, :].to(torch.bool)
        bias = torch.zeros((), dtype=scores.dtype, device=scores.device)
        scores = scores + torch.where(keep, bias, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1)


__all__ = [
    "attention_probs",
    "capture_projections",
    "relation_scores",
    "self_attention",
    "split_heads",
    "unwrap_model",
]
