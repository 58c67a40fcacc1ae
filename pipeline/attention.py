"""Attention recomputation from captured projections.

Fast kernels (SDPA, FlashAttention) never materialise attention probabilities,
and with ``output_attentions=True`` transformers 5.x SDPA returns an empty tuple.
So we never ask the model for attentions: forward hooks on the self-attention
query / key / value Linear layers (named per family in pipeline/families.py,
e.g. BERT's ``query``, DistilBERT's ``q_lin``, DeBERTa's ``query_proj``)
capture the projections under any backend, and the losses recompute only the
scores they need. For DeBERTa the recomputed scores are its content-to-content
relation, not its full attention (see pipeline/families.py). Families that
rotate queries and keys by position (ModernBERT, EuroBERT) get the same rotation
applied to the captured tensors, and ModernBERT's sliding-window layers the
same key window (``window``), so the recomputed scores are again the model's.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from .families import family_of, projection, self_attention, unwrap_model


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
    if not layers:  # a static student: nothing to hook, any model
        yield {}
        return
    family = family_of(model)
    captured: dict[int, dict[str, torch.Tensor]] = {i: {} for i in layers}
    handles = []

    def on_attention_call(state: dict):
        def pre_hook(_module, _args, kwargs):
            state["seen"] = set()  # kinds captured in this call of the layer's attention module
            state["rotation"] = kwargs.get("position_embeddings")  # RoPE families: (cos, sin) of this call

        return pre_hook

    def on_projection(slot: dict, names: tuple[str, ...], state: dict, attention: nn.Module):
        def hook(_module, _inputs, output):
            if (
                names[0] in state["seen"]
            ):  # a second call inside the same attention call (DeBERTa's position projection)
                return
            parts = (
                dict(zip(("query", "key", "value"), output.chunk(3, dim=-1)))
                if family.fused_qkv
                else {names[0]: output}
            )
            for kind in names:
                state["seen"].add(kind)
                slot[kind] = as_attention_sees_it(parts[kind], kind, family, attention, state["rotation"])

        return hook

    try:
        for i in layers:
            state: dict = {"seen": set(), "rotation": None}
            attention = self_attention(model, i)
            handles.append(attention.register_forward_pre_hook(on_attention_call(state), with_kwargs=True))
            # One hook per distinct Linear: a fused Q/K/V projection yields every kind at once.
            by_module: dict[str, list[str]] = {}
            for kind in kinds:
                by_module.setdefault(family.projection_name(kind), []).append(kind)
            for names in by_module.values():
                linear = projection(model, i, names[0])
                handles.append(linear.register_forward_hook(on_projection(captured[i], tuple(names), state, attention)))
        yield captured
    finally:
        for h in handles:
            h.remove()


def classifier_output_layer(model: nn.Module) -> nn.Linear:
    """The classifier's last Linear (out_features = num_labels): BERT's ``classifier``, MPNet's and ModernBERT's head
    ``classifier.out_proj`` / ``classifier``. Found by shape, so every family's head is covered; the last one
    registered wins (a head's dense layer comes before its output layer)."""
    model = unwrap_model(model)
    num_labels = model.config.num_labels
    found = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == num_labels]
    if not found:
        raise ValueError(f"{type(model).__name__} has no Linear layer with {num_labels} outputs (its classifier)")
    return found[-1]


@contextlib.contextmanager
def capture_classifier_input(model: nn.Module, enabled: bool = True) -> Iterator[dict[str, torch.Tensor]]:
    """Capture what the classifier's output layer reads (the penultimate representation, [B, D]: BERT's pooler output,
    MPNet's ``tanh(dense(<s>))``) in the next forward pass, under ``"input"``; dropout before the layer applies in
    training mode, as the logits see it. Keeps the autograd graph (capture a teacher under ``torch.no_grad()``).
    ``enabled=False`` hooks nothing and yields an empty dict."""
    captured: dict[str, torch.Tensor] = {}
    if not enabled:
        yield captured
        return

    def pre_hook(_module, args):
        captured["input"] = args[0]

    handle = classifier_output_layer(model).register_forward_pre_hook(pre_hook)
    try:
        yield captured
    finally:
        handle.remove()


def as_attention_sees_it(x: torch.Tensor, kind: str, family, attention: Any, rotation) -> torch.Tensor:
    """A projection [B, N, width] as the attention kernel multiplies it: queries and keys rotated by their positions
    (RoPE families), keys and values repeated per query head (grouped-query attention) -> [B, N, heads * head_dim]."""
    groups = getattr(attention, "num_key_value_groups", 1)
    rotated, repeated = family.rotary and kind != "value", kind != "query" and groups > 1
    if not (rotated or repeated):
        return x
    b, n, _ = x.shape
    heads = x.view(b, n, -1, attention.head_dim)
    if rotated:
        if rotation is None:
            raise RuntimeError(
                f"{family.name} attention was called without position_embeddings; cannot rotate the {kind}"
            )
        cos, sin = (t.unsqueeze(-2) for t in rotation)  # [B or 1, N, head_dim] -> the same for every head
        # Both modules rotate in float32; ModernBERT casts back to the projection's dtype, EuroBERT keeps the
        # promoted dtype (float32 under bf16 autocast): the same here, so the scores are the kernel's.
        dtype = x.dtype if family.rotary_casts_back else torch.promote_types(x.dtype, cos.dtype)
        heads = rotate(heads.float(), cos, sin).to(dtype)
    if repeated:
        heads = heads.repeat_interleave(groups, dim=2)
    return heads.reshape(b, n, -1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, x * cos + rotate_half(x) * sin (Su et al. 2021), as transformers applies it."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


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


def window_mask(n: int, window: int | None, device=None) -> torch.Tensor | None:
    """[N, N] bool, True where key j is within ``window`` tokens of query i (|i - j| <= window); None for no window."""
    if window is None:
        return None
    positions = torch.arange(n, device=device)
    return (positions[:, None] - positions[None, :]).abs() <= window


def attention_probs(
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    num_heads: int,
    window: int | None = None,
) -> torch.Tensor:
    """Attention probabilities [B, H, N, N] as HF eager attention computes them (eval mode).

    ``attention_mask`` is the usual [B, N] 0/1 tensor; padded keys get an additive
    ``finfo.min`` and therefore probability 0, as do keys outside a sliding-window
    layer's ``window`` (pipeline.families.attention_window). Padded query rows are
    computed like HF does (they attend to the valid keys); losses must mask them out.
    """
    scores = relation_scores(query, key, num_heads)
    keep = None if attention_mask is None else attention_mask[:, None, None, :].to(torch.bool)
    if (band := window_mask(scores.size(-1), window, scores.device)) is not None:
        keep = band if keep is None else keep & band
    if keep is not None:
        bias = torch.zeros((), dtype=scores.dtype, device=scores.device)
        scores = scores + torch.where(keep, bias, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1)


__all__ = [
    "attention_probs",
    "capture_classifier_input",
    "capture_projections",
    "classifier_output_layer",
    "relation_scores",
    "projection",
    "self_attention",
    "split_heads",
    "unwrap_model",
    "window_mask",
]
