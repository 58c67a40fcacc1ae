"""The peers (pipeline/peers.py, stages/peers.py) and the static student, through the whole pipeline on the
tiny config: every recorded figure recomputed from the files the run wrote."""

from __future__ import annotations

import json
import tempfile

import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.export.from_text import same_ids, text_model_runner, word_model_runner
from pipeline.export.variants import read_records
from pipeline.peers import FastTextPeer, StaticPeer, TfidfPeer, load_peer
from pipeline.plots import pareto_plot
from pipeline.runner import STAGES
from pipeline.splits import TokenizedSplit
from pipeline.sweep import markdown_table, reference_points
from pipeline.sweep.table import variant_row
from stages.peers import read_splits
from tests.helpers import read_json


@pytest.fixture(scope="module")
def static_run(static_tiny_run):
    return static_tiny_run


def splits(run_dir):
    names = [read_json(run_dir / "prepare" / "labels.json")[str(i)] for i in range(2)]
    return (*read_splits(run_dir / "prepare", names), names)


def test_recorded_peer_figures_come_from_the_shipped_files(static_run):
    run_dir = static_run["run_dir"]
    recorded = read_json(run_dir / "peers" / "peers.json")
    texts, labels, _ = splits(run_dir)
    assert recorded["enabled"] and sorted(recorded["peers"]) == ["fasttext", "model2vec", "static", "tfidf"]
    for name, figures in recorded["peers"].items():
        peer = load_peer(run_dir / "peers" / "models", name)
        one_per_call = np.array([peer.predict_one(t) for t in texts["test"]])  # as an app calls it: what is recorded
        assert figures["accuracy"] == float((one_per_call == labels["test"]).mean())
        assert list(peer.predict(texts["test"])) == list(one_per_call)  # and the batched path agrees
        assert figures["file_mb"] == pytest.approx((run_dir / "peers" / figures["file"]).stat().st_size / 1e6, abs=1e-3)
        assert figures["train_seconds"] > 0


def test_model2vec_peer_ships_its_numpy_pipeline_trained_on_the_static_peers_vectors(static_run):
    """model2vec's own classifier: its StaticModelPipeline folder (safetensors, JSON and its model card: nothing to
    unpickle) in one stored zip, on the static peer's PCA width, its validation accuracy recomputed from the shipped
    file."""
    import zipfile

    run_dir = static_run["run_dir"]
    recorded = read_json(run_dir / "peers" / "peers.json")["peers"]
    settings = recorded["model2vec"]["settings"]
    assert settings["dim"] == recorded["static"]["settings"]["dim"]  # the same vectors, as the docstring says
    with zipfile.ZipFile(run_dir / "peers" / "models" / "model2vec.zip") as archive:
        names = archive.namelist()
        assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_STORED}
    assert "model.safetensors" in names and "head.safetensors" in names, names
    assert all(name.endswith((".safetensors", ".json", ".md")) for name in names), names
    texts, labels, _ = splits(run_dir)
    shipped = load_peer(run_dir / "peers" / "models", "model2vec")
    assert settings["validation_accuracy"] == float(
        (shipped.predict(texts["validation"]) == labels["validation"]).mean()
    )


def test_tfidf_picks_the_c_with_the_best_validation_accuracy(static_run):
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    texts, labels, _ = splits(static_run["run_dir"])
    cs = [0.5, 4.0, 64.0]
    _, settings = TfidfPeer.train(
        texts["train"], labels["train"], texts["validation"], labels["validation"], cs, seed=0
    )
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True).fit(texts["train"])
    scores = [
        (
            LogisticRegression(C=c, max_iter=5000, random_state=0)
            .fit(vectorizer.transform(texts["train"]), labels["train"])
            .predict(vectorizer.transform(texts["validation"]))
            == labels["validation"]
        ).mean()
        for c in cs
    ]
    assert settings["C"] == cs[int(np.argmax(scores))]
    assert settings["validation_accuracy"] == pytest.approx(max(scores))


def test_a_class_balanced_student_meets_class_balanced_logistic_peers():
    """distill.class_weight: balanced reaches the peers stage: TF-IDF's logistic regression weighs each class by
    n / (classes x count) as the student does (scikit-learn's own "balanced", recorded in its settings), so on
    texts that hold a word of each class the minority class is chosen more often than unweighted."""
    rng = np.random.default_rng(0)
    majority, minority = ["good", "fine", "nice"], ["bad", "poor", "awful"]
    texts = [f"{rng.choice(majority)} {rng.choice(majority)} item {i}" for i in range(180)]
    texts += [f"{rng.choice(minority)} {rng.choice(majority)} item {i}" for i in range(20)]
    labels = np.array([1] * 180 + [0] * 20)
    mixed = [f"{a} {b}" for a in majority for b in minority]
    predictions = {}
    for weight in (None, "balanced"):
        peer, settings = TfidfPeer.train(texts, labels, texts[::5], labels[::5], [1.0], 0, weight)
        assert settings.get("class_weight") == weight
        predictions[weight] = peer.predict(mixed)
    assert (predictions["balanced"] == 0).sum() > (predictions[None] == 0).sum()


def test_fasttext_is_deterministic_and_survives_repeated_fits(static_run):
    """Each fit runs in a fresh process: in one process fastText's second fits stop with 'Encountered NaN'."""
    texts, labels, _ = splits(static_run["run_dir"])
    grid = {"epochs": [5], "word_ngrams": [1, 2], "lr": 0.5, "dim": 50, "buckets": 20000, "cutoff": 1000}
    runs = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as work:
            peer, settings = FastTextPeer.train(
                texts["train"], labels["train"], texts["validation"], labels["validation"], grid, work
            )
            runs.append((peer.predict(texts["test"]), settings))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1] and runs[0][1]["quantized"]


def test_static_peer_features_are_the_sif_weighted_mean(static_run):
    run_dir = static_run["run_dir"]
    peer = load_peer(run_dir / "peers" / "models", "static")
    train = TokenizedSplit(run_dir / "prepare", "train")
    ids = [np.asarray(train.input_ids[i]) for i in range(5)]
    features = StaticPeer.features(peer.vectors, peer.weights, ids)
    for row, tokens in zip(features, ids):
        naive = sum(peer.weights[t] * peer.vectors[t] for t in tokens) / sum(peer.weights[t] for t in tokens)
        np.testing.assert_allclose(row, naive, rtol=1e-4, atol=1e-6)


def test_export_puts_student_teacher_and_peers_side_by_side_from_raw_text(static_run):
    run_dir = static_run["run_dir"]
    metadata = read_json(run_dir / "export" / "bundle" / "metadata.json")
    metrics = read_json(run_dir / "export" / "metrics.json")
    from_text = metadata["from_text"]
    assert from_text == metrics["from_text"] and from_text["measured"]
    rows = {r["model"]: r for r in from_text["rows"]}
    # a static student has two rows: its text-in model and its word model (word_model.py), the one compared with peers
    assert set(rows) == {"student", "student_words", "teacher_int8", "tfidf", "fasttext", "static", "model2vec"}
    peers = read_json(run_dir / "peers" / "peers.json")["peers"]
    for name in peers:  # the peers stage measured them one text per call already: the export reuses it
        assert rows[name]["accuracy"] == peers[name]["accuracy"]
    assert all(0 < r["p25_ms"] <= r["p75_ms"] and r["median_ms"] > 0 for r in rows.values())
    assert rows["teacher_int8"]["speedup"] == 1.0
    # The student's and the int8 teacher's accuracy is the ids-in figure (the same ids from tokenizer.json): it equals
    # running the shipped text-in model on every raw test text, one per call; other ids would be measured again.
    assert from_text["accuracy_from_token_ids"] == ["student", "teacher_int8"]
    records = read_records(run_dir / "prepare")
    max_length = read_json(run_dir / "prepare" / "stats.json")["max_length"]
    names = metadata["labels"]
    index = {name: int(i) for i, name in names.items()}
    labels = np.array([index[str(r["label"])] for r in records])
    run = text_model_runner(run_dir / "export" / "bundle" / metadata["text_model"]["file"])
    assert rows["student"]["accuracy"] == pytest.approx(np.mean([run(r["text"]) for r in records] == labels))
    by_words = word_model_runner(run_dir / "export" / "bundle" / metadata["word_model"]["file"])
    assert rows["student_words"]["accuracy"] == pytest.approx(np.mean([by_words(r["text"]) for r in records] == labels))
    split = TokenizedSplit(run_dir / "prepare", "test")
    tokenizer = run_dir / "distill" / "student" / "tokenizer.json"
    texts = [r["text"] for r in records]
    assert same_ids(tokenizer, texts, max_length, split)
    assert not same_ids(tokenizer, ["an unrelated text", *texts[1:]], max_length, split)
    for row in rows.values():  # paired against the int8 teacher, with the median's interval
        assert row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
    versus = from_text["versus_peers"]
    assert versus["student_row"] == "student_words"
    student = rows["student_words"]
    best = max(peers, key=lambda p: rows[p]["accuracy"])
    assert versus["best_peer"] == best
    assert versus["accuracy_margin_points"] == pytest.approx(
        100 * (student["accuracy"] - rows[best]["accuracy"]), abs=0.01
    )
    best_f1 = max(peers, key=lambda p: rows[p]["macro_f1"])  # may differ from the most accurate: checked apart
    assert versus["best_macro_f1_peer"] == best_f1 and versus["best_peer_macro_f1"] == rows[best_f1]["macro_f1"]
    assert versus["macro_f1_margin_points"] == pytest.approx(
        100 * (student["macro_f1"] - rows[best_f1]["macro_f1"]), abs=0.01
    )
    fastest = min(peers, key=lambda p: rows[p]["median_ms"])
    assert versus["latency_vs_fastest_peer"] == pytest.approx(
        student["median_ms"] / rows[fastest]["median_ms"], rel=0.01
    )
    # the static student went through the bundle like any other: text-in model, evaluation, summary and README
    assert metadata["text_model"]["shipped"]
    assert read_json(run_dir / "evaluate" / "metrics.json")["attention_health"] == {
        "skipped": "the static student has no attention layers"
    }
    assert "from raw text, one text per call" in static_run["stdout"]
    assert "Against TF-IDF, fastText and static embeddings" in (run_dir / "export" / "bundle" / "README.md").read_text()
    student = read_json(run_dir / "distill" / "student" / "config.json")
    assert student["model_type"] == "static-embedding" and student["hidden_size"] == 16


def test_budget_table_and_plot_show_peers_as_references_only(static_run, tmp_path):
    folder = tmp_path / "sweep"
    (folder / "static" / "export").mkdir(parents=True)
    (folder / "static" / "export" / "metrics.json").write_text(
        (static_run["run_dir"] / "export" / "metrics.json").read_text()
    )
    references = reference_points(folder, ["static"])
    assert sorted(r["kind"] for r in references) == ["peer"] * 4 + ["teacher"]
    rows = [
        {
            "variant": "static",
            "description": "d",
            "text_accuracy": 0.7,
            "text_ms": 0.05,
            "mb": 1.0,
            "retention": 0.9,
            "latency_ms": 0.01,
        }
    ]
    table = markdown_table(rows, [], [], "static", references)
    assert table.count("peer (reference, not picked)") == 4
    assert pareto_plot(rows, tmp_path / "ladder.png", "t", "static", references).stat().st_size > 0


def test_a_static_variants_sweep_row_reads_its_word_model_from_raw_text(static_run):
    """The budget table's accuracy and ms from raw text for a static student are its word model's (its fastest
    route), not the int8 text-in model's."""
    run_dir = static_run["run_dir"]
    config = load_config(str(run_dir / "config.yaml"))
    row = variant_row("static", "d", config, run_dir, set(STAGES), 0.0)
    rows = {r["model"]: r for r in read_json(run_dir / "export" / "metrics.json")["from_text"]["rows"]}
    assert row["text_route"] == "word model"
    assert row["text_ms"] == rows["student_words"]["median_ms"] != rows["student"]["median_ms"]
    assert (
        row["text_accuracy"] == rows["student_words"]["accuracy"] and row["text_mb"] == rows["student_words"]["file_mb"]
    )


def test_peers_off_records_that_and_the_export_says_why(tiny_run):
    run_dir = tiny_run["run_dir"]
    assert read_json(run_dir / "peers" / "peers.json") == {"enabled": False, "peers": {}}
    assert read_json(run_dir / "export" / "metrics.json")["from_text"] == {
        "measured": False,
        "why": "peers.enabled is false",
    }
    assert json.loads((run_dir / "export" / "bundle" / "metadata.json").read_text())["from_text"]["measured"] is False
