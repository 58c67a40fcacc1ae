"""Processes that end with the process that started them, however it ends (``kill -9`` included).

The fastText workers (pipeline/fasttext_worker.py, a pool initializer) and the ranks of a multi-process run (each
rank arms it at start-up against the launcher, pipeline/cli.py) call :func:`end_with_parent`: without it, a
``kill -9`` of the pipeline or of the launcher leaves them running, holding cores and the run's lock files.
"""

from __future__ import annotations

import os
import sys


def end_with_parent(parent: int) -> None:
    """This process is killed when ``parent`` (its parent's pid) dies. Linux: the kernel's parent-death signal
    (prctl PR_SET_PDEATHSIG; it fires when the thread that started this process ends, so the parent must start it
    from a thread that lives as long as the parent: a pool's and torch elastic's do); elsewhere a thread that
    watches the parent's pid. Either way, a parent already gone before this ran ends this process at once."""
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
