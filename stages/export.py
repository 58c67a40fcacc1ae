"""Export: the student as a mobile bundle, every variant measured.

1. ONNX fp32: single file, dynamic batch and sequence axes, opset recorded;
   parity against PyTorch fp32 on the whole test split (fails above
   export.parity_tolerance).
2. int8: dynamic quantization of the MatMul weights, per channel. If accuracy
   drops more than export.max_int8_drop points, safer settings are tried
   (pooler/classifier in fp32, then first/last layers in fp32 with 7-bit
   weights); if none fits, int8 is marked not recommended and fp32 is.
3. The text-in model (pipeline/export/text_model.py): model.text.onnx, the tokenizer
   as onnxruntime-extensions operators in front of the recommended graph,
   strings in, probabilities and label out; shipped only if it reproduces
   predict.py's token ids and predictions on the whole test split, otherwise
   metadata.json says why. ORT format (model.int8.ort, model.text.ort, plus
   model.ort when fp32 is recommended) and required_operators.config for
   reduced mobile builds. ONNX Runtime's mobile usability checker on the
   shipped graph (pipeline/export/mobile.py): NNAPI and CoreML verdicts.
4. The baseline a user would ship instead: the teacher exported and quantized
   with the student's int8 setting (test accuracy, file size). Latency at batch
   1 of every model side by side (interleaved rounds) at the configured lengths:
   teacher (PyTorch, ONNX fp32, ONNX int8), student (PyTorch, ONNX fp32, int8,
   ExecuTorch); on real test sentences the int8 teacher and the student's ONNX
   and ExecuTorch files; then accuracy kept, speed-up and size against the int8
   teacher, checked against export.targets.
5. The bundle (bundle/): models, tokenizer.json (+ vocab.txt for WordPiece), labels.json,
   metadata.json (with sha256 of every file), README.md, predict.py,
   latency.json/.md, and demo.html (+ demo/: onnxruntime-web) when the browser
   runtime is installed (pipeline/bundle_files/web). Logged to MLflow; the recommended graph is registered as
   `attention-distill-<config>` with alias `candidate`.

With export.trim_vocab the shipped graph and tokenizer keep only the tokens
the train/validation text uses (plus specials): the embedding table shrinks,
test words made of other pieces become shorter pieces or [UNK]; accuracy and
size before and after are recorded (metadata.json, metrics.json: vocab_trim).
Only WordPiece vocabularies are trimmed; for other tokenizer models (BPE, Unigram)
trimming is skipped with a log line and vocab_trim {"applied": false, "reason": ...}.

Outputs: bundle/, metrics.json (per-variant test metrics, same keys as
evaluate's), export.json (summary figures).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from pipeline.config import WordCorpusConfig
from pipeline.data import data_file, normalized_text, split_sentences, texts_of_file
from pipeline.errors import DataError, PipelineError
from pipeline.export import executorch_program, from_text, mobile, ort_format, text_model, word_model
from pipeline.export.files import copy_predict_script, file_table, register_onnx, render_template, write_demo
from pipeline.export.latency import compare_with_int8_teacher, latency_markdown, side_by_side
from pipeline.export.measurements import (
    ALIAS,
    Measurements,
    bundle_metadata,
    bundle_name,
    export_summary,
    metrics_json,
    mlflow_metrics,
    registered_description,
)
from pipeline.export.readme import readme_values
from pipeline.export.tokenizer import tokenizer_facts, tokenizer_files, write_bundle_tokenizer
from pipeline.export.variants import (
    Inputs,
    Shipped,
    choose_variant,
    export_student,
    export_teacher,
    quantize_dynamic,
    quantize_static,
    read_records,
    recommended_graph,
    student_to_ship,
)
from pipeline.interrupts import interrupts_held
from pipeline.splits import TokenizedSplit, label_names, pad_id
from pipeline.stage_api import Context
from pipeline.summary import headline_metrics
from pipeline.timing import Laps

log = logging.getLogger("pipeline")

READS = ["export"]
AFTER = ["prepare", "teacher", "peers", "distill"]
VERSION = 13  # bump when the output changes for the same inputs (history: git log)
WORD_MODEL_KEYS = ("word_list", "word_corpus")  # read by a static student's word model only


def fingerprint_inputs(config) -> dict:
    """READS, less the word model's settings for a student that has none (a transformer): a config that sets them
    for its static variants leaves its transformer runs current."""
    export = config.section("export")
    if config.student.kind != "static":
        for key in WORD_MODEL_KEYS:
            export.pop(key, None)
    return {"export": export}


def run(ctx: Context) -> dict:
    """The export, step by step: each step below builds one thing; the figures are rendered into every output at the end."""
    if not ctx.is_main:  # export, measurement and registration happen once
        return {}
    cfg, seed = ctx.config.export, ctx.config.seed
    laps = Laps()  # each step's seconds: the log and export.json
    inputs = read_inputs(ctx)
    static = json.loads((inputs.student / "config.json").read_text()).get("model_type") == "static-embedding"
    word_list = word_list_file(cfg.word_list) if static and cfg.word_list else None  # checked before the work
    corpus, corpus_facts = (
        word_corpus_texts(cfg.word_corpus, inputs.test_records) if static and cfg.word_corpus else (None, {})
    )
    out = fresh_folder(ctx.out / "bundle")
    work = fresh_folder(ctx.out / "work")  # teacher graph and rejected int8 attempts; removed before the rename
    # model.pte, model.int8.pte (ExecuTorch, XNNPACK): lowered in a child process on one core while the ONNX steps
    # below run on the other; joined before the latency is timed on a quiet machine, ended if a step fails
    with executorch_program.Building(inputs, cfg, out) as building:
        student = student_to_ship(inputs, cfg, work)  # the PyTorch student, its vocabulary trimmed (export.trim_vocab)
        building.start(student)
        shipped = export_student(student, inputs, cfg, out, work)  # 1. fp32 ONNX and parity
        laps.lap("fp32 graph and parity")
        int8 = quantize_dynamic(shipped, inputs.names, cfg, out, work)  # 2. dynamic int8 within the accuracy budget
        static = quantize_static(shipped, inputs, cfg, seed, out, work)  # and static QDQ int8 (calibrated)
        laps.lap("int8")
        teacher = export_teacher(inputs, int8, cfg, work, ctx.cache_dir)  # 3. the baseline a user would ship instead
        laps.lap("int8 teacher")
        ort = ort_format.convert_and_check(  # ORT format of the int8 graphs, for ONNX Runtime Mobile
            [(v.path, v.logits) for v in (int8, static) if v], shipped.test, shipped.pad, cfg.ort_target_platform, out
        )
        usable = mobile.usability_of_graphs(shipped, int8, static)  # what NNAPI and CoreML could take of each graph
        laps.lap("ORT format and mobile check of the int8 graphs")
        pte = building.result()
        laps.lap("executorch (the part not beside the int8 steps)")
    latency = side_by_side(seed, inputs, shipped, int8, static, pte, teacher, cfg)  # every model side by side
    laps.lap("latency")
    recommended, because = choose_variant(cfg, int8, static, latency["rows"])  # on one-text-per-call accuracy and speed
    graph, logits = recommended_graph(shipped, int8, static, recommended)
    text, text_labels = text_model.ship(
        graph,
        shipped.tokenizer_json,
        shipped.facts,
        inputs.max_length,
        inputs.test_records,
        shipped.pad,
        out / "model.text.onnx",
        known=(shipped.test.input_ids, logits),
    )  # 4. text in
    laps.lap("text-in model")
    if recommended == "fp32":  # its ORT twin too
        ort = ort_format.convert_and_check(
            [(shipped.fp32_path, shipped.fp32_logits)], shipped.test, shipped.pad, cfg.ort_target_platform, out, ort
        )
    ort = ort_format.convert_and_check_text(ort, text, text_labels, inputs.test_records, cfg.ort_target_platform, out)
    checked = mobile.check_bundle(usable, recommended)
    laps.lap("ORT format of the text-in model")
    words, word_labels = None, None
    if shipped.model.config.model_type == "static-embedding":  # its word-lookup text-in model, the fastest route
        splits = [s for s in ("train", "validation", "unlabeled") if (inputs.prepare / f"{s}.jsonl").is_file()]
        word_texts = [r["text"] for split in splits for r in read_records(inputs.prepare, split)]  # never the test
        untrimmed = inputs.student / "tokenizer.json"  # its whole-word tokens: common words the text may lack
        facts = tokenizer_facts(untrimmed)
        more = word_model.vocabulary_words(untrimmed, facts)
        listed = word_model.list_words(word_list, untrimmed, facts) if word_list else []
        corpus_words = word_model.training_words(corpus, untrimmed, facts, corpus_facts["min_count"]) if corpus else []
        words, word_labels = word_model.ship(
            shipped, inputs.test_records, word_texts, inputs.max_length, out, more + listed + corpus_words
        )
        if listed and words.get("shipped"):  # more words on the fast route (a cache: the same logits); its licence
            words["word_list"] = {"source": cfg.word_list, "words": len(listed)}  # travels with the app
        if corpus and words.get("shipped"):
            words["word_corpus"] = {**corpus_facts, "words": len(corpus_words)}
        ort = ort_format.convert_and_check_words(
            ort, words, word_labels, inputs.test_records, cfg.ort_target_platform, out
        )
        laps.lap("word model and its ORT format")
    peers = from_text.measure_bundle(
        ctx.input("peers"),
        seed,
        cfg,
        inputs,
        shipped,
        int8,
        static,
        teacher,
        text,
        recommended,
        out,
        words,
        word_labels,
    )  # from raw text, beside TF-IDF, fastText and static embeddings
    laps.lap("from raw text beside the peers")
    variants = {
        "onnx_fp32": shipped.fp32,
        **({"onnx_int8": int8.metrics} if int8 else {}),
        **({"onnx_int8_static": static.metrics} if static else {}),
    }
    measured = Measurements(
        examples=len(shipped.test),
        variants=variants,
        recommended=recommended,
        because=because,
        parity=shipped.parity,
        quant=int8.setting if int8 else None,
        attempts=int8.attempts if int8 else [],
        static=static.setting if static else None,
        trim=shipped.trim or {"enabled": False},
        ort=ort,
        latency=latency,
        text_model=text,
        word_model=words,
        mobile=checked,
        from_text=peers,
        executorch=pte,
        comparison=compare_with_int8_teacher(
            cfg, inputs.teacher, teacher.baseline, variants, recommended, latency["rows"]
        ),
    )
    metadata = write_bundle(ctx, inputs, shipped, measured, mlflow_source(ctx))  # 5. the bundle files
    shutil.rmtree(work)
    ctx.write_json("metrics.json", metrics_json(measured))  # 6. metrics, MLflow
    with interrupts_held():  # a Ctrl-C inside MLflow's registry writes would leave its store locked
        registration = register(ctx, measured, metadata)
    summary = export_summary(cfg, measured, registration)
    laps.lap("bundle files and MLflow")
    ctx.write_json("export.json", {**summary, "step_seconds": laps.seconds})
    log.info("[export] steps: %s", laps.line())
    log_outcome(measured, ctx.final / "bundle")
    return summary


def read_inputs(ctx) -> Inputs:
    prepare, teacher, distill = ctx.input("prepare"), ctx.input("teacher"), ctx.input("distill")
    names = label_names(prepare)
    return Inputs(
        prepare=prepare,
        teacher=teacher,
        student=distill / "student",
        names=names,
        labels={str(i): name for i, name in enumerate(names)},
        pad=pad_id(prepare),
        max_length=json.loads((prepare / "stats.json").read_text())["max_length"],
        test=TokenizedSplit(prepare, "test"),
        test_records=read_records(prepare),
    )


def word_list_file(reference: str) -> Path:
    """export.word_list's file, checked before any graph is built (it is read only for the word model, near the end)."""
    path = data_file(reference, "export.word_list")
    if not path.is_file() or path.stat().st_size == 0:
        raise DataError(
            f"export.word_list '{reference}' is {'empty' if path.is_file() else 'not a file'} ({path}). Expected a "
            "text file with one word per line (its first column; most frequent first), or package:<pip package>/<path "
            "inside it>, e.g. package:symspellpy/frequency_dictionary_en_82_765.txt; or leave export.word_list unset "
            "(the word model's table then holds the words of the training text and the vocabulary's whole words)."
        )
    return path


def word_corpus_texts(corpus: WordCorpusConfig, test_records: list[dict]) -> tuple[list[str], dict]:
    """export.word_corpus's sentences (its texts split as data.unlabeled_source splits them), read before any graph
    is built, less those equal to a test text ignoring case and punctuation (a corpus quoting the test sentences
    would flatter the timing of the test texts); and what metadata.json records of it: the setting, the texts read
    and the sentences left out."""
    key = "export.word_corpus.path"
    texts, rows_read = texts_of_file(corpus.path, key, corpus.text_column, corpus.where, "texts")
    test = {normalized_text(record["text"]) for record in test_records}
    sentences = [sentence for text in texts for sentence in map(str.strip, split_sentences(text)) if sentence]
    kept = [sentence for sentence in sentences if normalized_text(sentence) not in test]
    if not kept:
        raise DataError(
            f"{key} '{corpus.path}' leaves no text: {rows_read} rows read, {len(texts)} matching "
            f"export.word_corpus.where {corpus.where or '{}'}, none with a sentence that no test example holds. Check "
            "where and text_column, or leave export.word_corpus unset (the word model's table then holds the words "
            "of the training text and the vocabulary's whole words)."
        )
    setting = {"source": corpus.path, "where": corpus.where, "min_count": corpus.min_count}
    return kept, {**setting, "texts": len(texts), "test_sentences_left_out": len(sentences) - len(kept)}


def fresh_folder(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def mlflow_source(ctx) -> dict:
    """Where the bundle is tracked and registered (metadata.json "source"); registration needs MLflow on."""
    ids = ctx.mlflow_ids() or {}
    registered = bundle_name(ctx.config) if ctx.config.export.register_model and ids else None
    return {
        "mlflow_tracking_uri": ids.get("tracking_uri", ""),
        "mlflow_experiment": ids.get("experiment"),
        "mlflow_parent_run_id": ids.get("parent_run_id"),
        "mlflow_export_run_id": ids.get("stage_run_id"),
        "registered_model": registered,
        "registered_alias": ALIAS if registered else None,
    }


def write_bundle(ctx, inputs: Inputs, shipped: Shipped, measured: Measurements, source: dict) -> dict:
    """The bundle's files besides the graphs; metadata.json last, with the sha256 of every other file. Returns the metadata."""
    out, latency = ctx.out / "bundle", measured.latency
    ctx.write_json(
        "bundle/latency.json",
        {
            "batch": 1,
            "machine": latency["machine"],
            **latency["load"],
            "rows": latency["rows"],
            "skipped": latency["skipped"],
        },
    )
    (out / "latency.md").write_text(latency_markdown(latency["rows"], latency["machine"], latency["load"]))
    written = write_bundle_tokenizer(
        shipped.tokenizer_json, out / "tokenizer.json", out / "vocab.txt", inputs.max_length
    )
    if written != tokenizer_files(shipped.facts):
        raise PipelineError(
            f"the bundle's tokenizer files {written} are not the ones metadata.json lists "
            f"({tokenizer_files(shipped.facts)})"
        )
    ctx.write_json("bundle/labels.json", inputs.labels)
    copy_predict_script(out / "predict.py")
    metadata = bundle_metadata(ctx.config, inputs, shipped, measured, source)
    metadata["demo"] = write_demo(
        out, metadata["name"], metadata["variants"][measured.recommended]["file"], inputs.max_length
    )  # demo.html: the model in a browser (onnxruntime-web)
    if not metadata["demo"]["shipped"]:
        log.info("[export] no demo.html: %s", metadata["demo"]["why"])
    (out / "README.md").write_text(render_template("README.md", readme_values(ctx.config, metadata, latency)))
    metadata["files"] = file_table(out)
    ctx.write_json("bundle/metadata.json", metadata)
    return metadata


def register(ctx, measured: Measurements, metadata: dict) -> dict | None:
    """MLflow: the figures, the bundle and metrics.json; the recommended graph registered with alias ``candidate``."""
    ctx.log_metrics(mlflow_metrics(measured))
    ctx.set_tags({"attention_distill.recommended_variant": measured.recommended})
    ctx.log_artifacts(ctx.out / "bundle", "bundle")
    ctx.log_artifact(ctx.out / "metrics.json")
    source = metadata["source"]
    if not source["registered_model"]:
        return None
    chosen = metadata["variants"][measured.recommended]
    registration = register_onnx(
        ctx.out / "bundle" / chosen["file"],
        source["mlflow_export_run_id"],
        source["registered_model"],
        ALIAS,
        {
            "variant": measured.recommended,
            "file": chosen["file"],
            "sha256": metadata["files"][chosen["file"]]["sha256"],
            "test_accuracy": chosen["accuracy"],
            "config": ctx.config.name,
            "bundle_artifact_path": "bundle",
        },
    )
    try:  # the headline figures and a description: niceties, MLflow refusing them never fails the export
        import mlflow  # imported by the tracker already when registration is on

        headline = headline_metrics({}, metrics_json(measured))  # the pipeline run's figures (export's part)
        if measured.comparison:
            headline["teacher_fp32_accuracy"] = measured.comparison["teacher_fp32_accuracy"]
        client, name, version = mlflow.MlflowClient(), source["registered_model"], registration["version"]
        for key, value in {
            "pipeline_run_id": source["mlflow_parent_run_id"],
            **{k: f"{v:.6g}" for k, v in headline.items()},
        }.items():
            client.set_model_version_tag(name, version, key, value)
        client.update_model_version(
            name, version, description=registered_description(ctx.config, measured, chosen, source)
        )
    except Exception as exc:
        log.warning(
            "[export] the registered version's figures or description were not set (%s: %s)",
            type(exc).__name__,
            str(exc)[:200],
        )
    log.info(
        "[export] registered %s version %s (alias '%s', %s)",
        source["registered_model"],
        registration["version"],
        ALIAS,
        measured.recommended,
    )
    return registration


def log_outcome(measured: Measurements, bundle: Path) -> None:
    fp32, int8 = measured.variants["onnx_fp32"], measured.variants.get("onnx_int8")
    log.info(
        "[export] parity max diff %.2e; fp32 acc %.4f (%.1f MB)%s; recommended %s; bundle %s",
        measured.parity["max_abs_logit_diff"],
        fp32["accuracy"],
        fp32["file_mb"],
        f", int8 acc {int8['accuracy']:.4f} ({int8['file_mb']:.1f} MB, {(measured.quant or {}).get('setting')})"
        if int8
        else "",
        measured.recommended,
        bundle,
    )
