"""The static student: one vector per token, a weighted mean, a linear head (or one hidden layer before it).

The fastest class of text classifier a phone runs (model2vec, fastText): no
attention, no layers, a table lookup and one small matrix product per text. Here
the table is distilled from the teacher twice over:

1. **Initialised from the teacher** (``static_vectors``, model2vec style): every
   vocabulary token is run through the teacher's encoder on its own
   (``[CLS] token [SEP]``) and its output is kept; tokens that the training text
   uses get the mean of the teacher's outputs for them *in context* over that
   text instead (the fine-tuned teacher's view of the word in this domain).
   PCA reduces the vectors to ``student.static.dim``; each token's pooling weight
   starts at the SIF weight a / (a + p(token)) of its training-text frequency.
2. **Trained as a student** (stages/distill.py): the same CE + logit KD against
   the teacher's cached logits on the teacher-labelled augmented data as any
   student; the vectors, the pooling weights and the head all learn.

The model is a transformers ``PreTrainedModel`` registered with the Auto
classes, so it saves, loads, evaluates, exports to ONNX (ids and mask in,
logits out: the bundle's text-in model, predict.py and the Node/browser checks
take it unchanged) and trims its vocabulary like every other student.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

MODEL_TYPE = "static-embedding"
SIF_A = 1e-3  # Arora et al. 2017's smoothing constant for the token weights
BIGRAM_PRIME = 1_000_003  # a pair (a, b) of token ids falls in bucket (a * BIGRAM_PRIME + b) % bigram_buckets


class StaticEmbeddingConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 256,
        pad_token_id: int = 0,
        max_position_embeddings: int = 512,
        bigram_buckets: int = 0,
        pooling: str = "mean",
        head_hidden: int = 0,
        **kwargs,
    ):
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.bigram_buckets = bigram_buckets
        self.pooling = pooling  # "mean" or "sqrtn" (StaticStudent.pooling in pipeline/config.py)
        self.head_hidden = head_hidden  # 0: a linear head; else a ReLU layer this wide first (StaticStudent.hidden)
        # No layers and no position table: these keep the code that reads them from every student working
        # (the export's int8 ladder, the latency inputs' longest length).
        self.num_hidden_layers = 0
        self.max_position_embeddings = max_position_embeddings


class AddBias(torch.nn.Module):
    """The head of a folded static student (fold_classifier): the rows already are logit contributions."""

    def __init__(self, bias: torch.Tensor):
        super().__init__()
        self.bias = torch.nn.Parameter(bias.detach().clone())

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled + self.bias


class StaticEmbeddingForSequenceClassification(PreTrainedModel):
    config_class = StaticEmbeddingConfig
    base_model_prefix = "static"
    main_input_name = "input_ids"
    hash_ids: torch.Tensor  # a buffer, with config.bigram_buckets only

    def __init__(self, config: StaticEmbeddingConfig):
        super().__init__(config)
        self.embeddings = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        # log of each token's pooling weight: a second per-token table (kept apart from the vectors so
        # per-channel int8 of the vectors is not scaled by the weights)
        self.token_weights = torch.nn.Embedding(config.vocab_size, 1)
        if config.bigram_buckets:
            # Hashed pairs of neighbouring tokens (fastText's word n-grams): their mean vector is added to the
            # pooled one. The table starts at zero, so the model starts as the one without it.
            self.bigrams = torch.nn.Embedding(config.bigram_buckets, config.hidden_size)
            # The id each row had when the model was built: pairs hash on it, so vocabulary trimming (which
            # renumbers the rows) leaves every pair in its bucket.
            self.register_buffer("hash_ids", torch.arange(config.vocab_size))
        assert config.num_labels is not None  # a config has id2label (2 labels unless given)
        self.classifier: torch.nn.Module = (
            torch.nn.Sequential(
                torch.nn.Linear(config.hidden_size, config.head_hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(config.head_hidden, config.num_labels),
            )
            if config.head_hidden
            else torch.nn.Linear(config.hidden_size, config.num_labels)
        )
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, torch.nn.Embedding):
            torch.nn.init.normal_(module.weight, std=0.02)
            if module is getattr(self, "token_weights", None) or module is getattr(self, "bigrams", None):
                torch.nn.init.zeros_(module.weight)
        elif isinstance(module, torch.nn.Linear):
            # the hidden layer (head_hidden) at He scale: at 0.02 its ReLU outputs, and so every gradient through the
            # output layer, start near zero
            hidden = isinstance(self.classifier, torch.nn.Sequential) and module is self.classifier[0]
            torch.nn.init.normal_(module.weight, std=(2.0 / module.in_features) ** 0.5 if hidden else 0.02)
            torch.nn.init.zeros_(module.bias)

    def get_input_embeddings(self):
        return self.embeddings

    def set_input_embeddings(self, value):
        self.embeddings = value

    def keep_tokens(self, kept: list[int]) -> None:
        """Cut both per-token tables to the rows in ``kept``, in that order (export's vocabulary trimming)."""
        index = torch.tensor(kept, dtype=torch.long)
        for name in ("embeddings", "token_weights"):
            old = getattr(self, name)
            new = torch.nn.Embedding(len(kept), old.embedding_dim, dtype=old.weight.dtype)
            with torch.no_grad():
                new.weight.copy_(old.weight[index])
            setattr(self, name, new)
        if self.config.bigram_buckets:
            self.hash_ids = self.hash_ids[index]
        self.config.vocab_size = len(kept)

    def first_linear(self) -> torch.nn.Module:
        """The head's first layer, the one read right after the pooling (the whole head without head_hidden)."""
        return self.classifier[0] if isinstance(self.classifier, torch.nn.Sequential) else self.classifier

    def output_layer(self) -> torch.nn.Linear | None:
        """The layer after the ReLU with head_hidden; None for a linear head."""
        return self.classifier[2] if isinstance(self.classifier, torch.nn.Sequential) else None

    @torch.no_grad()
    def fold_classifier(self) -> None:
        """Move the head's first linear layer into the tables, for export: its output is W (weighted mean of v_t) +
        W (mean of the pairs' b_p) + c, and W is linear, so each row becomes its contribution (W v_t, W b_p) and the
        layer only adds c. The same logits up to float rounding from tables of num_labels columns (head_hidden
        columns with a hidden layer, whose ReLU and output layer stay) instead of hidden_size (256 -> 2 for two
        labels: the clothing student's graph 82.9 -> 1.06 MB) and, with a linear head, a graph with no matrix
        product (bench/static_fold.py). The model is for export only afterwards: training reads the pooled vector
        (hidden_states), which is then in the first layer's output space."""
        first = self.first_linear()
        weight = first.weight  # [labels or head_hidden, hidden]
        for name in ("embeddings", "bigrams"):
            table = getattr(self, name, None)
            if table is not None:
                folded = torch.nn.Embedding(table.num_embeddings, weight.shape[0], dtype=table.weight.dtype)
                folded.weight.copy_(table.weight @ weight.T)
                setattr(self, name, folded)
        if self.output_layer() is not None:
            self.classifier[0] = AddBias(first.bias)
        else:
            self.classifier = AddBias(first.bias)

    def pooled(self, input_ids, attention_mask=None) -> torch.Tensor:
        """The weighted mean of the tokens' vectors (padding weighs 0), plus the mean of the vectors of the
        text's neighbouring token pairs where the model has them; with ``config.pooling == "sqrtn"`` the sums are
        divided by the root of the summed squared weights (of the pair count) instead."""
        weights = self.token_weights(input_ids).squeeze(-1).exp()
        if attention_mask is not None:
            weights = weights * attention_mask.to(weights.dtype)
        total = (weights.unsqueeze(-1) * self.embeddings(input_ids)).sum(1)
        norm = (
            weights.square().sum(1, keepdim=True).sqrt()
            if self.config.pooling == "sqrtn"
            else weights.sum(1, keepdim=True)
        )
        pooled = total / norm.clamp_min(1e-9)
        if self.config.bigram_buckets:
            pooled = pooled + self.bigram_mean(input_ids, attention_mask)
        return pooled

    def bigram_ids(self, input_ids) -> torch.Tensor:
        """The bucket of each token paired with the token after it, [batch, length]: the last position pairs with
        the first (a rotation rather than a shorter slice, so the exported graphs keep one sequence axis and
        torch.export takes texts from 2 tokens up; bigram_mean never counts that pair)."""
        original = self.hash_ids[input_ids]
        return (original * BIGRAM_PRIME + torch.roll(original, -1, dims=1)) % self.config.bigram_buckets

    def bigram_mean(self, input_ids, attention_mask=None) -> torch.Tensor:
        """The mean vector of the pairs of neighbouring real tokens (zero for a one-token text)."""
        pairs = self.bigrams(self.bigram_ids(input_ids))
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = attention_mask.to(pairs.dtype)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        real = mask * torch.roll(mask, -1, dims=1) * (positions < input_ids.shape[1] - 1).to(pairs.dtype)
        count = real.sum(1, keepdim=True).clamp_min(1.0)
        return (real.unsqueeze(-1) * pairs).sum(1) / (count.sqrt() if self.config.pooling == "sqrtn" else count)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        labels=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ):
        # token_type_ids: a static model reads a pair as one bag of tokens
        pooled = self.pooled(input_ids, attention_mask)
        logits = self.classifier(pooled)
        loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=(pooled.unsqueeze(1),) if output_hidden_states else None
        )


AutoConfig.register(MODEL_TYPE, StaticEmbeddingConfig)
AutoModelForSequenceClassification.register(StaticEmbeddingConfig, StaticEmbeddingForSequenceClassification)


# ---------------------------------------------------------------- vectors from the teacher


@torch.no_grad()
def token_vectors(encoder, vocab_size: int, cls_id: int, sep_id: int, batch_size: int = 1024) -> np.ndarray:
    """Every token through the encoder on its own, ``[CLS] token [SEP]``: the token position's output."""
    rows = []
    for start in range(0, vocab_size, batch_size):
        ids = torch.arange(start, min(vocab_size, start + batch_size))
        inputs = torch.stack([torch.full_like(ids, cls_id), ids, torch.full_like(ids, sep_id)], 1)
        out = encoder(input_ids=inputs, attention_mask=torch.ones_like(inputs)).last_hidden_state
        rows.append(out[:, 1].float())
    return torch.cat(rows).numpy()


def isolated_token_vectors(classifier, tokenizer) -> np.ndarray:
    """:func:`token_vectors` of a classifier's encoder, each token between the tokenizer's own start and end
    tokens ([CLS]/[SEP] for BERT, <s>/</s> for RoBERTa-style vocabularies)."""
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    end = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    return token_vectors(classifier.base_model, classifier.config.vocab_size, start, end)


def token_counts(input_ids, vocab_size: int) -> np.ndarray:
    """How often each id occurs in a list of token-id sequences (float64: the SIF weights' frequencies)."""
    return np.bincount(np.concatenate([np.asarray(x) for x in input_ids]), minlength=vocab_size).astype(np.float64)


@torch.no_grad()
def context_vectors(encoder, batches, vocab_size: int, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """Sum of the encoder's outputs per token id over real text, and how often each id occurred."""
    sums = torch.zeros(vocab_size, hidden, dtype=torch.float64)
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for batch in batches:
        out = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        keep = batch["attention_mask"].flatten().bool()
        ids = batch["input_ids"].flatten()[keep]
        sums.index_add_(0, ids, out.reshape(-1, out.shape[-1])[keep].double())
        counts.index_add_(0, ids, torch.ones_like(ids, dtype=torch.float64))
    return sums.numpy(), counts.numpy()


STATIC_INIT = "static_init.npz"  # capture's output for a static student: teacher_token_statistics, computed once


def teacher_token_statistics(classifier, tokenizer, train_ids, batches, context: bool) -> dict[str, np.ndarray]:
    """What a static student starts from, all of it from the teacher: every vocabulary token's isolated output
    (``isolated``, float32 [V, H]), how often each id occurs in the training texts (``counts``) and, with
    ``context``, the sum of the teacher's in-context outputs for each id the texts use (``context_sums``, float64,
    the rows of ``seen_ids`` only). The slow part of a static run (minutes for a base teacher on long texts), so the
    capture stage computes it once and every student of that capture (seeds, widths, bigram buckets) reuses it."""
    vocab = classifier.config.vocab_size
    out = {"isolated": isolated_token_vectors(classifier, tokenizer), "counts": token_counts(train_ids, vocab)}
    if context:
        sums, _ = context_vectors(classifier.base_model, batches, vocab, classifier.config.hidden_size)
        seen = np.flatnonzero(out["counts"] > 0)
        out.update(seen_ids=seen, context_sums=sums[seen])
    return out


def static_table_from(statistics, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``static_table`` from saved :func:`teacher_token_statistics` (a dict or an ``np.load`` of them)."""
    isolated, counts = statistics["isolated"], statistics["counts"]
    sums = None
    if "context_sums" in statistics:
        sums = np.zeros(isolated.shape, dtype=np.float64)
        sums[statistics["seen_ids"]] = statistics["context_sums"]
    return static_table(isolated, sums, counts, dim)


def pca(vectors: np.ndarray, dim: int) -> np.ndarray:
    """Project centred ``vectors`` on their ``dim`` leading principal axes (SVD; deterministic signs)."""
    if not 1 <= dim <= min(vectors.shape):
        raise ValueError(
            f"PCA width {dim} must be between 1 and {min(vectors.shape)} for vectors of shape {vectors.shape}"
        )
    centred = vectors - vectors.mean(0, keepdims=True)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    axes = vt[:dim]
    axes *= np.sign(axes[np.arange(dim), np.abs(axes).argmax(1)])[:, None]  # the largest entry of each axis positive
    return centred @ axes.T


def sif_weights(counts: np.ndarray, a: float = SIF_A) -> np.ndarray:
    """a / (a + p(token)): frequent tokens weigh less (smooth inverse frequency, Arora et al. 2017)."""
    p = counts / max(counts.sum(), 1.0)
    return a / (a + p)


def static_table(
    isolated: np.ndarray, context_sums: np.ndarray | None, counts: np.ndarray, dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """The initial (vectors [V, dim], log pooling weights [V]) of a static model.

    Tokens seen in the training text take the mean of their in-context outputs, the others their isolated
    output; PCA to ``dim``, scaled so the mean row norm is 1; SIF weights from ``counts``.
    """
    vectors = isolated.astype(np.float64).copy()
    if context_sums is not None:
        seen = counts > 0
        vectors[seen] = context_sums[seen] / counts[seen, None]
    reduced = pca(vectors, dim)
    reduced /= max(float(np.linalg.norm(reduced, axis=1).mean()), 1e-12)
    return reduced.astype(np.float32), np.log(sif_weights(counts)).astype(np.float32)


def build_static_student(
    teacher_config,
    dim: int,
    vectors: np.ndarray,
    log_weights: np.ndarray,
    max_positions: int = 512,
    bigram_buckets: int = 0,
    pooling: str = "mean",
    head_hidden: int = 0,
) -> StaticEmbeddingForSequenceClassification:
    """A static student with the teacher's labels and vocabulary, its tables set from ``static_table`` (and a
    zero table of ``bigram_buckets`` hashed token pairs; a ReLU layer of ``head_hidden`` units before its head)."""
    cfg = StaticEmbeddingConfig(
        vocab_size=vectors.shape[0],
        hidden_size=dim,
        pad_token_id=teacher_config.pad_token_id or 0,
        max_position_embeddings=max_positions,
        bigram_buckets=bigram_buckets,
        pooling=pooling,
        head_hidden=head_hidden,
        num_labels=teacher_config.num_labels,
        id2label=dict(teacher_config.id2label),
        label2id=dict(teacher_config.label2id),
    )
    model = StaticEmbeddingForSequenceClassification(cfg)
    with torch.no_grad():
        model.embeddings.weight.copy_(torch.from_numpy(vectors))
        model.token_weights.weight.copy_(torch.from_numpy(log_weights)[:, None])
    return model
