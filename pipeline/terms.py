"""The distillation terms, each declared once: weight key, teacher targets it needs, computation.

A *target* is one quantity of a BERT forward pass, read the same way from the
teacher (the target) and from the student (its prediction):

    logits          [B, C]                              per example; kept for logits-only rows too
    attn.<layer>    (query, key) vectors, [B, N, D] each   -> attention relation (MiniLM)
    vrel.<layer>    (value, value) vectors                 -> value relation (MiniLM)
    hidden.<layer>  output of the layer, [B, N, D]
    embedding       output of the embedding layer, [B, N, D]
    penultimate     what the classifier's output layer reads, [B, D] (one vector per example)

A *term* is one weighted part of the loss. It declares the weight key under
``distill.loss`` (with its default), the targets it needs, whether it learns a
projection from the student's width to the teacher's, and how it compares
student and teacher (calling the pure formulas in losses.py). A term that needs
a per-layer target is computed for every mapped (student, teacher) layer pair
and averaged, on the rows that carry teacher records (augmented rows carry
logits only).

Everything else is derived from these declarations: the ``distill.loss`` config
fields (pipeline/config.py), the TargetPlan, ``teacher_targets`` and
``DistillObjective`` (pipeline/objective.py), what the capture cache stores per
example and how (pipeline/cache.py), and the capture stage's fingerprint.

Adding a loss is one class here (plus its formula in losses.py if it is new)::

    @register_term
    class MyTerm(Term):
        '''One line for the config docs; then the formula and the paper.'''
        name = "my_term"        # distill.loss.my_term, and the name of the logged term
        default = 0.0
        needs = ("hidden",)     # registered targets (register_target for a new one)
        def compute(self, x: TermInputs):
            return losses().my_formula(x.student["hidden"], x.teacher["hidden"], x.mask)

Targets from the teacher have the form the capture cache also returns:
relations ``("vectors", (a, b))`` online or ``("probs", P [B,R,N,N])`` from a
cache, other targets a tensor. The student's value is the raw one (``(a, b)``
for a relation).

This module imports nothing heavy at import time (pipeline/config.py reads the
declarations); torch and losses.py are imported when a term computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    import torch

TARGETS: dict[str, "Target"] = {}
TERMS: dict[str, "Term"] = {}


def losses():
    """pipeline.losses, imported on first use (keeps this module light for the config)."""
    from . import losses as module

    return module


# --------------------------------------------------------------------------- targets


class Target:
    """A quantity of a forward pass, and how it is stored per example in the capture cache."""

    name: str
    per_layer: bool = True  # one per mapped layer ("<name>.<layer>") or one per example ("<name>")
    every_row: bool = False  # kept for logits-only (augmented) rows too: not part of the per-example record
    projections: tuple[str, ...] = ()  # attention projections hooked in the layer (query / key / value)
    hidden_states: bool = False  # needs output_hidden_states
    relation: bool = False  # a relation over relation_heads heads; stored as "probs" or "vectors"
    windowed: bool = False  # the model's attention: a sliding-window layer's keys are limited to its window
    classifier_input: bool = False  # hooks the input of the classifier's output layer (captured["classifier_input"])

    def key(self, layer: int | None) -> str:
        return f"{self.name}.{layer}" if self.per_layer else self.name

    def read(self, out, captured: dict, layer: int | None):
        """The value from a model's output and captured projections (the student's prediction)."""
        raise NotImplementedError

    def target(self, raw):
        """The teacher's online target from its ``read`` value."""
        return raw

    # The capture cache: per example, the record fields of this target (unpadded, n tokens).
    def fields(self, key: str, n: int, heads: int, width: int, store: str | None) -> list[tuple[str, tuple]]:
        return [(key, (n, width))]

    def flatten(self, key: str, value, store: str | None, mask, heads: int, window: int | None = None) -> dict:
        """Batched record fields {field: [B, ...]} from an online target (``window``: its layer's, windowed targets)."""
        return {key: value}

    def unflatten(self, key: str, fields: dict, store: str | None, device):
        """The target from padded record fields, or None when the batch has none."""
        return fields[key].to(device) if key in fields else None


def register_target(target: Target) -> Target:
    if target.name in TARGETS:
        raise ValueError(f"target {target.name!r} is already registered")
    TARGETS[target.name] = target
    return target


class LogitsTarget(Target):
    """Classifier logits, fp32. Always captured; the cache keeps them in each shard's index."""

    name, per_layer, every_row = "logits", False, True

    def read(self, out, captured, layer):
        return out.logits.float()

    def fields(self, key, n, heads, width, store):
        return []

    def flatten(self, key, value, store, mask, heads, window=None):
        return {}

    def unflatten(self, key, fields, store, device):
        return None


class RelationTarget(Target):
    """softmax(a . b / sqrt(d)) over relation heads, from the layer's projections ``kinds`` = (a, b)."""

    relation = True

    def __init__(self, name: str, kinds: tuple[str, str], windowed: bool = False):
        self.name, self.kinds, self.windowed = name, tuple(kinds), windowed
        self.projections = tuple(dict.fromkeys(self.kinds))  # (value, value) hooks and stores value once

    def read(self, out, captured, layer):
        return tuple(captured[layer][kind] for kind in self.kinds)

    def target(self, raw):
        return ("vectors", raw)

    def _vector_field(self, key, kind):
        return f"{key}.{kind[0]}"  # attn.<t>.q, attn.<t>.k, vrel.<t>.v

    def fields(self, key, n, heads, width, store):
        if store == "probs":
            return [(key, (heads, n, n))]
        return [(self._vector_field(key, kind), (n, width)) for kind in self.projections]

    def flatten(self, key, value, store, mask, heads, window=None):
        form, payload = value
        if store == "probs":
            if form == "probs":
                return {key: payload}
            from .attention import attention_probs

            return {key: attention_probs(*payload, mask, heads, window)}
        if form != "vectors":
            raise ValueError(f"{key}: vectors are to be stored but the target holds {form}")
        return {self._vector_field(key, kind): payload[self.kinds.index(kind)] for kind in self.projections}

    def unflatten(self, key, fields, store, device):
        if key in fields:
            return ("probs", fields[key].to(device))
        names = {kind: self._vector_field(key, kind) for kind in self.projections}
        if not all(name in fields for name in names.values()):
            return None
        moved = {kind: fields[name].to(device) for kind, name in names.items()}
        return ("vectors", tuple(moved[kind] for kind in self.kinds))


class HiddenStateTarget(Target):
    """``hidden_states[layer + offset]`` per mapped layer, or ``hidden_states[offset]`` once."""

    hidden_states = True

    def __init__(self, name: str, offset: int, per_layer: bool):
        self.name, self.offset, self.per_layer = name, offset, per_layer

    def read(self, out, captured, layer):
        return out.hidden_states[(layer if self.per_layer else 0) + self.offset]


class ClassifierInputTarget(Target):
    """The input of the classifier's output layer, [B, D]: one vector per example, no token axis in the cache."""

    name, per_layer, classifier_input = "penultimate", False, True

    def read(self, out, captured, layer):
        value = captured["classifier_input"]
        if value.dim() != 2:
            raise ValueError(
                f"distill.loss.penultimate compares one vector per example, the one the classifier's output layer "
                f"reads, but this model's output layer reads {tuple(value.shape)}: its head classifies every token and "
                "pools the logits (EuroBERT's classifier_pooling 'late'). Use a head that pools first (EuroBERT: "
                "classifier_pooling 'bos' or 'mean') or set distill.loss.penultimate to 0."
            )
        return value

    def fields(self, key, n, heads, width, store):
        return [(key, (width,))]


register_target(LogitsTarget())
register_target(RelationTarget("attn", ("query", "key"), windowed=True))
register_target(RelationTarget("vrel", ("value", "value")))
register_target(HiddenStateTarget("hidden", offset=1, per_layer=True))  # output of encoder layer l
register_target(HiddenStateTarget("embedding", offset=0, per_layer=False))  # output of the embedding layer
register_target(ClassifierInputTarget())


# --------------------------------------------------------------------------- terms


@dataclass
class TermInputs:
    """What a term's ``compute`` sees, for one mapped layer pair (or once, for a per-example term)."""

    student: dict  # target name -> the student's value (rows the term covers)
    teacher: dict  # target name -> the teacher's target
    mask: Any  # attention mask [B, N] of those rows
    labels: Any  # [B]; -1 for unlabeled rows
    logits: Any  # the student's fp32 logits [B, C]
    projection: Any  # the term's learned nn.Linear(student width, teacher width) for this pair, or None
    heads: int  # relation heads
    chunk: int | None  # query rows per chunk in the relation KL
    temperature: float
    windows: tuple = (None, None)  # (student, teacher) key windows of the pair's layers (None: global attention)
    class_weights: Any = None  # [C] weights of the cross-entropy's classes (distill.class_weight), or None


class Term:
    """One weighted term of the distillation loss (subclass, set the class attributes, ``@register_term``)."""

    name: ClassVar[str]  # the weight key distill.loss.<name>; also the name of the logged term
    default: ClassVar[float] = 0.0
    needs: ClassVar[tuple[str, ...]] = ()  # registered targets
    projected: ClassVar[bool] = False  # learn nn.Linear(student width, teacher width) when the widths differ
    # Gives every student parameter a gradient on every batch (through the logits of every row): with such a term
    # active, DDP need not search for unused parameters.
    reaches_every_parameter: ClassVar[bool] = False

    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(TARGETS[name] for name in self.needs)

    @property
    def per_pair(self) -> bool:
        """Computed for every mapped layer pair and averaged."""
        return any(t.per_layer for t in self.targets)

    @property
    def every_row(self) -> bool:
        """Computed on every row, also logits-only (augmented) ones."""
        return all(t.every_row for t in self.targets)

    @property
    def summary(self) -> str:
        return (type(self).__doc__ or self.name).strip().splitlines()[0]

    def projection_name(self, s: int | None, t: int | None) -> str:
        return self.name if s is None else f"{self.name}_{s}_{t}"

    def compute(self, x: TermInputs) -> "torch.Tensor | None":
        """The term's value; None skips it for this batch."""
        raise NotImplementedError


def active_terms(weights) -> list[Term]:
    """The registered terms with a weight above 0 in ``weights`` (a ``distill.loss`` section)."""
    return [term for name, term in TERMS.items() if getattr(weights, name) > 0]


def uses_model_attention(weights) -> bool:
    """An active term compares the model's own attention (a windowed target: ModernBERT's sliding windows apply)."""
    return any(t.windowed for term in active_terms(weights) for t in term.targets)


def some_parameters_may_get_no_gradient(weights) -> bool:
    """No active term reaches every student parameter on every batch (DDP's find_unused_parameters)."""
    return not any(term.reaches_every_parameter for term in active_terms(weights))


def register_term(cls: type[Term]) -> type[Term]:
    """Class decorator: registers one instance under ``cls.name`` (the order of registration is the order of terms)."""
    name = cls.name
    if not name.isidentifier() or name in TERMS:
        raise ValueError(f"term name {name!r} is not an identifier or is already registered")
    unknown = [n for n in cls.needs if n not in TARGETS]
    if unknown:
        raise ValueError(f"term {name!r} needs unregistered targets {unknown}")
    TERMS[name] = cls()
    return cls


def relation_term(x: TermInputs, name: str):
    """Relation KL between the student's vectors and the teacher's relation (cached probs or vectors)."""
    form, target = x.teacher[name]
    s_a, s_b = x.student[name]
    s_window, t_window = x.windows if TARGETS[name].windowed else (None, None)
    if form == "probs":  # cached teacher probabilities already carry the teacher layer's window
        return losses().relation_kl_from_probs(target, s_a, s_b, x.mask, x.heads, x.chunk, student_window=s_window)
    return losses().relation_kl(
        *target, s_a, s_b, x.mask, x.heads, x.chunk, teacher_window=t_window, student_window=s_window
    )


@register_term
class CrossEntropy(Term):
    """Cross-entropy with the labels (unlabeled rows, label -1, excluded; classes weighed by distill.class_weight)."""

    name, default = "ce", 1.0

    def compute(self, x):
        import torch.nn.functional as F

        labelled = x.labels >= 0
        if not labelled.any():
            return None
        return F.cross_entropy(x.logits[labelled], x.labels[labelled], weight=x.class_weights)


@register_term
class LogitKD(Term):
    """Soft-target logit KD, T^2 KL(softmax(t/T) || softmax(s/T)) (Hinton et al. 2015)."""

    name, default, needs = "kd", 1.0, ("logits",)
    reaches_every_parameter = True  # every row, labelled or not, through the logits

    def compute(self, x):
        return losses().logit_kd(x.student["logits"], x.teacher["logits"].float(), x.temperature)


@register_term
class AttentionKL(Term):
    """Attention relation KL(A_t || A_s) from queries and keys, mean over mapped layers (MiniLM)."""

    name, default, needs = "attention", 1.0, ("attn",)

    def compute(self, x):
        return relation_term(x, "attn")


@register_term
class ValueRelationKL(Term):
    """Value-relation KL(VR_t || VR_s), mean over mapped layers (MiniLM)."""

    name, default, needs = "value_relation", 0.0, ("vrel",)

    def compute(self, x):
        return relation_term(x, "vrel")


@register_term
class HiddenMSE(Term):
    """Hidden-state MSE(W h_s, h_t) through a learned projection, mean over mapped layers (TinyBERT)."""

    name, default, needs, projected = "hidden", 0.0, ("hidden",), True

    def projection_name(self, s, t):
        return f"{s}_{t}"  # the projections' names in checkpoints from before the registry

    def compute(self, x):
        return losses().hidden_mse(x.student["hidden"].float(), x.teacher["hidden"].float(), x.mask, x.projection)


@register_term
class EmbeddingMSE(Term):
    """Embedding-layer MSE(E_s W_e, E_t) through a learned projection (TinyBERT, Jiao et al. 2020).

    The embedding layer's output (hidden_states[0]) compared over valid tokens,
    the formula of ``losses.hidden_mse``; W_e is learned when the widths differ.
    """

    name, default, needs, projected = "embedding", 0.0, ("embedding",), True

    def compute(self, x):
        return losses().hidden_mse(x.student["embedding"].float(), x.teacher["embedding"].float(), x.mask, x.projection)


@register_term
class PenultimateMSE(Term):
    """Penultimate-representation MSE(W p_s, p_t): what the classifier's output layer reads, through a learned projection.

    Logit KD gives one number per example for a two-class task; the representation the teacher's classifier reads
    (BERT's pooler output, MPNet's head's tanh(dense(<s>)): D numbers) carries what the logit is a linear function
    of. Feature KD on the penultimate layer (Yang et al. 2021, SRRL, with a learned connector); the formula of
    ``losses.hidden_mse`` with one vector per example. Read on every row that carries teacher records
    (training and unlabelled text; augmented copies carry logits only). In training mode the student's vector is the
    one its classifier reads, after the head's dropout.
    """

    name, default, needs, projected = "penultimate", 0.0, ("penultimate",), True

    def compute(self, x):
        return losses().hidden_mse(
            x.student["penultimate"].float(), x.teacher["penultimate"].float(), None, x.projection
        )


__all__ = [
    "TARGETS",
    "TERMS",
    "ClassifierInputTarget",
    "HiddenStateTarget",
    "RelationTarget",
    "Target",
    "Term",
    "TermInputs",
    "active_terms",
    "register_target",
    "register_term",
    "relation_term",
    "some_parameters_may_get_no_gradient",
    "uses_model_attention",
]
