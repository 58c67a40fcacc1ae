"""A model on prepared data: the keyword inputs of every model call, and sharded prediction over a split with
exact gathering (every rank gets every logit, in order)."""

from __future__ import annotations

import numpy as np
import torch

from .splits import TokenizedSplit

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def model_inputs(batch: dict) -> dict:
    """The model's keyword inputs from a batch dict: input_ids, attention_mask, and token_type_ids when the data
    has them (sentence pairs for a teacher with segment embeddings). Every model call goes through this.

    A batch built here knows on the host whether it has padding (``batch["padded"]``); without padding the model
    gets no attention_mask. The result is the same (transformers drops an all-ones mask itself), but it finds
    that out with ``mask.all()``, a host-device sync on every forward, and only a mask-free call lets PyTorch's
    SDPA pick its flash kernel on CUDA. Batches of equal-length examples (length-grouped) take this path.
    """
    inputs = {key: batch[key] for key in MODEL_INPUTS if key in batch}
    if batch.get("padded") is False:
        del inputs["attention_mask"]
    return inputs


# The teacher stage's logits on the test split (teacher/test_logits.npy), read by evaluate instead of a second pass.
TEACHER_TEST_LOGITS = "test_logits.npy"


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
    mine = order[dist.rank :: dist.world]
    outputs = []
    for start in range(0, len(mine), batch_size):
        indices = mine[start : start + batch_size]
        batch = split.batch(indices, pad, dist.device)
        with dist.autocast():
            logits = model(**model_inputs(batch)).logits
        outputs.append((indices, logits.float().cpu().numpy()))
    if dist.world > 1:
        gathered: list[list] = [[] for _ in range(dist.world)]  # each filled with one rank's outputs
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


def ensemble_logits(members: list[torch.Tensor]) -> torch.Tensor:
    """The log of the members' mean probabilities (a classifier ensemble's prediction, as logits: softmax of the
    result is that mean); one member's logits come back as its log-probabilities."""
    log_probs = torch.stack([torch.log_softmax(m.float(), dim=-1) for m in members])
    return torch.logsumexp(log_probs, dim=0) - torch.log(torch.tensor(float(len(members))))


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(-1) == labels).mean())
