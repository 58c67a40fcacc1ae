"""The supported encoder families: where each architecture keeps what the pipeline touches.

One row per ``config.model_type``, read from the transformers 5.24 modeling
code. Capture and the losses hook the query/key/value projections of the
self-attention module; student construction copies and prunes layers, zeroes
the attention dropout and builds random students of the teacher's family; the
export finds encoder layers in the ONNX graph by their module scope. Paths are
attribute paths: ``layers`` from ``model.base_model``, ``attention`` and the
feed-forward Linears from one layer, the projections and the attention dropout
from the attention module.

What "attention" means per family (``attention_is_exact``): for BERT, RoBERTa,
XLM-RoBERTa, ELECTRA and DistilBERT, softmax(Q K^T / sqrt(d_head) + mask) from
the captured projections IS the model's attention (tests/test_families.py
checks it against eager ``output_attentions``). DeBERTa-v2/v3 adds
disentangled relative-position terms (content->position, position->content)
and scales by 1/sqrt(d_head * (1 + number of position terms)); for it the
distilled "attention" is the content-to-content relation
softmax(Q_c K_c^T / sqrt(d_head) + mask) of its content projections, a
MiniLMv2-style self-attention relation that needs only Q/K and so works
across families, depths and head counts. The position terms are not distilled.

ModernBERT (also mmBERT and the Ettin encoders, all ``model_type``
"modernbert") and EuroBERT rotate queries and keys by their positions (RoPE)
inside the attention module: capture applies the same rotation to the captured
projections (``rotary``), from the (cos, sin) the module is called with, so the
recomputed softmax(Q K^T / sqrt(d) + mask) is again the model's attention.
ModernBERT fuses Q/K/V into one Linear ``Wqkv`` (``fused_qkv``: its output is
split in thirds, as the module does) and alternates global layers with
sliding-window layers whose keys are limited to ``|i - j| <= sliding_window``
(``config.layer_types``; ``attention_window`` gives a layer's window, which the
recomputed attention and the losses apply). EuroBERT may share key/value heads
between query heads (grouped-query attention): captured keys and values are
repeated per query head, as its attention does. Their feed-forward blocks are
gated (GLU): ModernBERT's ``Wi`` yields the value and gate halves in one Linear
(``ffn_fused_glu``), EuroBERT has a separate ``gate_proj`` (``ffn_gate``);
pruning keeps a neuron's value row and gate row together.

MPNet (all-mpnet-base-v2, ``model_type`` "mpnet") adds a relative position bias to Q K^T / sqrt(d_head) before
the mask: one table of 32 buckets x heads in the encoder (``encoder.relative_attention_bias``), the same bias for
every layer, a function of the distance i - j alone. Its distilled "attention" is therefore, as for DeBERTa, the
content relation softmax(Q K^T / sqrt(d_head) + mask) (``attention_is_exact`` False): the only part of the
attention that differs between layers and examples. A student copied from teacher layers keeps the teacher's
bias table (it lives outside the layer list, so the copy takes it whole) and trains it with the rest;
tests/test_families.py checks that eager attention is exactly softmax(relation scores + that bias + mask).
transformers has no SDPA kernel for MPNet: it runs eager attention.

DeBERTa v1 (``model_type`` "deberta") fuses Q/K/V differently and is not supported.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Any, cast

from torch import nn

from .errors import ModelError

log = logging.getLogger("pipeline")


@dataclass(frozen=True)
class Family:
    name: str
    model_type: str
    layers: str  # the encoder layer list, from model.base_model
    attention: str  # the self-attention module, from one layer
    query: str  # projection Linears, from the attention module
    key: str
    value: str
    attention_dropout: str  # the Dropout on attention probabilities, from the attention module
    attention_dropout_key: str  # its config key
    hidden_dropout_key: str | None  # None: the family has no hidden dropout (EuroBERT)
    ffn_in: str  # feed-forward Linears (hidden -> ffn, ffn -> hidden), from one layer (pipeline/pruning.py)
    ffn_out: str
    ffn_size_key: str  # config key of the feed-forward width
    hidden_sized: tuple[str, ...]  # config keys a random student sets to its own hidden size
    position_offset: bool  # position ids start after pad_token_id (RoBERTa-style): pad_token_id + 1 positions are lost
    token_type_ids: (
        bool  # the family has segment embeddings (sentence pairs feed token_type_ids; data.uses_segment_ids decides)
    )
    sdpa: bool  # transformers has an SDPA kernel for it; otherwise eager runs
    attention_is_exact: bool  # softmax(QK^T/sqrt(d)+mask) is the model's attention (else: content relation)
    tokenizer_kind: str  # the tokenizer its checkpoints ship (documentation; trimming is WordPiece only)
    fused_qkv: bool = False  # query, key and value name one Linear whose output is [Q | K | V]
    rotary: bool = False  # the attention module rotates Q and K by its ``position_embeddings`` (cos, sin) argument
    ffn_fused_glu: bool = False  # ffn_in's output is [value half | gate half] (ModernBERT's Wi)
    ffn_gate: str | None = None  # a separate gate Linear of the GLU (EuroBERT's gate_proj), from one layer
    sliding_window_key: str | None = None  # config key of the half-window of "sliding_attention" layers
    heads_sized: tuple[str, ...] = ()  # config keys a random student sets to its own head count (key/value heads)
    # Layer 0 is built differently (ModernBERT: no attention LayerNorm, the embeddings' norm serves it), so a student
    # from teacher layers must start with teacher layer 0 and use it nowhere else.
    layer_zero_differs: bool = False
    rotary_casts_back: bool = True  # the rotated Q/K are cast back to the projection's dtype (EuroBERT keeps float32)
    # The attention's output Linear (heads -> hidden), from one layer; None: narrowing (pipeline/pruning.py) not
    # supported (fused Q/K/V, grouped key/value heads or hidden-sized position projections).
    attention_out: str | None = None
    head_table: str | None = None  # a per-head table all layers share (MPNet's relative position bias), from base_model

    def projection_name(self, kind: str) -> str:
        """``query`` / ``key`` / ``value`` -> this family's Linear name inside the attention module."""
        if kind not in ("query", "key", "value"):
            raise ValueError(f"unknown attention projection {kind!r}; expected query, key or value")
        return getattr(self, kind)


_BERT_LIKE: dict[str, Any] = dict(
    layers="encoder.layer",
    attention="attention.self",
    query="query",
    key="key",
    value="value",
    attention_dropout="dropout",
    attention_dropout_key="attention_probs_dropout_prob",
    hidden_dropout_key="hidden_dropout_prob",
    ffn_in="intermediate.dense",
    ffn_out="output.dense",
    ffn_size_key="intermediate_size",
    sdpa=True,
    attention_is_exact=True,
    attention_out="attention.output.dense",
)

FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family(
            "BERT",
            "bert",
            **_BERT_LIKE,
            hidden_sized=(),
            position_offset=False,
            token_type_ids=True,
            tokenizer_kind="WordPiece",
        ),
        Family(  # a BERT student with hashed token-pair vectors at its input (pipeline/pair_model.py)
            "BERT with token pairs",
            "bert-pairs",
            **_BERT_LIKE,
            hidden_sized=(),
            position_offset=False,
            token_type_ids=True,
            tokenizer_kind="WordPiece",
        ),
        Family(
            "RoBERTa",
            "roberta",
            **_BERT_LIKE,
            hidden_sized=(),
            position_offset=True,
            token_type_ids=False,
            tokenizer_kind="byte-level BPE",
        ),
        Family(
            "XLM-RoBERTa",
            "xlm-roberta",
            **_BERT_LIKE,
            hidden_sized=(),
            position_offset=True,
            token_type_ids=False,
            tokenizer_kind="Unigram (SentencePiece)",
        ),
        # embedding_size != hidden_size adds embeddings_project before the layers (outside the layer list).
        Family(
            "ELECTRA",
            "electra",
            **_BERT_LIKE,
            hidden_sized=("embedding_size",),
            position_offset=False,
            token_type_ids=True,
            tokenizer_kind="WordPiece",
        ),
        Family(
            "DistilBERT",
            "distilbert",
            layers="transformer.layer",
            attention="attention",
            query="q_lin",
            key="k_lin",
            value="v_lin",
            attention_dropout="dropout",
            attention_dropout_key="attention_dropout",
            hidden_dropout_key="dropout",
            ffn_in="ffn.lin1",
            ffn_out="ffn.lin2",
            ffn_size_key="hidden_dim",
            hidden_sized=(),
            position_offset=False,
            token_type_ids=False,
            sdpa=True,
            attention_is_exact=True,
            tokenizer_kind="WordPiece",
            attention_out="attention.out_lin",
        ),
        Family(
            "ModernBERT",
            "modernbert",
            layers="layers",
            attention="attn",
            query="Wqkv",
            key="Wqkv",
            value="Wqkv",
            attention_dropout="attention_dropout",
            attention_dropout_key="attention_dropout",
            hidden_dropout_key="mlp_dropout",
            ffn_in="mlp.Wi",
            ffn_out="mlp.Wo",
            ffn_size_key="intermediate_size",
            hidden_sized=(),
            position_offset=False,
            token_type_ids=False,
            sdpa=True,
            attention_is_exact=True,
            tokenizer_kind="byte-level BPE (mmBERT: Gemma 2's SentencePiece BPE)",
            fused_qkv=True,
            rotary=True,
            ffn_fused_glu=True,
            sliding_window_key="sliding_window",
            layer_zero_differs=True,
        ),
        Family(
            "EuroBERT",
            "eurobert",
            layers="layers",
            attention="self_attn",
            query="q_proj",
            key="k_proj",
            value="v_proj",
            attention_dropout="attention_dropout",
            attention_dropout_key="attention_dropout",
            hidden_dropout_key=None,
            ffn_in="mlp.up_proj",
            ffn_out="mlp.down_proj",
            ffn_size_key="intermediate_size",
            hidden_sized=(),
            position_offset=False,
            token_type_ids=False,
            sdpa=True,
            attention_is_exact=True,
            tokenizer_kind="byte-level BPE (Llama 3)",
            rotary=True,
            ffn_gate="mlp.gate_proj",
            heads_sized=("num_key_value_heads",),
            rotary_casts_back=False,
        ),
        Family(
            "DeBERTa-v2/v3",
            "deberta-v2",
            layers="encoder.layer",
            attention="attention.self",
            query="query_proj",
            key="key_proj",
            value="value_proj",
            attention_dropout="dropout",
            attention_dropout_key="attention_probs_dropout_prob",
            hidden_dropout_key="hidden_dropout_prob",
            ffn_in="intermediate.dense",
            ffn_out="output.dense",
            ffn_size_key="intermediate_size",
            hidden_sized=("pooler_hidden_size",),
            position_offset=False,
            token_type_ids=False,
            sdpa=False,
            attention_is_exact=False,
            tokenizer_kind="Unigram (SentencePiece)",
        ),
        # position ids start after the pad id (1), as in RoBERTa; <s> text </s> around a lower-casing WordPiece.
        Family(
            "MPNet",
            "mpnet",
            layers="encoder.layer",
            attention="attention.attn",
            query="q",
            key="k",
            value="v",
            attention_dropout="dropout",
            attention_dropout_key="attention_probs_dropout_prob",
            hidden_dropout_key="hidden_dropout_prob",
            ffn_in="intermediate.dense",
            ffn_out="output.dense",
            ffn_size_key="intermediate_size",
            hidden_sized=(),
            position_offset=True,
            token_type_ids=False,
            sdpa=False,
            attention_is_exact=False,
            tokenizer_kind="WordPiece (RoBERTa-style <s> ... </s>)",
            attention_out="attention.attn.o",
            head_table="encoder.relative_attention_bias",
        ),
    )
}

# Module scope of encoder layer N in a graph from torch's dynamo exporter, for every family
# (e.g. "bert.encoder.layer.3.attention.self.query", "distilbert.transformer.layer.0.ffn.lin1").
LAYER_SCOPE = re.compile(r"(?:%s)\.(\d+)(?:\.|$)" % "|".join(sorted({re.escape(f.layers) for f in FAMILIES.values()})))


def supported() -> str:
    return ", ".join(f"{f.name} ('{f.model_type}')" for f in FAMILIES.values())


def family_of(config_or_model, what: str = "model") -> Family:
    """The table row of a model or its config; a ModelError naming the model_type and the supported families otherwise."""
    if isinstance(config_or_model, nn.Module):
        config_or_model = unwrap_model(config_or_model)
    config = getattr(config_or_model, "config", config_or_model)
    model_type = getattr(config, "model_type", None)
    family = _row(config)
    if family is None:
        architectures = ", ".join(getattr(config, "architectures", None) or []) or type(config).__name__
        raise ModelError(
            f"The {what} is a '{model_type}' model ({architectures}), which is not a supported encoder family. "
            f"Supported families (config.json model_type): {supported()}. The pipeline must know where a family keeps "
            "its layers and query/key/value projections (pipeline/families.py) before it can capture attention, "
            "build students or export; use a model of a supported family."
        )
    return family


def _row(config) -> Family | None:
    """The table row of a config's model_type, or None."""
    model_type = getattr(config, "model_type", None)
    return FAMILIES.get(model_type) if isinstance(model_type, str) else None


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


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    inner: Any = unwrap_model(model)  # a transformers model: base_model, base_model_prefix, config
    return cast(nn.ModuleList, inner.base_model.get_submodule(family_of(inner).layers))


def layer_prefix(model: nn.Module) -> str:
    """The state-dict prefix of the encoder layers, e.g. 'bert.encoder.layer.' or 'distilbert.transformer.layer.'."""
    inner: Any = unwrap_model(model)
    base = inner.base_model_prefix if inner.base_model is not inner else ""
    return ".".join(p for p in (base, family_of(inner).layers) if p) + "."


def self_attention(model: nn.Module, layer: int) -> nn.Module:
    model = unwrap_model(model)
    return encoder_layers(model)[layer].get_submodule(family_of(model).attention)


def projection(model: nn.Module, layer: int, kind: str) -> nn.Linear:
    """The ``query`` / ``key`` / ``value`` Linear of encoder layer ``layer``."""
    model = unwrap_model(model)
    return cast(nn.Linear, self_attention(model, layer).get_submodule(family_of(model).projection_name(kind)))


def layer_types(config) -> list[str] | None:
    """Per-layer attention kinds ("full_attention" / "sliding_attention") of a family that alternates them, else None."""
    family = _row(config)
    if family is None or family.sliding_window_key is None:
        return None
    return list(config.layer_types)


def family_of_layer(layer: nn.Module, family: Family | None = None) -> Family:
    """The family (``family``, or the first in the table) whose feed-forward Linears this encoder layer has."""
    for f in [family] if family is not None else list(FAMILIES.values()):
        try:
            layer.get_submodule(f.ffn_in), layer.get_submodule(f.ffn_out)
        except AttributeError:
            continue
        return f
    raise ModelError(
        f"{type(layer).__name__} has no feed-forward Linears where "
        f"{family.name if family else 'any supported family'} keeps them; supported: {supported()}."
    )


def ffn_paths(layer: nn.Module, family: Family | None = None) -> tuple[str, str]:
    """The feed-forward input and output Linear paths of one encoder layer (of ``family``, or found in the layer)."""
    found = family_of_layer(layer, family)
    return found.ffn_in, found.ffn_out


def ffn_linears(layer: nn.Module, family: Family | None = None) -> tuple[nn.Linear, nn.Linear]:
    """The feed-forward input (hidden -> ffn) and output (ffn -> hidden) Linears of one encoder layer."""
    ffn_in, ffn_out = (cast(nn.Linear, layer.get_submodule(path)) for path in ffn_paths(layer, family))
    return ffn_in, ffn_out


def zero_attention_dropout(model: nn.Module) -> None:
    """Attention-probability dropout 0 in every layer and in the config (the KL target must be a distribution)."""
    model = unwrap_model(model)
    family = family_of(model)
    setattr(model.config, family.attention_dropout_key, 0.0)
    for i in range(len(encoder_layers(model))):
        attention = self_attention(model, i)
        dropout = getattr(attention, family.attention_dropout)
        if isinstance(dropout, nn.Module):
            setattr(dropout, "p", 0.0)  # noqa: B010 (nn.Dropout's p, through the Module type the attribute has)
        else:  # ModernBERT, EuroBERT: a float the module passes to its attention kernel
            setattr(attention, family.attention_dropout, 0.0)


def attention_window(config, layer: int) -> int | None:
    """The key window of encoder layer ``layer``: keys j with |i - j| <= window for query i, None for global attention.

    Only ModernBERT's "sliding_attention" layers have one (``config.layer_types``, half-window ``sliding_window``)."""
    family = _row(config)
    if family is None or family.sliding_window_key is None:
        return None
    types = getattr(config, "layer_types", None) or []
    if layer < len(types) and types[layer] == "sliding_attention":
        return int(getattr(config, family.sliding_window_key))
    return None


def teacher_layers_problem(family: Family, teacher_layers: list[int]) -> str | None:
    """Why these teacher layers cannot be copied into a student of ``family``, or None."""
    if family.layer_zero_differs and (teacher_layers[0] != 0 or 0 in teacher_layers[1:]):
        return (
            f"student.teacher_layers: {list(teacher_layers)} does not start with teacher layer 0 (or uses it again "
            f"later). A {family.name} model builds its first layer without the attention LayerNorm the others "
            "have (the embeddings' norm serves it), so a copied layer keeps its weights only in its own position "
            "kind: list teacher layer 0 first and only there, e.g. [0, 3, 5]."
        )
    return None


def check_layer_windows(pairs, student_config, teacher_config) -> None:
    """Each mapped student layer must see at least the keys its teacher layer sees (else KL(teacher || student) is infinite)."""
    for s, t in pairs:
        s_window, t_window = attention_window(student_config, s), attention_window(teacher_config, t)
        if s_window is not None and (t_window is None or s_window < t_window):
            raise ModelError(
                f"distill.layer_map pairs student layer {s} (sliding-window attention, keys within {s_window} tokens) "
                f"with teacher layer {t} ({'global attention' if t_window is None else f'a window of {t_window}'}): "
                "the student cannot put attention where the teacher does, so the attention KL would be infinite. Map "
                "that student layer to a teacher layer of its kind (config.json layer_types of both models), or give "
                "the student a global layer there."
            )


def usable_positions(config) -> int | None:
    """Tokens per sequence the position embeddings allow (RoBERTa-style models lose pad_token_id + 1)."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return None
    family = _row(config)
    if family is not None and family.position_offset:
        positions -= (getattr(config, "pad_token_id", None) or 0) + 1
    return positions


def attn_implementation(config, requested: str) -> str:
    """``requested``, or eager for a family without that kernel in transformers (said once in the log)."""
    family = family_of(config)
    if requested != "eager" and not family.sdpa:
        _say_eager(family.name, requested)
        return "eager"
    return requested


@functools.lru_cache(maxsize=None)
def _say_eager(family: str, requested: str) -> None:
    log.info(
        "%s has no %s attention in transformers; it runs eager attention (the losses recompute attention "
        "from Q/K either way)",
        family,
        requested,
    )


__all__ = [
    "FAMILIES",
    "Family",
    "LAYER_SCOPE",
    "attention_window",
    "attn_implementation",
    "check_layer_windows",
    "encoder_layers",
    "layer_types",
    "family_of",
    "family_of_layer",
    "ffn_linears",
    "ffn_paths",
    "layer_prefix",
    "projection",
    "self_attention",
    "supported",
    "unwrap_model",
    "usable_positions",
    "zero_attention_dropout",
]
