"""The distillation objective, declared by the config and assembled from the registered terms.

    loss = sum over registered terms of  distill.loss.<term> * term

The terms, their weight keys and the teacher targets each needs are declared
once, in pipeline/terms.py (ce, kd, attention, value_relation, hidden, ...);
the pure formulas live in losses.py. A term on a per-layer target is the mean
over the mapped (student, teacher) layer pairs.

Attention and value relations are computed from the query/key/value
projections captured by hooks (never from output_attentions), split into
``relation_heads`` heads (MiniLMv2), so the forward passes may run on SDPA or
flash kernels and teacher/student head counts may differ.

Teacher targets come either from the capture cache (fp16 or fp32, relation
probabilities or raw vectors, whichever is smaller) or from the teacher run
online inside the step; both give a dict of the same form, keyed by target
(``Target.key``: "<name>.<teacher layer>" per layer, "<name>" per example):

    {"logits": [B,C], "attn.<t>": ("probs", [B,R,N,N]) or ("vectors", (q, k)),
     "vrel.<t>": ("probs", ...) or ("vectors", (v, v)), "hidden.<t>": [B,N,D], ...}
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from .attention import attention_probs, capture_classifier_input, capture_projections
from .data import to_device
from .families import attention_window, unwrap_model
from .inference import model_inputs
from .models import layer_map, teacher_model_config
from .terms import TARGETS, TERMS, Target, TermInputs, active_terms


@dataclass(init=False)
class TargetPlan:
    """What the configured terms need from the teacher, per mapped layer pair.

    ``TargetPlan(pairs, relation_heads, terms=("kd", "attention"))`` or, equally,
    ``TargetPlan(pairs, relation_heads, kd=True, attention=True)``: flags are
    registered term names (pipeline/terms.py).
    """

    pairs: list[tuple[int, int]]  # (student layer, teacher layer)
    relation_heads: int
    terms: tuple[str, ...] = field(default=())  # active terms, in registration order
    teacher_windows: dict = field(default_factory=dict)  # teacher layer -> key window, sliding-window layers only

    def __init__(self, pairs, relation_heads, terms=(), teacher_windows=None, **flags):
        chosen = set(terms) | {name for name, on in flags.items() if on}
        unknown = sorted((chosen | set(flags)) - set(TERMS))
        if unknown:
            raise ValueError(f"unknown distillation terms {unknown}; registered: {', '.join(TERMS)}")
        self.pairs = [tuple(p) for p in pairs]
        self.relation_heads = relation_heads
        self.terms = tuple(name for name in TERMS if name in chosen)
        self.teacher_windows = {int(t): int(w) for t, w in (teacher_windows or {}).items() if w is not None}

    @classmethod
    def from_config(cls, config, pairs, relation_heads, teacher_windows=None):
        w = config.distill.loss
        return cls(
            pairs,
            relation_heads,
            terms=[name for name in TERMS if getattr(w, name) > 0],
            teacher_windows=teacher_windows,
        )

    def uses(self, term: str) -> bool:
        return term in self.terms

    @property
    def targets(self) -> tuple[Target, ...]:
        """The targets the active terms need, in registration order."""
        needed = {name for term in self.terms for name in TERMS[term].needs}
        return tuple(t for name, t in TARGETS.items() if name in needed)

    @property
    def teacher_layers(self) -> list[int]:
        return sorted({t for _, t in self.pairs})

    @property
    def student_layers(self) -> list[int]:
        return sorted({s for s, _ in self.pairs})

    @property
    def projections(self) -> tuple[str, ...]:
        """Attention projections to hook in the mapped layers (teacher and student alike)."""
        return tuple(dict.fromkeys(kind for t in self.targets for kind in t.projections))

    @property
    def hidden_states(self) -> bool:
        return any(t.hidden_states for t in self.targets)

    @property
    def classifier_input(self) -> bool:
        """A target reads the input of the classifier's output layer (hooked in teacher and student alike)."""
        return any(t.classifier_input for t in self.targets)

    def teacher_keys(self) -> list[tuple[str, Target, int | None]]:
        """(key, target, teacher layer) of every target: per-example ones, then per layer."""
        keys: list[tuple[str, Target, int | None]] = [(t.key(None), t, None) for t in self.targets if not t.per_layer]
        keys += [(t.key(layer), t, layer) for layer in self.teacher_layers for t in self.targets if t.per_layer]
        return keys

    def needed(self) -> dict:
        """What is asked of the teacher (not the weights, not the student layers): the capture fingerprint."""
        targets = self.targets
        needed = {
            "targets": [t.name for t in targets],
            "teacher_layers": self.teacher_layers if any(t.per_layer for t in targets) else [],
            "relation_heads": self.relation_heads if any(t.relation for t in targets) else None,
        }
        if self.teacher_windows and any(t.windowed for t in targets):  # absent otherwise: older fingerprints stay valid
            needed["teacher_windows"] = self.teacher_windows
        return needed

    def logits_only(self) -> "TargetPlan":
        """The same plan without the targets that logits-only (augmented) rows lack."""
        return TargetPlan(
            pairs=[],
            relation_heads=self.relation_heads,
            terms=[name for name in self.terms if TERMS[name].every_row],
            teacher_windows=self.teacher_windows,
        )


def target_plan(config, teacher_config=None) -> TargetPlan:
    """The plan for a config; reads only the teacher's config.json when not given."""
    teacher_config = teacher_config or teacher_model_config(config)
    # a static student has no layers: its terms read logits only (the config refuses per-layer terms for it)
    pairs = [] if config.student.kind == "static" else layer_map(config, teacher_config.num_hidden_layers)
    heads = config.distill.relation_heads or teacher_config.num_attention_heads
    windows = {t: attention_window(teacher_config, t) for _, t in pairs}  # ModernBERT's sliding-window layers
    return TargetPlan.from_config(config, pairs, heads, windows)


def capture_plan(config, teacher_config=None) -> TargetPlan:
    """What the capture stores: this run's own targets (``target_plan``) and those of ``capture.extra_terms`` at
    ``capture.extra_teacher_layers`` (a cache shared with other runs). Only teacher layers and targets count for
    a cache (it is read by teacher layer), so its pairs are (t, t) placeholders."""
    extra = config.capture
    if not extra.extra_terms:
        return target_plan(config, teacher_config)
    teacher_config = teacher_config or teacher_model_config(config)
    plan = target_plan(config, teacher_config)
    own = plan.needed()["teacher_layers"]  # [] when no target is per layer ("last" alone stores no layer)
    pairs = [(t, t) for t in sorted(set(own) | set(extra.extra_teacher_layers))]
    windows = {t: attention_window(teacher_config, t) for _, t in pairs}
    return TargetPlan(pairs, plan.relation_heads, terms=(*plan.terms, *extra.extra_terms), teacher_windows=windows)


def cache_fields(plan: TargetPlan, heads: int, hidden: int, stores: dict) -> set[str]:
    """The names of the cache record fields ``plan``'s targets occupy (given the cache's stores)."""
    return {
        name
        for key, target, _ in plan.teacher_keys()
        for name, _ in target.fields(key, 1, heads, hidden, stores.get(target.name))
    }


@torch.no_grad()
def teacher_targets(teacher, batch: dict, plan: TargetPlan) -> dict:
    """Run the teacher (eval mode) and collect raw targets (relations as vectors)."""
    with (
        capture_projections(teacher, plan.teacher_layers, plan.projections) as captured,
        capture_classifier_input(teacher, plan.classifier_input) as head,
    ):
        out = teacher(**model_inputs(batch), output_hidden_states=plan.hidden_states)
    seen: dict = {**captured, "classifier_input": head.get("input")}  # what Target.read reads besides the output
    targets = {"logits": out.logits.float()}
    for key, target, layer in plan.teacher_keys():
        targets[key] = target.target(target.read(out, seen, layer))
    return targets


def vectors_to_probs(vectors: tuple, attention_mask, heads: int) -> torch.Tensor:
    a, b = vectors
    return attention_probs(a, b, attention_mask, heads)


def map_tensors(fn, value):
    """``fn`` applied to every tensor in a (nested) target; tags such as "probs" stay."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(map_tensors(fn, v) for v in value)
    return value


def balanced_class_weights(labels: np.ndarray, num_classes: int) -> torch.Tensor:
    """n / (classes x count) per class over the labelled rows (label >= 0), as scikit-learn's
    ``compute_class_weight("balanced")`` over the classes present (tests/test_objective.py compares them; not called:
    importing scikit-learn would add about a second to every training command); a class without rows gets weight 0
    (it has no cross-entropy to weigh)."""
    labelled = labels[labels >= 0]
    counts = np.bincount(labelled, minlength=num_classes).astype(np.float64)
    present = int((counts > 0).sum())
    weights = np.divide(len(labelled), present * counts, out=np.zeros_like(counts), where=counts > 0)
    return torch.tensor(weights, dtype=torch.float32)


class DistillObjective(torch.nn.Module):
    """Computes the weighted loss of the registered terms; holds their learned projections."""

    def __init__(
        self,
        config,
        plan: TargetPlan,
        teacher_hidden: int,
        student_hidden: int,
        class_weights: torch.Tensor | None = None,
    ):
        super().__init__()
        self.register_buffer("class_weights", class_weights, persistent=False)  # moves with .to(device)
        self.weights = config.distill.loss
        self.temperature = config.distill.temperature
        self.chunk = config.distill.attention_chunk
        self.plan = plan
        self.projections = torch.nn.ModuleDict()
        if teacher_hidden != student_hidden:
            for name in plan.terms:
                term = TERMS[name]
                if term.projected:
                    for s, t in plan.pairs if term.per_pair else [(None, None)]:
                        self.projections[term.projection_name(s, t)] = torch.nn.Linear(student_hidden, teacher_hidden)

    def trained_modules(self, student) -> dict:
        """What distillation trains (fit's ``modules``): the student, and the projections when widths differ."""
        return {"model": student, **({"projections": self.projections} if len(self.projections) else {})}

    def loss_fn(self, *, cache=None, teacher=None):
        """fit's ``loss_fn(batch, prepared)``: teacher targets read from the capture stage's ``cache``, or,
        without one, computed by ``teacher`` inside the step (capture.mode: online)."""

        def loss(batch: dict, prepared: dict):
            if cache is not None:
                targets = cache.batch(batch["indices"], batch["input_ids"].shape[1], batch["input_ids"].device)
            else:
                targets = teacher_targets(teacher, batch, self.plan)
            return self(prepared["model"], batch, targets)

        return loss

    def forward(self, student, batch: dict, targets: dict) -> tuple[torch.Tensor, dict]:
        """The weighted sum of the active terms, and each term's value (detached, for the logs)."""
        plan = self.plan
        with (
            capture_projections(student, plan.student_layers, plan.projections) as captured,
            capture_classifier_input(student, plan.classifier_input) as head,
        ):
            out = student(**model_inputs(batch), output_hidden_states=plan.hidden_states)
        seen: dict = {**captured, "classifier_input": head.get("input")}
        read = functools.cache(lambda name, layer: TARGETS[name].read(out, seen, layer))  # each target once
        rows = RecordedRows(batch.get("relation_rows"), batch["attention_mask"].device)
        student_config = unwrap_model(student).config
        terms: dict[str, torch.Tensor] = {}
        for term in active_terms(self.weights):
            if not term.every_row and not rows.any:
                continue  # only logits-only (augmented) rows in this batch: nothing for this term to compare
            on_rows = rows.every if term.every_row else rows.recorded
            values = []
            for s, t in plan.pairs if term.per_pair else [(None, None)]:
                projection = term.projection_name(s, t)
                inputs = TermInputs(
                    student={n: on_rows(read(n, s)) for n in term.needs},
                    teacher={n: on_rows(targets[TARGETS[n].key(t)]) for n in term.needs},
                    mask=on_rows(batch["attention_mask"]),
                    labels=on_rows(batch["labels"]),
                    logits=on_rows(read("logits", None)),
                    projection=self.projections[projection] if projection in self.projections else None,
                    heads=plan.relation_heads,
                    chunk=self.chunk,
                    temperature=self.temperature,
                    class_weights=self.class_weights,
                    windows=(None, None)
                    if s is None
                    else (attention_window(student_config, s), plan.teacher_windows.get(t)),
                )
                if (value := term.compute(inputs)) is not None:
                    values.append(value)
            if values:
                terms[term.name] = torch.stack(values).mean() if term.per_pair else values[0]
        if not terms:  # the config refuses unlabelled rows without a term that reads every row (kd)
            raise RuntimeError(
                f"no active distillation term ({', '.join(t.name for t in active_terms(self.weights))}) has a row "
                "to learn from in this batch"
            )
        total = sum(getattr(self.weights, name) * value for name, value in terms.items())
        return total, {k: v.detach() for k, v in terms.items()}


class RecordedRows:
    """Which rows of a batch carry teacher records beyond logits (augmented rows carry logits only).

    ``relation_rows`` arrives as a host tensor (or None: every row), so deciding costs no device sync."""

    def __init__(self, relation_rows, device):
        rows = None if relation_rows is None else torch.as_tensor(relation_rows).cpu()
        self.all = rows is None or bool(rows.all())
        self.any = self.all or bool(rows.any())
        self._keep = None if self.all else to_device(rows.nonzero().flatten(), device)

    @staticmethod
    def every(x):
        return x

    def recorded(self, x):
        """``x`` (a tensor or a structure of tensors, batch first) on the recorded rows only."""
        return x if self.all else map_tensors(lambda v: v.index_select(0, self._keep), x)
