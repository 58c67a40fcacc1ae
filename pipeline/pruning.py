"""Structured FFN pruning: keep the feed-forward neurons that matter to the teacher's task loss.

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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.pytorch_utils import prune_linear_layer

from .families import family_of, family_of_layer, ffn_linears, ffn_paths
from .inference import model_inputs


def ffn_importance(model, batches, layers) -> dict[int, torch.Tensor]:
    """Taylor importance of every FFN neuron of ``layers`` (indices into ``layers``' encoder list), summed over ``batches``.

    ``batches`` yields dicts with input_ids, attention_mask and labels; the
    model is used in eval mode (no dropout) and its gradients are cleared after.
    """
    model.eval()
    family = family_of(model)
    outs = [ffn_linears(layer, family)[1] for layer in layers]
    scores = {i: torch.zeros(out.in_features) for i, out in enumerate(outs)}
    handles, mask_holder = [], {}
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in frozen:  # a frozen teacher builds no graph; gradients are needed here only
        p.requires_grad_(True)

    def watch(index):
        def hook(module, inputs):
            activation = inputs[0]  # the neurons' activations, as the output Linear reads them

            def on_grad(grad):
                contribution = (activation.detach() * grad).abs() * mask_holder["mask"]
                scores[index] += contribution.sum(dim=(0, 1)).float().cpu()

            activation.register_hook(on_grad)

        return hook

    for index, out in enumerate(outs):
        handles.append(out.register_forward_pre_hook(watch(index)))
    try:
        for batch in batches:
            mask_holder["mask"] = batch["attention_mask"].unsqueeze(-1).to(torch.float32)
            logits = model(**model_inputs(batch)).logits
            loss = F.cross_entropy(logits.float(), batch["labels"], reduction="sum")
            loss.backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
        for p in frozen:
            p.requires_grad_(False)
    return scores


def prune_ffn(layer, keep: torch.Tensor, family=None) -> None:
    """Keep only the FFN neurons ``keep`` (sorted indices) of one encoder layer, in place.

    ``family`` (pipeline/families.py) names its feed-forward Linears; without it they are found in the layer."""
    keep = torch.sort(keep).values
    family = family or family_of_layer(layer)
    in_path, out_path = ffn_paths(layer, family)
    width = layer.get_submodule(out_path).in_features
    rows = torch.cat([keep, keep + width]) if family.ffn_fused_glu else keep  # value rows, then the same gate rows
    layer.set_submodule(in_path, prune_linear_layer(layer.get_submodule(in_path), rows, dim=0))
    if family.ffn_gate is not None:
        layer.set_submodule(family.ffn_gate, prune_linear_layer(layer.get_submodule(family.ffn_gate), keep, dim=0))
    layer.set_submodule(out_path, prune_linear_layer(layer.get_submodule(out_path), keep, dim=1))


def top_neurons(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` most important neurons (ties broken by index: deterministic)."""
    order = torch.argsort(-scores, stable=True)
    return order[:count]
