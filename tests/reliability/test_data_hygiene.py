"""Data hygiene (issue 18): data that used to train on nonsense.

Missing-label tokens ("NA", "null", "None"...) are dropped and counted, never
made a class; data.label_names names integer labels whatever the file type;
a text cell that is a list, dict, array, bytes or number is refused; a huge
text cell is cut to data.max_text_chars characters before the tokenizer sees
it; error messages quote input cut to a readable length and name the line of
a parse error.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pandas as pd
import pytest

from tests.reliability.helpers import check, cli, error_message, planned, prepare_with, rows, write

NAMES = ("neg", "pos")


def prepared(run, path, *overrides) -> tuple:
    """Run prepare on a data file; return (cli result, prepare folder)."""
    result = cli(*prepare_with(run, path, *overrides))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return result, run.run_dir / "prepare"


def records_of(prepare: Path) -> list[dict]:
    return [
        json.loads(line)
        for split in ("train", "validation", "test")
        for line in (prepare / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


def labels_json(prepare: Path) -> dict:
    return json.loads((prepare / "labels.json").read_text())


# ---------------------------------------------------------------- missing labels

MISSING = ["NA", "null", "None", "N/A", " n/a ", "nan", "-", "?", "", "NULL"]


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_missing_label_tokens_are_dropped_and_counted(run_copy, tmp_path, suffix):
    records = rows(40) + [{"text": f"an unlabelled review {i}", "label": token} for i, token in enumerate(MISSING)]
    expected = len(MISSING)
    if suffix == "jsonl":
        records.append({"text": "a review with a JSON null label", "label": None})
        expected += 1
    path = write(tmp_path / f"data.{suffix}", records)
    result, prepare = prepared(run_copy, path)
    assert labels_json(prepare) == {"0": "neg", "1": "pos"}
    assert {r["label"] for r in records_of(prepare)} == set(NAMES)
    assert not any(r["text"].startswith("an unlabelled review") for r in records_of(prepare))
    stats = json.loads((prepare / "stats.json").read_text())
    assert stats["rows"]["missing_labels"] == expected
    assert stats["rows"]["rows_read"] == len(records)
    assert stats["missing_label_values"]["NA"] == 1 and stats["missing_label_values"]["null"] == 1
    assert stats["missing_label_values"]["<blank>"] == 1
    if suffix == "jsonl":
        assert stats["missing_label_values"]["<null>"] == 1
    assert f"{expected} of {len(records)} rows have no label" in result.stderr
    manifest = json.loads((prepare / "manifest.json").read_text())
    assert manifest["summary"]["missing_labels"] == expected


def test_missing_labels_setting_is_honoured(run_copy, tmp_path):
    records = rows(40) + [{"text": f"a review nobody rated {i}", "label": "Unknown"} for i in range(6)]
    records += [{"text": "a review with a blank label", "label": "  "}]  # blank stays missing whatever the list says
    path = write(tmp_path / "data.csv", records)
    result, prepare = prepared(run_copy, path, "data.missing_labels=[unknown]")
    assert labels_json(prepare) == {"0": "neg", "1": "pos"}
    assert json.loads((prepare / "stats.json").read_text())["rows"]["missing_labels"] == 7
    assert "7 of 47 rows have no label (Unknown x6, <blank> x1)" in result.stderr


def test_only_missing_labels_is_no_usable_rows(run_copy, tmp_path):
    path = write(tmp_path / "data.csv", [{"text": f"review {i}", "label": "N/A"} for i in range(30)])
    check(run_copy, path, phrases=("has no usable rows", "30 with a missing label"))


# ---------------------------------------------------------------- label_names for integer labels


def id_rows(n: int, make=lambda i: i) -> list[dict]:
    """Rows whose label is an id; the text says which name it stands for."""
    return [{"text": f"review number {i} says it was {NAMES[i % 2]}", "label": make(i % 2)} for i in range(n)]


@pytest.mark.parametrize("case", ["csv", "csv_padded", "jsonl_strings", "jsonl_with_null"])
def test_label_names_apply_to_integer_labels(run_copy, tmp_path, case):
    if case == "csv":
        path = write(tmp_path / "data.csv", id_rows(40))  # read as str: "0", "1"
    elif case == "csv_padded":
        path = tmp_path / "data.csv"
        path.write_text("text,label\n" + "".join(f'"{r["text"]}", {r["label"]}\n' for r in id_rows(40)))
    elif case == "jsonl_strings":
        path = write(tmp_path / "data.jsonl", id_rows(40, str))
    else:  # ints and a null: pandas reads the column as float64 (0.0, 1.0, NaN)
        path = write(tmp_path / "data.jsonl", id_rows(40) + [{"text": "an unlabelled review", "label": None}])
    _, prepare = prepared(run_copy, path, "data.label_names=[neg,pos]")
    assert labels_json(prepare) == {"0": "neg", "1": "pos"}
    records = records_of(prepare)
    assert len(records) == 40
    assert all(r["text"].endswith(r["label"]) for r in records)


def test_integer_label_outside_label_names_in_csv(run_copy, tmp_path):
    path = write(tmp_path / "data.csv", [{"text": f"review {i}", "label": str(i % 3)} for i in range(40)])
    check(
        run_copy, path, "data.label_names=[neg,pos]", phrases=("label id(s) [2] outside data.label_names", "ids 0..1")
    )


def test_labels_that_are_neither_ids_nor_names(run_copy, tmp_path):
    path = write(tmp_path / "data.csv", rows(40, labels=("positive", "negative")))
    check(
        run_copy,
        path,
        "data.label_names=[neg,pos]",
        phrases=("label(s) 'negative', 'positive' that are neither integer ids nor names in data.label_names",),
    )


# ---------------------------------------------------------------- text cells must be strings


@pytest.mark.parametrize(
    "suffix,value,kind",
    [
        ("jsonl", ["a", "list", "of", "words"], "a list"),
        ("jsonl", {"title": "a dict"}, "a dict"),
        ("jsonl", 4.5, "a number"),
        ("parquet", ["a", "list", "of", "words"], "an array"),
        ("parquet", b"some bytes", "bytes"),
    ],
)
def test_text_cells_that_are_not_strings_are_refused(run_copy, tmp_path, suffix, value, kind):
    path = tmp_path / f"data.{suffix}"
    if suffix == "jsonl":  # one bad cell, on the sixth line
        lines = [json.dumps(r) for r in rows(40)]
        lines.insert(5, json.dumps({"text": value, "label": "pos"}))
        path.write_text("\n".join(lines) + "\n")
    else:  # a whole column of token lists (read back as arrays) or of bytes
        texts, labels = [r["text"] for r in rows(40)], [r["label"] for r in rows(40)]
        column = [t.split() for t in texts] if isinstance(value, list) else [t.encode() for t in texts]
        pd.DataFrame({"text": column, "label": labels}).to_parquet(path)
    where = "row 6 (line 6 of the file)" if suffix == "jsonl" else "row 1"
    check(
        run_copy,
        path,
        phrases=(
            f"text column 'text' holds {kind}, not a string, at {where}",
            "point data.text_column at the column holding the text",
        ),
    )


def test_a_whole_number_column_as_text_is_refused(run_copy, tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("\n" + "".join(json.dumps({"id": i, "text": i, "label": NAMES[i % 2]}) + "\n" for i in range(40)))
    check(
        run_copy,
        path,
        phrases=("text column 'text' holds a number, not a string, at row 1 (line 2 of the file)", "wrong column"),
    )


def test_text_pair_cells_must_be_strings(run_copy, tmp_path):
    records = [dict(r, second=f"context {i}") for i, r in enumerate(rows(40))]
    records[7]["second"] = ["not", "a", "string"]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    check(
        run_copy,
        path,
        "data.text_pair_column=second",
        phrases=(
            "text_pair column 'second' holds a list, not a string, at row 8 (line 8 of the file)",
            "data.text_pair_column",
        ),
    )


def test_a_list_of_labels_is_refused(run_copy, tmp_path):
    path = tmp_path / "data.jsonl"
    lines = [json.dumps(r) for r in rows(40)]
    lines[2] = json.dumps({"text": "a multi-label review", "label": ["pos", "neg"]})
    path.write_text("\n".join(lines) + "\n")
    check(run_copy, path, phrases=("label column 'label' holds a list at row 3", "multi-label data is not supported"))


# ---------------------------------------------------------------- huge text cells


@pytest.mark.parametrize("setting,limit", [(None, 20 * 32), ("data.max_text_chars=100", 100)])
def test_a_huge_text_cell_is_cut_before_tokenization(run_copy, tmp_path, monkeypatch, setting, limit):
    import stages.prepare

    records = rows(40)
    records[0]["text"] = "an endless review " * 120_000  # ~2 MB: far over the budget
    records[1]["text"] = "  " + "x" * (limit + 1)  # leading blanks go first, then one character too many
    path = write(tmp_path / "data.csv", records)
    seen = []
    real = stages.prepare.tokenize_split

    def spy(tokenizer, texts, *rest, **options):
        seen.append(max(len(t) for t in texts))
        return real(tokenizer, texts, *rest, **options)

    monkeypatch.setattr(stages.prepare, "tokenize_split", spy)
    result, prepare = prepared(run_copy, path, *([setting] if setting else []))
    assert seen and max(seen) <= limit  # the tokenizer never saw the huge cell
    stats = json.loads((prepare / "stats.json").read_text())
    assert stats["cut_texts"] == 2 and stats["max_text_chars"] == limit
    assert f"2 texts were longer than data.max_text_chars={limit} characters and were cut" in result.stderr
    assert json.loads((prepare / "manifest.json").read_text())["summary"]["cut_texts"] == 2
    texts = [r["text"] for r in records_of(prepare)]
    assert max(map(len, texts)) <= limit
    assert ("an endless review " * 120_000)[:limit] in texts and "x" * limit in texts
    for split in ("train", "validation", "test"):
        ids = datasets.load_from_disk(str(prepare / "tokenized" / split))["input_ids"]
        assert max(len(x) for x in ids) <= 32
    if setting is None:  # 640 characters of the cut review are still far more than max_length=32 tokens
        assert sum(s["truncated"] for s in stats["splits"].values()) >= 1


def test_huge_text_pair_cell_is_cut(run_copy, tmp_path):
    records = [dict(r, second=f"context {i}") for i, r in enumerate(rows(40))]
    records[3]["second"] = "a long context " * 100_000
    path = write(tmp_path / "data.jsonl", records)
    result, prepare = prepared(run_copy, path, "data.text_pair_column=second")
    pairs = [r["text_pair"] for r in records_of(prepare)]
    assert max(map(len, pairs)) <= 640
    assert json.loads((prepare / "stats.json").read_text())["cut_texts"] == 1


# ---------------------------------------------------------------- error messages quote input briefly


def test_an_enormous_header_is_not_quoted_in_full(run_copy, tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("h" * 1_000_000 + "\n" + "".join(f"row {i}\n" for i in range(20)))
    result = check(
        run_copy, path, phrases=("no text column 'text'", "its columns are hhhh", "...", "set data.text_column")
    )
    assert len(error_message(result.stderr)) < 1000


def test_thousands_of_columns_are_not_listed(run_copy, tmp_path):
    path = tmp_path / "data.csv"
    path.write_text(",".join(f"column_{i}" for i in range(5000)) + "\n" + ",".join("0" * 5000) + "\n")
    result = check(run_copy, path, phrases=("its columns are column_0, column_1", "(4980 more)"))
    assert len(error_message(result.stderr)) < 1500


def test_a_long_label_is_quoted_briefly(run_copy, tmp_path):
    path = write(tmp_path / "data.csv", rows(40, labels=("L" * 100_000,)))
    result = check(run_copy, path, phrases=("only one class ('LLLL", "...')", "at least two labels"))
    assert len(error_message(result.stderr)) < 500


def test_csv_parse_error_names_the_line(run_copy, tmp_path):
    path = tmp_path / "data.csv"
    lines = ["text,label"] + [f"review {i},pos" for i in range(30)]
    lines[5] = "a review, with a comma,pos"
    path.write_text("\n".join(lines) + "\n")
    check(run_copy, path, phrases=(f"data file '{path}' could not be parsed as csv at line 6", "expected 2 fields"))


def test_jsonl_parse_error_names_the_line(run_copy, tmp_path):
    path = tmp_path / "data.jsonl"
    lines = [json.dumps(r) for r in rows(30)]
    lines[11] = '{"text": "broken", "label": '
    path.write_text("\n".join(lines) + "\n")
    check(run_copy, path, phrases=(f"data file '{path}' could not be parsed as jsonl at line 12",))


# ---------------------------------------------------------------- hub class labels


@pytest.mark.parametrize("label_names", [None, ["neg", "pos"]])
def test_hub_unlabelled_rows_are_missing_labels(monkeypatch, label_names):
    """A hub ClassLabel column marks unlabelled rows (GLUE test splits) with -1: dropped and counted, with or
    without data.label_names (with them the ids used to be refused as 'outside data.label_names')."""
    from pipeline.config import DataConfig
    from pipeline.data import load_frame

    features = datasets.Features(
        {"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["negative", "positive"])}
    )
    table = {"sentence": [f"sentence {i}" for i in range(30)], "label": [-1, -1] + [i % 2 for i in range(28)]}
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict(table, features=features))
    report: dict = {}
    cfg = DataConfig(source="hub", hub_name="fake", text_column="sentence", label_names=label_names)
    frame, _ = load_frame(cfg, report=report)
    assert sorted(frame["label"].unique()) == (label_names or ["negative", "positive"])
    assert len(frame) == 28 and report["missing_labels"] == 2 and report["missing_label_values"] == {"<null>": 2}


# ---------------------------------------------------------------- given splits


def test_given_split_files_are_kept_exactly(run_copy, tmp_path):
    """data.train / validation / test: prepare writes exactly those rows, in order; editing one reruns prepare."""
    files = {}
    for split, n in (("train", 60), ("validation", 14), ("test", 16)):
        records = [{"text": f"{split} review {i} was {NAMES[i % 2]}", "label": NAMES[i % 2]} for i in range(n)]
        files[split] = (write(tmp_path / f"{split}.csv", records), records)
    overrides = [
        "data.source=csv",
        "data.path=null",
        "data.group_column=null",
        *(f"data.{split}={path}" for split, (path, _) in files.items()),
    ]
    result = cli("run", run_copy.config, *overrides, "--only", "prepare", "--runs-dir", str(run_copy.runs_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    prepare = run_copy.run_dir / "prepare"
    for split, (_, records) in files.items():
        written = [json.loads(line) for line in (prepare / f"{split}.jsonl").read_text().splitlines()]
        assert [(r["text"], r["label"]) for r in written] == [(r["text"], r["label"]) for r in records]
    assert json.loads((prepare / "stats.json").read_text())["given_splits"] == ["train", "validation", "test"]
    assert "prepare" not in planned(run_copy.config, run_copy.runs_dir, *overrides)
    write(files["test"][0], files["test"][1][:-1])
    assert "prepare" in planned(run_copy.config, run_copy.runs_dir, *overrides)


def test_a_bad_cell_in_a_given_split_names_that_file_and_line(run_copy, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": f"good review {i}", "label": NAMES[i % 2]}) + "\n" for i in range(30)))
    test = tmp_path / "test.jsonl"
    test.write_text(
        json.dumps({"text": "fine", "label": "pos"})
        + "\n\n"
        + json.dumps({"text": ["a", "list"], "label": "neg"})
        + "\n"
    )
    result = cli(
        "run",
        run_copy.config,
        "data.source=jsonl",
        "data.path=null",
        "data.group_column=null",
        f"data.train={train}",
        f"data.test={test}",
        "--only",
        "prepare",
        "--runs-dir",
        str(run_copy.runs_dir),
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    message = error_message(result.stderr)
    assert str(test) in message and "row 2 (line 3 of the file)" in message and "a list" in message
