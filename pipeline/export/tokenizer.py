"""The bundle's tokenizer: the facts a mobile team needs to reproduce it (read from tokenizer.json), the files
it ships, and vocabulary trimming (the student and tokenizer cut to the tokens the training text uses)."""

from __future__ import annotations

import collections
import copy
import json
import re
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from ..errors import PipelineError
from ..families import FAMILIES

# Special-token roles the bundle records, each with the transformers attribute(s) that name it, in order of preference.
ROLES = {
    "cls": ("cls_token", "bos_token"),
    "sep": ("sep_token", "eos_token"),
    "pad": ("pad_token",),
    "unk": ("unk_token",),
    "mask": ("mask_token",),
}


_ROLE_NAMES = {
    "cls": ("[CLS]", "<s>", "<cls>", "[BOS]", "<bos>"),
    "sep": ("[SEP]", "</s>", "<sep>", "[EOS]", "<eos>"),
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
    "mask": ("[MASK]", "<mask>"),
}


_UNICODE_FORMS = ("NFC", "NFD", "NFKC", "NFKD")


def role_tokens_from_config(folder: Path) -> dict[str, str]:
    """{role: token string} from a save_pretrained folder's tokenizer_config.json / special_tokens_map.json (transformers' view)."""
    found: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the later file wins
        path = Path(folder) / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        for role, keys in ROLES.items():
            for key in keys:
                value = config.get(key)
                value = value.get("content") if isinstance(value, dict) else value  # older files store AddedToken dicts
                if isinstance(value, str) and value:
                    found[role] = value
                    break
    return found


def _flatten(component, key: str) -> list[dict]:
    """A normalizer / pre-tokenizer / post-processor with its Sequence wrappers unwrapped, in order."""
    if not component:
        return []
    if component.get("type") == "Sequence":
        return [part for child in component.get(key, []) for part in _flatten(child, key)]
    return [component]


def _token_ids(spec: dict) -> dict[str, int]:
    """token -> id for the model vocabulary (WordPiece/BPE dict, Unigram [piece, score] list) and the added tokens."""
    vocab = (spec.get("model") or {}).get("vocab") or {}
    ids = dict(vocab) if isinstance(vocab, dict) else {entry[0]: i for i, entry in enumerate(vocab)}
    ids.update({t["content"]: t["id"] for t in spec.get("added_tokens", [])})
    return ids


def _templates(spec: dict) -> tuple[list[str] | None, list[str] | None]:
    """Single and pair templates as token lists ("$A", "$B" for the texts); None, None without a special-token post-processor."""
    for post in _flatten(spec.get("post_processor"), "processors"):
        kind = post.get("type")
        if kind in ("BertProcessing", "RobertaProcessing"):
            cls, sep = post["cls"][0], post["sep"][0]
            pair = [cls, "$A", sep, sep, "$B", sep] if kind == "RobertaProcessing" else [cls, "$A", sep, "$B", sep]
            return [cls, "$A", sep], pair
        if kind == "TemplateProcessing":

            def render(items):
                return [
                    item["SpecialToken"]["id"] if "SpecialToken" in item else "$" + item["Sequence"]["id"]
                    for item in items
                ]

            return render(post.get("single", [])), render(post.get("pair", []))
    return None, None


def tokenizer_facts(tokenizer_json: Path, role_tokens: dict[str, str] | None = None) -> dict:
    """What a mobile team needs to reproduce tokenization, read from tokenizer.json.

    Special tokens are recorded by role (cls, sep, pad, unk, mask) in ``special_tokens``; ``role_tokens``
    ({role: token}) names them, by default from the tokenizer_config.json next to ``tokenizer_json`` (what
    transformers calls cls_token, sep_token, ...), else from the post-processor's template and the usual names.
    ``special_token_ids`` keeps the older token -> id mapping of every special token.
    """
    tokenizer_json = Path(tokenizer_json)
    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    kind = model.get("type")
    normalizers = _flatten(spec.get("normalizer"), "normalizers")
    pre_tokenizers = _flatten(spec.get("pre_tokenizer"), "pretokenizers")
    ids = _token_ids(spec)
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    vocab = model.get("vocab") or {}
    if isinstance(vocab, dict):
        for special in ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"):
            if special not in specials and special in vocab:
                specials[special] = vocab[special]
    single, pair = _templates(spec)
    unk = model.get("unk_token")
    if kind == "Unigram" and model.get("unk_id") is not None and isinstance(vocab, list):
        unk = vocab[model["unk_id"]][0]
    given = role_tokens if role_tokens is not None else role_tokens_from_config(tokenizer_json.parent)
    roles = {}
    for role in ROLES:
        token = given.get(role)
        if token is None and single and role in ("cls", "sep"):
            marks = [t for t in single if not t.startswith("$")]
            token = (marks[0] if role == "cls" else marks[-1]) if marks else None
        if token is None and role == "unk":
            token = unk
        if token is None:
            token = next((name for name in _ROLE_NAMES[role] if name in ids), None)
        if token is not None and token in ids:
            roles[role] = {"token": token, "id": ids[token]}
    lowercase = any(
        n.get("type") == "Lowercase" or (n.get("type") == "BertNormalizer" and n.get("lowercase")) for n in normalizers
    )
    strip = next((n.get("strip_accents") for n in normalizers if n.get("type") == "BertNormalizer"), None)
    if any(n.get("type") == "StripAccents" for n in normalizers):
        strip = True
    byte_level = next((p for p in pre_tokenizers if p.get("type") == "ByteLevel"), None)
    metaspace = next((p for p in pre_tokenizers if p.get("type") == "Metaspace"), None)

    def text(template):
        if not template:
            return "text" if template is not None or single is None else None
        return " ".join({"$A": "text", "$B": "text_pair"}.get(t, t) for t in template)

    return {
        "type": kind,
        "lowercase": lowercase,
        "strip_accents": strip,
        "normalizer": (spec.get("normalizer") or {}).get("type"),
        "normalizers": [n.get("type") for n in normalizers],
        "unicode_normalization": next((n["type"] for n in normalizers if n.get("type") in _UNICODE_FORMS), None),
        "pre_tokenizer": (spec.get("pre_tokenizer") or {}).get("type"),
        "pre_tokenizers": [p.get("type") for p in pre_tokenizers],
        "byte_level": byte_level is not None,
        "add_prefix_space": bool(byte_level.get("add_prefix_space")) if byte_level else None,
        "metaspace": (
            {"replacement": metaspace.get("replacement"), "prepend_scheme": metaspace.get("prepend_scheme")}
            if metaspace
            else None
        ),
        "continuing_subword_prefix": model.get("continuing_subword_prefix"),
        "max_input_chars_per_word": model.get("max_input_chars_per_word"),
        "merges": len(model.get("merges") or []) if kind == "BPE" else None,
        "byte_fallback": model.get("byte_fallback"),
        "unk_token": unk,
        "vocab_size": len(vocab),
        "special_token_ids": specials,
        "special_tokens": roles,
        "template": text(single) if single is not None else "text",
        "pair_template": text(pair) if pair is not None else "text text_pair",
    }


def role_token(facts: dict, role: str) -> str:
    """The special token playing ``role`` (cls, sep, pad, unk, mask), or a word for its absence: never None."""
    entry = facts.get("special_tokens", {}).get(role)
    return entry["token"] if entry else f"(no {role} token)"


def tokenizer_files(facts: dict) -> list[str]:
    """The tokenizer files a bundle ships: tokenizer.json, plus vocab.txt for WordPiece (line number = id)."""
    return ["tokenizer.json", "vocab.txt"] if facts.get("type") == "WordPiece" else ["tokenizer.json"]


def write_bundle_tokenizer(source: Path, target_json: Path, target_vocab: Path, max_length: int) -> list[str]:
    """tokenizer.json with truncation at ``max_length`` and no padding, plus for WordPiece vocab.txt (one token per line,
    line number = id). Other models (BPE, Unigram) need their merges or scores, which only tokenizer.json holds.
    Returns the names of the files written."""
    tokenizer = Tokenizer.from_file(str(source))
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    tokenizer.save(str(target_json))
    kind = json.loads(Path(target_json).read_text(encoding="utf-8")).get("model", {}).get("type")
    if kind != "WordPiece":
        return [Path(target_json).name]
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise RuntimeError("tokenizer ids are not contiguous; vocab.txt cannot represent them")
    target_vocab.write_text("".join(token + "\n" for token, _ in by_id), encoding="utf-8")
    return [Path(target_json).name, Path(target_vocab).name]


def same_rows(first, second) -> bool:
    """Whether two lists of token-id rows (lists or arrays) hold the same ids, row by row."""
    return len(first) == len(second) and all(list(a) == list(b) for a, b in zip(first, second))


def tokenize_texts(
    tokenizer_json: Path, texts: list[str], max_length: int, pairs: list[str] | None = None, segments: bool = False
):
    """Token ids as the bundle's predict.py computes them (tokenizers library, truncation, no padding);
    with ``segments`` a pair (ids, type ids)."""
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    items = list(zip(texts, pairs)) if pairs is not None else list(texts)
    encodings = tokenizer.encode_batch(items)
    if segments:
        return [e.ids for e in encodings], [e.type_ids for e in encodings]
    return [e.ids for e in encodings]


class IdSplit:
    """Token ids + label ids (+ token_type_ids for pairs) in split order (duck-types TokenizedSplit for
    onnx_logits / torch_logits)."""

    def __init__(self, input_ids: list[list[int]], labels: np.ndarray, token_type_ids: list[list[int]] | None = None):
        self.input_ids = input_ids
        self.token_type_ids = token_type_ids
        self.labels = np.asarray(labels)
        self.lengths = np.asarray([len(x) for x in input_ids])

    def __len__(self) -> int:
        return len(self.input_ids)


def trimmed_student(
    student, prepare, records, tokenizer_json, work, test, max_length, full_facts, unlabeled_min_count: int = 1
):
    """The student and tokenizer cut to the tokens train/validation use (and the unlabelled text, those it uses at
    least ``unlabeled_min_count`` times); test re-tokenized with the cut vocabulary.

    ``full_facts``: tokenizer_facts of the untrimmed tokenizer (its special-token roles name the trimmed one's)."""
    keep = corpus_token_ids(prepare, tokenizer_json, unlabeled_min_count=unlabeled_min_count)
    family = FAMILIES.get(str(getattr(student.config, "model_type", "")))
    if family is not None and family.position_offset:  # RoBERTa-style: positions count from pad_token_id, so ids up
        keep |= set(range(full_facts["special_tokens"]["pad"]["id"] + 1))  # to the pad id keep their number
    trimmed_json = work / "tokenizer.trimmed.json"
    kept = trim_vocabulary(tokenizer_json, keep, trimmed_json)
    original_vocab = student.config.vocab_size
    student = trim_embeddings(copy.deepcopy(student), kept).eval()
    pairs = [r["text_pair"] for r in records] if records and "text_pair" in records[0] else None
    if test.token_type_ids is not None:  # sentence pairs with segment ids: re-tokenized with them
        ids, types = tokenize_texts(trimmed_json, [r["text"] for r in records], max_length, pairs, segments=True)
    else:
        ids, types = tokenize_texts(trimmed_json, [r["text"] for r in records], max_length, pairs), None
    split = IdSplit(ids, test.labels, types)
    facts = tokenizer_facts(
        trimmed_json, {role: entry["token"] for role, entry in full_facts["special_tokens"].items()}
    )
    kept_set = set(kept)
    differs = [list(a) != [kept[i] for i in b] for a, b in zip(test.input_ids, ids)]
    surviving = [row for row, a in enumerate(test.input_ids) if kept_set.issuperset(int(i) for i in a)]
    if any(differs[row] for row in surviving):  # a trimming bug, never a property of the data
        row = next(row for row in surviving if differs[row])
        raise PipelineError(
            f"export.trim_vocab: test text {row} uses only kept tokens but the trimmed {facts['type']} "
            "tokenizer gives it other pieces; nothing was shipped. Report this with the tokenizer.json."
        )
    info = {
        "enabled": True,
        "applied": True,
        "tokenizer_model": facts["type"],
        "kept_tokens": len(kept),
        "original_vocab": original_vocab,
        "source_splits": "train, validation, unlabeled",
        "unlabeled_min_count": unlabeled_min_count,
        "test_texts_tokenized_differently": sum(differs),
        "test_texts_surviving": len(surviving),
        "pad_id": facts["special_tokens"]["pad"]["id"],
        "surviving_rows": surviving,
    }
    if "unk" in facts["special_tokens"]:  # byte-level BPE has no unknown token
        info["test_unk_rate_before"] = _rate(test.input_ids, full_facts["special_tokens"]["unk"]["id"])
        info["test_unk_rate_after"] = _rate(ids, facts["special_tokens"]["unk"]["id"])
    return student, split, trimmed_json, info


def corpus_token_ids(
    prepare_dir: Path,
    tokenizer_json: Path,
    splits: tuple[str, ...] = ("train", "validation", "unlabeled"),
    unlabeled_min_count: int = 1,
) -> set[int]:
    """Every token id the training-side text uses, tokenized WITHOUT truncation; of the ids only the unlabelled split
    uses, those it uses at least ``unlabeled_min_count`` times (a large unlabelled corpus brings thousands of rare
    words: 768 bytes each in an int8 base-width table).

    Untruncated: a word cut by truncation still needs all its pieces, or greedy
    WordPiece turns the whole word into [UNK] (and BPE / Unigram split it otherwise). The test split is left out, so
    its unseen words show what trimming costs on new text.
    """
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    ids: set[int] = set()
    unlabeled: collections.Counter[int] = collections.Counter()
    for split in splits:
        path = Path(prepare_dir) / f"{split}.jsonl"
        if not path.is_file():
            continue
        with open(path, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        items = [(r["text"], r["text_pair"]) if "text_pair" in r else r["text"] for r in records]
        for encoding in tokenizer.encode_batch(items):
            (unlabeled.update if split == "unlabeled" else ids.update)(encoding.ids)
    return ids | {token for token, count in unlabeled.items() if count >= unlabeled_min_count}


def trim_vocabulary(tokenizer_json: Path, keep: set[int], target: Path) -> list[int]:
    """A tokenizer.json restricted to ``keep`` plus what encoding needs; returns the kept old ids, in new-id order.

    Every text whose pieces are all kept tokenizes exactly as before; other texts fall back to shorter pieces (or the
    unknown token). What "what encoding needs" means depends on the tokenizer model:

    - WordPiece: the special tokens and [UNK]. Greedy longest match finds the same pieces.
    - BPE (byte-level or not): also every single-character token (the byte alphabet: any text stays encodable; with
      byte fallback, as in Gemma's SentencePiece BPE, the 256 byte pieces) and
      every token that a merge producing a kept token merges (recursively), since BPE reaches a piece through its
      parts. Merges are kept, in their order, when their parts and result are kept: the merges a kept word applied
      are all still there and still the lowest-ranked that apply, so it ends with the same pieces.
    - Unigram (SentencePiece): also the unknown piece, every single-character piece, the lowest-scoring piece and,
      with byte fallback, the 256 byte pieces. Pieces keep their scores; the best segmentation of a kept text is still
      available and still the best (``_trim_unigram``).

    Added tokens outside the model's vocabulary (Llama 3 style) are kept, after it.
    """
    spec = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    kind = model.get("type")
    vocab = model.get("vocab")
    in_model = (
        set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab))) if isinstance(vocab, list) else set()
    )
    added = {t["id"] for t in spec.get("added_tokens", [])}
    # Added tokens outside the model's vocabulary (Llama 3 / EuroBERT keep their specials only there) keep their
    # order after the kept vocabulary.
    added_only = sorted(added - in_model)
    wanted = (set(keep) | added) & in_model
    if kind == "WordPiece" and isinstance(vocab, dict):
        kept = sorted(wanted | {vocab[model["unk_token"]]})
        token_of = {i: t for t, i in vocab.items()}
        model["vocab"] = {token_of[old]: new for new, old in enumerate(kept)}
    elif kind == "BPE" and isinstance(vocab, dict):
        kept = _trim_bpe(model, wanted)
    elif kind == "Unigram" and isinstance(vocab, list):
        kept = _trim_unigram(model, wanted)
    else:
        raise ValueError(f"vocabulary trimming supports WordPiece, BPE and Unigram tokenizers, not {kind}")
    kept += added_only
    new_id = {old: new for new, old in enumerate(kept)}
    for token in spec.get("added_tokens", []):
        token["id"] = new_id[token["id"]]
    _remap_post_processor(spec.get("post_processor") or {}, new_id)
    if spec.get("padding"):
        spec["padding"]["pad_id"] = new_id[spec["padding"]["pad_id"]]
    Path(target).write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    Tokenizer.from_file(str(target))  # must load
    return kept


BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")  # SentencePiece's byte-fallback pieces


def _trim_bpe(model: dict, keep: set[int]) -> list[int]:
    """Cut a BPE model (vocab, merges) in place to ``keep`` plus the alphabet and the parts of kept tokens."""
    vocab = model["vocab"]
    token_of = {i: t for t, i in vocab.items()}
    prefix = model.get("continuing_subword_prefix") or ""
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]

    def merged(a: str, b: str) -> str:
        return a + (b[len(prefix) :] if prefix and b.startswith(prefix) else b)

    made_from: dict[str, list[tuple[str, str]]] = {}
    for a, b in merges:
        made_from.setdefault(merged(a, b), []).append((a, b))
    alphabet = {
        t
        for t in vocab
        if len(t) == 1
        or (prefix and t.startswith(prefix) and len(t) == len(prefix) + 1)
        or (model.get("byte_fallback") and BYTE_PIECE.fullmatch(t))
    }  # SentencePiece BPE (Gemma): <0xNN>
    wanted = {token_of[i] for i in keep} | alphabet
    if model.get("unk_token") in vocab:
        wanted.add(model["unk_token"])
    todo = list(wanted)
    while todo:  # every token a merge reaching a wanted token starts from is wanted too
        for a, b in made_from.get(todo.pop(), ()):
            for part in (a, b):
                if part in vocab and part not in wanted:
                    wanted.add(part)
                    todo.append(part)
    kept = sorted(vocab[t] for t in wanted)
    model["vocab"] = {token_of[old]: new for new, old in enumerate(kept)}
    model["merges"] = [[a, b] for a, b in merges if a in wanted and b in wanted and merged(a, b) in wanted]
    return kept


def _trim_unigram(model: dict, keep: set[int]) -> list[int]:
    """Cut a Unigram model's pieces in place to ``keep`` plus what keeps the best segmentation of kept texts the same.

    tokenizers scores a character no piece covers at (lowest piece score - 10), so the lowest-scoring piece stays
    (that score does not move) and so does every single-character piece (no character becomes uncovered): the
    trimmed lattice is then part of the original one, with the same scores, and holds the original best path."""
    pieces = model["vocab"]
    needed = set(keep) | {i for i, (piece, _) in enumerate(pieces) if len(piece) == 1}
    needed.add(min(range(len(pieces)), key=lambda i: pieces[i][1]))
    if model.get("unk_id") is not None:
        needed.add(model["unk_id"])
    if model.get("byte_fallback"):
        needed |= {i for i, (piece, _) in enumerate(pieces) if BYTE_PIECE.fullmatch(piece)}
    kept = sorted(needed)
    model["vocab"] = [pieces[old] for old in kept]
    if model.get("unk_id") is not None:
        model["unk_id"] = kept.index(model["unk_id"])
    return kept


def _remap_post_processor(post: dict, new_id: dict[int, int]) -> None:
    """Special-token ids in a post-processor (TemplateProcessing, Bert/RobertaProcessing, or a Sequence of them)."""
    for inner in post.get("processors") or []:
        _remap_post_processor(inner, new_id)
    for entry in (post.get("special_tokens") or {}).values():
        entry["ids"] = [new_id[i] for i in entry["ids"]]
    for key in ("sep", "cls"):  # BertProcessing / RobertaProcessing store [token, id]
        if isinstance(post.get(key), list):
            post[key][1] = new_id[post[key][1]]


def trim_embeddings(model, kept: list[int]):
    """``model`` (modified in place) with its word-embedding table cut to the rows in ``kept``, in that order."""
    if hasattr(model, "keep_tokens"):  # the static student: a second per-token table (its pooling weights) too
        model.keep_tokens(kept)
    else:
        old = model.get_input_embeddings()
        index = torch.tensor(kept, dtype=torch.long)
        new = torch.nn.Embedding(len(kept), old.embedding_dim, dtype=old.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(old.weight[index])
        model.set_input_embeddings(new)
    model.config.vocab_size = len(kept)
    if getattr(model.config, "pad_token_id", None) is not None:
        model.config.pad_token_id = kept.index(model.config.pad_token_id)
    return model


def _rate(rows, token: int) -> float:
    total = sum(len(r) for r in rows)
    return sum(r.count(token) if isinstance(r, list) else list(r).count(token) for r in rows) / max(total, 1)
