"""End-to-end: the `tiny` config through all seven stages, skip logic, MLflow contents."""

from __future__ import annotations

import json
import shutil

import mlflow
import numpy as np
from transformers import AutoModelForSequenceClassification

from pipeline.config import load_config
from pipeline.runner import STAGES, fingerprints, read_manifest, resolve_precision, stage_status
from pipeline.splits import label_names
from tests.helpers import read_json, run_cli


def test_every_stage_output_exists(tiny_run):
    run_dir = tiny_run["run_dir"]
    for stage in STAGES:
        manifest = read_manifest(run_dir / stage)
        assert manifest is not None and manifest["stage"] == stage
        assert not (run_dir / f"{stage}.partial").exists()
    for split in ("train", "validation", "test"):
        first = json.loads((run_dir / "prepare" / f"{split}.jsonl").open().readline())
        assert set(first) == {"text", "label"} and first["label"] in {"fresh", "rotten"}
    for folder in (run_dir / "teacher" / "model", run_dir / "distill" / "student"):
        model = AutoModelForSequenceClassification.from_pretrained(folder)
        assert model.config.num_labels == 2 and (folder / "model.safetensors").is_file()
    metrics = read_json(run_dir / "evaluate" / "metrics.json")
    # the recorded figures are those of the recorded predictions (and the test split: the labels are prepare's)
    predictions = [json.loads(line) for line in (run_dir / "evaluate" / "predictions.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (run_dir / "prepare" / "test.jsonl").read_text().splitlines() if line]
    assert [p["label"] for p in predictions] == [r["label"] for r in test]
    for who in ("teacher", "student"):
        assert metrics[who]["accuracy"] == sum(p[who] == p["label"] for p in predictions) / len(predictions)
    assert abs(metrics["retention"] - metrics["student"]["accuracy"] / metrics["teacher"]["accuracy"]) < 1e-9
    # evaluate reads the teacher stage's test logits (one teacher pass over the test split a run): the same figures
    names = label_names(run_dir / "prepare")
    logits = np.load(run_dir / "teacher" / "test_logits.npy")
    assert logits.shape == (len(test), 2) and logits.dtype == np.float32
    assert [names[i] for i in logits.argmax(-1)] == [p["teacher"] for p in predictions]
    assert metrics["teacher"]["accuracy"] == read_json(run_dir / "teacher" / "metrics.json")["test_accuracy"]
    export = read_json(run_dir / "export" / "export.json")
    assert export["parity_max_abs_diff"] < 1e-3 and (run_dir / "export" / "bundle" / "model.onnx").is_file()
    capture = read_json(run_dir / "capture" / "capture.json")
    assert capture["bytes_per_example"] > 0 and capture["examples"] == 260
    assert (run_dir / "config.yaml").read_text().startswith("name: tiny")


def test_mlflow_has_parent_with_a_nested_run_per_stage(tiny_run):
    client = mlflow.MlflowClient(f"sqlite:///{tiny_run['runs_dir'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("attention_distill.role") == "pipeline"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.params["distill.epochs"] == "2"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in children) == sorted(STAGES)
    by_name = {r.info.run_name: r for r in children}
    assert "train/loss" in by_name["distill"].data.metrics
    assert "student/accuracy" in by_name["evaluate"].data.metrics
    assert all(r.info.status == "FINISHED" for r in children)
    artifacts = [a.path for a in client.list_artifacts(parent.info.run_id, "config")]
    assert artifacts == ["config/resolved.yaml"]


def test_second_run_does_no_stage_work(tiny_run):
    before = {s: read_manifest(tiny_run["run_dir"] / s)["completed_at"] for s in STAGES}
    result = run_cli("run", "tiny", runs_dir=tiny_run["runs_dir"])
    assert result.returncode == 0, result.stderr
    assert "nothing to do" in result.stderr
    after = {s: read_manifest(tiny_run["run_dir"] / s)["completed_at"] for s in STAGES}
    assert before == after


def test_a_key_added_later_leaves_finished_runs_current_while_unset(monkeypatch):
    """student.attention_heads, student.static.bigram_buckets, distill.class_weight and data.split_lines came after
    runs existed: unset (None, 0, 'none', false), the fingerprints are those of a config without them."""
    import pipeline.runner as runner

    unset = fingerprints(load_config("tiny"))
    monkeypatch.setattr(runner, "ADDED_KEYS", {})  # the keys hashed like any other: None and 0 are values
    hashed = fingerprints(load_config("tiny"))
    assert hashed["distill"] != unset["distill"]
    assert hashed["prepare"] != unset["prepare"]  # data.split_lines, through prepare's own fingerprint_inputs
    monkeypatch.undo()
    student = runner._reads(load_config("tiny"), ["student"])["student"]
    assert "attention_heads" not in student and "bigram_buckets" not in student["static"]
    assert "class_weight" not in runner._reads(load_config("tiny"), ["distill"])["distill"]
    balanced = fingerprints(load_config("tiny", ["distill.class_weight=balanced"]))
    assert [s for s in STAGES if balanced[s] != unset[s]] == ["peers", "distill", "evaluate", "export"]
    static = [
        "student.kind=static",
        "student.ffn_size=null",
        "distill.loss.attention=0",
        "distill.loss.value_relation=0",
    ]
    tokens_only = fingerprints(load_config("tiny", static))
    with_pairs = fingerprints(load_config("tiny", [*static, "student.static.bigram_buckets=64"]))
    assert [s for s in STAGES if with_pairs[s] != tokens_only[s]] == ["distill", "evaluate", "export"]
    with_hidden = fingerprints(load_config("tiny", [*static, "student.static.hidden=32"]))
    assert [s for s in STAGES if with_hidden[s] != tokens_only[s]] == ["distill", "evaluate", "export"]
    assert "hidden" not in runner._reads(load_config("tiny", static), ["student"])["student"]["static"]
    narrowed = fingerprints(load_config("tiny", ["student.attention_heads=2", "distill.relation_heads=2"]))
    full_width = fingerprints(load_config("tiny", ["distill.relation_heads=2"]))
    assert [s for s in STAGES if narrowed[s] != full_width[s]] == ["distill", "evaluate", "export"]


def test_changing_a_key_reruns_only_downstream_fingerprints(tmp_path):
    base = fingerprints(load_config("tiny"))
    changed = fingerprints(load_config("tiny", ["distill.epochs=1"]))
    assert [s for s in STAGES if base[s] != changed[s]] == ["distill", "evaluate", "export"]
    teacher_change = fingerprints(load_config("tiny", ["teacher.lr=0.002"]))
    assert [s for s in STAGES if base[s] != teacher_change[s]] == [
        "teacher",
        "peers",
        "capture",
        "distill",
        "evaluate",
        "export",
    ]
    # the peers depend on the data and the teacher only: a student change keeps them
    static = fingerprints(
        load_config(
            "tiny",
            [
                "student.kind=static",
                "student.static.dim=16",
                "distill.loss.attention=0",
                "distill.loss.value_relation=0",
            ],
        )
    )
    assert [s for s in STAGES if base[s] != static[s]] == ["capture", "distill", "evaluate", "export"]
    # static students of one capture share the teacher's token statistics it saves (static_init.npz): another width
    # or seed reruns distill on; leaving out the in-context pass is another capture
    static_keys = ["student.kind=static", "distill.loss.attention=0", "distill.loss.value_relation=0"]
    for other in (["student.static.dim=8"], ["distill.seed=7"]):
        changed = fingerprints(load_config("tiny", [*static_keys, "student.static.dim=16", *other]))
        assert [s for s in STAGES if static[s] != changed[s]] == ["distill", "evaluate", "export"], other
    no_context = fingerprints(
        load_config("tiny", [*static_keys, "student.static.dim=16", "student.static.context=false"])
    )
    assert [s for s in STAGES if static[s] != no_context[s]] == ["capture", "distill", "evaluate", "export"]
    assert [s for s in STAGES if base[s] != fingerprints(load_config("tiny", ["peers.static_dim=8"]))[s]] == [
        "peers",
        "export",
    ]
    loss_weight = fingerprints(load_config("tiny", ["distill.loss.attention=2.0"]))
    assert [s for s in STAGES if base[s] != loss_weight[s]] == ["distill", "evaluate", "export"]
    # A deeper student matched to the same teacher layer reuses the teacher cache ...
    deeper = fingerprints(load_config("tiny", ["student.teacher_layers=[0,1]"]))
    assert [s for s in STAGES if base[s] != deeper[s]] == ["distill", "evaluate", "export"]
    # ... while matching another teacher layer needs other targets.
    other_layer = fingerprints(load_config("tiny", ["distill.layer_map=[[0,0]]"]))
    assert [s for s in STAGES if base[s] != other_layer[s]] == ["capture", "distill", "evaluate", "export"]
    # In-domain text without labels: prepare writes it and capture labels it, but the teacher and the peers never
    # read it (their UNAFFECTED_BY), so they are shared with the run without it (a base teacher is an hour).
    unlabeled = fingerprints(load_config("tiny", ["data.unlabeled_text=true"]))
    assert [s for s in STAGES if base[s] != unlabeled[s]] == ["prepare", "capture", "distill", "evaluate", "export"]
    # So is a file of its own (data.unlabeled_source)
    corpus_file = tmp_path / "corpus.csv"
    corpus_file.write_text("text\nAn unlabelled sentence.\n", encoding="utf-8")
    source = f"{{path: {corpus_file}, sentences: true}}"
    from_file = fingerprints(load_config("tiny", ["data.unlabeled_text=true", f"data.unlabeled_source={source}"]))
    assert [s for s in STAGES if unlabeled[s] != from_file[s]] == [
        "prepare",
        "capture",
        "distill",
        "evaluate",
        "export",
    ]
    assert from_file["teacher"] == base["teacher"] and from_file["peers"] == base["peers"]
    # ... and the file's contents count: an edited file is prepared again
    corpus_file.write_text("text\nAn unlabelled sentence.\nAnd another one.\n", encoding="utf-8")
    edited_source = fingerprints(load_config("tiny", ["data.unlabeled_text=true", f"data.unlabeled_source={source}"]))
    assert [s for s in STAGES if edited_source[s] != from_file[s]] == [
        "prepare",
        "capture",
        "distill",
        "evaluate",
        "export",
    ]
    # ... and a teacher change still reaches them with it on
    both = fingerprints(load_config("tiny", ["data.unlabeled_text=true", "teacher.lr=0.002"]))
    assert both["teacher"] == teacher_change["teacher"] and both["peers"] == teacher_change["peers"]
    # A word list for the static student's word model changes the export alone
    listed = fingerprints(load_config("tiny", [*static_keys, "student.static.dim=16", "export.word_list=words.txt"]))
    assert [s for s in STAGES if static[s] != listed[s]] == ["export"]
    # ... and so do a corpus's words for its table, and the corpus file's contents
    reviews = tmp_path / "reviews.csv"
    reviews.write_text("text\nA fine film\n", encoding="utf-8")
    corpus = f"export.word_corpus={{path: {reviews}, min_count: 2}}"
    from_corpus = fingerprints(load_config("tiny", [*static_keys, "student.static.dim=16", corpus]))
    assert [s for s in STAGES if static[s] != from_corpus[s]] == ["export"]
    reviews.write_text("text\nA fine film\nAnother one\n", encoding="utf-8")
    edited = fingerprints(load_config("tiny", [*static_keys, "student.static.dim=16", corpus]))
    assert [s for s in STAGES if edited[s] != from_corpus[s]] == ["export"]
    # a transformer student has no word model: both settings leave its run current
    for setting in (corpus, "export.word_list=words.txt"):
        assert fingerprints(load_config("tiny", [setting])) == base, setting


def test_status_lists_every_stage(tiny_run):
    result = run_cli("status", "tiny", runs_dir=tiny_run["runs_dir"])
    assert result.returncode == 0
    for stage in STAGES:
        assert any(line.startswith(stage) and " done " in line for line in result.stdout.splitlines()), result.stdout
    # a changed key: its stage and those after it are stale (in-process: the command's own path is the call above)
    config = load_config("tiny", ["distill.epochs=1"])
    config = config.model_copy(update={"precision": resolve_precision(config.precision)})  # as the command does
    states = {row["stage"]: row["state"] for row in stage_status(config, tiny_run["runs_dir"])}
    assert states == {**dict.fromkeys(STAGES[:4], "done"), **dict.fromkeys(["distill", "evaluate", "export"], "stale")}


def test_capture_stores_every_example_at_its_own_index(tiny_run):
    """Capture runs its batches sorted by length; the cache must still hold example i at index i."""
    import numpy as np

    from pipeline.cache import TeacherCache
    from pipeline.config import load_config
    from pipeline.models import load_classifier
    from pipeline.objective import target_plan, teacher_targets, vectors_to_probs
    from pipeline.runner import Distributed
    from pipeline.splits import TrainingData, pad_id

    run_dir = tiny_run["run_dir"]
    train = TrainingData(run_dir / "prepare")
    cache = TeacherCache(run_dir / "capture" / "cache")
    stored = [
        cache.shards[shard][1]["lengths"][position] for shard, position in (cache.where[i] for i in range(len(train)))
    ]
    assert stored == train.lengths.tolist()
    # Recompute a shuffled batch's targets directly (same precision as the run) and compare with the cache.
    config = load_config("tiny")
    teacher = load_classifier(str(run_dir / "teacher" / "model")).eval()
    plan = target_plan(config, teacher.config)
    picked = np.random.default_rng(0).permutation(len(train))[:40]
    batch = train.batch(picked, pad_id(run_dir / "prepare"), "cpu")
    with Distributed(config).accelerator.autocast():
        direct = teacher_targets(teacher, batch, plan)
    cached = cache.batch(picked, batch["input_ids"].shape[1], "cpu")
    error = (cached["logits"] - direct["logits"]).abs().max().item()
    shifted = (cached["logits"] - direct["logits"].roll(1, 0)).abs().max().item()
    assert error < 0.05 and error < shifted / 10, (error, shifted)
    # The attention relation too, whichever form (probabilities or Q/K vectors) the cache chose.
    t = plan.teacher_layers[0]
    kind, value = cached[f"attn.{t}"]
    probs = value if kind == "probs" else vectors_to_probs(value, batch["attention_mask"], plan.relation_heads)
    expected = vectors_to_probs(direct[f"attn.{t}"][1], batch["attention_mask"], plan.relation_heads)
    assert (probs.float() - expected.float()).abs().max().item() < 0.02


def test_unlabeled_text_reruns_prepare_and_capture_but_never_the_teacher(tiny_run, tmp_path):
    """data.unlabeled_text on, in a finished run folder: prepare writes the unlabelled rows and capture labels them,
    while the teacher and the peers (which never read them) stay done; off again, the same. Real processes."""
    runs_dir = tmp_path / "runs"
    shutil.copytree(tiny_run["run_dir"], runs_dir / "tiny", ignore=shutil.ignore_patterns("export", "evaluate"))
    teacher = json.loads((runs_dir / "tiny" / "teacher" / "manifest.json").read_text())
    corpus = tmp_path / "reviews.csv"  # data.unlabeled_source: a file of its own, cut into sentences
    corpus.write_text(
        'text\n"A quiet, moving film. The score lingers long after."\n"Two hours I will never get back."\n'
    )
    source = f"data.unlabeled_source={{path: '{corpus}', sentences: true}}"
    for settings in (["data.unlabeled_text=true"], ["data.unlabeled_text=true", source], ["data.unlabeled_text=false"]):
        result = run_cli("run", "tiny", *settings, "--to", "capture", runs_dir=runs_dir)
        assert result.returncode == 0, result.stderr[-4000:]
        log = result.stderr
        assert "[prepare] running" in log and "[capture] running" in log, log[-3000:]
        assert "[teacher] up to date" in log and "[peers] up to date" in log, log[-3000:]
        assert json.loads((runs_dir / "tiny" / "teacher" / "manifest.json").read_text()) == teacher
        unlabeled = runs_dir / "tiny" / "prepare" / "unlabeled.jsonl"
        assert unlabeled.is_file() == (settings[0] == "data.unlabeled_text=true")
        if source in settings:
            texts = [json.loads(line)["text"] for line in unlabeled.read_text().splitlines()]
            assert texts == [
                "A quiet, moving film.",
                "The score lingers long after.",
                "Two hours I will never get back.",
            ]
