"""Peers: what a mobile team would ship instead, trained and scored on this run's splits.

TF-IDF + logistic regression, fastText (quantized), model2vec-style static
embeddings from the teacher + logistic regression, and model2vec's own classifier
trained on those static vectors (pipeline/peers.py), each
tuned on the validation split, saved as the one file an app would ship, read
back from that file and scored on the test split one text per call (as an app
calls it): accuracy, macro-F1, file size, training time. The export stage times them one text per call, side by
side with the student and the int8 teacher, and puts them in the bundle's
figures; with ``peers.enabled: false`` this stage records that and trains
nothing.

A peer whose library refuses this run's data (TF-IDF on texts of only emoji and punctuation, fastText's NaN on
a tiny vocabulary at every setting it retries) is skipped with the reason, in peers.json "skipped" and the
log; the other peers and the run go on.

Outputs: models/ (tfidf.npz, fasttext.ftz, static.npz, model2vec.zip: no pickle), peers.json.
"""

from __future__ import annotations

import json
import logging
import tempfile

import numpy as np

from pipeline.metrics import classification_report
from pipeline.models import load_classifier, load_tokenizer
from pipeline.peers import (
    FILES,
    TITLES,
    FastTextPeer,
    Model2VecPeer,
    PeerUnfit,
    StaticPeer,
    TfidfPeer,
    file_mb,
    load_peer,
    timed,
)
from pipeline.splits import TokenizedSplit, label_names
from pipeline.stage_api import Context
from pipeline.static_model import isolated_token_vectors, pca, sif_weights, token_counts

log = logging.getLogger("pipeline")

# distill.class_weight: a class-balanced student is compared with class-balanced logistic regressions (TF-IDF and
# static + LR; fastText and model2vec's trainer have no class weights), or the comparison flatters the student
READS = ["seed", "peers", "distill.class_weight"]
AFTER = ["prepare", "teacher"]
# prepare also writes data.unlabeled_text's rows, which this stage never reads: runs with and without them share it
UNAFFECTED_BY = {"data.unlabeled_text": False, "data.unlabeled_source": None}
VERSION = 3  # bump when the output changes for the same inputs (history: git log)


def run(ctx: Context) -> dict:
    if not ctx.is_main:  # seconds of single-process work
        return {}
    config, cfg = ctx.config, ctx.config.peers
    if not cfg.enabled:
        ctx.write_json("peers.json", {"enabled": False, "peers": {}})
        log.info("[peers] peers.enabled is false: no peers trained")
        return {"enabled": False}
    prepare, teacher_dir = ctx.input("prepare"), ctx.input("teacher")
    names = label_names(prepare)
    texts, labels = read_splits(prepare, names)
    out = ctx.out / "models"
    out.mkdir(exist_ok=True)  # a rerun after an interruption overwrites what it left
    static = StaticInputs(prepare, teacher_dir)  # the teacher's token vectors: computed once for two peers
    weighted = "balanced" if config.distill.class_weight == "balanced" else None
    trainers = {
        "tfidf": lambda: TfidfPeer.train(
            texts["train"],
            labels["train"],
            texts["validation"],
            labels["validation"],
            cfg.tfidf_c,
            config.seed,
            weighted,
        ),
        "fasttext": lambda: fasttext_peer(texts, labels, cfg),
        "static": lambda: static_peer(static, labels, cfg, config.seed, weighted),
        "model2vec": lambda: model2vec_peer(static, texts, labels, cfg, config.seed),
    }
    peers, skipped = {}, {}
    for name in cfg.train:
        try:
            (peer, settings), seconds = timed(trainers[name])
        except PeerUnfit as exc:  # the library refused this run's data: the other peers and the run go on
            skipped[name] = f"{TITLES[name]} not trained on {prepare / 'train.jsonl'}: {exc}"
            log.warning("[peers] %-8s skipped: %s", name, skipped[name])
            continue
        peer.save(out / FILES[name])
        shipped = load_peer(out, name)  # score the file that ships, not the object in memory
        one_per_call = np.array([shipped.predict_one(t) for t in texts["test"]], dtype=np.int64)  # as an app calls it
        report = classification_report(labels["test"], one_per_call, names)
        peers[name] = {
            "title": TITLES[name],
            "file": f"models/{FILES[name]}",
            "file_mb": round(file_mb(out / FILES[name]), 3),
            "train_seconds": round(seconds, 2),
            "settings": settings,
            **report,
        }
        log.info(
            "[peers] %-8s test accuracy %.4f, macro-F1 %.4f, %.1f MB, trained in %.1f s (%s)",
            name,
            report["accuracy"],
            report["macro_f1"],
            peers[name]["file_mb"],
            seconds,
            _settings_line(settings),
        )
    ctx.write_json(
        "peers.json",
        {
            "enabled": True,
            "split": "test",
            "examples": int(len(labels["test"])),
            "peers": peers,
            **({"skipped": skipped} if skipped else {}),
        },
    )
    ctx.log_artifact(ctx.out / "peers.json")
    ctx.log_metrics(
        {
            f"{name}/{key}": peers[name][key]
            for name in peers
            for key in ("accuracy", "macro_f1", "file_mb", "train_seconds")
        }
    )
    if not peers:
        return {"best_peer": None, "best_peer_accuracy": None}
    best = max(peers, key=lambda n: peers[n]["accuracy"])
    return {"best_peer": best, "best_peer_accuracy": peers[best]["accuracy"]}


def read_splits(prepare, names) -> tuple[dict, dict]:
    """Raw texts (a pair joined by a space: the peers read one bag of words) and label ids per split."""
    index = {name: i for i, name in enumerate(names)}
    texts, labels = {}, {}
    for split in ("train", "validation", "test"):
        with open(prepare / f"{split}.jsonl", encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        texts[split] = [r["text"] + (" " + r["text_pair"] if r.get("text_pair") else "") for r in records]
        labels[split] = np.array([index[str(r["label"])] for r in records], dtype=np.int64)
    return texts, labels


def fasttext_peer(texts, labels, cfg):
    with tempfile.TemporaryDirectory() as work:
        return FastTextPeer.train(
            texts["train"], labels["train"], texts["validation"], labels["validation"], cfg.fasttext.model_dump(), work
        )


class StaticInputs:
    """What the static and model2vec peers both start from, computed on first use: each vocabulary token alone
    through the fine-tuned teacher's encoder, the training text's token counts and the tokenized splits."""

    def __init__(self, prepare, teacher_dir):
        self.prepare, self.tokenizer_json = prepare, teacher_dir / "model" / "tokenizer.json"
        self._teacher_dir, self._computed = teacher_dir, None

    def get(self):
        """(isolated token vectors [vocabulary, hidden], training token counts, token ids per split)."""
        if self._computed is None:
            teacher = load_classifier(str(self._teacher_dir / "model")).eval()
            tokenizer = load_tokenizer(str(self._teacher_dir / "model"))
            isolated = isolated_token_vectors(teacher, tokenizer)
            splits = {s: TokenizedSplit(self.prepare, s) for s in ("train", "validation")}
            ids = {s: [np.asarray(x) for x in splits[s].input_ids] for s in splits}
            self._computed = isolated, token_counts(ids["train"], teacher.config.vocab_size), ids
        return self._computed


def static_peer(static: StaticInputs, labels, cfg, seed, class_weight: str | None = None):
    """model2vec's recipe on the fine-tuned teacher: each token alone through the encoder, PCA, SIF weights."""
    isolated, counts, ids = static.get()
    return StaticPeer.train(
        static.tokenizer_json,
        isolated,
        counts,
        min(cfg.static_dim, isolated.shape[1]),
        ids["train"],
        labels["train"],
        ids["validation"],
        labels["validation"],
        cfg.static_c,
        seed,
        class_weight,
    )


def model2vec_peer(static: StaticInputs, texts, labels, cfg, seed):
    """model2vec's trainer on the static peer's vectors (the same PCA width and SIF weights)."""
    isolated, counts, _ = static.get()
    vectors = pca(isolated.astype(np.float64), min(cfg.static_dim, isolated.shape[1])).astype(np.float32)
    return Model2VecPeer.train(
        static.tokenizer_json,
        vectors,
        sif_weights(counts).astype(np.float32),
        texts["train"],
        labels["train"],
        texts["validation"],
        labels["validation"],
        seed,
    )


def _settings_line(settings: dict) -> str:
    return ", ".join(
        f"{k}={v}" for k, v in settings.items() if k not in ("weights", "vectors") and not isinstance(v, (float, dict))
    )
