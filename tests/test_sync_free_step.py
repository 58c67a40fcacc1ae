"""The training step never reads a value back from the device (issue 17): a GPU step that calls
``.item()`` makes the host wait, so the GPU idles while the next batch is built. Checked on CPU by
making every read-back call raise during the steps; the finiteness of the loss is still enforced,
at the reads FiniteWatch does (logged steps, checkpoints, validation)."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from pipeline.config import load_config
from pipeline.data import pad_batch
from pipeline.errors import TrainingError
from pipeline.inference import model_inputs
from pipeline.runner import Distributed
from pipeline.splits import has_padding
from pipeline.training import FiniteWatch, build_trainer, cross_entropy_loss, train_step

READ_BACKS = ("item", "tolist", "__float__", "__int__")


def tiny_bert():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def batch_of(rows, pad=0):
    ids, mask = pad_batch([np.array(r) for r in rows], pad)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "padded": has_padding(mask),
        "labels": torch.tensor([i % 2 for i in range(len(rows))]),
    }


# AdamW's step counter is a host tensor (capturable=False): its .item() in torch.optim reads no device memory.
HOST_SIDE = (f"torch{os.sep}optim{os.sep}",)


@contextlib.contextmanager
def read_backs_forbidden():
    """Every tensor read-back raises inside, except torch.optim's reads of its host-side step counters."""
    originals = {name: getattr(torch.Tensor, name) for name in READ_BACKS}

    def forbid(name):
        def refuse(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if any(part in caller for part in HOST_SIDE):
                return originals[name](self, *args, **kwargs)
            raise AssertionError(
                f"Tensor.{name}() read a value back from the device during a training step (called from {caller})"
            )

        return refuse

    try:
        for name in READ_BACKS:
            setattr(torch.Tensor, name, forbid(name))
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def make_trainer():
    config = load_config("tiny")
    dist = Distributed(config)
    model = tiny_bert()
    return build_trainer(dist, {"model": model}, config.distill, num_examples=64, tag="sync"), dist


def test_unpadded_batches_call_the_model_without_a_mask_and_give_the_same_logits():
    model = tiny_bert().eval()
    same_length = batch_of([[1, 5, 6, 2], [1, 7, 8, 2]])
    padded = batch_of([[1, 5, 6, 2], [1, 7, 2]])
    assert same_length["padded"] is False and padded["padded"] is True
    assert "attention_mask" not in model_inputs(same_length)
    assert "attention_mask" in model_inputs(padded)
    with torch.no_grad():
        without = model(**model_inputs(same_length)).logits
        with_mask = model(**{k: same_length[k] for k in ("input_ids", "attention_mask")}).logits
    torch.testing.assert_close(without, with_mask, rtol=0, atol=0)
    # A batch built elsewhere (no "padded" key) keeps its mask.
    assert "attention_mask" in model_inputs({k: padded[k] for k in ("input_ids", "attention_mask")})


def test_training_steps_read_nothing_back_from_the_device():
    trainer, _ = make_trainer()
    before = [p.detach().clone() for p in trainer.params]
    with read_backs_forbidden():
        for step in range(1, 4):
            rows = [[1, 5 + step, 6, 2], [1, 7, 8 + step, 2, 3]]  # padded and ...
            train_step(trainer, batch_of(rows), cross_entropy_loss, step=step)
            train_step(trainer, batch_of([[1, 9, 2], [1, 4, 2]]), cross_entropy_loss, step=step)  # ... unpadded batches
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.params)), "the steps trained nothing"


def test_a_non_finite_loss_is_reported_with_its_step_and_term_at_the_next_read():
    trainer, dist = make_trainer()

    def loss_at(step):
        def loss_fn(batch, modules):
            loss, terms = cross_entropy_loss(batch, modules)
            if step == 3:  # the kd term of step 3 blows up
                kd = torch.tensor(math.inf)
                return loss + kd, {"ce": terms["ce"], "kd": kd}
            return loss, {"ce": terms["ce"], "kd": torch.tensor(0.5)}

        return loss_fn

    for step in (1, 2):
        train_step(trainer, batch_of([[1, 5, 2], [1, 6, 2]]), loss_at(step), step=step)
    trainer.watch.check(dist, "distill")  # all finite so far: no error
    for step in (3, 4, 5):  # steps after the bad one do not move the reported step
        train_step(trainer, batch_of([[1, 5, 2], [1, 6, 2]]), loss_at(step), step=step)
    with pytest.raises(
        TrainingError,
        match=r"distill: the loss became non-finite at optimizer step 3 \(term\(s\): kd; "
        r"values: ce=[0-9.]+, kd=inf\)",
    ):
        trainer.watch.check(dist, "distill")


def test_finite_watch_before_any_step_reads_nothing():
    FiniteWatch().check(None, "teacher")  # no step seen: nothing to read, no dist needed


def test_a_distillation_step_from_the_cache_with_logits_only_rows_reads_nothing_back(tmp_path):
    """Cached targets, relation terms on some rows only (the objective picks them with a host-side index)."""
    from pipeline.cache import CacheLayout, TeacherCache, choose_stores
    from pipeline.config import LossWeights
    from pipeline.objective import DistillObjective, TargetPlan, teacher_targets
    from tests.helpers import batch_of as lengths_batch
    from tests.helpers import bert, fake_config, write_cache

    lengths = [7, 4, 9, 2]
    teacher, student = bert(32, 4, 2, seed=0), bert(32, 4, 1, seed=1)
    weights = LossWeights(ce=1.0, kd=1.0, attention=1.0, value_relation=1.0)
    plan = TargetPlan(pairs=[(0, 1)], relation_heads=4, ce=True, kd=True, attention=True, value_relation=True)
    objective = DistillObjective(fake_config(weights), plan, 32, 32)
    batch = lengths_batch(lengths)
    online = teacher_targets(teacher, batch, plan)
    write_cache(
        tmp_path, online, batch, CacheLayout(plan, 3, 32, choose_stores(plan, np.array(lengths), 32, "auto"), "float32")
    )
    cache = TeacherCache(tmp_path)
    batch["relation_rows"] = torch.tensor([True, False, True, False])  # rows 1 and 3: augmented, logits only
    with read_backs_forbidden():
        loss, terms = objective(student, batch, cache.batch(batch["indices"], batch["input_ids"].shape[1], "cpu"))
        loss.backward()
    assert set(terms) == {"ce", "kd", "attention", "value_relation"}
    assert torch.isfinite(loss) and student.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0


RANKS_SCRIPT = """
import math, sys, torch
from accelerate import Accelerator
from pipeline.errors import TrainingError
from pipeline.training import FiniteWatch

accelerator = Accelerator(cpu=True)
dist = type("Dist", (), {"accelerator": accelerator, "world": accelerator.num_processes, "device": accelerator.device})()
watch = FiniteWatch()
for step in range(1, 6):  # only rank 1 sees a non-finite loss, at step 3
    bad = accelerator.process_index == 1 and step == 3
    loss = torch.tensor(math.nan if bad else 0.5)
    watch.see(loss, {"ce": loss}, step)
try:
    watch.check(dist, "distill")
    print(f"rank {accelerator.process_index}: no error")
except TrainingError as err:
    print(f"rank {accelerator.process_index}: {err}")
torch.distributed.destroy_process_group()  # as the CLI does: no gloo thread left joinable at exit
"""


@pytest.mark.pipeline
def test_a_non_finite_loss_on_one_rank_stops_every_rank_naming_its_step(tmp_path):
    """Two real CPU processes (gloo): the earliest bad step of any rank is what every rank reports."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
        ],  # --standalone: torchrun picks a free rendezvous port itself
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: distill: the loss became non-finite at optimizer step 3" in result.stdout, (
            result.stdout + result.stderr[-3000:]
        )
