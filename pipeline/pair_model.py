"""A BERT student with hashed token-pair vectors added at its input (``student.token_pairs``).

Capacity that costs a lookup, not a layer: at a phone's batch of one short text the time goes per layer (one more
of bert_small's layers costs 32%: bench/results/phone_shapes_latency_mpnet_base.md), while a table row costs one
Gather. Each token's input vector becomes its word embedding plus the vector of its pair with the token before it,
hashed into ``token_pairs`` buckets as the static student's bigrams are (``BIGRAM_PRIME``, on the token ids the
model was built with, so vocabulary trimming keeps every pair in its bucket). The pair table starts at zero, so a
student converted from a trained one starts with its logits. fastText's word bigrams and the hashed n-gram input
embeddings of over-tokenized transformers (Huang et al. 2025) are the same idea.

The model is a transformers ``PreTrainedModel`` registered with the Auto classes under its own ``model_type``, so it
saves, loads, evaluates and exports like every student; the pairs are computed inside the graph from the ids.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

from .static_model import BIGRAM_PRIME

MODEL_TYPE = "bert-pairs"


class BertPairsConfig(BertConfig):
    model_type = MODEL_TYPE

    def __init__(self, token_pairs: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.token_pairs = token_pairs


class TokenPairEmbedding(torch.nn.Module):
    """The word-embedding module: token vector + the vector of (previous token, token)'s bucket (none at position 0)."""

    hash_ids: torch.Tensor  # a buffer: the original id of each row (vocabulary trimming reorders the rows)

    def __init__(self, vocab_size: int, hidden_size: int, buckets: int, padding_idx: int | None):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab_size, hidden_size, padding_idx=padding_idx)
        self.pairs = torch.nn.Embedding(buckets, hidden_size)
        self.register_buffer("hash_ids", torch.arange(vocab_size), persistent=True)

    def pair_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The bucket of each token paired with the one before it, [batch, length] (position 0 pairs with the last
        token: a rotation keeps one sequence axis for the exporters; ``forward`` drops that pair)."""
        original = self.hash_ids[input_ids]
        return (torch.roll(original, 1, dims=1) * BIGRAM_PRIME + original) % self.pairs.num_embeddings

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pairs = self.pairs(self.pair_ids(input_ids))
        first = torch.arange(input_ids.shape[1], device=input_ids.device) == 0
        return self.tokens(input_ids) + pairs.masked_fill(first[None, :, None], 0.0)


class BertPairsForSequenceClassification(BertForSequenceClassification):
    config_class = BertPairsConfig

    def __init__(self, config: BertPairsConfig):
        if config.token_pairs < 1:
            raise ValueError(f"a bert-pairs model needs token_pairs >= 1 buckets (config says {config.token_pairs})")
        super().__init__(config)
        self.bert.embeddings.word_embeddings = TokenPairEmbedding(
            config.vocab_size, config.hidden_size, config.token_pairs, config.pad_token_id
        )
        self.post_init()

    def get_input_embeddings(self):
        return self.bert.embeddings.word_embeddings.tokens

    def set_input_embeddings(self, value):
        self.bert.embeddings.word_embeddings.tokens = value

    def keep_tokens(self, kept: list[int]) -> None:
        """Cut the token table to the rows in ``kept``, in that order (export's vocabulary trimming); the pairs keep
        hashing the original ids."""
        embedding = self.bert.embeddings.word_embeddings
        index = torch.tensor(kept, dtype=torch.long)
        old = embedding.tokens
        new = torch.nn.Embedding(len(kept), old.embedding_dim, dtype=old.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(old.weight[index])
        embedding.tokens = new
        embedding.hash_ids = embedding.hash_ids[index]
        self.config.vocab_size = len(kept)


def with_token_pairs(model: BertForSequenceClassification, buckets: int) -> BertPairsForSequenceClassification:
    """``model``'s weights in a :class:`BertPairsForSequenceClassification` with a zero table of ``buckets`` pairs:
    the same logits until the table learns."""
    settings = model.config.to_dict()
    for key in ("model_type", "architectures", "transformers_version"):
        settings.pop(key, None)
    config = BertPairsConfig(token_pairs=buckets, **settings)
    config._attn_implementation = model.config._attn_implementation
    converted = BertPairsForSequenceClassification(config)
    state = {
        key.replace("embeddings.word_embeddings.", "embeddings.word_embeddings.tokens."): value
        for key, value in model.state_dict().items()
    }
    missing, unexpected = converted.load_state_dict(state, strict=False)
    expected_missing = {"bert.embeddings.word_embeddings.pairs.weight", "bert.embeddings.word_embeddings.hash_ids"}
    if set(missing) - expected_missing or unexpected:
        raise RuntimeError(f"token-pair conversion: missing {missing}, unexpected {unexpected}")
    embedding = converted.bert.embeddings.word_embeddings
    with torch.no_grad():  # transformers' own initialisation filled the new table; it must add nothing yet
        embedding.pairs.weight.zero_()
        embedding.hash_ids.copy_(torch.arange(embedding.hash_ids.numel()))
    return converted.to(next(model.parameters()).device)


AutoConfig.register(MODEL_TYPE, BertPairsConfig)
AutoModelForSequenceClassification.register(BertPairsConfig, BertPairsForSequenceClassification)
