"""How much padding length-grouped batches leave, and how many batches have none (those run without an
attention mask: see pipeline.inference.model_inputs).

    python bench/padding.py runs/bert_small/prepare [--batch-sizes 32 256] [--out bench/results/padding_bert_small.md]

Reads the prepare stage's tokenized train split and builds epoch 0's global batches exactly as training does
(``pipeline.data.global_batches`` with the config's seed, length grouping on and off); no model runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, emit  # (also puts the repository on the path)

from pipeline.data import global_batches
from pipeline.splits import TokenizedSplit


def rows(lengths, batch_sizes, seed: int) -> list[dict]:
    result = []
    for batch_size in batch_sizes:
        for grouped in (True, False):
            batches = global_batches(len(lengths), batch_size, seed, 0, lengths=lengths if grouped else None)
            padded_slots = sum(int(lengths[b].max()) * len(b) for b in batches)
            result.append(
                {
                    "batch_size": batch_size,
                    "grouped": grouped,
                    "batches": len(batches),
                    "unpadded": sum(int(lengths[b].min() == lengths[b].max()) for b in batches),
                    "padding_share": 1 - int(lengths.sum()) / padded_slots,
                }
            )
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prepare", type=Path, help="a prepare stage folder (runs/<config>/prepare)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--seed", type=int, default=42, help="the config's seed (bert_small: 42)")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args(argv)
    lengths = TokenizedSplit(args.prepare, "train").lengths
    lines = [
        f"Train split of {args.prepare} ({len(lengths)} examples, mean {lengths.mean():.1f} tokens), epoch 0, "
        f"seed {args.seed}: `python bench/padding.py {args.prepare}`",
        "",
        "| batch size | length-grouped | batches | without padding | padded positions |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in rows(lengths, args.batch_sizes, args.seed):
        lines.append(
            f"| {r['batch_size']} | {'yes' if r['grouped'] else 'no'} | {r['batches']} | "
            f"{r['unpadded']} ({r['unpadded'] / r['batches']:.0%}) | {r['padding_share']:.1%} |"
        )
    emit(lines, args.out, command=command_line("bench/padding.py", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
