"""The text-in model: the tokenizer as ONNX Runtime Extensions operators merged in front of the classifier.

``model.text.onnx`` takes a batch of strings and returns the class probabilities,
the label index and the token ids it fed the classifier:

    text           string  [batch]
    probabilities  float32 [batch, labels]   softmax of the classifier's logits
    label          int64   [batch]           argmax, the index in labels.json
    input_ids      int64   [batch, sequence] the tokens (right-padded), for checking a port

Graph: a Scan over the batch tokenizes one string at a time with the
extensions' operators, pads each row to ``max_length`` with the pad id (mask 0),
then the batch is cut to its longest row: the same ids and padding as predict.py, so the classifier sees
exactly what predict.py feeds it. Softmax and ArgMax follow the classifier.

WordPiece with BERT normalization uses ``BasicTokenizer`` (BERT's cleaning,
casing and splitting) and ``WordpieceTokenizer`` one word per row, then fixes
what the operator does differently: it keeps the pieces it matched before an
unknown one, where tokenizers makes the whole word ``[UNK]`` (frequent with a
trimmed vocabulary). The all-in-one ``BertTokenizer`` operator has that
difference too, with no word boundaries to fix it by. Byte-level BPE uses the generic ``HfJsonTokenizer``,
which reads tokenizer.json itself, under its GPT-2 class (the graph adds the
prefix space and cuts to ``max_length`` keeping the closing special token).
Unigram (SentencePiece-style) tokenizers are not reproduced by the extensions
0.15 operators from a tokenizer.json (see :func:`unsupported_reason`); those
bundles ship the ids-in model only and metadata.json says why.

Every text model is checked against predict.py's tokenization and the ids-in
model's predictions on the whole test split before it is shipped (:func:`check`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, compose, helper
from onnxruntime_extensions import get_library_path
from tokenizers import Tokenizer

from .files import package_version
from .onnx_graph import onnx_logits, ort_session
from .tokenizer import IdSplit, same_rows, tokenize_texts

log = logging.getLogger("pipeline")

TEXT_INPUT = "text"
TEXT_OUTPUTS = ["probabilities", "label", "input_ids"]
EXTENSIONS_DOMAIN = "ai.onnx.contrib"


class TextModelUnsupported(Exception):
    """The tokenizer cannot be expressed with the extension operators; the message says why."""


def extensions_library() -> str:
    """Path of the onnxruntime-extensions shared library (register it with SessionOptions.register_custom_ops_library)."""
    return get_library_path()


def unsupported_reason(facts: dict, pairs: bool) -> str | None:
    """Why this tokenizer (tokenizer_facts) cannot become a text-in model, or None when it can be tried."""
    kind, template = facts.get("type"), facts.get("template")
    if pairs:
        return (
            "the task classifies text pairs; the text-in model takes one string per example (the extensions' "
            "tokenizer operators take one text per row), so ship the ids-in model for pairs"
        )
    if template != f"{_role(facts, 'cls')} text {_role(facts, 'sep')}":
        return (
            f"the special-token template is '{template}'; the text-in model supports 'cls text sep' templates "
            "(truncation keeps the closing special token)"
        )
    if kind == "WordPiece":
        if facts.get("pre_tokenizer") != "BertPreTokenizer" or facts.get("normalizer") != "BertNormalizer":
            return (
                f"the WordPiece tokenizer uses normalizer {facts.get('normalizer')} and pre-tokenizer "
                f"{facts.get('pre_tokenizer')}; the extensions' BasicTokenizer operator implements BERT's own "
                "(BertNormalizer, BertPreTokenizer) only"
            )
        return None
    if kind == "BPE" and facts.get("byte_level") and not facts.get("normalizers"):
        return None
    if kind == "Unigram":
        return (
            "the tokenizer is Unigram (SentencePiece style): onnxruntime-extensions 0.15's SentencepieceTokenizer "
            "needs a SentencePiece model protobuf, which a tokenizers-trained tokenizer.json does not hold, and its "
            "HfJsonTokenizer, given this tokenizer.json, gave other ids than tokenizers (no [CLS], different first "
            "pieces; measured on the tiny config's test split); the app tokenizes with tokenizer.json and feeds the "
            "ids-in model"
        )
    return (
        f"the tokenizer is {kind}{' (byte-level)' if facts.get('byte_level') else ''} with normalizers "
        f"{facts.get('normalizers')}: the extension operators cover WordPiece with BERT normalization and byte-level "
        "BPE without a normalizer; the app tokenizes with tokenizer.json and feeds the ids-in model"
    )


def _role(facts: dict, role: str) -> str | None:
    entry = facts.get("special_tokens", {}).get(role)
    return entry["token"] if entry else None


def vocabulary(tokenizer_json: Path) -> dict[str, int]:
    """token -> id of the whole vocabulary (added tokens included), checked contiguous."""
    vocab = Tokenizer.from_file(str(tokenizer_json)).get_vocab(with_added_tokens=True)
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise TextModelUnsupported("the tokenizer's ids are not contiguous")
    return dict(sorted(vocab.items(), key=lambda item: item[1]))


# The extensions' BasicTokenizer and the tokenizers library's BertNormalizer part ways on about 150,000 of Unicode's
# 1.1 million code points: letters with accents beyond Latin-1 (ō, ł, ş; Greek and Cyrillic ones), combining marks,
# unassigned and private-use code points, U+FFFD, the Kelvin and Ohm signs, İ. The text-in graph therefore first
# applies tokenizers' own normalization to exactly those characters (normalization_fixes): one regex removes the
# ones tokenizers removes, a character map replaces the others; the operators then see what tokenizers would.
FIXES_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention-distill"
OPSET = 20  # of the text-in graphs (RegexFullMatch): a classifier exported at 18 is raised to it when merged
FIXES_FORMAT = 4  # part of the cache key: bump when normalization_fixes changes what it computes
# Removed ranges at least this long stay a regex (private-use planes); shorter ones join the character map, mapped to
# REMOVED_MARK, which the same regex then removes (one regex of a few ranges is cheap, one of hundreds is not).
LONG_RANGE = 256


def _code_point_ranges(code_points: list[int]) -> list[tuple[int, int]]:
    ranges: list[list[int]] = []
    for cp in sorted(code_points):
        if ranges and cp == ranges[-1][1] + 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return [(a, b) for a, b in ranges]


def _char_class(ranges: list[tuple[int, int]]) -> str:
    """An RE2 character class of the code point ranges."""
    return "[" + "".join(f"\\x{{{a:X}}}" + (f"-\\x{{{b:X}}}" if b > a else "") for a, b in ranges) + "]"


def basic_tokenizer(text: str, out: str, lowercase: bool, strip: bool, name: str | None = None) -> onnx.NodeProto:
    """The extensions' BasicTokenizer as BERT's normalizer and pre-tokenizer are set: ``text`` -> its words ``out``."""
    return helper.make_node(
        "BasicTokenizer",
        [text],
        [out],
        name=name,
        domain=EXTENSIONS_DOMAIN,
        do_lower_case=int(lowercase),
        strip_accents=int(strip),
        tokenize_chinese_chars=1,
        tokenize_punctuation=1,
        remove_control_chars=1,
    )


def _basic_tokenizer_words(texts: list[str], lowercase: bool, strip: bool, fixes: dict | None = None) -> list[str]:
    """The operator's words of each text (after ``fixes``, when given), joined by spaces (one text per Scan step)."""
    body = helper.make_graph(
        [
            helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [1], [0])),
            helper.make_node("Constant", [], ["axis"], value=helper.make_tensor("axis", TensorProto.INT64, [], [0])),
            helper.make_node(
                "Constant",
                [],
                ["space"],
                value=helper.make_tensor("space", TensorProto.STRING, [], [b" "]),  # type: ignore[list-item]  # onnx's hint omits the bytes a STRING tensor holds
            ),
            helper.make_node("Unsqueeze", ["string", "zero"], ["raw_text"]),
            *(
                normalization_nodes(fixes, "raw_text", "one_text")
                if fixes
                else [helper.make_node("Identity", ["raw_text"], ["one_text"])]
            ),
            basic_tokenizer("one_text", "words", lowercase, strip),
            helper.make_node("StringJoin", ["words", "space", "axis"], ["joined"], domain=EXTENSIONS_DOMAIN),
        ],
        "words_of_one",
        [helper.make_tensor_value_info("string", TensorProto.STRING, [])],
        [helper.make_tensor_value_info("joined", TensorProto.STRING, [])],
    )
    graph = helper.make_graph(
        [helper.make_node("Scan", ["texts"], ["words"], body=body, num_scan_inputs=1)],
        "words",
        [helper.make_tensor_value_info("texts", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("words", TensorProto.STRING, ["n"])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(EXTENSIONS_DOMAIN, 1)]
    )
    return list(session(model.SerializeToString()).run(None, {"texts": np.array(texts, dtype=object)})[0])


def normalization_fixes(tokenizer_json: Path, lowercase: bool, strip: bool) -> dict:
    """Every code point the operators normalize or split differently from tokenizers (each tried alone inside a word),
    as {"removed": ranges tokenizers drops, "mapped": {character: what tokenizers makes of it}, "still_different":
    ranges the fixes cannot reach}. Computed once per normalizer and library versions (about 15 s over all of
    Unicode on 2 cores) and kept in FIXES_CACHE."""
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    normalize = tokenizer.normalizer.normalize_str if tokenizer.normalizer else str
    spec = json.loads(Path(tokenizer_json).read_text(encoding="utf-8")).get("normalizer")
    key = hashlib.sha256(
        json.dumps(
            [
                FIXES_FORMAT,
                spec,
                lowercase,
                strip,
                package_version("onnxruntime-extensions"),
                package_version("tokenizers"),
            ],
            sort_keys=True,
        ).encode()
    ).hexdigest()[:16]
    cached = FIXES_CACHE / f"bert-normalization-fixes-{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text(encoding="utf-8"))
    code_points = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    texts = [f"ab{chr(cp)}cd" for cp in code_points]
    operators = _basic_tokenizer_words(texts, lowercase, strip)
    expected = {}
    removed, mapped = [], {}
    for cp, text, words in zip(code_points, texts, operators):
        wanted = " ".join(word for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(normalize(text)))
        if words == wanted:
            continue
        expected[cp] = wanted
        fixed = normalize(chr(cp))
        if not fixed:
            removed.append(cp)
        elif wanted == f"ab {fixed} cd":  # punctuation to tokenizers, a letter to the operator: split it off
            mapped[chr(cp)] = f" {fixed} "
        elif fixed != chr(cp):
            mapped[chr(cp)] = fixed
        # else: tokenizers keeps the character as it is where the operator drops or splits it; nothing to map
    # still_different is empty while the fixes are checked: every character they may touch takes their branch
    fixes = {"removed": _code_point_ranges(removed), "mapped": mapped, "still_different": []}
    # what the fixes leave: characters the operators still split or normalize otherwise (checked the same way)
    after = _basic_tokenizer_words([f"ab{chr(cp)}cd" for cp in expected], lowercase, strip, fixes)
    fixes["still_different"] = _code_point_ranges(
        [cp for (cp, wanted), words in zip(expected.items(), after) if words != wanted]
    )
    FIXES_CACHE.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(json.dumps(fixes, ensure_ascii=False), encoding="utf-8")
    os.replace(partial, cached)  # whole or not at all, also with two exports at once
    return fixes


# Characters a text commonly holds besides ASCII (Latin-1 letters and signs, the general punctuation of curly quotes,
# dashes and ellipses, currency signs): those of them the fixes leave alone let a text skip the fixes' costly branch.
COMMON_RANGES = [(0x09, 0x0A), (0x0D, 0x0D), (0x20, 0x7E), (0xA0, 0xFF), (0x2000, 0x206F), (0x20A0, 0x20CF)]


def unfixed_ranges(fixes: dict) -> list[tuple[int, int]]:
    """COMMON_RANGES minus every character the fixes map, remove or cannot fix: a text of these only needs no fix."""
    touched = {ord(char) for char in fixes["mapped"]}
    for a, b in fixes["removed"] + fixes["still_different"]:
        touched.update(range(max(a, 0), min(b, 0x20CF) + 1))  # beyond the common ranges nothing needs listing
    return _code_point_ranges([cp for a, b in COMMON_RANGES for cp in range(a, b + 1) if cp not in touched])


def normalization_nodes(fixes: dict, text: str, out: str) -> list:
    """``text`` (string [1]) -> ``out``: tokenizers' normalization of the characters in ``fixes``: the text split into
    characters, each fixed one replaced (the short runs of removed ones by a mark), joined, and one regex removing
    the mark and the long removed ranges. It runs only for a text holding a character the fixes may change (an If on
    one small regex over unfixed_ranges: ASCII, Latin-1, curly quotes, dashes and currency signs skip it; since
    2026-12-06, before which any character beyond printable ASCII took the branch, 0.2 ms a text): on English text the
    fixes cost one regex pass."""
    strings = lambda name, value: helper.make_node(  # noqa: E731 (a one-line node builder, read where it is used)
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.STRING, [], [value.encode("utf-8")])
    )
    node = helper.make_node
    long_ranges = [(a, b) for a, b in fixes["removed"] if b - a + 1 >= LONG_RANGE]
    mark = chr(long_ranges[0][0]) if long_ranges else None
    table = dict(fixes["mapped"])
    for a, b in fixes["removed"]:
        if b - a + 1 < LONG_RANGE:
            if mark is None:  # no long range to hide the mark in: a removed character is its own mark
                mark, long_ranges = chr(a), [(a, a)]
            table.update({chr(cp): mark for cp in range(a, b + 1) if chr(cp) != mark})
    fix = [
        strings("nothing_fixed", ""),
        strings("one_char", "((?s).)"),
        node("Constant", [], ["char_axis"], value=helper.make_tensor("char_axis", TensorProto.INT64, [], [0])),
        node(
            "StringRegexSplitWithOffsets",
            [text, "one_char", "one_char"],
            ["chars", "char_begin", "char_end", "char_rows"],
            domain=EXTENSIONS_DOMAIN,
        ),
        node(
            "StringMapping",
            ["chars"],
            ["fixed_chars"],
            domain=EXTENSIONS_DOMAIN,
            map="\n".join(f"{char}\t{value}" for char, value in table.items()),
        ),
        node("StringJoin", ["fixed_chars", "nothing_fixed", "char_axis"], ["mapped_text"], domain=EXTENSIONS_DOMAIN),
    ]
    if long_ranges:
        fix += [
            strings("removed_chars", _char_class(long_ranges)),
            node(
                "StringRegexReplace",
                ["mapped_text", "removed_chars", "nothing_fixed"],
                ["fixed_text"],
                domain=EXTENSIONS_DOMAIN,
                global_replace=1,
            ),
        ]
    else:
        fix.append(node("Identity", ["mapped_text"], ["fixed_text"]))
    fix_branch = helper.make_graph(
        fix, "fix_characters", [], [helper.make_tensor_value_info("fixed_text", TensorProto.STRING, [1])]
    )
    plain_branch = helper.make_graph(
        [node("Identity", [text], ["plain_text"])],
        "plain_text",
        [],
        [helper.make_tensor_value_info("plain_text", TensorProto.STRING, [1])],
    )
    return [
        # RegexFullMatch (opset 20) compiles its pattern once per session; the extensions' regex operators take theirs as
        # an input and compiled it on every call: 8-14 us a text, as long as the rest of the word model's lookup
        node("RegexFullMatch", [text], ["is_plain"], pattern=_char_class(unfixed_ranges(fixes)) + "*"),
        # If takes the one-element [1] condition as it is: no Not and Squeeze
        node("If", ["is_plain"], [out], then_branch=plain_branch, else_branch=fix_branch),
    ]


def casing(facts: dict) -> tuple[bool, bool]:
    """(lower-case, strip accents) of a BERT normalizer: strip_accents None follows lowercase, as BertNormalizer does."""
    lowercase, strip = bool(facts.get("lowercase")), facts.get("strip_accents")
    return lowercase, lowercase if strip is None else bool(strip)


def fixes_summary(fixes: dict) -> tuple[dict, list[str]]:
    """metadata.json's account of the normalization fixes, and the known difference they leave (if any)."""
    count = lambda ranges: sum(b - a + 1 for a, b in ranges)  # noqa: E731 (a one-line node builder, read where it is used)
    still = fixes["still_different"]
    summary = {
        "characters_mapped": len(fixes["mapped"]),
        "characters_removed": count(fixes["removed"]),
        "still_different": count(still),
        "still_different_ranges": [f"U+{a:04X}-U+{b:04X}" for a, b in still],
        "checked": "every Unicode code point, alone inside a word, against tokenizers",
    }
    if not still:
        return summary, []
    shown = ", ".join(f"U+{a:04X}" + (f"-U+{b:04X}" if b > a else "") for a, b in still[:4])
    return summary, [
        f"{count(still)} of Unicode's code points still tokenize differently from tokenizers ({shown}"
        f"{', ...' if len(still) > 4 else ''}; all listed in metadata.json text_model.normalization): "
        "code points no text should hold (unassigned) and rare ideographs the operators split as Chinese "
        "characters where tokenizers does not"
    ]


def words_nodes(tokenizer_json: Path, facts: dict, text: str, out: str, fixes: dict | None = None) -> list:
    """``text`` (string [1]) -> ``out`` (string [words]): BERT's normalization and splitting into words, as tokenizers'
    BertNormalizer and BertPreTokenizer do it (the extensions' BasicTokenizer after the normalization fixes)."""
    lowercase, strip = casing(facts)
    return [
        *normalization_nodes(fixes or normalization_fixes(tokenizer_json, lowercase, strip), text, "normalized_text"),
        basic_tokenizer("normalized_text", out, lowercase, strip, name="BasicTokenizer"),
    ]


def wordpiece_nodes(tokenizer_json: Path, facts: dict, max_length: int, fixes: dict | None = None) -> list:
    """WordPiece as tokenizers does it: BasicTokenizer (BERT normalization and splitting) into words, WordpieceTokenizer
    into pieces, one row per word so each word's pieces are known; a word with an unknown piece becomes one [UNK]
    (the operator keeps the pieces it matched before the [UNK], tokenizers drops the whole word); then
    ``cls pieces sep`` with the pieces cut to max_length - 2."""
    vocab = vocabulary(tokenizer_json)
    unk, cls, sep = (facts["special_tokens"][role]["id"] for role in ("unk", "cls", "sep"))
    scalar = lambda name, value: helper.make_node(  # noqa: E731 (a one-line node builder, read where it is used)
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [], [value])
    )
    vector = lambda name, values: helper.make_node(  # noqa: E731 (a one-line node builder, read where it is used)
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values)
    )
    node = helper.make_node
    return [
        *words_nodes(tokenizer_json, facts, "one_text", "all_words", fixes),
        scalar("s0", 0),
        scalar("s1", 1),
        scalar("unk_id", unk),
        vector("v0", [0]),
        vector("v1", [1]),
        vector("cls_sep", [cls, sep]),
        vector("content_max", [max_length - 2]),
        # every word gives at least one piece, so words past max_length - 2 never reach the ids: cut them here, which
        # keeps the word x piece bookkeeping below small for a text of any length (it is quadratic in words)
        node("Slice", ["all_words", "v0", "content_max"], ["words"]),
        node("Size", ["words"], ["word_count"]),
        node("Add", ["word_count", "s1"], ["word_count_1"]),
        node("Range", ["s0", "word_count_1", "s1"], ["word_rows"]),  # one row per word
        node(
            "WordpieceTokenizer",
            ["words", "word_rows"],
            ["pieces", "row_splits", "word_begin", "word_end"],
            name="WordpieceTokenizer",
            domain=EXTENSIONS_DOMAIN,
            vocab=json.dumps(vocab, ensure_ascii=False),
            suffix_indicator=facts.get("continuing_subword_prefix") or "##",
            unknown_token=_role(facts, "unk") or "[UNK]",
            max_input_chars_per_word=facts.get("max_input_chars_per_word") or 100,
        ),
        node(
            "LabelEncoder",
            ["pieces"],
            ["piece_ids"],
            domain="ai.onnx.ml",
            keys_strings=list(vocab),
            values_int64s=list(vocab.values()),
            default_int64=unk,
        ),
        # the word of every piece: how many words begin at or before it, minus one
        node("Size", ["pieces"], ["piece_count"]),
        node("Range", ["s0", "piece_count", "s1"], ["piece_index"]),
        node("Unsqueeze", ["piece_index", "v1"], ["piece_column"]),
        node("Unsqueeze", ["word_begin", "v0"], ["begin_row"]),
        node("GreaterOrEqual", ["piece_column", "begin_row"], ["after_begin"]),
        node("Cast", ["after_begin"], ["after_begin_int"], to=TensorProto.INT64),
        node("ReduceSum", ["after_begin_int", "v1"], ["begun"], keepdims=0),
        node("Sub", ["begun", "s1"], ["piece_word"]),
        # words holding an [UNK] piece
        node("Equal", ["piece_ids", "unk_id"], ["is_unk"]),
        node("Range", ["s0", "word_count", "s1"], ["word_index"]),
        node("Unsqueeze", ["piece_word", "v1"], ["piece_word_column"]),
        node("Unsqueeze", ["word_index", "v0"], ["word_row"]),
        node("Equal", ["piece_word_column", "word_row"], ["in_word"]),
        node("Unsqueeze", ["is_unk", "v1"], ["is_unk_column"]),
        node("And", ["in_word", "is_unk_column"], ["unk_in_word"]),
        node("Cast", ["unk_in_word"], ["unk_in_word_int"], to=TensorProto.INT64),
        node("ReduceSum", ["unk_in_word_int", "v0"], ["unk_per_word"], keepdims=0),
        node("Greater", ["unk_per_word", "s0"], ["word_unknown"]),
        node("Gather", ["word_unknown", "piece_word"], ["piece_in_unknown_word"]),
        node("Gather", ["word_begin", "piece_word"], ["piece_word_begin"]),
        node("Equal", ["piece_index", "piece_word_begin"], ["first_piece"]),
        node("Not", ["piece_in_unknown_word"], ["known_word"]),
        node("Or", ["first_piece", "known_word"], ["keep"]),
        node("Where", ["piece_in_unknown_word", "unk_id", "piece_ids"], ["fixed_ids"]),
        node("Compress", ["fixed_ids", "keep"], ["content"], axis=0),
        node("Slice", ["content", "v0", "content_max"], ["content_cut"]),  # truncation: specials + pieces <= max_length
        node("Split", ["cls_sep"], ["cls_id", "sep_id"], axis=0, num_outputs=2),
        node("Concat", ["cls_id", "content_cut", "sep_id"], ["row_ids"], axis=0),
        node("Shape", ["row_ids"], ["ids_length"]),
        node(
            "ConstantOfShape",
            ["ids_length"],
            ["row_mask"],
            value=helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        ),
    ]


def tokenizer_nodes(tokenizer_json: Path, facts: dict, max_length: int, fixes: dict | None = None) -> tuple[list, str]:
    """The nodes that turn ``one_text`` (string [1]) into ``row_ids`` and ``row_mask`` (int64 [length <= max_length]),
    and the extension operator they use."""
    if facts.get("type") == "WordPiece":
        return wordpiece_nodes(tokenizer_json, facts, max_length, fixes), "BasicTokenizer + WordpieceTokenizer"
    # byte-level BPE: the generic HfJsonTokenizer reads tokenizer.json itself (model, merges, post-processor); it
    # knows the GPT-2 class, which does not add the prefix space, so the graph adds it when tokenizer.json does.
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": _role(facts, "cls"),
        "eos_token": _role(facts, "sep"),
        **{f"{role}_token": _role(facts, role) for role in ("unk", "pad") if _role(facts, role)},
    }
    text = "one_text"
    nodes = []
    if facts.get("add_prefix_space"):
        # tokenizers adds the space only to a non-empty text that does not start with one
        strings = lambda name, value: helper.make_node(  # noqa: E731 (a one-line node builder, read where it is used)
            "Constant", [], [name], value=helper.make_tensor(name, TensorProto.STRING, [1], [value])
        )
        nodes += [
            strings("first_not_space", b"^([^ ])"),
            strings("space_before", b" \\1"),
            helper.make_node(
                "StringRegexReplace",
                ["one_text", "first_not_space", "space_before"],
                ["spaced_text"],
                domain=EXTENSIONS_DOMAIN,
                global_replace=0,
            ),
        ]
        text = "spaced_text"
    const = lambda name, values: helper.make_node(  # noqa: E731 (a one-line node builder, read where it is used)
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values)
    )
    nodes += [
        helper.make_node(
            "HfJsonTokenizer",
            [text],
            ["batch_ids"],
            name="HfJsonTokenizer",
            domain=EXTENSIONS_DOMAIN,
            tokenizer_vocab=Path(tokenizer_json).read_text(encoding="utf-8"),
            tokenizer_config=json.dumps(config),
        ),
        const("axis0", [0]),
        const("keep", [max_length - 1]),
        const("one_long", [1]),
        helper.make_node("Squeeze", ["batch_ids", "axis0"], ["all_ids"]),
        # truncation as tokenizers does it for "cls text sep": the first max_length - 1 ids, then the closing special
        helper.make_node("Shape", ["all_ids"], ["all_length"]),
        helper.make_node("Sub", ["all_length", "one_long"], ["last"]),
        helper.make_node("Min", ["last", "keep"], ["head_end"]),
        helper.make_node("Slice", ["all_ids", "axis0", "head_end"], ["head"]),
        helper.make_node("Slice", ["all_ids", "last", "all_length"], ["tail"]),
        helper.make_node("Concat", ["head", "tail"], ["row_ids"], axis=0),
        helper.make_node("Shape", ["row_ids"], ["ids_length"]),
        helper.make_node(
            "ConstantOfShape",
            ["ids_length"],
            ["row_mask"],
            value=helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        ),
    ]
    return nodes, "HfJsonTokenizer"


def tokenizer_graph(tokenizer_json: Path, facts: dict, max_length: int, opset: int, fixes: dict | None = None):
    """text string [batch] -> input_ids, attention_mask int64 [batch, longest]: predict.py's encoding, as ONNX."""
    pad = facts["special_tokens"]["pad"]["id"] if "pad" in facts.get("special_tokens", {}) else 0
    tokenizer, operator = tokenizer_nodes(tokenizer_json, facts, max_length, fixes)
    const = lambda name, values: helper.make_node(  # noqa: E731 (a one-line node builder, read where it is used)
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values)
    )
    body = helper.make_graph(  # one string -> its ids and mask, padded to max_length
        [
            const("zero", [0]),
            const("full", [max_length]),
            helper.make_node("Unsqueeze", ["string", "zero"], ["one_text"]),  # [1]: a single string, never a pair
            *tokenizer,
            helper.make_node("Shape", ["row_ids"], ["row_length"]),
            helper.make_node("Sub", ["full", "row_length"], ["missing"]),
            helper.make_node("Concat", ["zero", "missing"], ["pads"], axis=0),
            helper.make_node("Pad", ["row_ids", "pads", "pad_id"], ["ids_row"]),
            helper.make_node("Pad", ["row_mask", "pads", "zero_scalar"], ["mask_row"]),
        ],
        "tokenize_one",
        [helper.make_tensor_value_info("string", TensorProto.STRING, [])],
        [
            helper.make_tensor_value_info("ids_row", TensorProto.INT64, [max_length]),
            helper.make_tensor_value_info("mask_row", TensorProto.INT64, [max_length]),
        ],
    )
    nodes = [
        helper.make_node("Constant", [], ["pad_id"], value=helper.make_tensor("pad_id", TensorProto.INT64, [], [pad])),
        helper.make_node(
            "Constant", [], ["zero_scalar"], value=helper.make_tensor("zero_scalar", TensorProto.INT64, [], [0])
        ),
        helper.make_node("Constant", [], ["axis1"], value=helper.make_tensor("axis1", TensorProto.INT64, [1], [1])),
        helper.make_node("Constant", [], ["starts"], value=helper.make_tensor("starts", TensorProto.INT64, [1], [0])),
        # Bytes that are not UTF-8 would reach the tokenizer operators as they are and give other ids than
        # predict.py, which decodes with replacement first; StringNormalizer (no case change: the text passes
        # unchanged) refuses them with "Input strings must be valid UTF-8", so an app decodes first, as the README asks.
        helper.make_node("StringNormalizer", [TEXT_INPUT], ["utf8_text"], case_change_action="NONE", name="utf8_check"),
        # Scan, not Loop: a Loop around the extensions' BertTokenizer corrupted the heap on its second run (0.15.2)
        helper.make_node(
            "Scan", ["utf8_text"], ["padded_ids", "padded_mask"], body=body, num_scan_inputs=1, name="tokenize_batch"
        ),
        # cut to the longest row, as predict.py pads a batch only to its longest text
        helper.make_node("ReduceSum", ["padded_mask", "axis1"], ["lengths"], keepdims=0),
        helper.make_node("ReduceMax", ["lengths"], ["longest"], keepdims=1),
        helper.make_node("Slice", ["padded_ids", "starts", "longest", "axis1"], ["input_ids"]),
        helper.make_node("Slice", ["padded_mask", "starts", "longest", "axis1"], ["attention_mask"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tokenizer",
        [helper.make_tensor_value_info(TEXT_INPUT, TensorProto.STRING, ["batch"])],
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", opset),
            helper.make_opsetid(EXTENSIONS_DOMAIN, 1),
            helper.make_opsetid("ai.onnx.ml", 3),
        ],
    )
    onnx.checker.check_model(model)
    return model, operator


def build(classifier_onnx: Path, tokenizer_json: Path, facts: dict, max_length: int, target: Path) -> dict:
    """``target``: the tokenizer graph merged in front of ``classifier_onnx`` (input_ids, attention_mask -> logits),
    with softmax and argmax after it. Returns what metadata.json records about it; raises TextModelUnsupported."""
    classifier = onnx.load(str(classifier_onnx))
    for entry in classifier.opset_import:  # the tokenizer graph needs OPSET (RegexFullMatch); 18 -> 20 changes no
        if entry.domain in ("", "ai.onnx") and entry.version < OPSET:  # operator the exported classifiers use
            entry.version = OPSET
    opset = next(entry.version for entry in classifier.opset_import if entry.domain in ("", "ai.onnx"))
    # WordPiece: the normalization fixes, computed (or read from the cache) once for the graph and for metadata.json
    fixes = normalization_fixes(tokenizer_json, *casing(facts)) if facts.get("type") == "WordPiece" else None
    tokens, operator = tokenizer_graph(tokenizer_json, facts, max_length, opset, fixes)
    tokens.ir_version = classifier.ir_version
    merged = compose.merge_models(
        tokens,
        classifier,
        io_map=[("input_ids", "input_ids"), ("attention_mask", "attention_mask")],
        outputs=["logits", "input_ids"],
    )
    # merge_models keeps both models' opset entries (the default domain twice): one entry per domain instead
    imports = {"" if entry.domain == "ai.onnx" else entry.domain: entry.version for entry in merged.opset_import}
    del merged.opset_import[:]
    merged.opset_import.extend(helper.make_opsetid(domain, version) for domain, version in imports.items())
    graph = merged.graph
    graph.node.extend(
        [
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
            helper.make_node("ArgMax", ["logits"], ["label"], axis=-1, keepdims=0),
        ]
    )
    ids_output = next(o for o in graph.output if o.name == "input_ids")
    labels = classifier.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    del graph.output[:]
    graph.output.extend(
        [
            helper.make_tensor_value_info("probabilities", onnx.TensorProto.FLOAT, ["batch", labels]),
            helper.make_tensor_value_info("label", onnx.TensorProto.INT64, ["batch"]),
            ids_output,
        ]
    )
    merged.doc_string = (
        f"Text in, probabilities out: onnxruntime-extensions {operator} (truncation at "
        f"{max_length} tokens) in front of {Path(classifier_onnx).name}. Needs the extensions "
        "custom-op library (onnxruntime-extensions)."
    )
    onnx.checker.check_model(merged)
    onnx.save(merged, str(target))
    summary, left = fixes_summary(fixes) if fixes else (None, [])
    return {
        "file": Path(target).name,
        "classifier": Path(classifier_onnx).name,
        "operator": f"{EXTENSIONS_DOMAIN} {operator}",
        **({"normalization": summary} if summary else {}),
        "known_differences": KNOWN_DIFFERENCES.get(facts.get("type"), []) + left,
        "inputs": [{"name": TEXT_INPUT, "dtype": "string", "shape": ["batch"]}],
        "outputs": [
            {"name": "probabilities", "dtype": "float32", "shape": ["batch", labels]},
            {"name": "label", "dtype": "int64", "shape": ["batch"]},
            {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
        ],
        "truncation": max_length,
    }


def session(path: str | Path, threads: int | None = None):
    """An onnxruntime session for a text-in model (.onnx or .ort), the extensions library registered."""
    return ort_session(path, threads, custom_ops=extensions_library())


def run(path_or_session, texts: list[str], batch_size: int = 1) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """probabilities [n, labels], label [n] and every text's token ids, one text per call by default (as an app
    and predict.py call it); with ``batch_size`` > 1 ids are right-padded to the longest of their batch."""
    runner = session(path_or_session) if isinstance(path_or_session, (str, Path)) else path_or_session
    probs, labels, ids = [], [], []
    for start in range(0, len(texts), batch_size):
        p, lab, tok = runner.run(TEXT_OUTPUTS, {TEXT_INPUT: np.array(texts[start : start + batch_size], dtype=object)})
        probs.append(p)
        labels.append(lab)
        ids += [[int(t) for t in row] for row in tok]
    return np.concatenate(probs), np.concatenate(labels), ids


def check(
    path: Path, texts: list[str], expected_ids: list[list[int]], expected_logits: np.ndarray, pad: int
) -> tuple[dict, np.ndarray]:
    """The text-in model at ``path`` against predict.py's token ids and the ids-in model's logits on ``texts``.

    Ids compare row by row after removing the right padding (``pad`` after the last real token, which is
    where predict.py pads too); predictions must be identical, probabilities close. Returns the findings and the
    labels the model gave, one text per call."""
    probs, labels, ids = run(path, texts)
    same_ids = 0
    first_difference = None
    for index, (row, expected) in enumerate(zip(ids, expected_ids)):
        if row[: len(expected)] == list(expected) and all(t == pad for t in row[len(expected) :]):
            same_ids += 1
        elif first_difference is None:
            first_difference = {
                "index": index,
                "text": texts[index][:200],
                "text_model": row[: len(expected) + 2],
                "predict_py": list(expected),
            }
    shifted = np.exp(expected_logits - expected_logits.max(-1, keepdims=True))
    expected_probs = shifted / shifted.sum(-1, keepdims=True)
    agreement = float((labels == expected_logits.argmax(-1)).mean()) if len(texts) else 1.0
    return {
        "examples": len(texts),
        "token_ids_identical": same_ids,
        "prediction_agreement": agreement,
        "max_abs_probability_diff": float(np.abs(probs - expected_probs).max()) if len(texts) else 0.0,
        "exact": same_ids == len(texts) and agreement == 1.0,
        "first_difference": first_difference,
    }, labels


def ship(
    classifier: Path,
    tokenizer_json: Path,
    facts: dict,
    max_length: int,
    records: list[dict],
    pad: int,
    target: Path,
    known: tuple[Any, np.ndarray] | None = None,
) -> tuple[dict, np.ndarray | None]:
    """Build the text-in model at ``target`` from the shipped ``classifier`` and check it on ``records`` (the test
    split): predict.py's token ids (tokenizers, truncation at ``max_length``) and the classifier's predictions on
    them must be reproduced exactly, or nothing is shipped. ``known``: (token ids, the classifier's one-text-per-call
    logits on them), used when predict.py's ids are those. Returns metadata.json's ``text_model`` and, when it is
    shipped, its labels on ``records`` one text per call (what its ORT twin is compared with)."""
    why = unsupported_reason(facts, pairs=bool(records) and "text_pair" in records[0])
    if why is None:
        try:
            info = build(classifier, tokenizer_json, facts, max_length, target)
        except TextModelUnsupported as exc:
            why = str(exc)
    if why is not None:
        Path(target).unlink(missing_ok=True)
        log.info("[export] no text-in model: %s", why)
        return {"shipped": False, "why": why}, None
    texts = [r["text"] for r in records]
    ids = tokenize_texts(tokenizer_json, texts, max_length)  # exactly predict.py's encoding
    if known is not None and same_rows(known[0], ids):
        logits = known[1]  # the classifier was already run on exactly these ids
    else:
        logits = onnx_logits(classifier, IdSplit(ids, np.zeros(len(ids))), pad)  # predict.py's predictions
    result, labels = check(target, texts, ids, logits, pad)
    if not result["exact"]:
        Path(target).unlink()
        why = (
            f"the extension operators did not reproduce predict.py on the test split: {result['token_ids_identical']} of "
            f"{result['examples']} texts got identical token ids, prediction agreement {result['prediction_agreement']:.4f} "
            f"(first difference: {result['first_difference']})"
        )
        log.info("[export] no text-in model: %s", why)
        return {"shipped": False, "why": why, "check": result}, None
    log.info(
        "[export] text-in model %s: identical token ids on %d/%d test texts, prediction agreement %.4f",
        info["file"],
        result["token_ids_identical"],
        result["examples"],
        result["prediction_agreement"],
    )
    return {
        "shipped": True,
        **info,
        "check": {**result, "split": "test", "against": f"predict.py ({classifier.name})"},
        "onnxruntime_extensions": package_version("onnxruntime-extensions"),
    }, labels


# Measured against tokenizers: WordPiece on 6,000 Rotten Tomatoes sentences plus edge cases (empty text, accents,
# CJK, emoji, a 300-character word, control characters), full and trimmed vocabulary, at 32 and 128 tokens, and every
# code point (normalization_fixes, which also lists what its fixes leave); byte-level BPE on 3,000 sentences plus
# leading spaces, tabs and an empty text: identical ids. Where they part ways besides:
KNOWN_DIFFERENCES: dict[str | None, list[str]] = {  # by tokenizer_facts' type (None: tokenizer.json has none)
    "WordPiece": [
        "a special token typed inside the text (e.g. the literal string '[SEP]') is split like ordinary "
        "text by the operators, while tokenizers maps it to the special token's id"
    ],
    "BPE": ["special tokens typed inside the text (e.g. the literal string '</s>') were not compared"],
}
