"""Without a terminal (nohup, CI, a pipe), a stage's progress bar becomes log lines at most once a minute, so a long
stage shows it is moving; in a terminal it stays a bar; other ranks show nothing."""

from __future__ import annotations

import logging
import types

from pipeline import runner


def context(rank: int = 0) -> runner.StageContext:
    dist = types.SimpleNamespace(world=2, rank=rank, is_main=rank == 0)
    return runner.StageContext(config=None, name="teacher", run_dir=None, out=None, tracker=None, dist=dist)


def test_a_bar_without_a_terminal_is_logged(monkeypatch, caplog):
    monkeypatch.setattr(runner, "SHOW_BARS", False)
    monkeypatch.setattr(runner, "PROGRESS_LOG_INTERVAL_S", 0)  # every refresh, for the test
    with caplog.at_level(logging.INFO, logger="pipeline"):
        bar = context().progress(total=4, desc="teacher epoch 1/2")
        for _ in range(4):
            bar.update(1)
        bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("[teacher] teacher epoch 1/2") and "4/4" in line for line in lines), lines
    assert all("\r" not in line and line for line in lines)


def test_other_ranks_log_nothing(monkeypatch, caplog):
    monkeypatch.setattr(runner, "SHOW_BARS", False)
    monkeypatch.setattr(runner, "PROGRESS_LOG_INTERVAL_S", 0)
    with caplog.at_level(logging.INFO, logger="pipeline"):
        bar = context(rank=1).progress(total=2, desc="x")
        bar.update(2)
        bar.close()
    assert caplog.records == []


def test_the_training_loops_loss_readout_does_not_log_a_line_each_time(monkeypatch, caplog):
    """pipeline/training.py's _report_step sets the bar's loss every few steps: with the minute's interval, that must
    not log a line each time (it did: set_postfix redraws unless told not to)."""
    from pipeline import training

    monkeypatch.setattr(runner, "SHOW_BARS", False)
    import torch

    window = types.SimpleNamespace(start=0.0, samples=64)
    ctx = types.SimpleNamespace(tracker=types.SimpleNamespace(log_metrics=lambda *a, **k: None))
    trainer = types.SimpleNamespace(scheduler=types.SimpleNamespace(get_last_lr=lambda: [1e-4]))
    progress = types.SimpleNamespace(global_step=1)

    with caplog.at_level(logging.INFO, logger="pipeline"):
        bar = context().progress(total=100, desc="distill epoch 1/3")
        for _ in range(5):
            bar.update(1)
            training._report_step(ctx, trainer, progress, bar, window, torch.tensor(0.5), {"ce": torch.tensor(0.4)})
        bar.close()
    assert len([r for r in caplog.records if "distill epoch" in r.getMessage()]) <= 2, [
        r.getMessage() for r in caplog.records
    ]
