"""The bundle in the runtimes a mobile team uses: the text-in model (tokenizer operators + classifier), the shipped
files run by Node.js (onnxruntime-node, a JavaScript tokenizer), the mobile usability verdicts, integrity checks.

Most tests read the session-wide tiny run (tests/conftest.py `tiny_run`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from pipeline.export import text_model as TM
from pipeline.export import word_model
from pipeline.export.files import WEB_FILES
from pipeline.export.onnx_graph import onnx_logits
from pipeline.export.tokenizer import IdSplit, tokenize_texts, tokenizer_facts
from tests.helpers import NODE_DIR, read_json, run_bench

pytestmark = pytest.mark.pipeline  # every check runs on the tiny runs' bundles (fixture `bundle`)


@pytest.fixture(scope="module", params=["transformer", "static"])
def bundle(request):
    """The tiny run's bundle, and the same run's with a static student: every runtime check runs on both."""
    run = request.getfixturevalue("tiny_run" if request.param == "transformer" else "static_tiny_run")
    return run["run_dir"] / "export" / "bundle"


@pytest.fixture(scope="module")
def predict(bundle):
    """The bundle's own predict.py, imported from the bundle folder."""
    sys.path.insert(0, str(bundle))
    try:
        import predict
    finally:
        sys.path.remove(str(bundle))
    return predict


@pytest.fixture(scope="module")
def test_texts(tiny_run):
    records = [
        json.loads(line) for line in (tiny_run["run_dir"] / "prepare" / "test.jsonl").read_text().splitlines() if line
    ]
    return [r["text"] for r in records], [r["label"] for r in records]


def test_the_static_bundle_ships_a_student_with_hashed_bigrams(static_tiny_run):
    """The static tiny run's student has the bigram table (tests/conftest.py STATIC_TINY), so every runtime check on
    the static bundle (text-in model, int8, .ort, predict.py, Node) covers the pairs computed inside the graph."""
    student = read_json(static_tiny_run["run_dir"] / "distill" / "student" / "config.json")
    assert student["model_type"] == "static-embedding" and student["bigram_buckets"] == 64
    bundle = static_tiny_run["run_dir"] / "export" / "bundle"
    # the head is folded into the tables (static_model.fold_classifier): no matrix product is left in the graph
    assert not [n.name for n in onnx.load(bundle / "model.onnx").graph.node if n.op_type in ("MatMul", "Gemm")]


def test_the_word_model_bench_reads_a_static_run(static_tiny_run, tmp_path):
    """bench/word_model.py on the static tiny run: every model's row, the routes, the markdown written."""
    out = tmp_path / "word_model.md"
    result = run_bench("word_model.py", str(static_tiny_run["run_dir"]), "--texts", "20", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    table = out.read_text()
    assert "model.words.onnx" in table and "fastText" in table and "words in the table" in table


def test_the_static_bundle_ships_its_word_model_with_the_fp32_graphs_predictions(static_tiny_run, test_texts):
    """model.words.onnx (pipeline/export/word_model.py) and its .ort twin give the fp32 ids-in graph's predictions on
    predict.py's token ids for the whole test split, and the export timed it from raw text beside the peers."""
    texts, _ = test_texts
    texts = texts + UNCLEAN  # and the texts the normalization fixes are for
    bundle = static_tiny_run["run_dir"] / "export" / "bundle"
    metadata = read_json(bundle / "metadata.json")
    words = metadata["word_model"]
    assert words["shipped"] and words["file"] == "model.words.onnx" and words["ort_file"] == "model.words.ort"
    assert words["words_in_table"] > 100 and words["check"]["examples"] == len(texts) - len(UNCLEAN)
    assert {"model.words.onnx", "model.words.ort"} <= set(metadata["files"])
    ids = tokenize_texts(bundle / "tokenizer.json", texts, metadata["text_model"]["truncation"])
    fp32 = onnx_logits(bundle / "model.onnx", IdSplit(ids, np.zeros(len(ids))), 0)
    for name in ("model.words.onnx", "model.words.ort"):
        probabilities, labels = word_model.run(bundle / name, texts)
        assert (labels == fp32.argmax(-1)).all(), name
        assert np.abs(probabilities.sum(-1) - 1).max() < 1e-5
    rows = {row["model"]: row for row in metadata["from_text"]["rows"]}
    assert rows["student_words"]["median_ms"] > 0 and rows["student_words"]["file_mb"] == pytest.approx(
        words["file_mb"], abs=1e-3
    )
    assert metadata["from_text"]["versus_peers"]["student_row"] == "student_words"
    readme = (bundle / "README.md").read_text()
    assert "model.words.onnx" in readme
    # export.word_corpus (tests/conftest.py STATIC_WORD_CORPUS): the words it holds twice are in the graph's table
    corpus = words["word_corpus"]
    assert corpus["texts"] == 2 and corpus["min_count"] == 2 and corpus["where"] == {"source": "imdb"}
    assert corpus["words"] == 2 and corpus["test_sentences_left_out"] == 0
    assert "the words found at least 2 times (2) in 2 texts of `" in readme
    lookup = next(n for n in onnx.load(str(bundle / "model.words.onnx")).graph.node if n.op_type == "LabelEncoder")
    table = {key.decode() for a in lookup.attribute if a.name == "keys_strings" for key in a.strings}
    assert len(table) == words["words_in_table"]
    assert {"quorblax", "vintheral"} <= table and not {"frumiously", "zanzibarian"} & table


def test_text_model_reproduces_predict_py_ids_and_predictions(bundle, predict, test_texts):
    """model.text.onnx and its .ort twin: strings in, predict.py's token ids and predictions out, whole test split."""
    texts, _ = test_texts
    metadata = read_json(bundle / "metadata.json")
    text = metadata["text_model"]
    assert text["shipped"] and text["file"] == "model.text.onnx" and text["ort_file"] == "model.text.ort"
    assert text["classifier"] == metadata["variants"][metadata["recommended"]]["file"]  # the shipped variant inside
    assert text["check"]["exact"] and text["check"]["token_ids_identical"] == len(texts) == text["check"]["examples"]
    assert {"model.text.onnx", "model.text.ort"} <= set(metadata["files"])
    reference = predict.BundleClassifier(bundle)  # the recommended ids-in model, predict.py's tokenization
    expected = reference.predict(texts)
    encoded = [reference.tokenizer.encode(t).ids for t in texts]
    for name in ("model.text.onnx", "model.text.ort"):
        probabilities, labels, ids = TM.run(bundle / name, texts)  # one text per call, as predict.py now defaults to
        for row, expected_ids in zip(ids, encoded):  # right-padded with the pad id, like predict.py's batches
            assert row[: len(expected_ids)] == expected_ids and set(row[len(expected_ids) :]) <= {reference.pad_id}
        assert [reference.labels[i] for i in labels] == [e["label"] for e in expected], name
        expected_probs = np.array([[e["probabilities"][n] for n in reference.labels] for e in expected])
        assert np.abs(probabilities - expected_probs).max() < 1e-5, name
    config = (bundle / "required_operators.config").read_text()
    contrib = (
        next(line for line in config.splitlines() if line.startswith("ai.onnx.contrib;1;")).split(";")[2].split(",")
    )
    # a reduced build keeps the tokenizer operators, the normalization fixes' ones (inside an If) included
    assert {
        "BasicTokenizer",
        "WordpieceTokenizer",
        "StringMapping",
        "StringRegexSplitWithOffsets",
        "StringJoin",
    } <= set(contrib)
    readme = (bundle / "README.md").read_text()
    assert "OrtxPackage.getLibraryPath()" in readme and "registerCustomOps(functionPointer:" in readme
    assert "onnxruntime-extensions-android" in readme and "onnxruntime-extensions-c" in readme


def test_text_model_truncates_like_predict_py(bundle, predict):
    """Texts far longer than max_length, an empty text and mixed batches: same ids and labels as predict.py. The
    100,000-character texts took 7 s each when every word reached the word x piece bookkeeping (now the words are cut
    to max_length first)."""
    reference = predict.BundleClassifier(bundle)
    texts = [
        "",
        "a " * 200 + "film",
        "word " * 31,
        "word " * 29,
        "Café naïve résumé, déjà vu!",
        "ok",
        "word " * 20_000,
        "é" * 50_000 + " ok",
    ]
    _, labels, ids = TM.run(bundle / "model.text.onnx", texts)
    encoded = [reference.tokenizer.encode(t).ids for t in texts]
    assert max(len(e) for e in encoded) == reference.max_length  # truncation really happened
    for row, expected_ids in zip(ids, encoded):
        assert row[: len(expected_ids)] == expected_ids
    assert list(labels) == [reference.labels.index(e["label"]) for e in reference.predict(texts)]


# Texts the extension operators used to tokenize otherwise than tokenizers (issue 29): a review decoded with the wrong
# codec upstream (each "ô" became U+FFFD), invalid UTF-8 decoded with replacement, İ, the Kelvin and Ohm signs, letters
# with accents beyond Latin-1, Greek and Cyrillic accents, a combining mark, punctuation tokenizers splits off.
UNCLEAN = [
    "C\ufffdtes-du-Rh\ufffdne, a fine red",
    b"bad \xff\xfe bytes".decode("utf-8", errors="replace"),
    "\u0130stanbul trip",
    "5 \u212a warmer",
    "a 10 \u2126 resistor",
    "T\u014dky\u014d and \u0141\u00f3d\u017a",
    "\u1f10\u03bb\u03ad\u03bd\u03b7 \u0401\u043b\u043a\u0430",
    "e\u0301cole",
    "ctrl\x07char\x7f",
    "wow\u2772great\u2773",
    "line\u2028break",
    "\ue000private use",
    "\u4e2d\u6587 text",
]


def test_text_model_agrees_with_predict_py_on_unclean_text(bundle, predict):
    """Every text above gets predict.py's ids; what is left (if anything) is counted over all of Unicode and listed."""
    reference = predict.BundleClassifier(bundle)
    _, labels, ids = TM.run(bundle / "model.text.onnx", UNCLEAN)
    for text, row in zip(UNCLEAN, ids):
        expected = reference.tokenizer.encode(text).ids
        assert row[: len(expected)] == expected and set(row[len(expected) :]) <= {reference.pad_id}, repr(text)
    assert list(labels) == [reference.labels.index(e["label"]) for e in reference.predict(UNCLEAN)]
    text_model = read_json(bundle / "metadata.json")["text_model"]
    fixes = text_model["normalization"]
    assert fixes["characters_mapped"] > 10_000 and fixes["characters_removed"] > 100_000
    assert fixes["still_different"] < 1000  # of 1,112,064 code points; each one is listed
    assert len(fixes["still_different_ranges"]) >= 1 and any(
        "still tokenize differently" in line for line in text_model["known_differences"]
    )
    assert "decode them with replacement" in (bundle / "README.md").read_text()


def test_text_model_refuses_bytes_that_are_not_utf8(bundle, predict):
    """Raw bytes that are not UTF-8 (as a C API caller can pass them; numpy 'S' arrays reach onnxruntime as bytes)
    used to tokenize to other ids than predict.py's (which decodes with replacement first): now the model refuses
    them, and the same text decoded with replacement gets predict.py's ids."""
    import onnxruntime as ort

    raw = b"a caf\xe9 film \xff\xfe ok"
    session = TM.session(bundle / "model.text.onnx")
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match="Input strings must be valid UTF-8"):
        session.run(TM.TEXT_OUTPUTS, {TM.TEXT_INPUT: np.array([raw], dtype="S")})
    decoded = raw.decode("utf-8", "replace")
    _, _, ids = TM.run(session, [decoded])
    expected = predict.BundleClassifier(bundle).tokenizer.encode(decoded).ids
    assert ids[0][: len(expected)] == expected
    assert "refuses them" in (bundle / "README.md").read_text()


def _train(kind: str, folder: Path) -> Path:
    """A small tokenizer trained offline: RoBERTa-style byte-level BPE or SentencePiece-style Unigram."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    corpus = [
        "a gripping and beautifully acted film",
        "a tedious mess of a movie",
        "the plot is thin, the jokes fall flat",
        "  an unexpectedly moving story",
        "Café naïve résumé",
    ] * 20
    if kind == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tokenizer.train_from_iterator(
            corpus,
            trainers.BpeTrainer(
                vocab_size=400,
                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            ),
        )
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    else:
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.train_from_iterator(
            corpus,
            trainers.UnigramTrainer(
                vocab_size=120, special_tokens=["<pad>", "<unk>", "[CLS]", "[SEP]", "<mask>"], unk_token="<unk>"
            ),
        )
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
        )
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def test_byte_level_bpe_tokenizer_graph_matches_tokenizers(tmp_path, test_texts):
    """Byte-level BPE runs as HfJsonTokenizer (+ the prefix space tokenizers adds): identical ids, truncation included."""
    tokenizer_json = _train("bpe", tmp_path / "bpe")
    roles = {"cls": "<s>", "sep": "</s>", "pad": "<pad>", "unk": "<unk>", "mask": "<mask>"}
    facts = tokenizer_facts(tokenizer_json, roles)
    assert TM.unsupported_reason(facts, pairs=False) is None
    texts = test_texts[0] + ["", " leading space", "\ttab first", "x" * 300]
    model, operator = TM.tokenizer_graph(tokenizer_json, facts, 24, 18)
    path = tmp_path / "tokenizer.onnx"
    path.write_bytes(model.SerializeToString())
    ids, mask = TM.session(path).run(None, {TM.TEXT_INPUT: np.array(texts, dtype=object)})
    expected = tokenize_texts(tokenizer_json, texts, 24)
    assert operator == "HfJsonTokenizer" and any(len(e) == 24 for e in expected)
    assert [list(row[: m.sum()]) for row, m in zip(ids, mask)] == expected


def test_unigram_tokenizer_ships_ids_in_model_only_with_the_reason(tmp_path, bundle):
    """A tokenizer kind the operators cannot reproduce: no file, metadata says why (and so does a pair task)."""
    tokenizer_json = _train("unigram", tmp_path / "unigram")
    facts = tokenizer_facts(tokenizer_json, {"cls": "[CLS]", "sep": "[SEP]", "pad": "<pad>", "unk": "<unk>"})
    target = tmp_path / "model.text.onnx"
    records = [{"text": "a fine film", "label": "fresh"}]
    result, labels = TM.ship(bundle / "model.int8.onnx", tokenizer_json, facts, 16, records, 0, target)
    assert labels is None and result["shipped"] is False and "Unigram" in result["why"] and not target.exists()
    wordpiece = tokenizer_facts(bundle / "tokenizer.json")
    pairs, _ = TM.ship(
        bundle / "model.int8.onnx",
        bundle / "tokenizer.json",
        wordpiece,
        16,
        [{"text": "a", "text_pair": "b", "label": "fresh"}],
        0,
        target,
    )
    assert pairs["shipped"] is False and "pair" in pairs["why"] and not target.exists()


@pytest.mark.external  # Node.js
def test_node_runs_the_bundle_like_predict_py(node, bundle, predict, tiny_run, test_texts, tmp_path):
    """Node.js, onnxruntime-node and @huggingface/tokenizers (JavaScript), fed only the bundle's files: the same token
    ids, labels and probabilities as predict.py on the whole test split, for the recommended graph and its .ort twin."""
    import shutil
    import subprocess

    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)  # the bundle alone, away from the run folder
    texts, gold = test_texts
    reference = predict.BundleClassifier(copy)
    expected = reference.predict(texts)
    encoded = [reference.tokenizer.encode(t).ids for t in texts]
    metadata = read_json(copy / "metadata.json")
    chosen = metadata["variants"][metadata["recommended"]]
    for model in (chosen["file"], chosen["ort_file"]):
        proc = subprocess.run(
            [
                node,
                str(NODE_DIR / "predict.mjs"),
                str(copy),
                str(tiny_run["run_dir"] / "prepare" / "test.jsonl"),
                model,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        assert len(rows) == len(texts)
        assert [row["ids"] for row in rows] == encoded, model
        assert [row["label"] for row in rows] == [e["label"] for e in expected], model
        got = np.array([row["probabilities"] for row in rows])
        want = np.array([[e["probabilities"][n] for n in reference.labels] for e in expected])
        assert np.abs(got - want).max() < 1e-5, model
        accuracy = float(np.mean([row["label"] == label for row, label in zip(rows, gold)]))
        assert accuracy == pytest.approx(chosen["accuracy"], abs=1e-12), model  # the recorded test accuracy


@pytest.mark.external  # Node.js
def test_node_answers_a_damaged_model_file_with_one_error(node, bundle, tiny_run, tmp_path):
    """A listed model file changed on disk, and an unlisted one of random bytes (.onnx and .ort): one "error:" line
    naming the file and exit 2, as predict.py answers them; never a stack trace."""
    import random
    import shutil
    import subprocess

    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    texts = tiny_run["run_dir"] / "prepare" / "test.jsonl"
    (copy / "model.int8.onnx").write_bytes(random.Random(1).randbytes(4096))
    for name in ("other.onnx", "other.ort"):
        (copy / name).write_bytes(random.Random(name).randbytes(4096))
    for name, says in [
        ("model.int8.onnx", "is damaged: its sha256"),
        ("other.onnx", "is not a model onnxruntime-node can load"),
        ("other.ort", "is not a model onnxruntime-node can load"),
    ]:
        proc = subprocess.run(
            [node, str(NODE_DIR / "predict.mjs"), str(copy), str(texts), name],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, (name, proc.stderr[-2000:])
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], (name, proc.stderr)
        assert str(copy / name) in lines[0] and proc.stdout == ""


def test_mobile_usability_verdicts_recorded_and_match_the_checker_cli(bundle):
    """metadata.json holds the mobile usability checker's verdicts per provider; the checker's own CLI agrees."""
    import re
    import subprocess

    metadata = read_json(bundle / "metadata.json")
    mobile = metadata["mobile_usability"]
    shipped = mobile["shipped"]
    assert shipped["model"] == metadata["variants"][metadata["recommended"]]["file"]
    assert shipped["dynamic_inputs"] == ["input_ids", "attention_mask"]
    assert set(shipped["providers"]) == {"NNAPI", "CoreML NeuralNetwork", "CoreML MLProgram"}
    for provider in shipped["providers"].values():
        as_is, fixed = provider["as_shipped"], provider["with_fixed_shapes"]
        assert 0 <= as_is["supported_nodes"] <= as_is["nodes"] and as_is["partitions"] >= 0
        assert fixed["supported_nodes"] >= as_is["supported_nodes"]  # fixing shapes never loses nodes
        assert provider["verdict"] in ("YES", "MAYBE", "NO")
    limit = shipped["coreml_dimension_limit"]
    assert limit["embedding_rows"] == metadata["tokenizer"]["vocab_size"] and limit["exceeded"] == (
        limit["embedding_rows"] > 16384
    )
    proc = subprocess.run(
        [sys.executable, "-m", "onnxruntime.tools.check_onnx_model_mobile_usability", str(bundle / shipped["model"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = dict(re.findall(r"Model should perform well with (.+?) as is: (\w+)", proc.stderr + proc.stdout))
    assert said == {name: p["verdict"] for name, p in shipped["providers"].items()}
    readme = (bundle / "README.md").read_text()
    assert "## Mobile execution providers (NNAPI, CoreML)" in readme
    assert f"| NNAPI (Android) | {shipped['providers']['NNAPI']['as_shipped']['supported_nodes']}/" in readme
    static = mobile["static_qdq_int8"]  # the static QDQ int8 graph is checked too, shipped or not
    assert static["built"] and static["model"] == metadata["variants"]["int8_static"]["file"]
    assert set(static["providers"]) == set(shipped["providers"])
    if shipped["model"] != static["model"]:
        assert f"The static QDQ int8 graph `{static['model']}`" in readme


def test_verify_checks_every_file_and_names_the_one_that_differs(bundle, tmp_path):
    import shutil
    import subprocess

    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)

    def verify():
        return subprocess.run(
            [sys.executable, "-I", "predict.py", "--verify"], cwd=copy, capture_output=True, text=True, timeout=120
        )

    ok = verify()
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["verified"] == len(read_json(copy / "metadata.json")["files"])
    labels = (copy / "labels.json").read_text()
    (copy / "labels.json").write_text(labels.replace("fresh", "fresk"))  # one changed byte in a non-model file
    bad = verify()
    assert bad.returncode == 2 and "labels.json" in bad.stderr and "changed after export" in bad.stderr
    assert bad.stdout == ""
    (copy / "labels.json").write_text(labels)
    (copy / "model.text.ort").unlink()
    missing = verify()
    assert missing.returncode == 2 and "model.text.ort is missing" in missing.stderr


def _devtools():
    """scripts/ui_screenshot.py's Chromium finder and DevTools-pipe client (no extra packages)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "ui_screenshot", Path(__file__).resolve().parents[1] / "scripts" / "ui_screenshot.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.external  # headless Chromium
def test_demo_page_classifies_in_headless_chromium(bundle, predict, test_texts, tmp_path):
    """bundle/demo.html served from 127.0.0.1, opened in headless Chromium: type a sentence, click, read the label and
    probabilities back from the page; they are predict.py's for that sentence."""
    import shutil
    import subprocess
    import time
    import urllib.request

    metadata = read_json(bundle / "metadata.json")
    if not metadata["demo"]["shipped"]:
        pytest.skip(f"no demo.html in this bundle: {metadata['demo']['why']}")
    ui = _devtools()
    chromium = next((path for name in ui.CHROMIUM_NAMES if (path := shutil.which(name))), None)
    if chromium is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium); the demo page cannot be opened")
    assert {f"demo/{name}" for name in WEB_FILES} | {"demo.html"} <= set(metadata["files"])  # checksummed like the rest
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    port = ui.free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(copy)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/demo.html", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "the local http server did not start"
                time.sleep(0.2)
        with ui.browser_page(chromium, tmp_path, 1280, 900) as browser:
            browser("Page.navigate", url=f"http://127.0.0.1:{port}/demo.html")
            assert browser.wait_for("document.body && ['1', 'error'].includes(document.body.dataset.ready)", 90)
            status = browser.js("document.getElementById('status').textContent")
            assert browser.js("document.body.dataset.ready") == "1", status
            reference = predict.BundleClassifier(copy)
            texts = test_texts[0][:3] + ["a " * 100 + "dull film"]  # the last one is truncated
            for text in texts:
                browser.js(
                    f"document.getElementById('label').textContent = ''; document.getElementById('status').textContent = '';"
                    f"document.getElementById('text').value = {json.dumps(text)}; document.getElementById('classify').click()"
                )
                assert browser.wait_for("document.getElementById('status').textContent !== ''", 30)
                assert browser.js("document.getElementById('status').textContent") == "done"
                shown = browser.js(
                    "({label: document.getElementById('label').textContent, ids: JSON.parse(document.getElementById"
                    "('label').dataset.ids), rows: [...document.querySelectorAll('#probabilities tr')].map(r => "
                    "[r.dataset.label, Number(r.dataset.probability)])})"
                )
                expected = reference.predict([text])[0]  # batch 1, as the page runs it
                assert shown["ids"] == reference.tokenizer.encode(text).ids, (
                    text
                )  # the JavaScript tokenizer, truncation too
                assert shown["label"] == expected["label"], text
                assert [name for name, _ in shown["rows"]] == reference.labels
                # WebAssembly's int8 kernels round differently from the native CPU ones: ~3e-3 measured on the tiny run
                assert all(abs(p - expected["probabilities"][name]) < 1e-2 for name, p in shown["rows"]), (
                    shown,
                    expected,
                )
            # a damaged model file: the page says which file and what to do, and classifies nothing
            model_file = metadata["demo"]["model"]
            (copy / model_file).write_bytes(b"\0" * 4096)
            browser("Page.navigate", url=f"http://127.0.0.1:{port}/demo.html?damaged")
            assert browser.wait_for("document.body && ['1', 'error'].includes(document.body.dataset.ready)", 90)
            assert browser.js("document.body.dataset.ready") == "error"
            assert browser.js("document.getElementById('status').textContent") == (
                f"error: {model_file} is damaged: its sha256 differs from metadata.json; copy the bundle again"
            )
    finally:
        server.terminate()
        server.wait(timeout=10)
