"""Tokenized splits on disk, batching, and sharded prediction with exact gathering."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .data import pad_batch


class TokenizedSplit:
    """One split as written by the prepare stage (Arrow via `datasets`, memory-mapped)."""

    def __init__(self, prepare_dir: Path, split: str, folder: Path | None = None):
        import datasets

        self.dataset = datasets.load_from_disk(str(folder or Path(prepare_dir) / "tokenized" / split))
        self.input_ids: list[list[int]] = self.dataset["input_ids"]
        self.labels = np.asarray(self.dataset["label"], dtype=np.int64)
        self.lengths = np.asarray([len(x) for x in self.input_ids])

    def __len__(self) -> int:
        return len(self.input_ids)

    def batch(self, indices, pad_id: int, device) -> dict:
        ids, mask = pad_batch([self.input_ids[i] for i in indices], pad_id)
        return {
            "input_ids": ids.to(device),
            "attention_mask": mask.to(device),
            "labels": torch.as_tensor(self.labels[np.asarray(indices)]).to(device),
            "indices": np.asarray(indices),
        }


class TrainingData:
    """Everything the student trains on, in one index space: the train split, then unlabeled
    in-domain text (prepare), then teacher-labelled augmented variants (capture); both label -1: KD targets only.

    Rows below ``relational`` (train + unlabeled) get every configured teacher
    target; augmented rows get the teacher's logits only, so the cache stays small.
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
        self.relational = int(sum(len(p) for name, p in zip(self.names, self.parts) if name != "augmented"))

    def __len__(self):
        return int(self.offsets[-1])

    def batch(self, indices, pad, device):
        indices = np.asarray(indices)
        which = np.searchsorted(self.offsets, indices, side="right") - 1
        ids = [self.parts[w].input_ids[i - self.offsets[w]] for w, i in zip(which, indices)]
        labels = [int(self.parts[w].labels[i - self.offsets[w]]) for w, i in zip(which, indices)]
        input_ids, mask = pad_batch(ids, pad)
        return {"input_ids": input_ids.to(device), "attention_mask": mask.to(device),
                "labels": torch.tensor(labels, device=device), "indices": indices,
                "relation_rows": torch.as_tensor(indices < self.relational, device=device)}


def label_names(prepare_dir: Path) -> list[str]:
    labels = json.loads((Path(prepare_dir) / "labels.json").read_text())
    return [labels[str(i)] for i in range(len(labels))]


def pad_id(prepare_dir: Path) -> int:
    return json.loads((Path(prepare_dir) / "stats.json").read_text())["pad_token_id"]


@torch.no_grad()
def predict_logits(model, split: TokenizedSplit, batch_size: int, dist, pad: int) -> np.ndarray:
    """Logits for every example of ``split``, in order, on every rank.

    Examples are sorted by length (less padding), each rank takes a strided
    share, and the shares are gathered as Python objects with their indices,
    so an uneven last batch is neither duplicated nor dropped. ``dist`` is
    anything with rank, world, device and autocast(): a StageContext or the runner's Distributed.
    """
    model.eval()
    order = np.argsort(split.lengths, kind="stable")
    mine = order[dist.rank::dist.world]
    outputs = []
    for start in range(0, len(mine), batch_size):
        indices = mine[start:start + batch_size]
        batch = split.batch(indices, pad, dist.device)
        with dist.autocast():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        outputs.append((indices, logits.float().cpu().numpy()))
    if dist.world > 1:
        gathered = [None] * dist.world
        torch.distributed.all_gather_object(gathered, outputs)
        outputs = [item for part in gathered for item in part]
    num_labels = outputs[0][1].shape[1]
    result = np.zeros((len(split), num_labels), dtype=np.float32)
    seen = np.zeros(len(split), dtype=bool)
    for indices, logits in outputs:
        result[indices] = logits
        seen[indices] = True
    assert seen.all(), "prediction gather lost examples"
    return result


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(-1) == labels).mean())
