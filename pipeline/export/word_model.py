"""The static student's word model: ``model.words.onnx``, raw text in, the static student's logits out, by word lookup.

The static student's logits are sums over its tokens (static_model.py): the weighted token rows over the sum of the
weights, plus the mean row of the neighbouring pairs, plus the bias. A word always gives the same pieces, so what a
word adds can be summed once at export: its weighted rows, its weight, its piece count, the rows of the pairs inside
it, and the hashed ids of its first and last piece (for the pairs across words). Per text the graph then runs BERT's
normalization and word splitting (the text-in model's operators), one hash lookup per word, one Gather of the words'
rows and their sum, and the pairs across word boundaries. The subword operators (WordpieceTokenizer and its [UNK]
bookkeeping), the padding and the classifier's own graph, where the text-in model spends most of its time
(bench/word_model.py), run only where they must:

* words outside the table (typos, rare words): WordpieceTokenizer on those words alone, their rows summed from the
  token table inside the graph and put in their place among the known words;
* a text longer than max_length - 2 pieces: the words whose pieces all fit, then as many pieces of the next word as
  fit (WordpieceTokenizer on that one word), as predict.py cuts the text at max_length.

The logits are the fp32 ids-in graph's for every text, up to float summation order: the export checks the
predictions on the whole test split before shipping it. The table holds the words of the training, validation and
unlabeled texts (never the test split's), the vocabulary's whole words and those of export.word_list and
export.word_corpus if set; it is a cache, not a vocabulary (any word list gives the same logits; a word outside it
costs the subword route).

    text           string  [1]       one text per call, as an app calls it (a batch: model.text.onnx)
    probabilities  float32 [1, labels]
    label          int64   [1]
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer

from ..static_model import BIGRAM_PRIME
from . import text_model
from .onnx_graph import onnx_logits
from .tokenizer import IdSplit, same_rows, tokenize_texts

log = logging.getLogger("pipeline")

FILE = "model.words.onnx"
OUTPUTS = ["probabilities", "label"]
# The piece count of a word outside the table: a text holding one sums past any max_length, so a single comparison
# sends it off the common path (exact in float32, far above any piece count of a real text)
OUTSIDE = 2.0**20


def _split_lines(texts: list[str], tokenizer_json: Path, facts: dict) -> list[str]:
    """Each text as the text-in operators split it (normalization fixes included): its words joined by spaces."""
    lowercase, strip = text_model.casing(facts)
    fixes = text_model.normalization_fixes(tokenizer_json, lowercase, strip)
    return text_model._basic_tokenizer_words(texts, lowercase, strip, fixes)


def training_words(texts: list[str], tokenizer_json: Path, facts: dict, min_count: int = 1) -> list[str]:
    """The words the text-in operators split ``texts`` into (normalization fixes included) that the texts hold at least
    ``min_count`` times, most frequent first."""
    counts: Counter = Counter()
    for line in _split_lines(texts, tokenizer_json, facts):
        counts.update(word for word in line.split(" ") if word)
    return [word for word, count in counts.most_common() if count >= min_count]


def vocabulary_words(tokenizer_json: Path, facts: dict) -> list[str]:
    """The whole-word tokens of ``tokenizer_json`` (the untrimmed vocabulary): tokens that are not a word's continuation
    nor a special token and that the operators' splitting leaves as one word. Common words the training text lacks,
    for the table (as pieces of the shipped, maybe trimmed, vocabulary)."""
    prefix = facts.get("continuing_subword_prefix") or "##"
    specials = {entry["token"] for entry in facts.get("special_tokens", {}).values()}
    tokens = [t for t in text_model.vocabulary(tokenizer_json) if not t.startswith(prefix) and t not in specials]
    split = _split_lines(tokens, tokenizer_json, facts)
    return [token for token, words in zip(tokens, split) if words == token]


def list_words(path: Path, tokenizer_json: Path, facts: dict) -> list[str]:
    """The words of a word list (export.word_list: one entry per line, its first whitespace-separated column, most
    frequent first) as the text-in operators split them, in the list's order, each once."""
    with open(path, encoding="utf-8") as fh:
        entries = [fields[0] for fields in map(str.split, fh) if fields]
    split = _split_lines(entries, tokenizer_json, facts)
    return list(dict.fromkeys(word for line in split for word in line.split(" ") if word))


def word_tables(model, tokenizer_json: Path, words: list[str]) -> dict[str, np.ndarray]:
    """The graph's tables from the folded static student ``model`` (fold_classifier), in its own (maybe trimmed)
    vocabulary. A row is [weighted token rows (width: the labels, or head_hidden with a hidden layer), weight, pieces(,
    pair rows (width) with bigram buckets)]:
    ``word_rows`` per word, summed over its pieces in float64, plus a last row for a word outside the table (its piece
    count OUTSIDE, so one sum tells whether a text is all table words and fits), ``token_rows`` per token. With
    bigrams, the pairs across words read ``word_left`` (the last piece's hashed id times the prime, modulo the
    buckets) and ``word_right`` (the first piece's hashed id)."""
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    with torch.no_grad():
        rows = model.embeddings.weight.double().numpy()  # [vocab, width]: W v_t, W the head's first layer
        weights = model.token_weights.weight.double().squeeze(-1).exp().numpy()
        buckets = model.config.bigram_buckets
        pairs = model.bigrams.weight.double().numpy() if buckets else None
        hashes = model.hash_ids.numpy().astype(np.int64) if buckets else np.zeros(len(weights), np.int64)
        bias = model.first_linear().bias.double().numpy()
        # with a hidden layer (head_hidden) its ReLU and the output layer run after the pooling
        tail = model.output_layer()
        output = {"out_weight": tail.weight.double().numpy().T, "out_bias": tail.bias.double().numpy()} if tail else {}
    width = rows.shape[1]
    # the weight column sums to what the pooled sum is divided by: the weights, or their squares (sqrtn pooling,
    # whose root the graph takes)
    divisor = weights**2 if model.config.pooling == "sqrtn" else weights
    token_rows = np.concatenate([weights[:, None] * rows, divisor[:, None], np.ones((len(weights), 1))], 1)
    word_rows = np.zeros((len(words) + 1, width + 2 + (width if buckets else 0)))
    word_rows[-1, width + 1] = OUTSIDE
    ends = np.zeros((len(words) + 1, 2), dtype=np.int64)
    for index, word in enumerate(words):
        ids = np.array([token.id for token in tokenizer.model.tokenize(word)], dtype=np.int64)
        word_rows[index, : width + 2] = token_rows[ids].sum(0)
        if pairs is not None and len(ids) > 1:
            word_rows[index, width + 2 :] = pairs[(hashes[ids[:-1]] * BIGRAM_PRIME + hashes[ids[1:]]) % buckets].sum(0)
        ends[index] = hashes[ids[0]], hashes[ids[-1]]
    tables = {"word_rows": word_rows, "token_rows": token_rows, "bias": bias, **output}
    if buckets:
        tables.update(
            word_left=ends[:, 1] * BIGRAM_PRIME % buckets,
            word_right=ends[:, 0],
            token_hash=hashes,
            pair_rows=pairs,
        )
    return {name: t.astype(np.int64 if t.dtype == np.int64 else np.float32) for name, t in tables.items()}


def graph(model, tokenizer_json: Path, facts: dict, max_length: int, words: list[str]) -> onnx.ModelProto:
    """The word model of the folded static student ``model`` (see the module's docstring)."""
    tables = word_tables(model, tokenizer_json, words)
    width = len(tables["bias"])
    num_labels = int(model.config.num_labels)
    buckets = int(model.config.bigram_buckets)
    columns = width + 2 + (width if buckets else 0)
    special = facts["special_tokens"]
    cls, sep, unk = (special[role]["id"] for role in ("cls", "sep", "unk"))
    vocab = text_model.vocabulary(tokenizer_json)
    fixes = text_model.normalization_fixes(tokenizer_json, *text_model.casing(facts))

    def node(op: str, inputs: list[str], outputs: list[str], **attributes) -> onnx.NodeProto:
        attributes.setdefault("name", outputs[0])  # profiles and errors name the node by what it makes
        return helper.make_node(op, inputs, outputs, **attributes)

    def const(name: str, value) -> onnx.NodeProto:
        return node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))

    def one_piece_row(token: int) -> np.ndarray:  # a token as a word of one piece (no pairs inside)
        row = np.zeros(columns, np.float32)
        row[: width + 2] = tables["token_rows"][token]
        return row

    initializers = {
        "w_word_rows": tables["word_rows"],
        "w_token_rows": tables["token_rows"],
        "w_bias": tables["bias"],
        **({"w_out_weight": tables["out_weight"], "w_out_bias": tables["out_bias"]} if "out_weight" in tables else {}),
        "w_specials": one_piece_row(cls) + one_piece_row(sep),  # [CLS] and [SEP] are in every text's bag
        "w_unk_row": one_piece_row(unk),  # a word with an unknown piece is one [UNK], as tokenizers makes it
    }
    outside = len(words)  # the word id of a word outside the table: the last row
    small = [
        const("w_zero", np.int64(0)),
        const("w_one", np.int64(1)),
        const("w_outside", np.int64(outside)),
        const("w_axis0", np.array([0], np.int64)),
        const("w_axis1", np.array([1], np.int64)),
        const("w_zero_1d", np.array([0], np.int64)),
        const("w_pieces_column", np.int64(width + 1)),
        const("w_unk_id", np.int64(unk)),
        const("w_content_max", np.float32(max_length - 2)),
    ]
    if buckets:
        hashes = tables["token_hash"]
        initializers.update(
            w_word_left=tables["word_left"],
            w_word_right=tables["word_right"],
            w_token_hash=hashes,
            w_pair_rows=tables["pair_rows"],
        )
        small += [
            const("w_prime", np.int64(BIGRAM_PRIME)),
            const("w_buckets", np.int64(buckets)),
            const("w_cls_left", np.array([hashes[cls] * BIGRAM_PRIME % buckets], np.int64)),
            const("w_sep_right", np.array([hashes[sep]], np.int64)),
            const("w_unk_left", np.int64(hashes[unk] * BIGRAM_PRIME % buckets)),
            const("w_unk_right", np.int64(hashes[unk])),
            const("w_after_first", np.array([1], np.int64)),
            const("w_to_end", np.array([np.iinfo(np.int64).max], np.int64)),
            const("w_before_last", np.array([-1], np.int64)),
        ]

    def wordpiece(words_in: str, splits: str, prefix: str) -> list:
        """``words_in`` (one row per word: ``splits``) -> ``{prefix}_ids``, the pieces' ids, and ``{prefix}_begin`` /
        ``{prefix}_end``, each word's first and past-its-last piece (the operator keeps the pieces matched before an
        unknown one: the caller makes such a word one [UNK])."""
        return [
            node(
                "WordpieceTokenizer",
                [words_in, splits],
                [f"{prefix}_pieces", f"{prefix}_piece_splits", f"{prefix}_begin", f"{prefix}_end"],
                domain=text_model.EXTENSIONS_DOMAIN,
                vocab=json.dumps(vocab, ensure_ascii=False),
                suffix_indicator=facts.get("continuing_subword_prefix") or "##",
                unknown_token=special["unk"]["token"],
                max_input_chars_per_word=facts.get("max_input_chars_per_word") or 100,
            ),
            node(
                "LabelEncoder",
                [f"{prefix}_pieces"],
                [f"{prefix}_ids"],
                domain="ai.onnx.ml",
                keys_strings=list(vocab),
                values_int64s=list(vocab.values()),
                default_int64=unk,
            ),
        ]

    def pair_rows(left: str, right: str, out: str, summed: bool = True) -> list:
        """``out``: the rows of the pairs whose bucket is (left + right) % buckets (left already holds the first id
        times the prime, modulo the buckets), [pairs, width], or their sum [width] when ``summed``."""
        rows = f"{out}_rows" if summed else out
        return [
            node("Add", [left, right], [f"{out}_key"]),
            node("Mod", [f"{out}_key", "w_buckets"], [f"{out}_bucket"]),
            node("Gather", ["w_pair_rows", f"{out}_bucket"], [rows]),
        ] + ([node("ReduceSum", [rows, "w_axis0"], [out], keepdims=0)] if summed else [])

    def words_sum(rows_sum: str, lefts: str, rights: str, tag: str) -> tuple[list, list[str]]:
        """A text that fits: its words' summed rows plus [CLS] and [SEP], and the pairs across words."""
        nodes = [node("Add", [rows_sum, "w_specials"], [f"w_{tag}_stats"])]
        if not buckets:
            return nodes, [f"w_{tag}_stats"]
        return nodes + [
            node("Concat", ["w_cls_left", lefts], [f"w_{tag}_lefts"], axis=0),  # [CLS] w1 ... wn
            node("Concat", [rights, "w_sep_right"], [f"w_{tag}_rights"], axis=0),  # w1 ... wn [SEP]
            *pair_rows(f"w_{tag}_lefts", f"w_{tag}_rights", f"w_{tag}_across"),
        ], [f"w_{tag}_stats", f"w_{tag}_across"]

    def branch(nodes: list, outputs: list[str], name: str) -> onnx.GraphProto:
        values = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        return helper.make_graph(nodes, name, [], values)

    # ---- every word in the table and the text within max_length: the common case, a few nodes
    known = [
        node("Gather", ["w_word_left", "w_word_id"], ["w_lefts"]),
        node("Gather", ["w_word_right", "w_word_id"], ["w_rights"]),
    ]
    known_nodes, known_outputs = words_sum("w_rows_sum", "w_lefts", "w_rights", "table")
    known_nodes = (known if buckets else []) + known_nodes

    # ---- words outside the table: WordpieceTokenizer on those words alone, their pieces summed per word (running sums
    # at each word's first and past its last piece) and put in their place; then the text as above, or cut
    mixed = [
        node("NonZero", ["w_unknown"], ["w_unknown_nonzero"]),  # [1, u]
        node("Transpose", ["w_unknown_nonzero"], ["w_unknown_index"], perm=[1, 0]),  # [u, 1]: ScatterND's indices
        node("Squeeze", ["w_unknown_nonzero", "w_axis0"], ["w_unknown_position"]),
        node("Gather", ["w_words", "w_unknown_position"], ["w_unknown_words"]),
        node("Size", ["w_unknown_words"], ["w_unknown_count"]),
        node("Add", ["w_unknown_count", "w_one"], ["w_unknown_count_1"]),
        node("Range", ["w_zero", "w_unknown_count_1", "w_one"], ["w_unknown_splits"]),  # one row per word
        *wordpiece("w_unknown_words", "w_unknown_splits", "w_unknown"),
        node("Gather", ["w_token_rows", "w_unknown_ids"], ["w_piece_rows"]),
        node("Equal", ["w_unknown_ids", "w_unk_id"], ["w_piece_is_unk"]),
        node("Cast", ["w_piece_is_unk"], ["w_piece_unk_float"], to=TensorProto.FLOAT),
        node("Unsqueeze", ["w_piece_unk_float", "w_axis1"], ["w_piece_unk"]),
        node("Sub", ["w_unknown_end", "w_one"], ["w_last_piece"]),
    ]
    piece_parts = ["w_piece_rows"]
    if buckets:
        mixed += [  # the pairs inside a word: each piece with the next one, except at a word's last piece
            node("Gather", ["w_token_hash", "w_unknown_ids"], ["w_piece_hash"]),
            node("Mul", ["w_piece_hash", "w_prime"], ["w_piece_scaled"]),
            node("Mod", ["w_piece_scaled", "w_buckets"], ["w_piece_left"]),
            node("Slice", ["w_piece_hash", "w_after_first", "w_to_end"], ["w_next_part"]),
            node("Concat", ["w_next_part", "w_zero_1d"], ["w_piece_right"], axis=0),
            *pair_rows("w_piece_left", "w_piece_right", "w_piece_pairs", summed=False),
            node("Shape", ["w_unknown_ids"], ["w_piece_shape"]),
            node("Shape", ["w_last_piece"], ["w_word_shape"]),
            node("ConstantOfShape", ["w_piece_shape"], ["w_ones"], value=helper.make_tensor("v", 1, [1], [1.0])),
            node("ConstantOfShape", ["w_word_shape"], ["w_zeros"], value=helper.make_tensor("v", 1, [1], [0.0])),
            node("ScatterElements", ["w_ones", "w_last_piece", "w_zeros"], ["w_pair_inside"]),
            node("Unsqueeze", ["w_pair_inside", "w_axis1"], ["w_pair_inside_column"]),
            node("Mul", ["w_piece_pairs", "w_pair_inside_column"], ["w_inside_pairs"]),
        ]
        piece_parts.append("w_inside_pairs")
    mixed += [
        node("Concat", [*piece_parts, "w_piece_unk"], ["w_piece_matrix"], axis=1),
        const("w_zero_row", np.zeros((1, columns + 1), np.float32)),
        node("Concat", ["w_zero_row", "w_piece_matrix"], ["w_piece_padded"], axis=0),
        node("CumSum", ["w_piece_padded", "w_zero"], ["w_running"]),
        node("Gather", ["w_running", "w_unknown_end"], ["w_running_end"]),
        node("Gather", ["w_running", "w_unknown_begin"], ["w_running_begin"]),
        node("Sub", ["w_running_end", "w_running_begin"], ["w_unknown_sums"]),
        const("w_split_unk", np.array([columns, 1], np.int64)),
        node("Split", ["w_unknown_sums", "w_split_unk"], ["w_unknown_word_rows", "w_unknown_unk"], axis=1),
        const("w_half", np.float32(0.5)),
        node("Greater", ["w_unknown_unk", "w_half"], ["w_has_unk"]),  # [u, 1]
        node("Where", ["w_has_unk", "w_unk_row", "w_unknown_word_rows"], ["w_unknown_rows"]),
        node("ScatterND", ["w_rows", "w_unknown_index", "w_unknown_rows"], ["w_rows_mixed"]),
    ]
    if buckets:
        mixed += [
            node("Squeeze", ["w_has_unk", "w_axis1"], ["w_word_has_unk"]),
            node("Gather", ["w_piece_left", "w_last_piece"], ["w_last_left"]),
            node("Gather", ["w_piece_hash", "w_unknown_begin"], ["w_first_right"]),
            node("Where", ["w_word_has_unk", "w_unk_left", "w_last_left"], ["w_unknown_lefts"]),
            node("Where", ["w_word_has_unk", "w_unk_right", "w_first_right"], ["w_unknown_rights"]),
            node("Gather", ["w_word_left", "w_word_id"], ["w_lefts_table"]),
            node("Gather", ["w_word_right", "w_word_id"], ["w_rights_table"]),
            node("ScatterND", ["w_lefts_table", "w_unknown_index", "w_unknown_lefts"], ["w_lefts_mixed"]),
            node("ScatterND", ["w_rights_table", "w_unknown_index", "w_unknown_rights"], ["w_rights_mixed"]),
        ]
    fits_nodes, fits_outputs = words_sum("w_general_sum", "w_lefts_mixed", "w_rights_mixed", "fits")

    # ---- longer than max_length - 2 pieces: the words whose pieces all fit, then the first pieces of the next word
    # (WordpieceTokenizer on that word alone; a word with an unknown piece is one [UNK]), as predict.py cuts the text
    cut = [
        node("Gather", ["w_rows_mixed", "w_pieces_column"], ["w_cut_word_pieces"], axis=1),
        node("CumSum", ["w_cut_word_pieces", "w_zero"], ["w_cut_running"]),
        node("LessOrEqual", ["w_cut_running", "w_content_max"], ["w_cut_whole"]),
        node("Cast", ["w_cut_whole"], ["w_cut_whole_int"], to=TensorProto.INT64),
        node("ReduceSum", ["w_cut_whole_int", "w_axis0"], ["w_cut_words"], keepdims=1),  # [1]: whole words kept
        node("Slice", ["w_rows_mixed", "w_zero_1d", "w_cut_words"], ["w_cut_rows"]),
        node("ReduceSum", ["w_cut_rows", "w_axis0"], ["w_cut_rows_sum"], keepdims=0),
        node("Gather", ["w_cut_rows_sum", "w_pieces_column"], ["w_cut_kept"]),
        node("Sub", ["w_content_max", "w_cut_kept"], ["w_cut_room_float"]),
        node("Cast", ["w_cut_room_float"], ["w_cut_room"], to=TensorProto.INT64),  # pieces left for the next word
        node("Add", ["w_cut_words", "w_one"], ["w_cut_next_end"]),
        node("Slice", ["w_words", "w_cut_words", "w_cut_next_end"], ["w_cut_word"]),
        const("w_one_word", np.array([0, 1], np.int64)),
        *wordpiece("w_cut_word", "w_one_word", "w_cut"),
        node("Equal", ["w_cut_ids", "w_unk_id"], ["w_cut_is_unk"]),
        node("Cast", ["w_cut_is_unk"], ["w_cut_unk_int"], to=TensorProto.INT64),
        node("ReduceSum", ["w_cut_unk_int"], ["w_cut_unks"], keepdims=0),
        node("Greater", ["w_cut_unks", "w_zero"], ["w_cut_word_unknown"]),
        node("Where", ["w_cut_word_unknown", "w_unk_id", "w_cut_ids"], ["w_cut_fixed_ids"]),
        node("Min", ["w_cut_room", "w_one"], ["w_cut_room_for_unk"]),  # one [UNK], if there is room for it
        node("Where", ["w_cut_word_unknown", "w_cut_room_for_unk", "w_cut_room"], ["w_cut_take"]),
        node("Unsqueeze", ["w_cut_take", "w_axis0"], ["w_cut_take_1d"]),
        node("Slice", ["w_cut_fixed_ids", "w_zero_1d", "w_cut_take_1d"], ["w_cut_part"]),  # 0 pieces when no room
        node("Gather", ["w_token_rows", "w_cut_part"], ["w_cut_part_rows"]),
        node("ReduceSum", ["w_cut_part_rows", "w_axis0"], ["w_cut_part_sum"], keepdims=0),
    ]
    if buckets:
        cut += [
            node("Gather", ["w_token_hash", "w_cut_part"], ["w_cut_part_hash"]),
            node("Mul", ["w_cut_part_hash", "w_prime"], ["w_cut_part_scaled"]),
            node("Mod", ["w_cut_part_scaled", "w_buckets"], ["w_cut_part_lefts"]),
            node("Slice", ["w_cut_part_lefts", "w_zero_1d", "w_before_last"], ["w_cut_inside_lefts"]),
            node("Slice", ["w_cut_part_hash", "w_after_first", "w_to_end"], ["w_cut_inside_rights"]),
            *pair_rows("w_cut_inside_lefts", "w_cut_inside_rights", "w_cut_inside"),
            node("Concat", ["w_cut_part_sum", "w_cut_inside"], ["w_cut_part_row"], axis=0),
            node("Add", ["w_cut_rows_sum", "w_cut_part_row"], ["w_cut_sum"]),
            # the cut word's ends: its last kept piece and its first (none when no piece of it fits)
            node("Slice", ["w_cut_part_lefts", "w_before_last", "w_to_end"], ["w_cut_part_left"]),
            node("Slice", ["w_cut_part_hash", "w_zero_1d", "w_after_first"], ["w_cut_part_right"]),
            node("Slice", ["w_lefts_mixed", "w_zero_1d", "w_cut_words"], ["w_cut_lefts_whole"]),
            node("Slice", ["w_rights_mixed", "w_zero_1d", "w_cut_words"], ["w_cut_rights_whole"]),
            node("Concat", ["w_cut_lefts_whole", "w_cut_part_left"], ["w_cut_word_lefts"], axis=0),
            node("Concat", ["w_cut_rights_whole", "w_cut_part_right"], ["w_cut_word_rights"], axis=0),
        ]
    else:
        cut.append(node("Add", ["w_cut_rows_sum", "w_cut_part_sum"], ["w_cut_sum"]))
    cut_nodes, cut_outputs = words_sum("w_cut_sum", "w_cut_word_lefts", "w_cut_word_rights", "cut")

    general = [  # a text all of table words reaches here only when too long: then no word goes to WordpieceTokenizer
        node("Equal", ["w_word_id", "w_outside"], ["w_unknown"]),
        *mixed,
        node("ReduceSum", ["w_rows_mixed", "w_axis0"], ["w_general_sum"], keepdims=0),
        node("Gather", ["w_general_sum", "w_pieces_column"], ["w_general_total"]),
        node("LessOrEqual", ["w_general_total", "w_content_max"], ["w_general_fits"]),
        node(
            "If",
            ["w_general_fits"],
            ["w_general_stats"] + (["w_general_across"] if buckets else []),
            then_branch=branch(fits_nodes, fits_outputs, "words_in_place"),
            else_branch=branch(cut + cut_nodes, cut_outputs, "cut_at_max_length"),
        ),
    ]
    general_outputs = ["w_general_stats"] + (["w_general_across"] if buckets else [])

    stats = ["w_stats"] + (["w_across"] if buckets else [])
    body = [
        *small,
        *text_model.words_nodes(tokenizer_json, facts, "utf8_text", "w_words", fixes),
        node(
            "LabelEncoder",
            ["w_words"],
            ["w_word_id"],
            domain="ai.onnx.ml",
            keys_strings=words,
            values_int64s=list(range(len(words))),
            default_int64=outside,
        ),
        node("Gather", ["w_word_rows", "w_word_id"], ["w_rows"]),
        node("ReduceSum", ["w_rows", "w_axis0"], ["w_rows_sum"], keepdims=0),
        node("Gather", ["w_rows_sum", "w_pieces_column"], ["w_pieces_total"]),
        node("LessOrEqual", ["w_pieces_total", "w_content_max"], ["w_all_in_table"]),  # a word outside adds OUTSIDE
        node(
            "If",
            ["w_all_in_table"],
            stats,
            then_branch=branch(known_nodes, known_outputs, "words_in_the_table"),
            else_branch=branch(general, general_outputs, "outside_the_table_or_too_long"),
        ),
        # logits = weighted rows / weight (+ pair rows / pairs) + bias; with sqrtn pooling, over the roots
        const("w_split_stats", np.array([width, 1, 1] + ([width] if buckets else []), np.int64)),
        node(
            "Split",
            ["w_stats", "w_split_stats"],
            ["w_weighted", "w_weight", "w_tokens"] + (["w_inside"] if buckets else []),
            axis=0,
        ),
    ]
    sqrtn = model.config.pooling == "sqrtn"  # divide by the roots of the sums of squared weights and of the pairs
    body += (
        [node("Sqrt", ["w_weight"], ["w_weight_root"]), node("Div", ["w_weighted", "w_weight_root"], ["w_mean"])]
        if sqrtn
        else [node("Div", ["w_weighted", "w_weight"], ["w_mean"])]
    )
    if buckets:
        body += [
            const("w_one_float", np.array([1], np.float32)),
            node("Add", ["w_inside", "w_across"], ["w_pair_total"]),
            node("Sub", ["w_tokens", "w_one_float"], ["w_pairs"]),
            *([node("Sqrt", ["w_pairs"], ["w_pairs_root"])] if sqrtn else []),
            node("Div", ["w_pair_total", "w_pairs_root" if sqrtn else "w_pairs"], ["w_pair_mean"]),
            node("Add", ["w_mean", "w_pair_mean"], ["w_pooled"]),
        ]
    pooled = "w_pooled" if buckets else "w_mean"
    if "out_weight" in tables:  # the hidden layer's ReLU, then the output layer
        body += [
            node("Add", [pooled, "w_bias"], ["w_hidden_in"]),
            node("Relu", ["w_hidden_in"], ["w_hidden"]),
            node("MatMul", ["w_hidden", "w_out_weight"], ["w_hidden_out"]),
            node("Add", ["w_hidden_out", "w_out_bias"], ["w_logits"]),
        ]
    else:
        body.append(node("Add", [pooled, "w_bias"], ["w_logits"]))
    # One text per call, as an app calls it: no Scan over a batch (nor an If choosing between one text and a Scan), each
    # a cost on every call; batches go to the text-in model
    main = helper.make_graph(
        [
            # not UTF-8: refused ("Input strings must be valid UTF-8"), as the text-in model does (text_model.py)
            node("StringNormalizer", [text_model.TEXT_INPUT], ["utf8_text"], case_change_action="NONE"),
            *body,
            node("Unsqueeze", ["w_logits", "w_axis0"], ["logits"]),
            node("Softmax", ["logits"], ["probabilities"], axis=-1),
            node("ArgMax", ["logits"], ["label"], axis=-1, keepdims=0),
        ],
        "static_student_by_words",
        [helper.make_tensor_value_info(text_model.TEXT_INPUT, TensorProto.STRING, [1])],
        [
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, num_labels]),
            helper.make_tensor_value_info("label", TensorProto.INT64, [1]),
        ],
        initializer=[numpy_helper.from_array(array, name) for name, array in initializers.items()],
    )
    model_proto = helper.make_model(
        main,
        opset_imports=[
            helper.make_opsetid("", text_model.OPSET),
            helper.make_opsetid(text_model.EXTENSIONS_DOMAIN, 1),
            helper.make_opsetid("ai.onnx.ml", 3),
        ],
    )
    model_proto.ir_version = 10
    model_proto.doc_string = (
        f"Text in, probabilities out: the static student by word lookup ({len(words)} words summed at export; other "
        f"words through onnxruntime-extensions WordpieceTokenizer; texts over {max_length} tokens by pieces). Needs "
        "the extensions custom-op library (onnxruntime-extensions)."
    )
    onnx.checker.check_model(model_proto)
    return model_proto


def run(path_or_session, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """probabilities [n, labels] and labels [n], one text per call (as an app calls it)."""
    runner = text_model.session(path_or_session) if isinstance(path_or_session, (str, Path)) else path_or_session
    probs, labels = [], []
    for text in texts:
        p, label = runner.run(OUTPUTS, {text_model.TEXT_INPUT: np.array([text], dtype=object)})
        probs.append(p)
        labels.append(label)
    return np.concatenate(probs), np.concatenate(labels)


def ship(
    shipped,
    records: list[dict],
    words_texts: list[str],
    max_length: int,
    out: Path,
    more_words: list[str] | None = None,
) -> tuple[dict, np.ndarray | None]:
    """Build ``model.words.onnx`` in ``out`` for the folded static student of ``shipped`` and check it on the test
    ``records`` one text per call against the fp32 ids-in graph on predict.py's ids: the same prediction for every
    text and probabilities within 1e-4, or nothing is shipped. ``words_texts``: the texts whose words fill the table
    (training, validation, unlabeled), most frequent first; ``more_words`` join them after (vocabulary_words of the
    untrimmed tokenizer: 60% -> 43% of the test sentences and 34% -> 20% of the test reviews hold a word outside the
    table). Returns metadata.json's ``word_model`` and, when it is shipped, its labels on ``records`` one text per call
    (what its ORT twin is checked against and its from-raw-text accuracy is computed from)."""
    target = out / FILE
    if getattr(shipped.model.config, "model_type", None) != "static-embedding":
        return {"shipped": False, "why": "only a static student has a word model"}, None
    if shipped.facts.get("type") != "WordPiece" or text_model.unsupported_reason(shipped.facts, pairs=False):
        why = text_model.unsupported_reason(shipped.facts, pairs=False) or (
            f"the word model reuses the WordPiece operators; this tokenizer is {shipped.facts.get('type')}"
        )
        return {"shipped": False, "why": why}, None
    words = training_words(words_texts, shipped.tokenizer_json, shipped.facts)
    known = set(words)
    words += [word for word in dict.fromkeys(more_words or []) if word not in known]
    partial = target.with_suffix(".partial")
    onnx.save(graph(shipped.model, shipped.tokenizer_json, shipped.facts, max_length, words), str(partial))
    texts = [r["text"] for r in records]
    ids = tokenize_texts(shipped.tokenizer_json, texts, max_length)
    if same_rows(shipped.test.input_ids, ids):
        logits = shipped.fp32_logits
    else:
        logits = onnx_logits(shipped.fp32_path, IdSplit(ids, np.zeros(len(ids))), shipped.pad)
    probs, labels = run(partial, texts)
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    expected = shifted / shifted.sum(-1, keepdims=True)
    differ = np.flatnonzero(labels != logits.argmax(-1))
    check = {
        "examples": len(texts),
        "prediction_agreement": float(1 - len(differ) / max(1, len(texts))),
        "max_abs_probability_diff": float(np.abs(probs - expected).max(initial=0.0)),
        "against": f"the fp32 ids-in graph ({shipped.fp32_path.name}) on predict.py's token ids",
        "split": "test",
    }
    if len(differ) or float(np.abs(probs - expected).max(initial=0.0)) > 1e-4:
        partial.unlink()
        why = f"the word model did not reproduce the fp32 ids-in graph on the test split: {check}"
        if len(differ):
            why += f" (first differing text: {texts[differ[0]][:200]!r})"
        log.info("[export] no word model: %s", why)
        return {"shipped": False, "why": why, "check": check}, None
    partial.replace(target)
    log.info(
        "[export] word model %s: %d words in its table, same predictions as the fp32 graph on %d/%d test texts",
        FILE,
        len(words),
        len(texts),
        len(texts),
    )
    return {
        "shipped": True,
        "file": FILE,
        "words_in_table": len(words),
        "file_mb": round(target.stat().st_size / 1e6, 3),
        "check": check,
        "inputs": [{"name": text_model.TEXT_INPUT, "dtype": "string", "shape": [1], "texts_per_call": 1}],
        "outputs": [
            {"name": "probabilities", "dtype": "float32", "shape": [1, len(shipped.model.config.id2label)]},
            {"name": "label", "dtype": "int64", "shape": [1]},
        ],
    }, labels
