"""teacher.ensemble: several teachers fine-tuned with consecutive seeds; the students' logit target is the log of their
mean probabilities (pipeline/inference.py ensemble_logits, stages/teacher.py, stages/capture.py)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

from pipeline.cache import TeacherCache
from pipeline.config import load_config
from pipeline.errors import ConfigError
from pipeline.inference import accuracy, ensemble_logits
from pipeline.models import load_classifier
from pipeline.splits import TokenizedSplit, TrainingData, pad_id
from tests.helpers import read_json, run_cli


def test_ensemble_logits_are_the_log_of_the_mean_probabilities():
    members = [torch.randn(5, 3, generator=torch.Generator().manual_seed(s)) * 4 for s in range(3)]
    naive = torch.zeros(5, 3)
    for row in range(5):
        for label in range(3):
            mean = sum(torch.exp(m[row, label]).item() / torch.exp(m[row]).sum().item() for m in members) / len(members)
            naive[row, label] = float(np.log(mean))
    combined = ensemble_logits(members)
    assert torch.allclose(combined, naive, atol=1e-5)
    assert torch.allclose(combined.exp().sum(-1), torch.ones(5), atol=1e-5)  # log-probabilities
    assert torch.allclose(ensemble_logits(members[:1]), torch.log_softmax(members[0], -1), atol=1e-6)
    # half precision members (capture runs under autocast) are combined in fp32
    assert ensemble_logits([m.half() for m in members]).dtype == torch.float32


def test_an_ensemble_needs_fine_tuning_and_a_cached_capture():
    with pytest.raises(ConfigError, match=r"teacher.ensemble 2 fine-tunes .* teacher.finetune is false"):
        load_config("tiny", ["teacher.ensemble=2", "teacher.finetune=false"])
    with pytest.raises(ConfigError, match=r"teacher.finetune is true with teacher.epochs 0"):
        load_config("tiny", ["teacher.ensemble=2", "teacher.epochs=0"])
    with pytest.raises(ConfigError, match=r"capture.mode 'online' runs one teacher"):
        load_config("tiny", ["teacher.ensemble=2", "capture.mode=online"])
    with pytest.raises(ConfigError, match="teacher.ensemble"):
        load_config("tiny", ["teacher.ensemble=0"])


@pytest.fixture(scope="module")
def ensemble_run(tiny_run, tmp_path_factory):
    """The tiny run's prepare, then a teacher ensemble of two, its capture, a student and its evaluation, in fp32
    (a tiny random teacher's logits stay near zero: bf16 rounding would hide the second member's share)."""
    runs_dir = tmp_path_factory.mktemp("ensemble")
    shutil.copytree(tiny_run["run_dir"] / "prepare", runs_dir / "tiny" / "prepare", copy_function=os.link)
    fp32 = ("precision=fp32", "capture.dtype=float32")
    args = ("run", "tiny", "teacher.ensemble=2", *fp32, "tracking.enabled=false", "--to", "evaluate")
    result = run_cli(*args, runs_dir=runs_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    return runs_dir, args


def teacher_logits(folder, batch) -> torch.Tensor:
    model = load_classifier(str(folder)).eval()
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()


def test_the_cache_holds_the_two_teachers_mean_probabilities(ensemble_run):
    run_dir = ensemble_run[0] / "tiny"
    teacher = run_dir / "teacher"
    assert (teacher / "members" / "1" / "model" / "config.json").is_file()
    # the member's checkpoints and best weights are gone once it is saved; the first teacher's best weights stay (its
    # checkpoints, resume state, go when the stage completes)
    assert not list(teacher.glob("*member1*")) and (teacher / "best-teacher.safetensors").is_file()
    assert not list(teacher.glob("checkpoints-*"))
    assert not (teacher / "members" / "2").exists()
    train = TrainingData(run_dir / "prepare")
    picked = np.arange(len(train))[:40]
    batch = train.batch(picked, pad_id(run_dir / "prepare"), "cpu")
    first, second = teacher_logits(teacher / "model", batch), teacher_logits(teacher / "members/1/model", batch)
    assert (first - second).abs().max().item() > 0.005  # another seed: another teacher
    expected = ensemble_logits([first, second])
    cached = TeacherCache(run_dir / "capture" / "cache").batch(picked, batch["input_ids"].shape[1], "cpu")["logits"]
    error = (cached - expected).abs().max().item()
    against_first = (cached - torch.log_softmax(first, -1)).abs().max().item()
    assert error < 1e-5 and against_first > 2e-4, (error, against_first)  # fp32: exact up to rounding
    # the ensemble's accuracies in metrics.json are those of the combined test and validation logits
    metrics = read_json(teacher / "metrics.json")
    test = TokenizedSplit(run_dir / "prepare", "test")
    batch = test.batch(np.arange(len(test)), pad_id(run_dir / "prepare"), "cpu")
    both = ensemble_logits(
        [teacher_logits(teacher / "model", batch), teacher_logits(teacher / "members/1/model", batch)]
    )
    stored = np.load(teacher / "ensemble_test_logits.npy")
    assert np.abs(stored - both.numpy()).max() < 1e-5  # the members' mean probabilities, not the first teacher's
    assert np.abs(stored - torch.log_softmax(teacher_logits(teacher / "model", batch), -1).numpy()).max() > 2e-4
    assert metrics["ensemble_test_accuracy"] == accuracy(stored, test.labels)
    assert metrics["member1_test_accuracy"] == accuracy(
        teacher_logits(teacher / "members/1/model", batch).numpy(), test.labels
    )
    assert "ensemble_validation_accuracy" in metrics and metrics["ensemble_members"] == 2
    evaluated = read_json(run_dir / "evaluate" / "metrics.json")
    assert evaluated["teacher_ensemble"] == {"members": 2, "accuracy": metrics["ensemble_test_accuracy"]}
    assert evaluated["teacher"]["accuracy"] == metrics["test_accuracy"]  # retention stays against the first teacher


def test_an_interrupted_ensemble_keeps_the_members_it_finished(ensemble_run):
    """A teacher stage stopped after member 1 was saved resumes without fine-tuning anything again: the first
    teacher's last checkpoint is complete, member 1's folder is loaded."""
    runs_dir, args = ensemble_run
    run_dir = runs_dir / "tiny"
    copy = runs_dir / "resumed"
    shutil.copytree(run_dir, copy / "tiny", copy_function=os.link)
    stage = copy / "tiny" / "teacher"
    fingerprint = read_json(stage / "manifest.json")["fingerprint"]
    before = read_json(stage / "metrics.json")
    (stage / "manifest.json").unlink()
    for name in ("model", "metrics.json"):  # unlinked, not written: the hard links' originals stay intact
        target = stage / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    stage.rename(stage.with_name("teacher.partial"))
    (copy / "tiny" / "teacher.partial" / ".fingerprint").write_text(fingerprint)
    result = run_cli(*args[:-2], "--to", "teacher", runs_dir=copy)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stderr + result.stdout
    assert "[teacher] member 1 already fine-tuned" in output and "teacher-member1 epoch" not in output
    assert read_json(stage / "metrics.json") == before
