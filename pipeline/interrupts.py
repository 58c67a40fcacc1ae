"""Ctrl-C and SIGTERM as KeyboardInterrupt, and the writes they must not cut in half.

The command line and a sweep's variant processes turn SIGTERM (what schedulers and containers send) into the same
KeyboardInterrupt as Ctrl-C: the run checkpoints, marks its MLflow runs KILLED and exits 130. A KeyboardInterrupt
raised *inside* an MLflow write is the exception: on the sqlite store it leaves that connection holding the
database's write lock, so the KILLED mark that follows fails with "database is locked" and the run shows RUNNING
until the next run of that folder ends it (seen in tests/test_sweep.py's SIGTERM test, one run in four to eleven
under load).
:func:`interrupts_held` lets such a write finish first.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Iterator
from typing import Any

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def interrupt(signum: int, frame: object) -> None:
    """A signal handler that stops the program as Ctrl-C does (installed for SIGTERM)."""
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then deliver the first that came (to the handler that was in
    place). A second one during the block interrupts at once: a hung write never makes the program unstoppable.

    Only signals a Python handler would turn into an exception are held (one ignored or left to the system's
    default stays so), and only on the main thread, the one Python delivers signals to.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if arrived:
            raise KeyboardInterrupt
        arrived.append(signum)

    replaced = {}
    for signum in HELD_SIGNALS:
        if callable(signal.getsignal(signum)):
            replaced[signum] = signal.signal(signum, hold)
    try:
        yield
    finally:
        for signum, handler in replaced.items():
            signal.signal(signum, handler)
        if arrived:
            signal.raise_signal(arrived[0])  # the restored handler runs now


class WholeCalls:
    """``client`` (an MlflowClient) whose every method call runs under :func:`interrupts_held`."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def whole(*args: Any, **kwargs: Any) -> Any:
            with interrupts_held():
                return attribute(*args, **kwargs)

        return whole
