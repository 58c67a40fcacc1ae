"""One fastText fit per fresh process (run by pipeline/peers.py).

fastText's bindings keep state between ``train_supervised`` calls in one process: on this machine a second
fit in the same process stopped with "Encountered NaN" for settings that train cleanly as the first fit
of a fresh process (seen in one-off probes on this machine). So every fit runs here, in a process of its own, imports nothing but
fastText, and hands back a file and its validation accuracy.

Each worker ends with the pipeline process that started it, however that ends (``kill -9`` included):
pipeline/parent_death.py's ``end_with_parent`` is the pool's initializer.
"""

from __future__ import annotations


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
