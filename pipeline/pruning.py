"""Structured pruning of teacher layers: feed-forward neurons, attention heads and hidden width.

Two thirds of a BERT layer's weights and MatMul work sit in its feed-forward
block (hidden -> 4*hidden -> hidden). A student built from teacher layers can
keep only ``student.ffn_size`` of those neurons per layer; which ones is
decided by first-order (Taylor) importance on the fine-tuned teacher
(Molchanov et al. 2017; Michel et al. 2019 do the same for heads):

    importance_j = sum over real tokens |a_j * dL/da_j|

where a_j is the neuron's activation (after GELU: the input of the
feed-forward output Linear) and L the teacher's cross-entropy on training
examples: the estimated loss change if the neuron were removed. The kept rows
of the feed-forward input Linear and columns of its output Linear are copied
unchanged, so the pruned layer computes exactly the full layer minus the
dropped neurons' contributions; distillation then recovers what they carried.
Which Linears those are is the family's (pipeline/families.py: BERT's
``intermediate.dense`` / ``output.dense``, DistilBERT's ``ffn.lin1`` / ``ffn.lin2``).
In a gated (GLU) block a neuron is act(value_j) * gate_j: its value row and its
gate row go together (ModernBERT's ``Wi`` holds both halves, rows j and
ffn + j; EuroBERT's gate is the separate ``gate_proj``).

Narrowing (``student.attention_heads``) keeps fewer heads per layer and, with
them, a narrower residual stream: in these transformers families the hidden
width is the number of heads times the head width, so a student keeping 6 of
12 heads of width 64 has hidden size 384. Heads are ranked by Taylor
importance of a gate on each head's output (Michel et al. 2019):

    importance_h = sum over examples |sum over the head's real tokens and dims a * dL/da|

with a the head's context vectors (the input of the attention's output Linear).
Hidden channels are ranked by activation (Minitron, Muralidharan et al. 2024):
the mean |value| of the channel at the output of every LayerNorm the student
keeps (the embeddings' and its layers'). Every weight that reads or writes the
residual stream keeps the chosen channels; the query/key/value rows and the
output Linear's columns keep the chosen heads' blocks. A LayerNorm over fewer
channels is not the same function, so, as after FFN pruning, distillation
recovers what was lost. MPNet shares one relative-position bias table (one
column per head) between all layers, so its students keep the same heads in
every layer (the heads with the highest summed importance).
"""

from __future__ import annotations

import copy
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import prune_linear_layer

from .errors import ModelError
from .families import encoder_layers, family_of, family_of_layer, ffn_linears, ffn_paths, layer_prefix, unwrap_model
from .inference import model_inputs


def ffn_importance(model, batches, layers) -> dict[int, torch.Tensor]:
    """Taylor importance of every FFN neuron of ``layers`` (indices into ``layers``' encoder list), summed over ``batches``.

    ``batches`` yields dicts with input_ids, attention_mask and labels; the
    model is used in eval mode (no dropout) and its gradients are cleared after.
    """
    return task_importance(model, batches, ffn_layers=layers)[0]


def width_importance(model: Any, batches, layers: list[int]) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Taylor importance of each attention head of encoder ``layers`` (by layer index) and activation importance of
    each hidden channel (LayerNorm outputs of the embeddings and those layers), summed over ``batches``.

    ``batches`` as for ffn_importance; the model is left as found (eval mode, no gradients)."""
    width = task_importance(model, batches, width_layers=layers)[1]
    assert width is not None
    return width


def task_importance(
    model: Any, batches, ffn_layers=None, width_layers: list[int] | None = None
) -> tuple[Any, tuple[dict[int, torch.Tensor], torch.Tensor] | None]:
    """FFN neuron importance of ``ffn_layers`` (modules) and head and channel importance of ``width_layers``
    (indices), from one backward pass over ``batches``: (ffn scores or None, (head scores, channel scores) or None)."""
    if ffn_layers is None and width_layers is None:
        return None, None
    model.eval()
    mask_holder: dict[str, torch.Tensor] = {}
    handles: list[Any] = []
    try:
        ffn_scores = None if ffn_layers is None else _watch_ffn(model, ffn_layers, mask_holder, handles)
        width = None if width_layers is None else _watch_width(model, width_layers, mask_holder, handles)
    except BaseException:  # e.g. a family that cannot be narrowed: no hook left behind on the teacher
        for handle in handles:
            handle.remove()
        raise
    tokens = _task_loss_backward(model, batches, handles, mask_holder)
    if width is not None:
        width[1].div_(max(tokens, 1))  # channel activation: mean over real tokens
    return ffn_scores, width


def _watch_ffn(model, layers, mask_holder: dict[str, torch.Tensor], handles: list) -> dict[int, torch.Tensor]:
    """Hooks (added to ``handles``) that sum |activation x gradient| of each FFN neuron into the returned scores."""
    family = family_of(model)
    outs = [ffn_linears(layer, family)[1] for layer in layers]
    scores = {i: torch.zeros(out.in_features) for i, out in enumerate(outs)}

    def watch(index):
        def hook(module, inputs):
            activation = inputs[0]  # the neurons' activations, as the output Linear reads them

            def on_grad(grad):
                contribution = (activation.detach() * grad).abs() * mask_holder["mask"]
                scores[index] += contribution.sum(dim=(0, 1)).float().cpu()

            activation.register_hook(on_grad)

        return hook

    handles += [out.register_forward_pre_hook(watch(index)) for index, out in enumerate(outs)]
    return scores


def _watch_width(
    model, layers: list[int], mask_holder: dict[str, torch.Tensor], handles: list
) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Hooks (added to ``handles``) that sum each head's gate importance and each hidden channel's |activation|."""
    family = family_of(model)
    if family.attention_out is None:
        raise ModelError(narrowing_unsupported(family.name))
    heads = model.config.num_attention_heads
    hidden = model.config.hidden_size
    head_scores = {i: torch.zeros(heads) for i in layers}
    channel_scores = torch.zeros(hidden)

    def watch_heads(index):
        def hook(module, inputs):
            context = inputs[0]  # (batch, tokens, heads * head width): every head's output, before mixing

            def on_grad(grad):
                gate = (context.detach() * grad).float() * mask_holder["mask"]  # d loss / d head gate, per token
                per_example = gate.unflatten(-1, (heads, -1)).sum(dim=(1, 3))  # (batch, heads)
                head_scores[index] += per_example.abs().sum(0).cpu()

            context.register_hook(on_grad)

        return hook

    def watch_channels(module, inputs, output):
        channel_scores.add_((output.detach().float().abs() * mask_holder["mask"]).sum(dim=(0, 1)).cpu())

    all_layers = encoder_layers(model)
    norms = [m for m in model.base_model.embeddings.modules() if isinstance(m, nn.LayerNorm)]
    for index in layers:
        layer = all_layers[index]
        handles.append(layer.get_submodule(family.attention_out).register_forward_pre_hook(watch_heads(index)))
        norms += [m for m in layer.modules() if isinstance(m, nn.LayerNorm)]
    handles += [norm.register_forward_hook(watch_channels) for norm in norms if norm.normalized_shape == (hidden,)]
    return head_scores, channel_scores


def _task_loss_backward(model, batches, handles: list, mask_holder: dict[str, torch.Tensor]) -> int:
    """The summed cross-entropy's backward pass on every batch, for the importance ``handles`` watch (each batch's
    real-token mask in ``mask_holder["mask"]``); then the hooks are removed, the gradients cleared and frozen
    parameters frozen again. Returns the real tokens seen."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in frozen:  # a frozen teacher builds no graph; gradients are needed here only
        p.requires_grad_(True)
    tokens = 0
    try:
        for batch in batches:
            mask_holder["mask"] = batch["attention_mask"].unsqueeze(-1).to(torch.float32)
            tokens += int(batch["attention_mask"].sum())
            logits = model(**model_inputs(batch)).logits
            F.cross_entropy(logits.float(), batch["labels"], reduction="sum").backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
        for p in frozen:
            p.requires_grad_(False)
    return tokens


def prune_ffn(layer, keep: torch.Tensor, family=None) -> None:
    """Keep only the FFN neurons ``keep`` (sorted indices) of one encoder layer, in place.

    ``family`` (pipeline/families.py) names its feed-forward Linears; without it they are found in the layer."""
    keep = cast(torch.LongTensor, torch.sort(keep).values)
    family = family or family_of_layer(layer)
    in_path, out_path = ffn_paths(layer, family)
    width = layer.get_submodule(out_path).in_features
    rows = cast(torch.LongTensor, torch.cat([keep, keep + width]) if family.ffn_fused_glu else keep)  # value, gate rows
    layer.set_submodule(in_path, prune_linear_layer(layer.get_submodule(in_path), rows, dim=0))
    if family.ffn_gate is not None:
        layer.set_submodule(family.ffn_gate, prune_linear_layer(layer.get_submodule(family.ffn_gate), keep, dim=0))
    layer.set_submodule(out_path, prune_linear_layer(layer.get_submodule(out_path), keep, dim=1))


def top_neurons(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` most important neurons (ties broken by index: deterministic)."""
    order = torch.argsort(-scores, stable=True)
    return order[:count]


def kept_heads(head_scores: dict[int, torch.Tensor], layers: list[int], count: int, shared: bool) -> list[torch.Tensor]:
    """The ``count`` most important heads of each of ``layers`` (sorted indices); ``shared``: the same heads in every
    layer, by summed importance (a family whose per-head table all layers share)."""
    if shared:
        top = torch.sort(top_neurons(torch.stack([head_scores[i] for i in layers]).sum(0), count)).values
        return [top for _ in layers]
    return [torch.sort(top_neurons(head_scores[i], count)).values for i in layers]


def narrowing_unsupported(family: str) -> str:
    return (
        f"student.attention_heads: narrowing a {family} model is not supported (its attention fuses the query, key "
        "and value projections, shares key/value heads or has hidden-sized position projections); narrowing works "
        "for BERT, RoBERTa, XLM-RoBERTa, ELECTRA, DistilBERT and MPNet teachers. Remove student.attention_heads, "
        "or prune the feed-forward blocks instead (student.ffn_size)."
    )


def narrow(model: Any, channels: torch.Tensor, heads: list[torch.Tensor]) -> Any:
    """A copy of ``model`` keeping hidden channels ``channels`` and, in encoder layer i, the heads ``heads[i]``.

    The new hidden size is ``len(heads[i])`` times the head width and must equal ``len(channels)``. Indices are
    used in the order given (sorted indices keep the original order; a permutation gives an equivalent model)."""
    model = unwrap_model(model)
    family = family_of(model)
    if family.attention_out is None:
        raise ModelError(narrowing_unsupported(family.name))
    cfg = copy.deepcopy(model.config)
    wide, head_width = cfg.hidden_size, cfg.hidden_size // cfg.num_attention_heads
    count = len(heads[0])
    if any(len(h) != count for h in heads) or count * head_width != len(channels):
        raise ModelError(
            f"narrowing needs the same number of heads in every layer and {count} x {head_width} = "
            f"{count * head_width} hidden channels; got heads per layer {[len(h) for h in heads]} and "
            f"{len(channels)} channels"
        )
    if family.head_table is not None and any(not torch.equal(h, heads[0]) for h in heads):
        raise ModelError(f"a {family.name} model shares {family.head_table} between layers: keep the same heads in all")
    # ELECTRA's embedding width: narrowed with the residual stream where it is the hidden size; otherwise the
    # embeddings keep their width and the projection into the stream keeps the chosen channels' rows.
    narrowed_keys = [key for key in family.hidden_sized if getattr(cfg, key, None) == wide]
    for key in narrowed_keys:
        setattr(cfg, key, len(channels))
    cfg.hidden_size, cfg.num_attention_heads = len(channels), count
    narrowed = type(model)(cfg)

    selections: dict[
        str, dict[int, torch.Tensor]
    ] = {}  # parameter -> {dimension: indices}; other narrowed dims: channels
    prefix = layer_prefix(model)
    for i, layer_heads in enumerate(heads):
        rows = (layer_heads[:, None] * head_width + torch.arange(head_width)).flatten()
        attention = f"{prefix}{i}.{family.attention}."
        for projection in {family.query, family.key, family.value}:
            selections[f"{attention}{projection}.weight"] = {0: rows, 1: channels}
            selections[f"{attention}{projection}.bias"] = {0: rows}
        selections[f"{prefix}{i}.{family.attention_out}.weight"] = {0: channels, 1: rows}
    if family.head_table is not None:
        base = f"{model.base_model_prefix}." if model.base_model is not model else ""
        selections[f"{base}{family.head_table}.weight"] = {1: heads[0]}
    # Which dimensions scale with the width: those that differ in a model one head wider (built without memory).
    probe_cfg = copy.deepcopy(cfg)
    probe_cfg.hidden_size, probe_cfg.num_attention_heads = len(channels) + head_width, count + 1
    for key in narrowed_keys:
        setattr(probe_cfg, key, probe_cfg.hidden_size)
    with torch.device("meta"):
        probe = type(model)(probe_cfg).state_dict()
    source = model.state_dict()
    target = narrowed.state_dict()
    for name, narrow_tensor in target.items():
        tensor = source[name]
        chosen = selections.get(name, {})
        for dim in range(tensor.ndim):
            if probe[name].shape[dim] == narrow_tensor.shape[dim]:
                continue  # not a width dimension (vocabulary, positions, FFN neurons, labels)
            tensor = tensor.index_select(dim, chosen.get(dim, channels))
        if tensor.shape != narrow_tensor.shape:  # a width dimension the family table does not describe
            raise ModelError(
                f"narrowing: {name} came out {tuple(tensor.shape)}, the narrow model needs "
                f"{tuple(narrow_tensor.shape)}; {narrowing_unsupported(family.name)}"
            )
        target[name] = tensor.clone()
    narrowed.load_state_dict(target)
    return narrowed
