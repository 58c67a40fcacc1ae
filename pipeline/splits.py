"""The prepare stage's splits as every later stage reads them: token ids memory-mapped from Arrow and read lazily,
batches padded on the host, the training data (train split, unlabeled text, the teacher-labelled augmented copies)
in one index space, and the run's labels and pad id."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .data import pad_batch, pad_segments, to_device
from .errors import CacheError


def has_padding(mask: torch.Tensor) -> bool:
    """Whether a host-side [B, N] 0/1 mask pads any row (checked before the batch moves to the device)."""
    return bool((mask == 0).any())


RELATION_ROWS = (
    "relation_rows.npy"  # capture's choice under capture.max_cache_gb: which relational rows have relation targets
)


class TokenIds(Sequence):
    """The ``input_ids`` column of a memory-mapped Arrow split, read lazily.

    ``ids[i]`` is one example's ids as a list, ``ids[a:b]`` a list of them, :meth:`arrays` numpy views for a
    batch: nothing is copied until an example is asked for, so a split of millions of examples costs its
    offsets, not Python objects. Each Arrow chunk keeps its own values (views of the mapped file) and offsets.
    """

    def __init__(self, column):
        self._values = [chunk.values.to_numpy(zero_copy_only=False) for chunk in column.chunks]
        self._offsets = [chunk.offsets.to_numpy() for chunk in column.chunks]
        self._starts = np.cumsum([0] + [len(chunk) for chunk in column.chunks])
        self.lengths = (np.concatenate([np.diff(o) for o in self._offsets]) if self._offsets else np.zeros(0)).astype(
            np.int64
        )

    def __len__(self) -> int:
        return int(self._starts[-1])

    def distinct(self) -> np.ndarray:
        """Every token id the split uses, once, sorted."""
        parts = [
            values[offsets[0] : offsets[-1]] for values, offsets in zip(self._values, self._offsets) if len(offsets) > 1
        ]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

    def _array(self, index: int) -> np.ndarray:
        chunk = int(np.searchsorted(self._starts, index, side="right")) - 1
        offsets, row = self._offsets[chunk], index - self._starts[chunk]
        return self._values[chunk][offsets[row] : offsets[row + 1]]

    def arrays(self, indices) -> list[np.ndarray]:
        """The ids of these examples (non-negative indices) as numpy views, in order."""
        return [self._array(int(i)) for i in indices]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._array(i).tolist() for i in range(*index.indices(len(self)))]
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"example {index} of a split of {len(self)}")
        return self._array(index % len(self)).tolist()

    def __iter__(self):
        for values, offsets in zip(self._values, self._offsets):
            for row in range(len(offsets) - 1):
                yield values[offsets[row] : offsets[row + 1]].tolist()


def used_token_ids(splits, always) -> np.ndarray:
    """Every token id these splits use, and the ids in ``always`` (pad, special tokens), sorted: the rows a training
    job's word embeddings need (teacher.used_embedding_rows: train and validation; distill.used_embedding_rows:
    every part of the training data, augmented variants included, and validation)."""
    return np.union1d(np.concatenate([split.input_ids.distinct() for split in splits]), list(always))


class TokenizedSplit:
    """One split as written by the prepare stage (Arrow via `datasets`, memory-mapped).

    ``input_ids`` reads examples lazily (:class:`TokenIds`); ``labels`` and ``lengths`` are numpy arrays
    taken from the Arrow columns, so no split is ever held as Python lists. ``token_type_ids`` is read the same
    way when prepare stored it (sentence pairs), else None; batches then carry it too.
    """

    def __init__(self, prepare_dir: Path, split: str, folder: Path | None = None):
        import datasets

        self.dataset = datasets.load_from_disk(str(folder or Path(prepare_dir) / "tokenized" / split))
        table = self.dataset.with_format("arrow")[
            :
        ]  # zero-copy: the mapped table (save_to_disk leaves no index mapping)
        self.input_ids = TokenIds(table.column("input_ids"))
        self.labels = table.column("label").to_numpy().astype(np.int64, copy=False)
        self.lengths = self.input_ids.lengths
        names = table.column_names
        self.token_type_ids = TokenIds(table.column("token_type_ids")) if "token_type_ids" in names else None

    def __len__(self) -> int:
        return len(self.input_ids)

    def batch(self, indices, pad_id: int, device) -> dict:
        indices = np.asarray(indices)
        ids, mask = pad_batch(self.input_ids.arrays(indices), pad_id)
        batch = {
            "input_ids": to_device(ids, device),
            "attention_mask": to_device(mask, device),
            "padded": has_padding(mask),
            "labels": to_device(torch.as_tensor(self.labels[indices]), device),
            "indices": indices,
        }
        if self.token_type_ids is not None:
            batch["token_type_ids"] = to_device(pad_segments(self.token_type_ids.arrays(indices), ids.shape[1]), device)
        return batch


class TrainingData:
    """Everything the student trains on, in one index space: the train split, then unlabeled
    in-domain text (prepare), then teacher-labelled augmented variants (capture); both label -1: KD targets only.

    Rows below ``relational`` (train + unlabeled) get every configured teacher
    target; augmented rows get the teacher's logits only, so the cache stays small.
    When the capture stage could store relation targets for only some rows
    (``capture.max_cache_gb``), ``relation_rows.npy`` in its folder says which;
    the others train with logits only.
    """

    def __init__(self, prepare: Path, capture: Path | None = None):
        self.names, self.parts = ["train"], [TokenizedSplit(prepare, "train")]
        if (Path(prepare) / "tokenized" / "unlabeled").exists():
            self.names.append("unlabeled")
            self.parts.append(TokenizedSplit(prepare, "unlabeled"))
        if capture is not None and (Path(capture) / "augmented").exists():  # written by the capture stage
            self.names.append("augmented")
            self.parts.append(TokenizedSplit(prepare, "augmented", Path(capture) / "augmented"))
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts])
        self.lengths = np.concatenate([p.lengths for p in self.parts])
        self.labels = np.concatenate([p.labels for p in self.parts])
        self.relational = int(sum(len(p) for name, p in zip(self.names, self.parts) if name != "augmented"))
        self.has_relations = np.arange(len(self)) < self.relational
        chosen = Path(capture) / RELATION_ROWS if capture is not None else None
        if chosen is not None and chosen.is_file():
            kept = np.load(chosen)
            if kept.shape != (self.relational,):
                raise CacheError(
                    f"{chosen} marks {kept.shape[0]} examples but the training data has {self.relational} "
                    "with relation targets; it belongs to another run. Rerun with --from capture."
                )
            self.has_relations[: self.relational] = kept
        with_types = [p.token_type_ids is not None for p in self.parts]
        if any(with_types) and not all(with_types):
            raise CacheError(
                f"The training data parts {self.names} do not all carry token_type_ids ({with_types}); "
                "they come from different prepare runs. Rerun with --from prepare."
            )
        self.segments = all(with_types)

    def __len__(self):
        return int(self.offsets[-1])

    def batch(self, indices, pad, device):
        indices = np.asarray(indices)
        which = np.searchsorted(self.offsets, indices, side="right") - 1
        ids = [self.parts[w].input_ids.arrays([i - self.offsets[w]])[0] for w, i in zip(which, indices)]
        input_ids, mask = pad_batch(ids, pad)
        # relation_rows stays on the host: the objective picks rows with it without a device sync.
        batch = {
            "input_ids": to_device(input_ids, device),
            "attention_mask": to_device(mask, device),
            "padded": has_padding(mask),
            "labels": to_device(torch.as_tensor(self.labels[indices]), device),
            "indices": indices,
            "relation_rows": torch.as_tensor(self.has_relations[indices]),
        }
        if self.segments:
            types = [self.parts[w].token_type_ids.arrays([i - self.offsets[w]])[0] for w, i in zip(which, indices)]
            batch["token_type_ids"] = to_device(pad_segments(types, input_ids.shape[1]), device)
        return batch


def label_names(prepare_dir: Path) -> list[str]:
    labels = json.loads((Path(prepare_dir) / "labels.json").read_text())
    return [labels[str(i)] for i in range(len(labels))]


def pad_id(prepare_dir: Path) -> int:
    return json.loads((Path(prepare_dir) / "stats.json").read_text())["pad_token_id"]
