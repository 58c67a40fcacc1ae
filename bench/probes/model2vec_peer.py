"""Probe: the model2vec peer (pipeline/peers.py Model2VecPeer) trained on a finished run's splits and teacher, exactly
as the peers stage trains it, without rerunning the stage (a run made with an older peer list keeps its
fingerprint). Prints its training seconds, file size, test accuracy and macro-F1 one text per call, and the mean
ms per text over the first 300 test texts (one thread, not interleaved with the other models: a rough figure).
Run: python bench/probes/model2vec_peer.py runs/mpnet_base [--config mpnet_base] [--seed 0]"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder with prepare/ and teacher/ complete")
    parser.add_argument("--config", help="the config it ran (default: the folder's name)")
    parser.add_argument("--seed", type=int, help="model2vec's training seed (default: the config's seed)")
    args = parser.parse_args()

    import numpy as np
    import torch

    from pipeline.config import load_config
    from pipeline.metrics import classification_report
    from pipeline.peers import Model2VecPeer
    from pipeline.splits import label_names
    from stages.peers import StaticInputs, model2vec_peer, read_splits

    torch.set_num_threads(1)
    prepare, teacher = args.run / "prepare", args.run / "teacher"
    names = label_names(prepare)
    texts, labels = read_splits(prepare, names)
    config = load_config(args.config or args.run.name)
    start = time.perf_counter()
    peer, settings = model2vec_peer(
        StaticInputs(prepare, teacher), texts, labels, config.peers, config.seed if args.seed is None else args.seed
    )
    print(f"trained in {time.perf_counter() - start:.0f} s (token vectors from the teacher included): {settings}")
    with tempfile.TemporaryDirectory() as tmp:
        peer.save(Path(tmp) / "model2vec.zip")
        print(f"file {(Path(tmp) / 'model2vec.zip').stat().st_size / 1e6:.1f} MB")
        shipped = Model2VecPeer.load(Path(tmp) / "model2vec.zip")
    predicted = np.array([shipped.predict_one(text) for text in texts["test"]])
    report = classification_report(labels["test"], predicted, names)
    print(f"test accuracy {report['accuracy']:.4f}, macro-F1 {report['macro_f1']:.4f} ({len(predicted)} texts)")
    start = time.perf_counter()
    for text in texts["test"][:300]:
        shipped.predict_one(text)
    print(f"{(time.perf_counter() - start) / 300 * 1000:.3f} ms per text (mean of 300, one thread)")


if __name__ == "__main__":
    main()
