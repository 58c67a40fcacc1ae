"""The distillation objective, declared by the config and assembled from losses.py.

    loss = w_ce * CE(student, labels)
         + w_kd * T^2 KL(softmax(t/T) || softmax(s/T))                 (Hinton 2015)
         + w_att * mean over mapped layers KL(A_t || A_s)               (MiniLM)
         + w_vr  * mean over mapped layers KL(VR_t || VR_s)             (MiniLM value relation)
         + w_hid * mean over mapped layers MSE(W h_s, h_t)              (TinyBERT)

Attention and value relations are computed from the query/key/value
projections captured by hooks (never from output_attentions), split into
``relation_heads`` heads (MiniLMv2), so the forward passes may run on SDPA or
flash kernels and teacher/student head counts may differ.

Teacher targets come either from the capture cache (fp16 or fp32, relation
probabilities or raw vectors, whichever is smaller) or from the teacher run
online inside the step; both give a dict of the same form:

    {"logits": [B,C], "attn.<t>": ("probs", [B,R,N,N]) or ("vectors", (q, k)),
     "vrel.<t>": ("probs", ...) or ("vectors", (v, v)), "hidden.<t>": [B,N,D]}
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .attention import attention_probs, capture_projections
from .losses import hidden_mse, logit_kd, relation_kl, relation_kl_from_probs


@dataclass
class TargetPlan:
    """What the configured losses need from the teacher, per mapped layer pair."""

    pairs: list[tuple[int, int]]  # (student layer, teacher layer)
    relation_heads: int
    attention: bool
    value_relation: bool
    hidden: bool
    kd: bool

    @classmethod
    def from_config(cls, config, pairs, relation_heads):
        w = config.distill.loss
        return cls(pairs=[tuple(p) for p in pairs], relation_heads=relation_heads, attention=w.attention > 0,
                   value_relation=w.value_relation > 0, hidden=w.hidden > 0, kd=w.kd > 0)

    @property
    def teacher_layers(self) -> list[int]:
        return sorted({t for _, t in self.pairs})

    @property
    def student_layers(self) -> list[int]:
        return sorted({s for s, _ in self.pairs})

    def logits_only(self) -> "TargetPlan":
        """The same plan without relation or hidden-state targets (augmented rows)."""
        return TargetPlan(pairs=[], relation_heads=self.relation_heads, attention=False, value_relation=False,
                          hidden=False, kd=self.kd)

    def kinds(self) -> tuple[str, ...]:
        kinds = []
        if self.attention:
            kinds += ["query", "key"]
        if self.value_relation:
            kinds += ["value"]
        return tuple(kinds)


def target_plan(config, teacher_config=None) -> TargetPlan:
    """The plan for a config; reads only the teacher's config.json when not given."""
    from .models import layer_map, teacher_model_config

    teacher_config = teacher_config or teacher_model_config(config)
    pairs = layer_map(config, teacher_config.num_hidden_layers)
    heads = config.distill.relation_heads or teacher_config.num_attention_heads
    return TargetPlan.from_config(config, pairs, heads)


@torch.no_grad()
def teacher_targets(teacher, batch: dict, plan: TargetPlan) -> dict:
    """Run the teacher (eval mode) and collect raw targets as vectors."""
    with capture_projections(teacher, plan.teacher_layers, plan.kinds()) as captured:
        out = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      output_hidden_states=plan.hidden)
    targets = {"logits": out.logits.float()}
    for t in plan.teacher_layers:
        if plan.attention:
            targets[f"attn.{t}"] = ("vectors", (captured[t]["query"], captured[t]["key"]))
        if plan.value_relation:
            targets[f"vrel.{t}"] = ("vectors", (captured[t]["value"], captured[t]["value"]))
        if plan.hidden:
            targets[f"hidden.{t}"] = out.hidden_states[t + 1]
    return targets


def vectors_to_probs(vectors: tuple, attention_mask, heads: int) -> torch.Tensor:
    a, b = vectors
    return attention_probs(a, b, attention_mask, heads)


class DistillObjective(torch.nn.Module):
    """Computes the weighted loss; holds the learned hidden-state projections."""

    def __init__(self, config, plan: TargetPlan, teacher_hidden: int, student_hidden: int):
        super().__init__()
        self.weights = config.distill.loss
        self.temperature = config.distill.temperature
        self.chunk = config.distill.attention_chunk
        self.plan = plan
        self.projections = torch.nn.ModuleDict()
        if plan.hidden and teacher_hidden != student_hidden:
            for s, t in plan.pairs:
                self.projections[f"{s}_{t}"] = torch.nn.Linear(student_hidden, teacher_hidden)

    def forward(self, student, batch: dict, targets: dict) -> tuple[torch.Tensor, dict]:
        plan, w = self.plan, self.weights
        mask = batch["attention_mask"]
        with capture_projections(student, plan.student_layers, plan.kinds()) as captured:
            out = student(input_ids=batch["input_ids"], attention_mask=mask, output_hidden_states=plan.hidden)
        logits = out.logits.float()
        terms: dict[str, torch.Tensor] = {}
        labelled = batch["labels"] >= 0  # unlabeled in-domain text has label -1
        if w.ce > 0 and labelled.any():
            terms["ce"] = F.cross_entropy(logits[labelled], batch["labels"][labelled])
        if w.kd > 0:
            terms["kd"] = logit_kd(logits, targets["logits"].float(), self.temperature)
        heads = plan.relation_heads
        # Rows with relation / hidden targets (augmented rows carry logits only).
        rows = batch.get("relation_rows")
        every_row = rows is None or bool(rows.all())
        if not every_row and not rows.any():
            w = w.model_copy(update={"attention": 0.0, "value_relation": 0.0, "hidden": 0.0})

        def pick(x):
            return x if every_row else x[rows]

        r_mask = pick(mask)
        for key, kind, weight, student_kinds in (
            ("attn", "attention", w.attention, ("query", "key")),
            ("vrel", "value_relation", w.value_relation, ("value", "value")),
        ):
            if weight <= 0:
                continue
            values = []
            for s, t in plan.pairs:
                s_a, s_b = (pick(captured[s][k]) for k in student_kinds)
                form, target = targets[f"{key}.{t}"]
                if form == "probs":
                    values.append(relation_kl_from_probs(pick(target), s_a, s_b, r_mask, heads, self.chunk))
                else:
                    values.append(relation_kl(*(pick(x) for x in target), s_a, s_b, r_mask, heads, self.chunk))
            terms[kind] = torch.stack(values).mean()
        if w.hidden > 0:
            values = []
            for s, t in plan.pairs:
                projection = self.projections[f"{s}_{t}"] if f"{s}_{t}" in self.projections else None
                values.append(hidden_mse(pick(out.hidden_states[s + 1]).float(), pick(targets[f"hidden.{t}"]).float(), r_mask,
                                         projection))
            terms["hidden"] = torch.stack(values).mean()
        total = sum(getattr(w, name) * value for name, value in terms.items())
        return total, {k: v.detach() for k, v in terms.items()}
