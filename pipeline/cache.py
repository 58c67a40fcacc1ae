"""The teacher cache: what the losses need, per example, unpadded, in checksummed shards.

Each shard is a flat binary array (fp16 by default) of example records plus a
JSON index (record offsets, lengths, sha256, and the fp32 logits). A record is
the concatenation of the example's fields in a fixed order: the fields of every
target the configured terms need (``TargetPlan.teacher_keys``; each registered
target in pipeline/terms.py declares its fields), whose shapes follow from the
example's token count n. With the built-in targets:

    logits                  [C]        (always, fp32, in the shard index: KD is sensitive to it)
    attn.<t>  probs         [R, n, n]  or vectors q, k: [n, D] each
    vrel.<t>  probs         [R, n, n]  or vectors v:    [n, D]
    hidden.<t>              [n, D]
    penultimate             [D]        (one vector per example)

Per relation, ``store: auto`` picks probabilities or vectors, whichever is
smaller for the data's lengths (probs grow with n^2, vectors with n*D).
Shards are memory-mapped when read; a shard whose checksum does not match is
reported by name. Rows listed in a shard's ``bare`` carry logits only: the
cache budget (capture.max_cache_gb) held no relation targets for them
(:func:`relation_subset`); the reader keeps per-example facts as numpy arrays.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .data import to_device
from .errors import CacheError
from .integrity import sha256_file
from .objective import TargetPlan, cache_fields, map_tensors

DTYPES = {"float16": np.float16, "float32": np.float32}


@dataclass
class CacheLayout:
    plan: TargetPlan
    num_labels: int
    hidden: int
    stores: dict  # relation target ("attn", "vrel") -> "probs" | "vectors"
    dtype: str

    def fields(self, n: int) -> list[tuple[str, tuple]]:
        fields = []
        for key, target, _ in self.plan.teacher_keys():
            fields += target.fields(key, n, self.plan.relation_heads, self.hidden, self.stores.get(target.name))
        return fields

    def record_size(self, n: int) -> int:
        return int(sum(np.prod(shape) for _, shape in self.fields(n)))

    def example_bytes(self, lengths: np.ndarray) -> np.ndarray:
        """Bytes each example takes in the cache (its record plus its fp32 logits), one size per distinct length."""
        lengths = np.asarray(lengths, dtype=np.int64)
        sizes, inverse = np.unique(lengths, return_inverse=True)
        item = np.dtype(DTYPES[self.dtype]).itemsize
        per_size = np.array([self.record_size(int(n)) * item + self.num_labels * 4 for n in sizes], dtype=np.int64)
        return per_size[inverse.reshape(-1)] if len(lengths) else np.zeros(0, np.int64)

    def bytes_per_example(self, lengths: np.ndarray) -> float:
        return float(np.mean(self.example_bytes(lengths)))

    def to_json(self) -> dict:
        windows = {"teacher_windows": self.plan.teacher_windows} if self.plan.teacher_windows else {}
        return {
            "pairs": self.plan.pairs,
            "relation_heads": self.plan.relation_heads,
            "terms": list(self.plan.terms),
            "targets": [t.name for t in self.plan.targets],
            "num_labels": self.num_labels,
            "hidden": self.hidden,
            "stores": self.stores,
            "dtype": self.dtype,
            **windows,
        }


def choose_stores(plan: TargetPlan, lengths: np.ndarray, hidden: int, store: str) -> dict:
    """probs or vectors per registered relation target; 'auto' takes the smaller total."""
    relations = [t for t in plan.targets if t.relation]  # only what the active terms need: none for CE + KD
    if store != "auto":
        return {t.name: store for t in relations}
    sizes, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)

    def total(target, form):
        return float(
            sum(
                int(np.prod(shape)) * int(c)
                for n, c in zip(sizes, counts)
                for _, shape in target.fields(target.name, int(n), plan.relation_heads, hidden, form)
            )
        )

    return {t.name: "probs" if total(t, "probs") <= total(t, "vectors") else "vectors" for t in relations}


def estimate_bytes(layout: CacheLayout, lengths: np.ndarray) -> int:
    return int(layout.example_bytes(lengths).sum())


def relation_subset(
    layout: CacheLayout, logits_layout: CacheLayout, lengths: np.ndarray, budget: float, seed: int = 0
) -> np.ndarray:
    """Which examples keep their relation targets when the full cache would exceed ``budget`` bytes.

    Every example keeps its logits; the rest of the budget goes to relation targets for a seeded random
    subset of the examples (random, so no movie, source file or length range is favoured), as many as fit
    in permutation order. Returns a boolean mask over ``lengths``; empty budget left: all False.
    """
    lengths = np.asarray(lengths)
    logits_bytes = logits_layout.example_bytes(lengths)
    left = budget - float(logits_bytes.sum())
    extra = layout.example_bytes(lengths) - logits_bytes  # what relation targets add per example
    order = np.random.default_rng(seed).permutation(len(lengths))
    fits = int(np.searchsorted(np.cumsum(extra[order]), left, side="right")) if left > 0 else 0
    keep = np.zeros(len(lengths), dtype=bool)
    keep[order[:fits]] = True
    return keep


def shard_ranges(num_examples: int, shard_size: int) -> list[tuple[int, int]]:
    return [(start, min(start + shard_size, num_examples)) for start in range(0, num_examples, shard_size)]


def shard_complete(folder: Path, shard: int) -> bool:
    """A shard counts only if its index exists and its bytes match the recorded checksum."""
    index = folder / f"shard-{shard:05d}.json"
    data = folder / f"shard-{shard:05d}.bin"
    if not (index.is_file() and data.is_file()):
        return False
    try:
        meta = json.loads(index.read_text())
    except json.JSONDecodeError:
        return False
    return data.stat().st_size == meta["bytes"] and sha256_file(data) == meta["sha256"]


def write_shard(
    folder: Path,
    shard: int,
    records: list[np.ndarray],
    logits: np.ndarray,
    lengths: list[int],
    first: int,
    logits_only: bool = False,
    bare: list[int] | None = None,
) -> dict:
    """Write one shard atomically: data then index, each via a temp file + rename.

    ``bare``: positions in the shard whose records are empty (logits only: the cache budget held no relation
    targets for them)."""
    data_path = folder / f"shard-{shard:05d}.bin"
    tmp = data_path.with_suffix(".bin.tmp")
    offsets = np.cumsum([0] + [len(r) for r in records])
    with open(tmp, "wb") as fh:
        for record in records:
            fh.write(record.tobytes())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, data_path)
    meta = {
        "first": first,
        "count": len(records),
        "lengths": lengths,
        "logits_only": logits_only,
        "offsets": offsets.tolist(),
        "logits": logits.tolist(),
        "bytes": data_path.stat().st_size,
        "sha256": sha256_file(data_path),
    }
    if bare:
        meta["bare"] = [int(b) for b in bare]
    index_tmp = folder / f"shard-{shard:05d}.json.tmp"
    index_tmp.write_text(json.dumps(meta))
    os.replace(index_tmp, folder / f"shard-{shard:05d}.json")
    return meta


def write_index(folder: Path, num_shards: int, num_examples: int, layout: CacheLayout) -> None:
    """The cache's table of contents, written last: a cache without it is incomplete."""
    tmp = folder / "index.json.tmp"
    tmp.write_text(json.dumps({"num_shards": num_shards, "num_examples": num_examples, "layout": layout.to_json()}))
    os.replace(tmp, folder / "index.json")


def flatten_targets(
    targets: dict, layout: CacheLayout, lengths: list[int], mask: torch.Tensor, empty_rows=()
) -> list[np.ndarray]:
    """Per-example records (unpadded) from a batch of online teacher targets; rows in ``empty_rows`` (kept for
    their logits only, capture.max_cache_gb) get an empty record."""
    dtype = DTYPES[layout.dtype]
    pieces: dict[str, Any] = {}  # torch tensors, then (below) their numpy copies
    for key, target, layer in layout.plan.teacher_keys():
        window = layout.plan.teacher_windows.get(layer) if target.windowed else None
        pieces.update(
            target.flatten(key, targets[key], layout.stores.get(target.name), mask, layout.plan.relation_heads, window)
        )
    pieces = {name: value.float().cpu().numpy() for name, value in pieces.items()}  # one copy to the host per batch
    records = []
    for row, n in enumerate(lengths):
        parts = []
        for name, shape in [] if row in empty_rows else layout.fields(n):
            value = pieces[name][row]
            value = value[:, :n, :n] if len(shape) == 3 else value[:n] if len(shape) == 2 else value  # [D]: no tokens
            parts.append(value.reshape(-1).astype(dtype))
        records.append(np.concatenate(parts) if parts else np.zeros(0, dtype))
    return records


class TeacherCache:
    """Read side: verified, memory-mapped shards -> padded target tensors for a batch."""

    def __init__(self, folder: Path, verify: bool = True, reader: TargetPlan | None = None):
        """``reader``: the reading run's target plan; a cache that stores more (capture.extra_terms) is read for those only,
        and one that lacks any of them is refused."""
        self.folder = Path(folder)
        index = json.loads((self.folder / "index.json").read_text())
        layout = index["layout"]
        if "terms" not in layout:
            raise CacheError(
                f"Teacher cache {self.folder} was written by an older capture stage (no 'terms' in its "
                "index). Rerun the same command with --from capture to recompute it."
            )
        plan = TargetPlan(
            pairs=layout["pairs"],
            relation_heads=layout["relation_heads"],
            terms=layout["terms"],
            teacher_windows=layout.get("teacher_windows"),
        )
        self.layout = CacheLayout(plan, layout["num_labels"], layout["hidden"], layout["stores"], layout["dtype"])
        stored = cache_fields(plan, plan.relation_heads, self.layout.hidden, self.layout.stores)
        # the record fields batch() reads; a target whose fields are not read unflattens to None and is left out
        self.wanted = (
            stored
            if reader is None
            else cache_fields(reader, plan.relation_heads, self.layout.hidden, self.layout.stores)
        )
        if not self.wanted <= stored:
            raise CacheError(
                f"Teacher cache {self.folder} does not hold every target this run's terms need (it stores "
                f"{', '.join(sorted(stored)) or 'logits only'}; needed: {', '.join(sorted(self.wanted))}). "
                "Rerun the same command with --from capture to recompute it."
            )
        self.shards = []
        firsts = []
        for shard in range(index["num_shards"]):
            path = self.folder / f"shard-{shard:05d}.bin"
            meta = json.loads((self.folder / f"shard-{shard:05d}.json").read_text())
            if verify and (
                not path.is_file() or path.stat().st_size != meta["bytes"] or sha256_file(path) != meta["sha256"]
            ):
                raise CacheError(
                    f"Teacher cache shard {path} is corrupted (its checksum does not match the index). "
                    "Delete that file and rerun the same command with --from capture to recompute the cache."
                )
            data = np.memmap(path, dtype=DTYPES[self.layout.dtype], mode="r") if meta["bytes"] else np.zeros(0)
            # Per-example facts as numpy (a million examples are arrays, not millions of Python objects).
            meta["lengths"] = np.asarray(meta["lengths"], dtype=np.int64)
            meta["offsets"] = np.asarray(meta["offsets"], dtype=np.int64)
            meta["logits"] = np.asarray(meta["logits"], dtype=np.float32).reshape(-1, self.layout.num_labels)
            bare = np.zeros(meta["count"], dtype=bool)
            bare[meta.get("bare", [])] = True
            meta["bare"] = bare
            self.shards.append((data, meta))
            firsts.append((meta["first"], shard))
        self.where = ShardLookup(firsts, [meta["count"] for _, meta in self.shards])

    def batch(self, indices, padded_length: int, device) -> dict:
        """Targets for these examples, padded to ``padded_length`` with zeros."""
        B, N = len(indices), padded_length
        logits, fields = [], {}
        for row, index in enumerate(indices):
            shard, position = self.where[int(index)]
            data, meta = self.shards[shard]
            n = int(meta["lengths"][position])
            start = int(meta["offsets"][position])
            logits.append(meta["logits"][position])
            if (
                meta.get("logits_only") or meta["bare"][position]
            ):  # logits only: the objective skips their relation terms
                continue
            for name, shape in self.layout.fields(n):
                size = int(np.prod(shape))
                if name not in self.wanted:  # another run's target in a shared cache
                    start += size
                    continue
                value = torch.from_numpy(np.array(data[start : start + size], dtype=np.float32)).view(shape)
                start += size
                if name not in fields:
                    full = {3: (B, shape[0], N, N), 2: (B, N, shape[-1]), 1: (B, shape[0])}[len(shape)]
                    fields[name] = torch.zeros(full)
                if len(shape) == 3:
                    fields[name][row, :, :n, :n] = value
                elif len(shape) == 2:
                    fields[name][row, :n] = value
                else:  # one vector per example
                    fields[name][row] = value
        targets = {"logits": to_device(torch.as_tensor(np.stack(logits), dtype=torch.float32), device)}
        for key, target, _ in self.layout.plan.teacher_keys():
            value = target.unflatten(key, fields, self.layout.stores.get(target.name), "cpu")
            if value is not None:
                targets[key] = map_tensors(lambda t: to_device(t, device), value)
        return targets


class ShardLookup:
    """example index -> (shard, position in it), from each shard's first example and count (shards hold
    contiguous ranges), without a per-example table."""

    def __init__(self, firsts: list[tuple[int, int]], counts: list[int]):
        ordered = sorted(firsts)
        self.starts = np.array([first for first, _ in ordered], dtype=np.int64)
        self.shard_ids = np.array([shard for _, shard in ordered], dtype=np.int64)
        self.counts = np.array([counts[shard] for _, shard in ordered], dtype=np.int64)

    def __getitem__(self, index: int) -> tuple[int, int]:
        slot = int(np.searchsorted(self.starts, index, side="right")) - 1
        position = int(index) - int(self.starts[slot]) if slot >= 0 else -1
        if slot < 0 or position >= self.counts[slot]:
            raise KeyError(index)
        return int(self.shard_ids[slot]), position

    def __len__(self) -> int:
        return int(self.counts.sum())
