#!/usr/bin/env python3
"""Reference classifier for this bundle: onnxruntime + tokenizers + numpy, nothing else.

It is the executable specification of how to call the model: tokenize with
tokenizer.json (WordPiece, "[CLS] text [SEP]", truncated to metadata
max_length), feed int64 input_ids and attention_mask, apply softmax to the
logits. Port this file, not the training code.

    pip install onnxruntime tokenizers numpy
    python predict.py "a gripping, beautifully acted film" "a tedious mess"
    python predict.py --model model.int8.onnx --eval test.jsonl      # accuracy on {"text", "label"} records
    python predict.py --model model.int8.ort "works with the ORT format file too"

Exit codes: 0 ok, 2 bad arguments or bundle files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent


class BundleClassifier:
    """Tokenizer + ONNX Runtime session + label names, all read from the bundle folder."""

    def __init__(self, bundle: Path = HERE, model: str | None = None, threads: int | None = None):
        bundle = Path(bundle)
        self.metadata = json.loads((bundle / "metadata.json").read_text(encoding="utf-8"))
        labels = json.loads((bundle / "labels.json").read_text(encoding="utf-8"))
        self.labels = [labels[str(i)] for i in range(len(labels))]
        self.max_length = int(self.metadata["max_length"])
        self.pad_id = int(self.metadata["tokenizer"]["special_token_ids"]["[PAD]"])
        self.tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_length)  # same cut as training: [CLS] + tokens + [SEP] <= max_length
        self.tokenizer.no_padding()  # padding is done per batch below, only up to the longest text
        model = model or self.metadata["variants"][self.metadata["recommended"]]["file"]
        path = Path(model) if Path(model).is_absolute() or Path(model).exists() else bundle / model
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        self.model_path = path
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def encode(self, texts: list[str], pairs: list[str] | None = None) -> dict:
        """int64 input_ids / attention_mask, right-padded with [PAD] to the longest text of the batch."""
        items = list(zip(texts, pairs)) if pairs is not None else list(texts)
        encodings = self.tokenizer.encode_batch(items)
        longest = max(len(e.ids) for e in encodings)
        input_ids = np.full((len(encodings), longest), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(encodings), longest), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            input_ids[row, : len(encoding.ids)] = encoding.ids
            attention_mask[row, : len(encoding.ids)] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def logits(self, texts: list[str], pairs: list[str] | None = None, batch_size: int = 64) -> np.ndarray:
        parts = []
        for start in range(0, len(texts), batch_size):
            batch_pairs = pairs[start:start + batch_size] if pairs is not None else None
            parts.append(self.session.run(["logits"], self.encode(texts[start:start + batch_size], batch_pairs))[0])
        return np.concatenate(parts) if parts else np.zeros((0, len(self.labels)), dtype=np.float32)

    def predict(self, texts: list[str], pairs: list[str] | None = None, batch_size: int = 64) -> list[dict]:
        logits = self.logits(texts, pairs, batch_size)
        shifted = np.exp(logits - logits.max(-1, keepdims=True))
        probs = shifted / shifted.sum(-1, keepdims=True)  # softmax: logits -> probabilities
        return [{"label": self.labels[int(p.argmax())], "probabilities": dict(zip(self.labels, map(float, p)))}
                for p in probs]


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def evaluate(classifier: BundleClassifier, records: list[dict], batch_size: int) -> dict:
    texts = [r["text"] for r in records]
    pairs = [r["text_pair"] for r in records] if records and "text_pair" in records[0] else None
    predicted = classifier.logits(texts, pairs, batch_size).argmax(-1)
    index = {name: i for i, name in enumerate(classifier.labels)}
    unknown = sorted({r["label"] for r in records} - set(index))
    if unknown:
        raise SystemExit(f"error: labels {unknown} are not in labels.json ({classifier.labels})")
    gold = np.array([index[r["label"]] for r in records])
    return {"model": classifier.model_path.name, "examples": len(records),
            "accuracy": float((predicted == gold).mean()) if len(records) else float("nan"),
            "correct": int((predicted == gold).sum())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("texts", nargs="*", help="texts to classify (one JSON line each is printed)")
    parser.add_argument("--model", help="model file in the bundle (default: the recommended variant in metadata.json)")
    parser.add_argument("--bundle", default=str(HERE), help="bundle folder (default: this file's folder)")
    parser.add_argument("--eval", metavar="FILE.jsonl", help='accuracy on records {"text": ..., "label": <label name>}')
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    args = parser.parse_args(argv)
    if not args.texts and not args.eval:
        parser.error("give texts to classify or --eval FILE.jsonl")
    try:
        classifier = BundleClassifier(Path(args.bundle), args.model, args.threads)
    except (OSError, KeyError, ValueError) as exc:
        print(f"error: cannot load the bundle at {args.bundle}: {exc}", file=sys.stderr)
        return 2
    if args.eval:
        print(json.dumps(evaluate(classifier, read_jsonl(Path(args.eval)), args.batch_size)))
    for text, result in zip(args.texts, classifier.predict(args.texts, batch_size=args.batch_size)):
        print(json.dumps({"text": text, **result}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
