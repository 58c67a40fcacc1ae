"""What mobile teams ship instead of a transformer, trained on the run's own splits.

Three peers, each a few seconds to a minute of training, each answering in
micro- to milliseconds:

* ``tfidf``: TF-IDF of word 1-2 grams + logistic regression (scikit-learn), C chosen on validation;
* ``fasttext``: fastText supervised (the ``fasttext-numpy2`` build of Facebook's bindings), a small grid
  on validation, then quantized to ``.ftz`` (retrained after quantization), the file mobile apps ship;
* ``static``: model2vec-style static embeddings from the teacher (every vocabulary token through its encoder
  on its own, PCA, SIF frequency weights; pipeline/static_model.py) + logistic regression on the weighted mean;
* ``model2vec``: what a model2vec user ships: the same static vectors (SIF-scaled, as model2vec's distiller
  bakes them) fine-tuned together with a small MLP head by model2vec's own trainer
  (``StaticModelForClassification``, early stopping on validation), saved as its numpy-only
  ``StaticModelPipeline``.

Each peer predicts from raw text (``predict_one``: one text per call, the way an app calls it), saves one file
(its size is what ships) and loads from it. The peers stage trains and scores them; the export times them
side by side with the student and the int8 teacher.

scikit-learn, fastText and tokenizers are imported inside the peer that uses them: a bundle check or a run
with ``peers.enabled: false`` imports this module for its names only and pays for none of them
(scikit-learn alone adds about 1.5 s to start-up here).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from .static_model import pca, sif_weights

PEERS = ("tfidf", "fasttext", "static", "model2vec")
TITLES = {
    "tfidf": "TF-IDF 1-2 grams + logistic regression",
    "fasttext": "fastText supervised (quantized .ftz)",
    "static": "static embeddings from the teacher + logistic regression",
    "model2vec": "model2vec classifier (its trainer, on the teacher's static vectors)",
}
FILES = {"tfidf": "tfidf.npz", "fasttext": "fasttext.ftz", "static": "static.npz", "model2vec": "model2vec.zip"}
_WORDS = re.compile(r"\w+|[^\w\s]")


class PeerUnfit(Exception):
    """A peer that cannot be trained on this run's data (the library refused it): the peers stage skips that
    peer and records this message as the reason."""


def fasttext_line(text: str) -> str:
    """fastText splits on whitespace only: lower-case, punctuation as its own word, one line."""
    return " ".join(_WORDS.findall(text.lower()))


def _best_on_validation(candidates, fit, score):
    """(validation accuracy, setting, model) of the best candidate; ties keep the first (the simplest)."""
    best = None
    for setting in candidates:
        model = fit(setting)
        accuracy = score(model)
        if best is None or accuracy > best[0]:
            best = (accuracy, setting, model)
    return best


# ---------------------------------------------------------------- TF-IDF + logistic regression


class TfidfPeer:
    """Saved without pickle: the vocabulary (JSON), the idf weights and the linear classifier, as a mobile port
    would hold them; loading rebuilds scikit-learn's vectorizer from them."""

    name = "tfidf"
    SETTINGS = {"ngram_range": (1, 2), "sublinear_tf": True, "dtype": np.float32}

    def __init__(self, vectorizer, coef: np.ndarray, bias: np.ndarray):
        self.vectorizer, self.coef, self.bias = vectorizer, coef, bias

    @classmethod
    def train(cls, texts, labels, val_texts, val_labels, cs, seed, class_weight: str | None = None):
        from sklearn.feature_extraction.text import TfidfVectorizer

        vectorizer = TfidfVectorizer(**cls.SETTINGS)
        try:
            features, val_features = vectorizer.fit_transform(texts), vectorizer.transform(val_texts)
        except ValueError as exc:  # "empty vocabulary; perhaps the documents only contain stop words"
            raise PeerUnfit(
                f"TF-IDF found no word to count in the {len(texts)} training texts (scikit-learn: {exc}); "
                "it counts words of two or more letters or digits, and texts of only emoji, punctuation "
                "or single characters have none"
            ) from None
        accuracy, c, classifier = _fit_logistic(
            cs, features, labels, val_features, val_labels, seed, "TF-IDF", class_weight
        )
        coef, bias = _class_scores(classifier)
        return cls(vectorizer, coef, bias), {
            "C": c,
            **({"class_weight": class_weight} if class_weight else {}),
            "ngram_range": [1, 2],
            "validation_accuracy": accuracy,
            "features": len(vectorizer.vocabulary_),
        }

    def predict(self, texts) -> np.ndarray:
        return np.asarray((self.vectorizer.transform(texts) @ self.coef + self.bias).argmax(1)).ravel()

    def predict_one(self, text: str) -> int:
        return int(np.argmax(self.vectorizer.transform([text]) @ self.coef + self.bias))

    def save(self, path: Path) -> None:
        vocabulary = {term: int(i) for term, i in self.vectorizer.vocabulary_.items()}
        with open(path, "wb") as fh:
            # the vocabulary as UTF-8 JSON bytes: a numpy string would store 4 bytes per character
            text = np.frombuffer(json.dumps(vocabulary, ensure_ascii=False).encode("utf-8"), dtype=np.uint8)
            np.savez(fh, vocabulary=text, idf=self.vectorizer.idf_.astype(np.float32), coef=self.coef, bias=self.bias)

    @classmethod
    def load(cls, path: Path):
        from sklearn.feature_extraction.text import TfidfVectorizer

        data = np.load(path, allow_pickle=False)
        vectorizer = TfidfVectorizer(
            vocabulary=json.loads(data["vocabulary"].tobytes().decode("utf-8")), **cls.SETTINGS
        )
        vectorizer.idf_ = data["idf"]
        return cls(vectorizer, data["coef"], data["bias"])


def _fit_logistic(cs, features, labels, val_features, val_labels, seed, what: str, class_weight: str | None = None):
    """(validation accuracy, C, classifier) of the best logistic regression; PeerUnfit when scikit-learn refuses the
    data (one class only, no features, values it cannot take). ``class_weight`` "balanced": each class's loss weighed
    by n / (classes x count), as the student's distill.class_weight does."""
    from sklearn.linear_model import LogisticRegression

    try:
        return _best_on_validation(
            cs,
            lambda c: LogisticRegression(C=c, max_iter=5000, random_state=seed, class_weight=class_weight).fit(
                features, labels
            ),
            lambda m: float((m.predict(val_features) == val_labels).mean()),
        )
    except ValueError as exc:
        raise PeerUnfit(
            f"the logistic regression of the {what} peer cannot be fit on the {len(labels)} training "
            f"texts (scikit-learn: {exc})"
        ) from None


def _class_scores(classifier) -> tuple[np.ndarray, np.ndarray]:
    """A fitted logistic regression as (weights [features, classes], bias [classes]): argmax is its prediction
    (binary: scikit-learn keeps one row, class 1 against class 0)."""
    coef, bias = classifier.coef_, classifier.intercept_
    if coef.shape[0] == 1:
        coef, bias = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], bias])
    return coef.T.astype(np.float32), bias.astype(np.float32)


# ---------------------------------------------------------------- fastText


class FastTextPeer:
    name = "fasttext"

    def __init__(self, model):
        self.model = model

    @staticmethod
    def _write(path, texts, labels):
        with open(path, "w", encoding="utf-8") as fh:
            for text, label in zip(texts, labels):
                fh.write(f"__label__{int(label)} {fasttext_line(text)}\n")

    # On "Encountered NaN" a fit is tried again: lower learning rates first, then a narrow model. Tiny data sets
    # (a few hundred texts, a few dozen distinct words) stop with NaN for some (rate, epochs, n-grams), not
    # monotonically in the rate, and with a small vocabulary at every rate unless the vectors are narrow (dim 10
    # trained where 20 and 100 did not, in one-off probes here). (learning-rate factor, width or None: the grid's)
    RETRIES = ((1.0, None), (0.5, None), (0.25, None), (0.1, None), (0.05, None), (1.0, 10), (0.1, 10))

    @classmethod
    def train(cls, texts, labels, val_texts, val_labels, grid: dict, work: Path):
        """The grid on validation, then the best setting quantized (the next best where quantization refuses it).
        PeerUnfit when no setting trains: fastText's reason for each."""
        from concurrent.futures.process import BrokenProcessPool

        from .fasttext_worker import fit
        from .parent_death import end_with_parent

        work = Path(work)
        train_file, validation_file = work / "fasttext.train.txt", work / "fasttext.validation.txt"
        cls._write(train_file, texts, labels)
        cls._write(validation_file, val_texts, val_labels)
        settings = [
            {"epoch": e, "wordNgrams": n, "lr": grid["lr"], "dim": grid["dim"]}
            for e in grid["epochs"]
            for n in grid["word_ngrams"]
        ]
        names = [f"epochs {s['epoch']}, word n-grams {s['wordNgrams']}" for s in settings]

        def run(setting, target, cutoff=None):  # a fresh process per fit (see pipeline/fasttext_worker.py)
            base, width, tried = setting["lr"], setting["dim"], []
            for factor, narrow in cls.RETRIES:
                if narrow is not None and narrow >= width:
                    continue
                setting["lr"], setting["dim"] = base * factor, narrow or width  # the one used is recorded
                with ProcessPoolExecutor(
                    max_workers=1, mp_context=get_context("spawn"), initializer=end_with_parent, initargs=(os.getpid(),)
                ) as pool:
                    try:
                        return pool.submit(
                            fit, str(train_file), str(validation_file), setting, grid["buckets"], str(target), cutoff
                        ).result()
                    except RuntimeError as exc:
                        if "NaN" not in str(exc):
                            raise PeerUnfit(f"fastText refused the training texts ({exc})") from None
                        tried.append(f"lr {setting['lr']:g} dim {setting['dim']}")
                    except (ValueError, BrokenProcessPool, OSError) as exc:  # "Empty vocabulary", a crashed worker
                        raise PeerUnfit(f"fastText refused the training texts ({type(exc).__name__}: {exc})") from None
            raise PeerUnfit(
                f'fastText reported "Encountered NaN" at every setting tried ({", ".join(tried)}; '
                f"epochs {setting['epoch']}, word n-grams {setting['wordNgrams']}): the "
                f"{len(texts)} training texts are too few or their vocabulary too small for it"
            )

        failed = {}

        def score(i):
            try:
                return run(settings[i], work / f"grid-{i}.bin")["validation_accuracy"]
            except PeerUnfit as exc:
                failed[i] = str(exc)
                return None

        # Each fit is one thread in its own process, so the grid runs one fit per core at once, with the same results.
        with ThreadPoolExecutor(max_workers=max(1, min(len(settings), os.cpu_count() or 1))) as fits:
            scores = list(fits.map(score, range(len(settings))))
        trained = sorted((i for i, s in enumerate(scores) if s is not None), key=lambda i: (-scores[i], i))
        if not trained:  # ties: the first (the simplest)
            raise PeerUnfit(f"no fastText setting of the grid trained: {failed[0]}")
        for best in trained:
            try:
                final = run(settings[best], work / "fasttext.ftz", grid["cutoff"])
                break
            except PeerUnfit as exc:  # "Matrix too small for quantization" (fewer than 256 words and n-gram rows)
                failed[best] = f"quantized: {exc}"
        else:
            raise PeerUnfit(f"no fastText model of the grid could be quantized to .ftz: {failed[trained[0]]}")
        peer = cls.load(work / "fasttext.ftz")
        narrowed = {
            names[i]: (
                f"trained at width {settings[i]['dim']} (lr {settings[i]['lr']:g}): fastText said "
                f'"Encountered NaN" at width {grid["dim"]} at every learning rate tried'
            )
            for i in trained
            if settings[i]["dim"] != grid["dim"]
        }
        return peer, {
            **settings[best],
            "quantized": True,
            "cutoff": grid["cutoff"],
            "validation_accuracy": scores[best],
            "validation_accuracy_quantized": final["validation_accuracy"],
            **({"narrowed": narrowed} if narrowed else {}),
            **({"not_trained": {names[i]: why for i, why in sorted(failed.items())}} if failed else {}),
        }

    def predict(self, texts) -> np.ndarray:
        return np.array([self.predict_one(t) for t in texts], dtype=np.int64)

    def predict_one(self, text: str) -> int:
        labels, _ = self.model.predict(fasttext_line(text), k=1)
        return int(labels[0][len("__label__") :])

    def save(self, path: Path) -> None:
        self.model.save_model(str(path))

    @classmethod
    def load(cls, path: Path):
        import fasttext

        return cls(fasttext.load_model(str(path)))


# ---------------------------------------------------------------- static embeddings + logistic regression


class StaticPeer:
    """model2vec-style: SIF-weighted mean of the text's token vectors, then a linear classifier."""

    name = "static"

    def __init__(
        self, tokenizer_json: Path, vectors: np.ndarray, weights: np.ndarray, coef: np.ndarray, bias: np.ndarray
    ):
        from tokenizers import Tokenizer

        self.tokenizer_json = Path(tokenizer_json)
        self.tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self.tokenizer.no_padding()
        self.vectors, self.weights, self.coef, self.bias = vectors, weights, coef, bias

    @staticmethod
    def features(vectors, weights, ids_list) -> np.ndarray:
        out = np.zeros((len(ids_list), vectors.shape[1]), dtype=np.float32)
        for row, ids in enumerate(ids_list):
            w = weights[ids]
            out[row] = w @ vectors[ids] / max(float(w.sum()), 1e-9)
        return out

    @classmethod
    def train(
        cls,
        tokenizer_json,
        isolated,
        counts,
        dim,
        train_ids,
        labels,
        val_ids,
        val_labels,
        cs,
        seed,
        class_weight: str | None = None,
    ):
        vectors = pca(isolated.astype(np.float64), dim).astype(np.float32)
        weights = sif_weights(counts).astype(np.float32)
        features, val_features = cls.features(vectors, weights, train_ids), cls.features(vectors, weights, val_ids)
        accuracy, c, classifier = _fit_logistic(
            cs, features, labels, val_features, val_labels, seed, "static-embedding", class_weight
        )
        peer = cls(tokenizer_json, vectors, weights, *_class_scores(classifier))
        return peer, {
            "C": c,
            **({"class_weight": class_weight} if class_weight else {}),
            "dim": dim,
            "weights": "SIF a=1e-3 from training-text token counts",
            "vectors": "each token alone through the teacher's encoder ([CLS] token [SEP]), PCA",
            "validation_accuracy": accuracy,
        }

    def predict(self, texts) -> np.ndarray:
        return np.array([self.predict_one(t) for t in texts], dtype=np.int64)

    def predict_one(self, text: str) -> int:
        ids = self.tokenizer.encode(text).ids
        w = self.weights[ids]
        pooled = w @ self.vectors[ids] / max(float(w.sum()), 1e-9)
        return int(np.argmax(pooled @ self.coef + self.bias))

    def save(self, path: Path) -> None:
        # fp16 vectors: what an app would ship (the classifier was fit on them in fp32; checked in the tests)
        with open(path, "wb") as fh:
            np.savez(
                fh,
                vectors=self.vectors.astype(np.float16),
                weights=self.weights.astype(np.float16),
                coef=self.coef,
                bias=self.bias,
                tokenizer=self.tokenizer_json.read_text(encoding="utf-8"),
            )

    @classmethod
    def load(cls, path: Path):
        data = np.load(path, allow_pickle=False)
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer = Path(tmp) / "tokenizer.json"
            tokenizer.write_text(str(data["tokenizer"]), encoding="utf-8")
            return cls(
                tokenizer,
                data["vectors"].astype(np.float32),
                data["weights"].astype(np.float32),
                data["coef"],
                data["bias"],
            )


# ---------------------------------------------------------------- model2vec's own classifier


class Model2VecPeer:
    """model2vec's ``StaticModelForClassification`` on the static peer's vectors: the embeddings and the token
    weights are trained with the head (its default: one hidden layer of 512), then converted to its inference
    pipeline. The pipeline's folder (safetensors and JSON, no pickle) is stored in one zip without compression,
    so the file size is what an app ships."""

    name = "model2vec"

    def __init__(self, pipeline):
        self.pipeline = pipeline

    @classmethod
    def train(cls, tokenizer_json, vectors, weights, texts, labels, val_texts, val_labels, seed):
        """``vectors`` [vocabulary, dim] and ``weights`` [vocabulary] as the static peer computed them."""
        from model2vec import StaticModel
        from model2vec.train import StaticModelForClassification
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_json))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        # model2vec's distiller multiplies each token's vector by its SIF weight and normalizes the mean
        static = StaticModel(
            vectors=(vectors * weights[:, None]).astype(np.float32),
            tokenizer=tokenizer,
            normalize=True,
            base_model_name="the run's teacher",
        )
        classifier = StaticModelForClassification.from_static_model(model=static, out_dim=int(labels.max()) + 1)
        try:
            classifier.fit(
                list(texts),
                [int(y) for y in labels],
                X_val=list(val_texts),
                y_val=[int(y) for y in val_labels],
                random_seed=seed,
                device="cpu",
            )
        except ValueError as exc:  # model2vec's checks of the data (one class only, empty texts)
            raise PeerUnfit(f"model2vec's trainer refused the training texts ({exc})") from None
        peer = cls(classifier.to_pipeline())
        val_accuracy = float((peer.predict(val_texts) == np.asarray(val_labels)).mean())
        return peer, {
            "dim": int(vectors.shape[1]),
            "head": "model2vec default (1 hidden layer of 512, ReLU); embeddings and token weights trained",
            "vectors": "the static peer's (each token alone through the teacher, PCA), scaled by SIF weights",
            "early_stopping": "model2vec's (validation accuracy, patience 5)",
            "validation_accuracy": val_accuracy,
        }

    def predict(self, texts) -> np.ndarray:
        return np.array([self.predict_one(t) for t in texts], dtype=np.int64)

    def predict_one(self, text: str) -> int:
        return int(self.pipeline.predict([text], use_multiprocessing=False)[0])

    def save(self, path: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            self.pipeline.save_pretrained(tmp)
            with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
                for file in sorted(Path(tmp).rglob("*")):
                    if file.is_file():
                        archive.write(file, file.relative_to(tmp).as_posix())

    @classmethod
    def load(cls, path: Path):
        from model2vec.inference import StaticModelPipeline

        with tempfile.TemporaryDirectory() as tmp:
            with zipfile.ZipFile(path) as archive:
                archive.extractall(tmp)
            return cls(StaticModelPipeline.from_pretrained(tmp))


LOADERS: dict[str, Any] = {
    "tfidf": TfidfPeer,
    "fasttext": FastTextPeer,
    "static": StaticPeer,
    "model2vec": Model2VecPeer,
}


def load_peer(folder: Path, name: str):
    return LOADERS[name].load(Path(folder) / FILES[name])


def timed(fn):
    """(result, seconds) of fn()."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def file_mb(path: Path) -> float:
    return os.path.getsize(path) / 1e6
