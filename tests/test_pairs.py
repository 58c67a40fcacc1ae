"""Sentence pairs end to end (issue 13 item 3): token_type_ids from prepare to the exported graph and predict.py.

The pair task is built from the packaged corpus: two Rotten Tomatoes sentences, labelled "same" when both
have the same sentiment, else "different". The tiny random BERT teacher (segment embeddings: BERT uses
token_type_ids) runs the whole pipeline once, shared by the tests below.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from tests.helpers import run_cli

PAIRS = 300


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory):
    from pipeline.data import rotten_tomatoes_path

    folder = tmp_path_factory.mktemp("pairs")
    corpus = pd.read_csv(rotten_tomatoes_path(), keep_default_na=False, dtype=str)
    corpus = corpus[corpus["category"] != "plot"].reset_index(drop=True)
    rng = np.random.default_rng(13)
    first, second = rng.choice(len(corpus), PAIRS, replace=False), rng.choice(len(corpus), PAIRS, replace=False)
    frame = pd.DataFrame(
        {
            "premise": corpus["text"].to_numpy()[first],
            "hypothesis": corpus["text"].to_numpy()[second],
            "movie": corpus["movie_name"].to_numpy()[first],  # the premise's movie: no movie in two splits
            "relation": np.where(
                corpus["category"].to_numpy()[first] == corpus["category"].to_numpy()[second], "same", "different"
            ),
        }
    )
    frame.to_csv(folder / "pairs.csv", index=False)
    config = {
        "extends": "tiny",
        "name": "pairs",
        "precision": "fp32",  # the same numbers on AVX2 and AVX512-BF16 machines
        "data": {
            "source": "csv",
            "path": str(folder / "pairs.csv"),
            "text_column": "premise",
            "text_pair_column": "hypothesis",
            "label_column": "relation",
            "group_column": "movie",
            "max_examples": None,
            "max_length": 48,
        },
        "distill": {"epochs": 1},
        "export": {"latency_sentences": 5, "latency_runs": 2, "latency_rounds": 1, "quantize": True},
        "tracking": {"enabled": False},
    }
    (folder / "pairs.yaml").write_text(yaml.safe_dump(config))
    result = run_cli("run", str(folder / "pairs.yaml"), runs_dir=folder / "runs")
    assert result.returncode == 0, result.stderr[-4000:]
    run_dir = folder / "runs" / "pairs"
    return {
        "run_dir": run_dir,
        "prepare": run_dir / "prepare",
        "bundle": run_dir / "export" / "bundle",
        "config": folder / "pairs.yaml",
    }


def test_prepare_stores_the_tokenizers_segment_ids_for_pairs(pair_run):
    from pipeline.models import load_tokenizer
    from pipeline.splits import TokenizedSplit

    test = TokenizedSplit(pair_run["prepare"], "test")
    records = [json.loads(line) for line in (pair_run["prepare"] / "test.jsonl").open()]
    assert test.token_type_ids is not None and len(test.token_type_ids) == len(records)
    tokenizer = load_tokenizer(str(pair_run["run_dir"] / "teacher" / "model"))
    direct = tokenizer([r["text"] for r in records], [r["text_pair"] for r in records], truncation=True, max_length=48)
    assert list(test.input_ids) == direct["input_ids"]
    assert list(test.token_type_ids) == direct["token_type_ids"]
    assert all(0 in types and 1 in types for types in test.token_type_ids)  # both segments are really there
    assert json.loads((pair_run["prepare"] / "stats.json").read_text())["token_type_ids"] is True


def test_batches_carry_segment_ids_and_the_teacher_uses_them(pair_run):
    from pipeline.inference import model_inputs
    from pipeline.models import load_classifier
    from pipeline.splits import TokenizedSplit, TrainingData, pad_id

    prepare, pad = pair_run["prepare"], pad_id(pair_run["prepare"])
    test = TokenizedSplit(prepare, "test")
    batch = test.batch(np.arange(8), pad, "cpu")
    assert batch["token_type_ids"].shape == batch["input_ids"].shape
    assert (batch["token_type_ids"][batch["attention_mask"] == 0] == 0).all()  # padding is segment 0
    for row in range(8):
        assert batch["token_type_ids"][row, : len(test.token_type_ids[row])].tolist() == test.token_type_ids[row]
    assert set(model_inputs(batch)) == {"input_ids", "attention_mask", "token_type_ids"}
    train_batch = TrainingData(prepare, pair_run["run_dir"] / "capture").batch(np.arange(4), pad, "cpu")
    assert train_batch["token_type_ids"].shape == train_batch["input_ids"].shape
    assert train_batch["token_type_ids"].sum() > 0
    teacher = load_classifier(str(pair_run["run_dir"] / "teacher" / "model")).eval()
    with torch.no_grad():
        with_segments = teacher(**model_inputs(batch)).logits
        without = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert not torch.allclose(with_segments, without, atol=1e-5)  # segment ids change what the teacher computes

    # capture ran the teacher with them: the cached logits of train rows are the teacher's with token_type_ids
    from pipeline.cache import TeacherCache

    rows = np.arange(8)
    train_batch = TrainingData(prepare, pair_run["run_dir"] / "capture").batch(rows, pad, "cpu")
    cached = TeacherCache(pair_run["run_dir"] / "capture" / "cache").batch(
        rows, train_batch["input_ids"].shape[1], "cpu"
    )
    with torch.no_grad():
        fed = teacher(**model_inputs(train_batch)).logits
        unfed = teacher(input_ids=train_batch["input_ids"], attention_mask=train_batch["attention_mask"]).logits
    torch.testing.assert_close(cached["logits"], fed, atol=1e-4, rtol=1e-4)
    # the tiny teacher's segment embeddings move its logits by ~1e-4; the fp16 cache is finer than that
    assert (cached["logits"] - fed).abs().max() < (cached["logits"] - unfed).abs().max()


def test_predict_logits_feeds_segment_ids(pair_run):
    """The evaluation / validation path (predict_logits) equals the teacher run by hand with token_type_ids."""
    from pipeline.inference import predict_logits
    from pipeline.models import load_classifier
    from pipeline.splits import TokenizedSplit, pad_id

    prepare, pad = pair_run["prepare"], pad_id(pair_run["prepare"])
    test = TokenizedSplit(prepare, "test")
    teacher = load_classifier(str(pair_run["run_dir"] / "teacher" / "model")).eval()

    class Single:
        rank, world, device = 0, 1, "cpu"

        @staticmethod
        def autocast():
            return torch.autocast("cpu", enabled=False)

    logits = predict_logits(teacher, test, 16, Single(), pad)
    with torch.no_grad():
        # straight from the stored columns, not through the batch code predict_logits uses
        by_hand = np.concatenate(
            [
                teacher(
                    input_ids=torch.tensor([test.input_ids[i]]), token_type_ids=torch.tensor([test.token_type_ids[i]])
                ).logits.numpy()
                for i in range(12)
            ]
        )
    np.testing.assert_allclose(logits[:12], by_hand, atol=1e-4)  # one example at a time: no padding at all


def test_exported_graph_takes_segment_ids_and_holds_parity(pair_run):
    import onnx

    metadata = json.loads((pair_run["bundle"] / "metadata.json").read_text())
    names = ["input_ids", "attention_mask", "token_type_ids"]
    assert [i["name"] for i in metadata["inputs"]] == names
    for variant in metadata["variants"].values():
        graph = onnx.load(str(pair_run["bundle"] / variant["file"])).graph
        assert [i.name for i in graph.input] == names
    assert metadata["parity"]["max_abs_logit_diff"] <= metadata["parity"]["tolerance"]
    assert metadata["parity"]["prediction_agreement"] == 1.0
    assert "`token_type_ids`" in (pair_run["bundle"] / "README.md").read_text()
    assert metadata["text_model"]["shipped"] is False and "pair" in metadata["text_model"]["why"]
    latency = json.loads((pair_run["bundle"] / "latency.json").read_text())
    assert {row["input"] for row in latency["rows"]} == {"L=16", "sentences"}
    assert "teacher ONNX int8" in {row["model"] for row in latency["rows"]}


def test_predict_py_reproduces_the_accuracy_and_classifies_a_pair(pair_run):
    bundle = pair_run["bundle"]
    metadata = json.loads((bundle / "metadata.json").read_text())
    recorded = metadata["variants"][metadata["recommended"]]["accuracy"]
    evaluated = subprocess.run(
        [sys.executable, str(bundle / "predict.py"), "--eval", str(pair_run["prepare"] / "test.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["accuracy"] == pytest.approx(recorded, abs=1e-9)
    single = subprocess.run(
        [
            sys.executable,
            str(bundle / "predict.py"),
            "a gripping film",
            "--pair",
            "a dull film",
            "a tedious mess",
            "--pair",
            "a tedious mess",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert single.returncode == 0, single.stderr
    lines = [json.loads(line) for line in single.stdout.splitlines()]
    assert [(r["text"], r["text_pair"]) for r in lines] == [
        ("a gripping film", "a dull film"),
        ("a tedious mess", "a tedious mess"),
    ]
    assert all(r["label"] in ("same", "different") and abs(sum(r["probabilities"].values()) - 1) < 1e-5 for r in lines)
    uneven = subprocess.run(
        [sys.executable, str(bundle / "predict.py"), "a", "b", "--pair", "c"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert uneven.returncode == 2 and "one --pair per text" in uneven.stderr
    assert metadata["text_pairs"] is True
    bare = subprocess.run(
        [sys.executable, str(bundle / "predict.py"), "a gripping film"], capture_output=True, text=True, timeout=120
    )
    assert bare.returncode == 2 and "classifies sentence pairs" in bare.stderr and "Traceback" not in bare.stderr


def test_predict_py_feeds_the_encodings_type_ids(pair_run):
    """predict.py's encode gives the same token_type_ids prepare stored (one tokenizer.json, one template)."""
    sys.path.insert(0, str(pair_run["bundle"]))
    try:
        import predict
    finally:
        sys.path.pop(0)
    from pipeline.splits import TokenizedSplit

    classifier = predict.BundleClassifier(pair_run["bundle"])
    records = [json.loads(line) for line in (pair_run["prepare"] / "test.jsonl").open()][:6]
    feeds = classifier.encode([r["text"] for r in records], [r["text_pair"] for r in records])
    stored = TokenizedSplit(pair_run["prepare"], "test").token_type_ids
    for row in range(6):
        n = int(feeds["attention_mask"][row].sum())
        assert feeds["token_type_ids"][row, :n].tolist() == stored[row]


def test_single_sentences_store_no_segment_ids(tmp_path):
    """Without a pair column nothing changes: no token_type_ids column, no stats key, batches without the key."""
    from pipeline.config import PACKAGED_TEACHER
    from pipeline.data import tokenize_split, tokenize_to_disk, uses_segment_ids
    from pipeline.inference import model_inputs
    from pipeline.models import load_tokenizer, random_bert_config, resolve_reference
    from pipeline.splits import TokenizedSplit

    tokenizer = load_tokenizer(resolve_reference(PACKAGED_TEACHER))
    texts = pd.Series(["a fine film", "a dull one", "ok"])
    folder = tmp_path / "tokenized" / "test"
    tokenize_to_disk(lambda t, p: tokenize_split(tokenizer, t, p, 16), texts, None, np.array([0, 1, 0]), folder)
    split = TokenizedSplit(tmp_path, "test", folder)
    assert split.dataset.column_names == ["input_ids", "label"]
    assert split.token_type_ids is None
    batch = split.batch(np.arange(3), tokenizer.pad_token_id, "cpu")
    assert "token_type_ids" not in batch and set(model_inputs(batch)) == {"input_ids", "attention_mask"}
    assert len(tokenize_split(tokenizer, list(texts), None, 16)) == 2
    # which teachers get segment ids: BERT's two-row segment table yes; one row (RoBERTa-style) no
    config = random_bert_config(
        type(
            "Shape",
            (),
            {
                "hidden_size": 8,
                "num_layers": 1,
                "num_heads": 2,
                "intermediate_size": 8,
                "max_position_embeddings": 16,
                "dropout": 0.0,
            },
        ),
        100,
    )
    assert uses_segment_ids(tokenizer, config)
    config.type_vocab_size = 1
    assert not uses_segment_ids(tokenizer, config)
