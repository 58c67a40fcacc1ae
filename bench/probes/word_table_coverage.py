"""One-off probe: how many test texts would the static student's word model (model.words.onnx) send down its slow
route (a word outside its table: WordpieceTokenizer on that word) if its table also held the N most frequent words of
a general English word list? The table is a cache (any word list gives the same logits), so this is a speed lever
only; on the sentences the slow route costs about twice the common one (bench/results/word_model.md).

The table today holds the words of the training and validation texts and the tokenizer's whole-word tokens
(pipeline/export/word_model.py); words are split as the graph splits them (the tokenizer's normalizer and
pre-tokenizer). The general list is wordfreq's `large_en` (321k words, frequency order), fetched into a temporary
folder with `pip download` (not installed; wordfreq's data is CC BY-SA 4.0, which a shipped table would have to
respect: the probe measures, it ships nothing). Beside it, SymSpell's English list (installed with the project; the
list configs/sweeps/static_word_list.yaml ships through export.word_list).

    python bench/probes/word_table_coverage.py runs/mpnet_base
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pipeline.data import data_file  # noqa: E402

SIZES = [20_000, 50_000, 100_000, 200_000, None]
SYMSPELL = "package:symspellpy/frequency_dictionary_en_82_765.txt"  # MIT-like words (SCOWL), CC BY 3.0 order


def split_words(tokenizer: Tokenizer):
    def words(text: str) -> list[str]:
        normalized = tokenizer.normalizer.normalize_str(text) if tokenizer.normalizer else text
        return [word for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(normalized)]

    return words


def general_words(folder: Path) -> list[str]:
    """wordfreq's large English list, most frequent first (msgpack read from the wheels, nothing installed)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "wordfreq==3.1.1", "msgpack", "-d", str(folder)],
        check=True,
    )
    for wheel in folder.glob("*.whl"):
        zipfile.ZipFile(wheel).extractall(folder / "unpacked")
    sys.path.insert(0, str(folder / "unpacked"))
    import msgpack

    data = msgpack.load(gzip.open(folder / "unpacked" / "wordfreq" / "data" / "large_en.msgpack.gz"), raw=False)
    return [word for bucket in data[1:] for word in bucket]  # data[0] is the format header


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder with prepare/ and teacher/model/tokenizer.json")
    args = parser.parse_args()
    tokenizer_json = args.run / "teacher" / "model" / "tokenizer.json"
    words = split_words(Tokenizer.from_file(str(tokenizer_json)))

    def texts(split: str) -> list[str]:
        return [json.loads(line)["text"] for line in (args.run / "prepare" / f"{split}.jsonl").open()]

    table = {w for split in ("train", "validation") for text in texts(split) for w in words(text)}
    model = json.loads(tokenizer_json.read_text())["model"]
    prefix = model.get("continuing_subword_prefix") or "##"
    table |= {t for t in model["vocab"] if not t.startswith(prefix) and words(t) == [t]}
    test = [words(text) for text in texts("test")]

    def outside_share(known: set[str]) -> float:
        return sum(any(w not in known for w in text) for text in test) / len(test)

    print(
        f"{len(test)} test texts; table today: {len(table)} words; {outside_share(table):.1%} of test texts have a word outside it"
    )
    outside = Counter(w for text in test for w in text if w not in table)
    print("most frequent outside words:", ", ".join(w for w, _ in outside.most_common(15)))
    symspell = [line.split()[0] for line in data_file(SYMSPELL, "word list").open(encoding="utf-8") if line.split()]
    extra = {w for word in symspell for w in words(word)}
    print(
        f"\nwith SymSpell's list ({SYMSPELL}: {len(symspell):,} words; what export.word_list ships): "
        f"{len(extra - table):,} new words, {outside_share(table | extra):.1%} of test texts with a word outside"
    )
    with tempfile.TemporaryDirectory() as folder:
        general = general_words(Path(folder))
    print(
        "\n| general words added (most frequent first) | words new to the table | table words | test texts with a word outside |"
    )
    print("|---:|---:|---:|---:|")
    for size in SIZES:
        extra = {w for word in general[:size] for w in words(word)}
        known = table | extra
        print(
            f"| {size or len(general):,} | {len(known) - len(table):,} | {len(known):,} | {outside_share(known):.1%} |"
        )


if __name__ == "__main__":
    main()
