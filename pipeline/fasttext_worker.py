"""One fastText fit per fresh process (run by pipeline/peers.py).

fastText's bindings keep state between ``train_supervised`` calls in one process: on this machine a second
fit in the same process stopped with "Encountered NaN" for settings that train cleanly as the first fit
of a fresh process (seen in one-off probes on this machine). So every fit runs here, in a process of its own, imports nothing but
fastText, and hands back a file and its validation accuracy.

Each worker ends with the pipeline process that started it, however that ends (``kill -9`` included):
:func:`end_with_parent` is the pool's initializer.
"""

from __future__ import annotations

import os
import sys


def end_with_parent(parent: int) -> None:
    """Pool initializer: this worker is killed when its parent process dies. Linux: the kernel's parent-death
    signal (prctl PR_SET_PDEATHSIG); elsewhere a thread that watches the parent's pid. Either way, a parent already
    gone before this ran ends the worker at once."""
    import signal
    import threading
    import time

    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            PR_SET_PDEATHSIG = 1
            armed = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    if not armed:

        def watch():
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


def fit(
    train_file: str, validation_file: str, setting: dict, buckets: int, target: str, quantize_cutoff: int | None = None
) -> dict:
    """Train on ``train_file`` (one thread: deterministic), optionally quantize (retraining), save to ``target``;
    the validation accuracy of what was saved."""
    import fasttext

    model = fasttext.train_supervised(input=train_file, thread=1, verbose=0, minCount=1, bucket=buckets, **setting)
    if quantize_cutoff is not None:
        model.quantize(input=train_file, qnorm=True, retrain=True, cutoff=quantize_cutoff, thread=1, verbose=0)
    model.save_model(target)
    examples, precision, _ = model.test(validation_file)  # one label per line: precision@1 is accuracy
    return {"validation_accuracy": float(precision), "examples": int(examples)}
