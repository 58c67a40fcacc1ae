"""Attention recomputation from captured projections.

Fast kernels (SDPA, FlashAttention) never materialise attention probabilities,
and with ``output_attentions=True`` transformers 5.x SDPA returns an empty tuple.
So we never ask the model for attentions: forward hooks on the self-attention
query / key / value Linear layers (named per family in pipeline/families.py,
e.g. BERT's ``query``, DistilBERT's ``q_lin``, DeBERTa's ``query_proj``)
capture the projections under any backend, and the losses recompute only the
scores they need. For DeBERTa the recomputed scores are its content-to-content
relation, not its full attention (see pipeline/families.py).
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch
from torch import nn

from .families import projection, self_attention, unwrap_model


@contextlib.contextmanager
def capture_projections(
    model: nn.Module,
    layers: Iterable[int],
    kinds: Iterable[str] = ("query", "key"),
) -> Iterator[dict[int, dict[str, torch.Tensor]]]:
    """Capture the Q/K/V projection outputs of the given encoder layers.

    ``kinds`` are the family-independent names query / key / value; the module
    hooked for each is the family's (pipeline/families.py).

    Yields ``{layer: {kind: tensor [B, N, D]}}`` (D = all heads concatenated),
    filled by the next forward pass. Tensors keep their autograd graph, so a
    student loss can backprop through them; capture a teacher under
    ``torch.no_grad()``.

    Independent of ``attn_implementation`` (sdpa, eager, flash): only the Linear
    outputs are read, never ``output_attentions``.

    Only the first call of each projection within one call of the attention
    module is the content projection: DeBERTa-v2/v3 with shared keys calls its
    query/key projections a second time on the relative-position embeddings,
    which is not captured.

    Gradient checkpointing: with non-reentrant checkpointing (the transformers
    default) the backward pass re-runs the layer and the hooks fire again; each
    entry holds the LAST attention call's value, i.e. the recomputed one after backward.
    Compute the loss from the entries before calling ``backward()``. With
    ``use_reentrant=True`` the first forward runs without grad, so captured
    tensors carry no graph: use non-reentrant checkpointing with this capture.

    Hooks are removed on exit, also when the body raises.
    """
    layers = list(layers)
    kinds = tuple(kinds)
    captured: dict[int, dict[str, torch.Tensor]] = {i: {} for i in layers}
    handles = []

    def make_hook(slot: dict[str, torch.Tensor], kind: str, seen: set):
        def hook(_module, _inputs, output):
            if kind in seen:  # a second call inside the same attention call (DeBERTa's position projection)
                return
            seen.add(kind)
            slot[kind] = output  # overwrite: the last attention call (e.g. a checkpoint recompute) wins

        return hook

    try:
        for i in layers:
            seen: set[str] = set()  # kinds captured in the current call of layer i's attention module
            handles.append(self_attention(model, i).register_forward_pre_hook(lambda *_, seen=seen: seen.clear()))
            for kind in kinds:
                handles.append(projection(model, i, kind).register_forward_hook(make_hook(captured[i], kind, seen)))
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
    "projection",
    "self_attention",
    "split_heads",
    "unwrap_model",
]
