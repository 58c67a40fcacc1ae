#!/usr/bin/env python3
"""Reference classifier for this bundle: onnxruntime + tokenizers + numpy, nothing else.

It is the executable specification of how to call the model: tokenize with
tokenizer.json (the model, normalization and special-token template it holds,
e.g. WordPiece "[CLS] text [SEP]" or byte-level BPE "<s> text </s>"; see
metadata.json "tokenizer" and README.md), truncated to metadata max_length, pad
with the pad token (metadata.json tokenizer.special_tokens.pad), feed int64
input_ids and attention_mask (and, for a sentence-pair model whose graph has a
third input, token_type_ids: the encoding's type ids, 0 for the first text and
its special tokens, 1 for the second), apply softmax to the logits. Port this
file, not the training code.

    pip install onnxruntime tokenizers numpy
    python predict.py "a gripping, beautifully acted film" "a tedious mess"
    python predict.py --model model.int8.onnx --eval test.jsonl      # accuracy on {"text", "label"} records
    python predict.py --model model.int8.ort "works with the ORT format file too"
    python predict.py --model model.int8.pte "an ExecuTorch program (needs: pip install executorch)"
    python predict.py "a man is eating" --pair "someone eats"   # a sentence pair: one --pair per text, in order
    python predict.py --verify          # check every bundle file against metadata.json's sha256 (exit 2 naming a bad one)
    python predict.py --verify "..."    # the same check, then classify

An empty text is valid: it is classified as its special tokens alone ("[CLS] [SEP]", "<s> </s>").
The model file's sha256 is checked against metadata.json on every run: a
mismatch is a warning. --verify checks every file metadata.json lists (models,
tokenizer, labels, README...) before anything runs and stops at a missing or
changed one, or at a file in the bundle folder that metadata.json does not list.
A model file other than the one metadata.json records is first loaded and run
once in a child process: a runtime that aborts on a damaged file (ExecuTorch
does on a .pte of random bytes) ends only that process, and the error names the
file.

Exit codes: 0 ok; 2 bad arguments, bundle files, --eval file, or (with
--verify) a bundle file that is missing or whose sha256 is not the one in
metadata.json. Errors are one "error: ..." message on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
REBUILD = "re-download or re-export the bundle"


class PredictError(ValueError):
    """A bad bundle file or input file; the message names it and says what is expected."""


def read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: bad UTF-8 or bad JSON
        raise PredictError(f"{path} is not readable JSON ({exc}); {REBUILD}") from None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pad_token_id(tokenizer: dict) -> int:
    """The pad token's id: metadata.json tokenizer.special_tokens.pad (by role), else the older special_token_ids["[PAD]"]."""
    roles = tokenizer.get("special_tokens") or {}
    if "pad" in roles:
        return int(roles["pad"]["id"])
    return int(tokenizer["special_token_ids"]["[PAD]"])  # bundles written before roles were recorded


class BundleClassifier:
    """Tokenizer + ONNX Runtime session + label names, all read from the bundle folder.

    Raises PredictError (a ValueError) naming the file when the bundle or model cannot be used.
    ``sha256`` / ``recorded_sha256`` are the model file's digest and the one metadata.json records
    for it (None for a file metadata.json does not list, such as a model outside the bundle).
    """

    session: Any  # an onnxruntime InferenceSession, or an ExecuTorchSession (same run()) for a .pte

    def __init__(self, bundle: Path = HERE, model: str | None = None, threads: int | None = None, probe: bool = True):
        bundle = Path(bundle)
        if not bundle.is_dir():
            problem = "is not a folder" if bundle.exists() else "does not exist"
            raise PredictError(f"bundle folder {bundle} {problem} (expected the folder holding metadata.json)")
        for name in ("metadata.json", "labels.json", "tokenizer.json"):
            if not (bundle / name).is_file():
                raise PredictError(
                    f"{bundle / name} is missing: a bundle folder holds metadata.json, labels.json, "
                    f"tokenizer.json and the model files; {REBUILD}"
                )
        self.metadata = read_json(bundle / "metadata.json")
        labels = read_json(bundle / "labels.json")
        try:
            self.labels = [labels[str(i)] for i in range(len(labels))]
        except (KeyError, TypeError):
            raise PredictError(f'{bundle / "labels.json"} must map "0", "1", ... to label names; {REBUILD}') from None
        try:
            self.max_length = int(self.metadata["max_length"])
            self.pad_id = pad_token_id(self.metadata["tokenizer"])
            variants = self.metadata["variants"]
            if model is None:  # the recommended file, as metadata.json names it: it must be a file of this bundle
                model = variants[self.metadata["recommended"]]["file"]
                if not inside_bundle(bundle, model):
                    raise PredictError(
                        f"metadata.json names {model!r} as the recommended model, which is not a file "
                        f"inside the bundle folder {bundle}: refusing to load it; {REBUILD}"
                    )
            path = Path(model) if Path(model).is_absolute() or Path(model).exists() else bundle / model
            inside = path.resolve().parent == bundle.resolve()  # a digest describes the bundle's own file only
            self.recorded_sha256 = self.metadata.get("files", {}).get(path.name, {}).get("sha256") if inside else None
            shipped = sorted(
                {v[k] for v in variants.values() for k in ("file", "ort_file") if v.get(k)}
                | {v["file"] for v in (self.metadata.get("executorch") or {}).get("variants", {}).values()}
            )
            self.text_pairs = self.metadata.get("text_pairs")  # None in bundles older than the field: not checked
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PredictError(
                f"{bundle / 'metadata.json'} is incomplete ({type(exc).__name__}: {exc}); {REBUILD}"
            ) from None
        try:
            self.tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a bare Exception
            raise PredictError(f"{bundle / 'tokenizer.json'} is not a tokenizers file ({exc}); {REBUILD}") from None
        self.tokenizer.enable_truncation(self.max_length)  # same cut as training: specials + tokens <= max_length
        self.tokenizer.no_padding()  # padding is done per batch below, only up to the longest text
        if not path.is_file():
            raise PredictError(f"model file {path} does not exist; this bundle's models: {', '.join(shipped)}")
        self.model_path = path
        try:
            self.sha256 = sha256_file(path)
        except OSError as exc:
            raise PredictError(f"cannot read model file {path}: {exc.strerror or exc}") from None
        self.executorch = path.suffix == ".pte"
        if probe and self.sha256 != self.recorded_sha256:  # not the file the export wrote and ran: try it elsewhere
            probe_model(bundle, path, self.recorded_sha256 is not None)
        if self.executorch:  # an ExecuTorch program: batch 1, input_ids and attention_mask
            self.session, self.segments = ExecuTorchSession(path, threads), False
            return
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Exception subclasses (InvalidProtobuf, Fail, ...)
            damaged = (
                f"; its sha256 differs from metadata.json, so the file is damaged: {REBUILD}"
                if self.recorded_sha256 not in (None, self.sha256)
                else ""
            )
            raise PredictError(
                f"{path} is not an ONNX or ORT-format model onnxruntime {ort.__version__} can load "
                f"({str(exc).strip()}){damaged}"
            ) from None
        inputs = [i.name for i in self.session.get_inputs()]
        if inputs not in (
            ["input_ids", "attention_mask"],
            ["input_ids", "attention_mask", "token_type_ids"],
        ) or "logits" not in [o.name for o in self.session.get_outputs()]:
            raise PredictError(
                f"{path} is not this bundle's classifier: inputs {inputs}, outputs "
                f"{[o.name for o in self.session.get_outputs()]} "
                "(expected input_ids, attention_mask[, token_type_ids] -> logits)"
            )
        self.segments = "token_type_ids" in inputs  # a sentence-pair model with segment embeddings

    def encode(self, texts: list[str], pairs: list[str] | None = None) -> dict:
        """int64 input_ids / attention_mask, right-padded with the pad token to the longest text of the batch;
        token_type_ids too (padded with 0) when the model takes them."""
        items = list(zip(texts, pairs)) if pairs is not None else list(texts)
        encodings = self.tokenizer.encode_batch(items)
        longest = max(len(e.ids) for e in encodings)
        input_ids = np.full((len(encodings), longest), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(encodings), longest), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            input_ids[row, : len(encoding.ids)] = encoding.ids
            attention_mask[row, : len(encoding.ids)] = 1
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.segments:
            feeds["token_type_ids"] = np.zeros((len(encodings), longest), dtype=np.int64)
            for row, encoding in enumerate(encodings):
                feeds["token_type_ids"][row, : len(encoding.type_ids)] = encoding.type_ids
        return feeds

    def logits(self, texts: list[str], pairs: list[str] | None = None, batch_size: int = 1) -> np.ndarray:
        if batch_size < 1:  # a negative step would silently classify nothing
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        if self.text_pairs is False and pairs is not None:
            raise PredictError(
                "this bundle's model classifies single texts (metadata.json text_pairs: false), but a "
                "second text was given (--pair, or text_pair in the --eval records): drop it"
            )
        if self.text_pairs and pairs is None and texts:
            raise PredictError(
                "this bundle's model classifies sentence pairs (metadata.json text_pairs: true): give "
                "one --pair per text (or text_pair in every --eval record)"
            )
        if self.executorch:
            batch_size = 1  # a .pte takes one text per call
        parts = []
        for start in range(0, len(texts), batch_size):
            batch_pairs = pairs[start : start + batch_size] if pairs is not None else None
            parts.append(self.session.run(["logits"], self.encode(texts[start : start + batch_size], batch_pairs))[0])
        return np.concatenate(parts) if parts else np.zeros((0, len(self.labels)), dtype=np.float32)

    def predict(self, texts: list[str], pairs: list[str] | None = None, batch_size: int = 1) -> list[dict]:
        logits = self.logits(texts, pairs, batch_size)
        shifted = np.exp(logits - logits.max(-1, keepdims=True))
        probs = shifted / shifted.sum(-1, keepdims=True)  # softmax: logits -> probabilities
        return [
            {"label": self.labels[int(p.argmax())], "probabilities": dict(zip(self.labels, map(float, p)))}
            for p in probs
        ]


JSON_TYPES = {
    dict: "object",
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def read_jsonl(path: Path) -> list[dict]:
    """Records {"text": str, "label": str[, "text_pair": str]}, one JSON object a line (blank lines skipped)."""
    expected = 'one JSON object a line, {"text": <string>, "label": <label name>} (optionally "text_pair": <string>)'
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()  # -sig: a leading BOM is not part of line 1
    except FileNotFoundError:
        raise PredictError(f"--eval file {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise PredictError(f"--eval file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise PredictError(f"cannot read --eval file {path}: {exc.strerror or exc}") from None
    records: list[dict] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"--eval file {path} line {number}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise PredictError(f"{where} is not JSON ({exc}); expected {expected}") from None
        if not isinstance(record, dict):
            raise PredictError(f"{where} is a JSON {JSON_TYPES[type(record)]}; expected {expected}")
        for key in ("text", "label"):
            if not isinstance(record.get(key), str):
                problem = "has no" if key not in record else f"has a {JSON_TYPES[type(record[key])]} as"
                raise PredictError(f'{where} {problem} "{key}"; expected {expected}')
        if "text_pair" in record and not isinstance(record["text_pair"], str):
            raise PredictError(f'{where} has a non-string "text_pair"; expected {expected}')
        if records and ("text_pair" in record) != ("text_pair" in records[0]):  # pairs are all or nothing
            raise PredictError(
                f'{where} {"has" if "text_pair" in record else "lacks"} "text_pair", unlike the first '
                f"record: give it on every line or none"
            )
        records.append(record)
    if not records:
        raise PredictError(f"--eval file {path} has no records; expected {expected}")
    return records


class ExecuTorchSession:
    """A .pte program behind onnxruntime's ``run(outputs, feeds)``; imports executorch (and with it torch) only here."""

    def __init__(self, path: Path, threads: int | None = None):
        try:
            import torch
            from executorch.extension.pybindings import portable_lib
            from executorch.runtime import Runtime
        except ImportError:
            raise PredictError(
                f"{path} is an ExecuTorch program: pip install executorch to run it from Python "
                "(the .onnx and .ort files need only onnxruntime)"
            ) from None
        if threads:  # before any program is loaded: a loaded program keeps the pool it was loaded with
            portable_lib._unsafe_reset_threadpool(threads)
        self.torch = torch
        try:
            self.method = Runtime.get().load_program(path).load_method("forward")
        except Exception as exc:  # the runtime raises RuntimeError / ValueError subclasses for bad programs
            raise PredictError(f"{path} is not an ExecuTorch program this runtime can load ({exc})") from None

    def run(self, _outputs, feeds: dict) -> list:
        ids, mask = (self.torch.from_numpy(feeds[name]) for name in ("input_ids", "attention_mask"))
        return [self.method.execute((ids, mask))[0].numpy()]


def probe_model(bundle: Path, path: Path, damaged: bool) -> None:
    """Load ``path`` and classify one empty text in a child process first: a native runtime can abort the process
    on a damaged file (ExecuTorch on a .pte of random bytes: "terminate called ...", signal 6) where no Python error
    can be caught. Raises PredictError with the child's message, or naming the signal that ended it. Only models
    other than the ones metadata.json records (changed files, files from elsewhere) are probed: the export loaded and
    ran those."""
    import signal
    import subprocess

    runtime = "ExecuTorch" if path.suffix == ".pte" else f"onnxruntime {ort.__version__}"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--bundle",
        str(bundle),
        "--model",
        str(path),
        "--threads",
        "1",
        "--probe-only",
    ]
    try:
        child = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PredictError(f"could not try {path} in a separate process first ({exc})") from None
    if child.returncode == 0:
        return
    lines = [line for line in child.stderr.splitlines() if line.strip()]
    said = next((line[len("error: ") :] for line in lines if line.startswith("error: ")), None)
    if said is not None and child.returncode == 2:
        raise PredictError(said)
    if child.returncode < 0:
        try:
            name = signal.Signals(-child.returncode).name
        except ValueError:
            name = f"signal {-child.returncode}"
        what = f"{runtime} ended the process with {name} while loading or running it"
    else:
        what = f"loading or running it failed ({lines[-1].strip()[:300] if lines else f'exit {child.returncode}'})"
    rebuild = (
        f"its sha256 differs from metadata.json, so the file is damaged: {REBUILD}"
        if damaged
        else "give a model file exported for this bundle"
    )
    raise PredictError(f"{path} is not a model {runtime} can run: {what}; {rebuild}")


def evaluate(classifier: BundleClassifier, records: list[dict], batch_size: int) -> dict:
    index = {name: i for i, name in enumerate(classifier.labels)}
    unknown = sorted({r["label"] for r in records} - set(index))
    if unknown:
        raise PredictError(
            f"labels {unknown} in the --eval file are not in labels.json (expected one of {classifier.labels})"
        )
    texts = [r["text"] for r in records]
    pairs = [r["text_pair"] for r in records] if "text_pair" in records[0] else None
    predicted = classifier.logits(texts, pairs, batch_size).argmax(-1)
    gold = np.array([index[r["label"]] for r in records])
    return {
        "model": classifier.model_path.name,
        "examples": len(records),
        "accuracy": float((predicted == gold).mean()),
        "correct": int((predicted == gold).sum()),
    }


def check_sha256(classifier: BundleClassifier, verify: bool) -> None:
    """A model that is not the exported one must not run unnoticed: warn, or with --verify stop."""
    name = classifier.model_path.name
    if classifier.recorded_sha256 is None:
        if verify:
            raise PredictError(
                f"--verify: metadata.json records no sha256 for {classifier.model_path} "
                f"(only files inside the bundle folder that the export wrote are listed)"
            )
    elif classifier.sha256 != classifier.recorded_sha256:
        message = (
            f"{name} has sha256 {classifier.sha256}, but metadata.json records {classifier.recorded_sha256}: "
            f"the file changed after export"
        )
        if verify:
            raise PredictError(f"--verify: {message}; {REBUILD}")
        print(f"warning: {message} (--verify makes this an error)", file=sys.stderr)


def inside_bundle(bundle: Path, name: str) -> bool:
    """Whether ``name`` (as metadata.json writes it: relative, '/'-separated) is a path inside the bundle folder."""
    path = (Path(bundle) / name).resolve()
    return not Path(name).is_absolute() and Path(bundle).resolve() in path.parents


def unlisted_files(bundle: Path, files: dict) -> list[str]:
    """Every file in the bundle folder (subfolders included) that metadata.json -> files does not list, whatever its
    name: metadata.json itself and the bytecode Python writes for a listed script (__pycache__/predict.*.pyc) aside."""
    scripts = {Path(name).with_suffix("").as_posix() for name in files if name.endswith(".py")}
    unlisted = []
    for path in sorted(bundle.rglob("*")):
        name = path.relative_to(bundle).as_posix()
        if name in files or name == "metadata.json" or not (path.is_file() or path.is_symlink()):
            continue
        if (
            path.parent.name == "__pycache__"
            and path.suffix == ".pyc"
            and (path.parent.parent / path.name.split(".")[0]).relative_to(bundle).as_posix() in scripts
        ):
            continue
        unlisted.append(name)
    return unlisted


def verify_bundle(bundle: Path) -> int:
    """Every file metadata.json -> files lists must be inside the bundle and exist with that sha256, and every
    other file in the bundle folder must be listed; returns how many were checked."""
    bundle = Path(bundle)
    files = read_json(bundle / "metadata.json").get("files") if (bundle / "metadata.json").is_file() else None
    if not isinstance(files, dict) or not files:
        raise PredictError(
            f"--verify: {bundle / 'metadata.json'} is missing or lists no files with their sha256; {REBUILD}"
        )
    outside = sorted(name for name in files if not inside_bundle(bundle, name))
    if outside:
        raise PredictError(
            f"--verify: metadata.json lists {', '.join(map(repr, outside))}, outside the bundle folder "
            f"{bundle}: a bundle describes only its own files; {REBUILD}"
        )
    unlisted = unlisted_files(bundle, files)
    if unlisted:
        one = len(unlisted) == 1
        raise PredictError(
            f"--verify: {', '.join(unlisted)} in {bundle} {'is a file' if one else 'are files'} "
            f"metadata.json does not list: the export did not write {'it' if one else 'them'}; remove "
            f"{'it' if one else 'them'} or {REBUILD}"
        )
    for name, entry in sorted(files.items()):
        path = bundle / name
        if not path.is_file():
            raise PredictError(f"--verify: {name} is missing from {bundle} (metadata.json lists it); {REBUILD}")
        digest = sha256_file(path)
        if digest != entry.get("sha256"):
            raise PredictError(
                f"--verify: {name} has sha256 {digest}, but metadata.json records {entry.get('sha256')}: "
                f"the file changed after export; {REBUILD}"
            )
    return len(files)


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("texts", nargs="*", help="texts to classify (one JSON line each is printed)")
    parser.add_argument("--model", help="model file in the bundle (default: the recommended variant in metadata.json)")
    parser.add_argument("--bundle", default=str(HERE), help="bundle folder (default: this file's folder)")
    parser.add_argument(
        "--pair",
        action="append",
        metavar="TEXT",
        help="second text of a sentence pair; give one --pair per text, in the texts' order",
    )
    parser.add_argument("--eval", metavar="FILE.jsonl", help='accuracy on records {"text": ..., "label": <label name>}')
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=1,
        help="texts per call (default 1, as an app calls the model, and what metadata.json's accuracies "
        "mean); larger batches are faster for bulk scoring, but dynamic int8 then scales "
        "activations per batch, so a few answers change with the other texts of the batch",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=None, help="onnxruntime intra-op threads (default: its own)"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="exit 2 unless every file metadata.json lists has the sha256 recorded there",
    )
    parser.add_argument("--probe-only", action="store_true", help=argparse.SUPPRESS)  # probe_model's child process
    args = parser.parse_intermixed_args(
        argv
    )  # texts and their --pair options interleaved: "a" --pair "b" "c" --pair "d"
    if args.probe_only:
        try:
            classifier = BundleClassifier(Path(args.bundle), args.model, args.threads, probe=False)
            classifier.logits([""], [""] if classifier.text_pairs else None)
        except PredictError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.texts and not args.eval and not args.verify:
        parser.error("give texts to classify, --eval FILE.jsonl or --verify")
    if args.pair is not None and len(args.pair) != len(args.texts):
        parser.error(
            f"--pair was given {len(args.pair)} time(s) for {len(args.texts)} text(s); give one --pair per text"
        )
    try:
        if args.verify:
            checked = verify_bundle(Path(args.bundle))
            if not args.texts and not args.eval:
                print(json.dumps({"verified": checked, "bundle": str(Path(args.bundle).resolve())}))
                return 0
        records = read_jsonl(Path(args.eval)) if args.eval else None  # bad input fails before the model loads
        classifier = BundleClassifier(Path(args.bundle), args.model, args.threads)
        check_sha256(classifier, args.verify)
        if records is not None:
            print(json.dumps(evaluate(classifier, records, args.batch_size)))
        texts, pairs = [valid_text(t) for t in args.texts], [valid_text(p) for p in args.pair] if args.pair else None
        results = classifier.predict(texts, pairs, batch_size=args.batch_size)
    except PredictError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pair_of_text: Sequence[str | None] = pairs or [None] * len(texts)
    for text, pair, result in zip(texts, pair_of_text, results):
        print(
            json.dumps(
                {"text": text, **({"text_pair": pair} if pair is not None else {}), **result}, ensure_ascii=False
            )
        )
    return 0


def valid_text(text: str) -> str:
    """A command-line argument as the model reads it: bytes that are not UTF-8 (which Python keeps as lone
    surrogates) become U+FFFD, the replacement character, as the bundle README asks of every caller."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


if __name__ == "__main__":
    sys.exit(main())
