"""Teacher-labelled data augmentation: more teacher signal per labelled sentence.

A small student learns the teacher's function from the inputs it sees; with a
few thousand labelled sentences it sees little of it. Following Tang et al.
(2019, "Distilling Task-Specific Knowledge from BERT into Simple Neural
Networks") and TinyBERT's augmentation, each training sentence yields
``data.augment.copies`` variants, made word by word on the token ids:

* with ``mask_prob`` a word becomes one [MASK] token,
* else with ``replace_prob`` a one-piece word becomes one of its
  ``neighbours`` nearest words in the teacher's input embedding table
  (cosine; only words that occur in the training text, so a trimmed
  vocabulary keeps them),
* then with ``ngram_prob`` only a random span of 1-5 words is kept.

Variants have no label (-1): the teacher labels them during capture (logits
only, so the cache stays small) and the student learns them through logit KD.
Everything is a pure function of the seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def word_spans(ids: Sequence[int], continuation: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) token spans of the words between the first and last (special) token: a piece marked as a
    continuation (``continuation_mask``) joins the word before it."""
    spans: list[tuple[int, int]] = []
    for position in range(1, len(ids) - 1):
        if continuation[ids[position]] and spans:
            spans[-1] = (spans[-1][0], position + 1)
        else:
            spans.append((position, position + 1))
    return spans


def nearest_words(embeddings: torch.Tensor, candidates: np.ndarray, k: int, chunk: int = 2048) -> dict[int, np.ndarray]:
    """For each candidate token id, the ids of its ``k`` nearest other candidates by cosine similarity."""
    if len(candidates) < 2 or k == 0:
        return {}
    k = min(k, len(candidates) - 1)
    vectors = torch.nn.functional.normalize(embeddings[torch.as_tensor(candidates)].float(), dim=-1)
    neighbours = {}
    for start in range(0, len(candidates), chunk):
        similarity = vectors[start : start + chunk] @ vectors.T
        similarity[
            torch.arange(similarity.shape[0]), torch.arange(start, start + similarity.shape[0])
        ] = -2.0  # not itself
        top = similarity.topk(k, dim=-1).indices.numpy()
        for row, token in enumerate(candidates[start : start + chunk]):
            neighbours[int(token)] = candidates[top[row]]
    return neighbours


def augment(
    sentences: Sequence[Sequence[int]],
    copies: int,
    seed: int,
    *,
    mask_id: int,
    continuation: np.ndarray,
    neighbours: dict[int, np.ndarray],
    mask_prob: float,
    replace_prob: float,
    ngram_prob: float,
    cls_id: int,
    sep_id: int,
) -> list[list[int]]:
    """``copies`` variants of every sentence (token ids with [CLS]/[SEP]), in sentence order; duplicates of the source dropped."""
    rng = np.random.default_rng([seed, 20190328])
    out = []
    for ids in sentences:
        spans = word_spans(ids, continuation)
        if not spans:
            continue
        for _ in range(copies):
            words = []
            for start, end in spans:
                draw = rng.random()
                if draw < mask_prob:
                    words.append([mask_id])
                elif draw < mask_prob + replace_prob and end - start == 1 and ids[start] in neighbours:
                    words.append([int(rng.choice(neighbours[ids[start]]))])
                else:
                    words.append(list(ids[start:end]))
            if rng.random() < ngram_prob and len(words) > 1:
                n = int(rng.integers(1, min(5, len(words)) + 1))
                first = int(rng.integers(0, len(words) - n + 1))
                words = words[first : first + n]
            variant = [cls_id] + [t for word in words for t in word] + [sep_id]
            if variant != ids:
                out.append(variant)
    return out


def word_marker(tokenizer) -> tuple[str, bool]:
    """(marker, marks_start): WordPiece marks a piece that continues a word ('##'); byte-level BPE
    ('\u0120', RoBERTa's 'Ġ') and SentencePiece / Metaspace ('\u2581', '▁') mark a piece that starts one."""
    vocab = tokenizer.get_vocab()
    if any(token.startswith("##") for token in vocab):
        return "##", False
    for marker in ("\u0120", "\u2581"):
        if sum(token.startswith(marker) for token in vocab) > len(vocab) // 10:
            return marker, True
    return "##", False


def continuation_mask(tokenizer) -> np.ndarray:
    """True for vocabulary ids that continue a word (a WordPiece '##' piece; a BPE / SentencePiece piece
    without the word-start marker). Special tokens never continue a word."""
    vocab = tokenizer.get_vocab()
    marker, marks_start = word_marker(tokenizer)
    specials = set(tokenizer.all_special_ids)
    mask = np.zeros(max(vocab.values()) + 1, dtype=bool)
    for token, index in vocab.items():
        mask[index] = index not in specials and (
            not token.startswith(marker) if marks_start else token.startswith(marker)
        )
    return mask


def word_candidates(tokenizer, sentences: Sequence[Sequence[int]]) -> np.ndarray:
    """Ids of alphabetic whole-word tokens that occur in ``sentences`` (replacement candidates)."""
    marker, marks_start = word_marker(tokenizer)
    seen = np.unique(np.fromiter((t for ids in sentences for t in ids), dtype=np.int64))
    tokens = tokenizer.convert_ids_to_tokens(seen.tolist())
    if marks_start:  # a word-start piece; the text after its marker must be a word
        words = [token[len(marker) :] if token.startswith(marker) else "" for token in tokens]
    else:
        words = tokens
    return np.array([i for i, word in zip(seen, words) if word.isalpha() and len(word) > 1], dtype=np.int64)
