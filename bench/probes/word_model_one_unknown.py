"""One-off probe behind docs/budgets-and-sweeps.md's "a branch for exactly one word outside the table, not built":
the shipped word model against an edit of it whose outside-the-table branch handles one unknown word only (its pieces
summed in place of the table's OUTSIDE row, no NonZero / CumSum / ScatterND bookkeeping), on the test texts where
both give the same logits and the word model takes that branch; then ONNX Runtime's session options (memory arena,
memory pattern, spinning, optimisation level) on the shipped graph over all test texts. One text per call, one
thread, the models in random order for every text (a fixed order favours the later model).

    python bench/probes/word_model_one_unknown.py runs/bert_small/sweeps/budget/static
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: word_model.py's routes
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import word_model as word_model_bench  # noqa: E402  (bench/word_model.py, after the path)

from pipeline.export import text_model  # noqa: E402


def one_unknown_edit(model: onnx.ModelProto) -> onnx.ModelProto:
    """The word model with its outside-the-table branch replaced by one for exactly one unknown word (no bigrams)."""
    edited = copy.deepcopy(model)
    route = next(n for n in edited.graph.node if n.op_type == "If" and "w_stats" in n.output)
    branch = next(a for a in route.attribute if a.name == "else_branch").g
    wordpiece = copy.deepcopy(next(n for n in branch.node if n.op_type == "WordpieceTokenizer"))
    lookup = copy.deepcopy(next(n for n in branch.node if n.op_type == "LabelEncoder"))
    wordpiece.input[:], wordpiece.output[:] = ["s_word", "s_splits"], ["s_pieces", "s_piece_splits", "s_b", "s_e"]
    lookup.input[:], lookup.output[:] = ["s_pieces"], ["s_ids"]
    word_rows = numpy_helper.to_array(next(i for i in edited.graph.initializer if i.name == "w_word_rows"))

    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))

    nodes = [
        helper.make_node("Equal", ["w_word_id", "w_outside"], ["s_unknown"]),
        helper.make_node("Cast", ["s_unknown"], ["s_unknown_int"], to=TensorProto.INT32),
        helper.make_node("ArgMax", ["s_unknown_int"], ["s_position"], axis=0, keepdims=1),
        helper.make_node("Gather", ["w_words", "s_position"], ["s_word"]),
        const("s_splits", np.array([0, 1], np.int64)),
        wordpiece,
        lookup,
        helper.make_node("Gather", ["w_token_rows", "s_ids"], ["s_rows"]),
        helper.make_node("ReduceSum", ["s_rows", "w_axis0"], ["s_row"], keepdims=0),
        helper.make_node("Equal", ["s_ids", "w_unk_id"], ["s_is_unk"]),
        helper.make_node("Cast", ["s_is_unk"], ["s_is_unk_float"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMax", ["s_is_unk_float"], ["s_any_unk_float"], keepdims=0),
        const("s_half", np.float32(0.5)),
        helper.make_node("Greater", ["s_any_unk_float", "s_half"], ["s_any_unk"]),
        helper.make_node("Where", ["s_any_unk", "w_unk_row", "s_row"], ["s_word_row"]),
        const("s_outside_row", word_rows[-1].astype(np.float32)),
        helper.make_node("Sub", ["w_rows_sum", "s_outside_row"], ["s_known"]),
        helper.make_node("Add", ["s_known", "s_word_row"], ["s_sum"]),
        helper.make_node("Add", ["s_sum", "w_specials"], [branch.output[0].name]),
    ]
    del branch.node[:]
    branch.node.extend(nodes)
    return edited


def session(model: onnx.ModelProto, **options) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.register_custom_ops_library(text_model.extensions_library())
    for key, value in options.items():
        if key == "entries":
            for entry, setting in value:
                so.add_session_config_entry(entry, setting)
        else:
            setattr(so, key, value)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def random_order_ms(sessions: dict, texts: list[str], repeat: int = 3) -> dict:
    """Median ms per call and the median per-text ratio to the first session, every text in a fresh random order."""
    rng = np.random.default_rng(0)
    times = {name: [] for name in sessions}
    feeds = [{text_model.TEXT_INPUT: np.array([t], dtype=object)} for t in texts]
    names = list(sessions)
    for _ in range(repeat):
        for feed in feeds:
            for i in rng.permutation(len(names)):
                start = time.perf_counter()
                sessions[names[i]].run(["label"], feed)
                times[names[i]].append(time.perf_counter() - start)
    first = np.array(times[names[0]])
    return {n: (1000 * float(np.median(t)), float(np.median(np.array(t) / first))) for n, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder whose export shipped a word model without bigrams")
    args = parser.parse_args()
    bundle = args.run / "export" / "bundle"
    model = onnx.load(str(bundle / "model.words.onnx"))
    texts = [json.loads(line)["text"] for line in open(args.run / "prepare" / "test.jsonl")]
    max_length = json.loads((bundle / "metadata.json").read_text())["text_model"]["truncation"]
    shipped, edited = session(model), session(one_unknown_edit(model))
    outside = word_model_bench.ROUTES[1]
    routes = word_model_bench.routes(bundle, texts, max_length)
    one = []
    for text, route in zip(texts, routes):
        feed = {text_model.TEXT_INPUT: np.array([text], dtype=object)}
        if route == outside and np.allclose(shipped.run(None, feed)[0], edited.run(None, feed)[0], atol=1e-5):
            one.append(text)
    print(f"{len(one)} of {len(texts)} test texts ({100 * len(one) / len(texts):.1f}%) have exactly one word outside")
    for name, (ms, ratio) in random_order_ms({"shipped": shipped, "one-unknown branch": edited}, one).items():
        print(f"  {name}: {ms:.4f} ms, median ratio to the shipped graph {ratio:.3f}")
    level = ort.GraphOptimizationLevel
    options = {
        "default": session(model),
        "no memory arena": session(model, enable_cpu_mem_arena=False),
        "no memory pattern": session(model, enable_mem_pattern=False),
        "no spinning": session(model, entries=[("session.intra_op.allow_spinning", "0")]),
        "basic optimisation": session(model, graph_optimization_level=level.ORT_ENABLE_BASIC),
        "no optimisation": session(model, graph_optimization_level=level.ORT_DISABLE_ALL),
    }
    print(f"session options, all {len(texts)} test texts:")
    for name, (ms, ratio) in random_order_ms(options, texts).items():
        print(f"  {name}: {ms:.4f} ms, median ratio to the default {ratio:.3f}")


if __name__ == "__main__":
    main()
