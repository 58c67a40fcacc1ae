"""Vocabulary trimming for every tokenizer kind (pipeline/export/tokenizer.py: trim_vocabulary).

Each tokenizer is trained offline on mixed-language text: sentences of real words in nine languages and six
scripts (Latin, Cyrillic, Greek, Arabic, Japanese, Chinese), from faker's word lists. The trimmed tokenizer keeps
what half of the Latin-script sentences use (a multilingual teacher distilled on data in a few languages); then every sentence, from every language and a fresh set, whose
original pieces all survive must get exactly the same pieces (remapped ids) from the trimmed tokenizer, and every
other sentence must still encode. The whole-pipeline runs of tests/test_families.py check the same on a trimmed
student (RoBERTa: byte-level BPE, DeBERTa-v3: Unigram, XLM-R: a 250k-piece Unigram vocabulary).
"""

from __future__ import annotations

import json

import pytest
from faker import Faker
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from pipeline.export.tokenizer import trim_vocabulary

pytestmark = pytest.mark.unit

LOCALES = ["en_US", "de_DE", "fr_FR", "es_ES", "ru_RU", "el_GR", "ar_AA", "ja_JP", "zh_CN"]
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]


def mixed_language_text(per_locale: int, seed: int) -> list[str]:
    texts = []
    for locale in LOCALES:
        fake = Faker(locale)
        fake.seed_instance(seed)
        texts += [fake.sentence(nb_words=10) for _ in range(per_locale)]
    return texts


def byte_level_bpe(texts):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=3000, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return tokenizer


def unigram(texts, byte_fallback=False):
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.train_from_iterator(
        texts, trainers.UnigramTrainer(vocab_size=3000, special_tokens=SPECIALS, unk_token="<unk>")
    )
    return with_byte_pieces(tokenizer) if byte_fallback else tokenizer


def with_byte_pieces(tokenizer) -> Tokenizer:
    """SentencePiece style (Gemma, Llama 2): the 256 byte pieces, used for characters without a piece."""
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    if isinstance(vocab, list):  # Unigram: [piece, score], the byte pieces scored below every other piece
        lowest = min(score for _, score in vocab)
        vocab += [[f"<0x{byte:02X}>", lowest - 1.0] for byte in range(256)]
    else:  # BPE: token -> id
        vocab.update({f"<0x{byte:02X}>": len(vocab) + byte for byte in range(256)})
    spec["model"]["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(spec))


def sentencepiece_bpe(texts):
    """Gemma's tokenizer (mmBERT's) as tokenizer.json: spaces become ▁, no pre-tokenizer, BPE with byte fallback."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    # SentencePiece trains on whitespace-split words (no piece crosses a word), then encodes the whole string
    tokenizer.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=3000, special_tokens=GEMMA_SPECIALS))
    spec = json.loads(tokenizer.to_str())
    spec["pre_tokenizer"] = None
    return with_byte_pieces(Tokenizer.from_str(json.dumps(spec)))


def wordpiece(texts):
    tokenizer = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.BertNormalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=3000, special_tokens=SPECIALS))
    return tokenizer


KINDS = {
    "byte_level_bpe": byte_level_bpe,
    "sentencepiece_bpe": sentencepiece_bpe,
    "unigram": unigram,
    "unigram_byte_fallback": lambda texts: unigram(texts, byte_fallback=True),
    "wordpiece": wordpiece,
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_trimmed_tokenizer_gives_the_same_pieces_to_every_text_whose_pieces_survive(kind, tmp_path):
    corpus = mixed_language_text(120, seed=0)
    full_path, trimmed_path = tmp_path / "tokenizer.json", tmp_path / "trimmed.json"
    KINDS[kind](corpus).save(str(full_path))
    full = Tokenizer.from_file(str(full_path))
    # What the trimmed vocabulary must serve: half of the Latin-script sentences, as when a multilingual teacher is
    # distilled on data in a few languages (the other scripts' pieces are what trimming removes).
    training = corpus[: 4 * 120 : 2]
    keep = {i for text in training for i in full.encode(text).ids}
    kept = trim_vocabulary(full_path, keep, trimmed_path)
    trimmed = Tokenizer.from_file(str(trimmed_path))
    assert (
        len(kept) == trimmed.get_vocab_size() < full.get_vocab_size() * 0.8
    )  # a fifth of the vocabulary or more was cut

    fresh = mixed_language_text(40, seed=1) + ["naïve café ☃ 🙂 Ωμέγα ok"]
    kept_set, surviving, other = set(kept), 0, 0
    for text in corpus + fresh:
        before, after = full.encode(text), trimmed.encode(text)
        if kept_set.issuperset(before.ids):
            assert [kept[i] for i in after.ids] == before.ids, text
            assert after.tokens == before.tokens
            surviving += 1
        else:
            other += 1
            assert after.ids, text  # still encodes: the byte alphabet, byte pieces or the unknown token
    assert surviving >= len(training) and other > 0
    assert {full.id_to_token(i) for i in kept} >= set(GEMMA_SPECIALS if kind == "sentencepiece_bpe" else SPECIALS)
    spec = json.loads(trimmed_path.read_text(encoding="utf-8"))["model"]
    if spec["type"] == "BPE":  # every kept merge joins two kept tokens into a kept token
        vocab = spec["vocab"]
        assert spec["merges"] and all(a in vocab and b in vocab and a + b in vocab for a, b in spec["merges"])
        assert len(spec["merges"]) < len(json.loads(full_path.read_text(encoding="utf-8"))["model"]["merges"])
    if kind in ("unigram_byte_fallback", "sentencepiece_bpe"):  # the 256 byte pieces stay: unseen characters still
        pieces = [piece for piece, _ in spec["vocab"]] if kind == "unigram_byte_fallback" else list(spec["vocab"])
        assert sum(piece.startswith("<0x") for piece in pieces) == 256  # fall back to bytes
        assert trimmed.encode("☃").tokens == full.encode("☃").tokens
        assert full.encode("☃").tokens[-3:] == ["<0xE2>", "<0x98>", "<0x83>"]


def test_a_tokenizer_model_without_trimming_support_is_refused(tmp_path):
    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")).save(str(path))
    with pytest.raises(ValueError, match="WordPiece, BPE and Unigram tokenizers, not WordLevel"):
        trim_vocabulary(path, {0}, tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


def test_unigram_trimming_keeps_the_unknown_score_and_every_character(tmp_path):
    """tokenizers scores a character no piece covers at (lowest score - 10): dropping the lowest-scoring piece or a
    single-character piece would change that lattice, and "abcd" (pieces ▁ab + cd, both kept) would become
    ▁ + <unk> + bcd. The trim keeps them, so it does not."""
    pieces = [
        ["<unk>", 0.0],
        ["\u2581ab", -15.0],
        ["cd", -15.0],
        ["\u2581", -0.5],
        ["bcd", -0.5],
        ["a", -40.0],
        ["b", -40.0],
        ["c", -40.0],
        ["d", -40.0],
        ["xyz", -60.0],
        ["wq", -1.0],
    ]
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": False, "vocab": pieces},
    }
    full_path, trimmed_path = tmp_path / "tokenizer.json", tmp_path / "trimmed.json"
    full_path.write_text(json.dumps(spec), encoding="utf-8")
    full = Tokenizer.from_file(str(full_path))
    assert full.encode("abcd").tokens == ["\u2581ab", "cd"]
    kept = trim_vocabulary(full_path, {1, 2, 3, 4}, trimmed_path)
    assert Tokenizer.from_file(str(trimmed_path)).encode("abcd").tokens == ["\u2581ab", "cd"]
    assert {full.id_to_token(i) for i in kept} == {piece for piece, _ in pieces} - {"wq"}  # only "wq" could go


def test_added_tokens_outside_the_model_vocabulary_are_kept_after_it(tmp_path):
    """Llama 3 / EuroBERT style: special tokens only in added_tokens, with ids after the model's vocabulary."""
    full_path, trimmed_path = tmp_path / "tokenizer.json", tmp_path / "trimmed.json"
    tokenizer = byte_level_bpe(mixed_language_text(40, seed=0))
    tokenizer.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    tokenizer.save(str(full_path))
    full = Tokenizer.from_file(str(full_path))
    begin, end = full.token_to_id("<|begin_of_text|>"), full.token_to_id("<|end_of_text|>")
    assert begin >= 3000 - 2 and end == begin + 1  # beyond the trained vocabulary
    text = "ein Licht"
    keep = set(full.encode(text).ids) | {begin, end}
    kept = trim_vocabulary(full_path, keep, trimmed_path)
    trimmed = Tokenizer.from_file(str(trimmed_path))
    assert kept[-2:] == [begin, end] and trimmed.token_to_id("<|end_of_text|>") == len(kept) - 1
    assert [kept[i] for i in trimmed.encode(f"<|begin_of_text|>{text}<|end_of_text|>").ids] == full.encode(
        f"<|begin_of_text|>{text}<|end_of_text|>"
    ).ids
