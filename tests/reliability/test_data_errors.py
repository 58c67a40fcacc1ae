"""Data problems with local files (csv / jsonl / parquet): one DataError naming the
file or split and the fix, exit 1, no traceback; the prepare stage that was
complete before stays complete and byte-identical. Long texts are truncated
with a logged count, not an error."""

from __future__ import annotations

import json

import pytest

from tests.reliability.helpers import check, cli, prepare_with, rows, write


def test_missing_data_file(run_copy, tmp_path):
    missing = tmp_path / "absent.csv"
    check(run_copy, missing, phrases=(f"data file '{missing}' does not exist", "set data.path"))


@pytest.mark.parametrize("suffix", ["csv", "jsonl", "parquet"])
def test_missing_text_column(run_copy, tmp_path, suffix):
    records = [{"sentence": r["text"], "label": r["label"]} for r in rows(40)]
    path = write(tmp_path / f"data.{suffix}", records)
    check(run_copy, path, phrases=("no text column 'text'", "its columns are sentence, label", "set data.text_column"))


def test_missing_label_column(run_copy, tmp_path):
    records = [{"text": r["text"], "sentiment": r["label"]} for r in rows(40)]
    path = write(tmp_path / "data.csv", records)
    check(run_copy, path, phrases=("no label column 'label'", "its columns are text, sentiment", "data.label_column"))


def test_empty_file(run_copy, tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"")
    check(run_copy, path, phrases=(f"data file '{path}' is empty",))


def test_header_only_csv(run_copy, tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("text,label\n")
    check(run_copy, path, phrases=("has no usable rows",))


def test_a_split_that_ends_up_empty(run_copy, tmp_path):
    path = write(tmp_path / "data.csv", rows(12))
    check(
        run_copy,
        path,
        "data.validation_fraction=0.02",
        phrases=("the validation split is empty", "12 examples", "use more data or larger fractions"),
    )


def test_only_one_class(run_copy, tmp_path):
    path = write(tmp_path / "data.csv", rows(40, labels=("pos",)))
    check(run_copy, path, phrases=("only one class ('pos')", "at least two labels"))


def test_test_label_unseen_in_training(run_copy, tmp_path):
    from pipeline.config import load_config
    from pipeline.data import load_frame, split_frame
    from pipeline.errors import DataError

    path = write(tmp_path / "data.csv", rows(60) + [{"text": "a lone neutral review", "label": "neutral"}])
    cfg = load_config(run_copy.config, ["data.source=csv", f"data.path={path}", "data.group_column=null"])
    frame, _ = load_frame(cfg.data)

    def places_neutral_in_test(seed: int) -> bool:
        try:
            split_frame(frame, cfg.data, seed)
        except DataError as exc:
            return "in the test split" in str(exc)
        return False

    seed = next(s for s in range(200) if places_neutral_in_test(s))
    check(
        run_copy,
        path,
        f"seed={seed}",
        phrases=("label(s) ['neutral'] appear in the test split but never in train", "add training examples"),
    )


def test_undecodable_bytes_in_csv(run_copy, tmp_path):
    path = tmp_path / "data.csv"
    lines = ["text,label"] + [f"{r['text']},{r['label']}" for r in rows(30)]
    lines[3] = "caf\xe9 cr\xe8me was lovely,pos"
    path.write_bytes("\n".join(lines).encode("latin-1"))
    check(
        run_copy,
        path,
        phrases=(f"data file '{path}' is not valid utf-8", "line 4, byte 0xe9 at column 4", "re-save it as utf-8"),
    )


def test_malformed_jsonl(run_copy, tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "fine", "label": "pos"}\n{"text": "broken", "label": \n')
    check(run_copy, path, phrases=(f"data file '{path}' could not be parsed as jsonl",))


def test_label_id_outside_label_names(run_copy, tmp_path):
    records = [{"text": f"review {i}", "label": i % 3} for i in range(40)]
    path = write(tmp_path / "data.jsonl", records)
    check(run_copy, path, "data.label_names=[neg,pos]", phrases=("label id(s) [2] outside data.label_names",))


def test_null_labels_are_dropped_not_a_class(run_copy, tmp_path):
    records = rows(40) + [{"text": "a review nobody labelled", "label": None}]
    path = write(tmp_path / "data.jsonl", records)
    result = cli(*prepare_with(run_copy, path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run_copy.run_dir / "prepare" / "labels.json").read_text()) == {"0": "neg", "1": "pos"}


def test_long_texts_are_truncated_and_counted(run_copy, tmp_path):
    records = rows(40)
    records[0]["text"] = "a very long review " * 40
    records[1]["text"] = "another long review " * 40
    path = write(tmp_path / "data.csv", records)
    teacher_before = run_copy.snapshot()["teacher"]
    result = cli(*prepare_with(run_copy, path, "data.max_length=16"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "error:" not in result.stderr
    stats = json.loads((run_copy.run_dir / "prepare" / "stats.json").read_text())
    truncated = sum(s["truncated"] for s in stats["splits"].values())
    assert truncated >= 2
    assert f"{truncated} texts were longer than data.max_length=16 tokens and were truncated" in result.stderr
    assert all(s["max_tokens"] <= 16 for s in stats["splits"].values())
    assert run_copy.snapshot()["teacher"] == teacher_before  # downstream output kept (now stale, not deleted)


def test_a_jsonl_file_with_a_utf8_bom_reads_like_one_without(run_copy, tmp_path):
    """Editors on Windows write a byte-order mark; a BOM CSV always worked, a BOM JSONL was refused."""
    plain = write(tmp_path / "plain.jsonl", rows(60))
    marked = tmp_path / "bom.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    runs = {}
    for name, path in (("plain", plain), ("bom", marked)):
        folder = tmp_path / f"runs_{name}"
        result = cli(
            "run",
            run_copy.config,
            "data.source=jsonl",
            f"data.path={path}",
            "data.group_column=null",
            "tracking.enabled=false",
            "--only",
            "prepare",
            "--runs-dir",
            str(folder),
        )
        assert result.returncode == 0, result.stderr[-2000:]
        runs[name] = next(folder.glob("*/prepare"))
    for split in ("train", "validation", "test"):
        assert (runs["bom"] / f"{split}.jsonl").read_text() == (runs["plain"] / f"{split}.jsonl").read_text()
