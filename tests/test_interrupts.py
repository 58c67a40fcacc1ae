"""Ctrl-C and SIGTERM held while an MLflow write finishes (pipeline/interrupts.py), with real signals to this process."""

from __future__ import annotations

import signal

import pytest

from pipeline.interrupts import WholeCalls, interrupt, interrupts_held


@pytest.fixture
def sigterm_interrupts():
    """SIGTERM raises KeyboardInterrupt here, as in the CLI and a sweep's variant, and Ctrl-C as Python's default
    does (a shell's background job starts with SIGINT ignored: `make test &`); both handlers restored after."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def test_a_signal_during_the_block_is_delivered_when_it_ends(sigterm_interrupts):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_held():
            signal.raise_signal(signal.SIGTERM)
            done.append("the write after the signal")
        done.append("after the block")  # never: the held signal stops the program here
    assert done == ["the write after the signal"]
    assert signal.getsignal(signal.SIGTERM) is interrupt  # the handler is back
    with interrupts_held():  # and a block with no signal runs to its end and leaves the handlers as they were
        done.append("quiet")
    assert done[-1] == "quiet" and signal.getsignal(signal.SIGTERM) is interrupt


def test_a_second_signal_interrupts_at_once(sigterm_interrupts):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_held():
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGINT)  # Ctrl-C again: the user means it now
            done.append("never")
    assert done == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_signal_stays_ignored(sigterm_interrupts):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a sweep's variant ignores Ctrl-C: the sweep passes it on
    with interrupts_held():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.process  # MLflow starts a process of its own on first use
def test_a_sigterm_inside_an_mlflow_write_lets_it_finish_and_the_run_end_killed(sigterm_interrupts, tmp_path):
    """The real store: the SIGTERM arrives inside log_batch (before the store writes). Held, the metric is written,
    the interrupt follows, and the run can still be marked KILLED. Unheld, the write would be cut off."""
    import mlflow  # seconds to import: only this test of the module needs it

    client = WholeCalls(mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}"))
    run = client.create_run(client.create_experiment("e"))
    store = client._client._tracking_client.store  # MLflow internals (pinned range): where the write happens
    write = store.log_batch

    def signalled_write(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        return write(*args, **kwargs)

    store.log_batch = signalled_write
    with pytest.raises(KeyboardInterrupt):
        client.log_batch(run.info.run_id, metrics=[mlflow.entities.Metric("loss", 0.5, 0, 0)])  # as the tracker logs
    store.log_batch = write
    client.set_terminated(run.info.run_id, status="KILLED")
    ended = client.get_run(run.info.run_id)
    assert ended.data.metrics == {"loss": 0.5} and ended.info.status == "KILLED"
