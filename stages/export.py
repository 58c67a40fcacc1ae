"""Stage 6, export: the student as a mobile bundle, every variant measured.

1. ONNX fp32: single file, dynamic batch and sequence axes, opset recorded;
   parity against PyTorch fp32 on the whole test split (fails above
   export.parity_tolerance).
2. int8: dynamic quantization of the MatMul weights, per channel. If accuracy
   drops more than export.max_int8_drop points, safer settings are tried
   (pooler/classifier in fp32, then first/last layers in fp32 with 7-bit
   weights); if none fits, int8 is marked not recommended and fp32 is.
3. ORT format (model.int8.ort, plus model.ort when fp32 is recommended) and
   required_operators.config for reduced mobile builds.
4. The baseline a user would ship instead: the teacher exported and quantized
   with the student's int8 setting (test accuracy, file size). Latency at batch
   1 of every model side by side (interleaved rounds) at the configured lengths
   and on real test sentences: teacher (PyTorch, ONNX fp32, ONNX int8), student
   (PyTorch, ONNX fp32, int8); then accuracy kept, speed-up and size against
   the int8 teacher, checked against export.targets.
5. The bundle (bundle/): models, tokenizer.json, vocab.txt, labels.json,
   metadata.json (with sha256 of every file), README.md, predict.py,
   latency.json/.md. Logged to MLflow; the recommended graph is registered as
   `attention-distill-<config>` with alias `candidate`.

With export.trim_vocab the shipped graph and tokenizer keep only the tokens
the train/validation text uses (plus specials): the embedding table shrinks,
test words made of other pieces become shorter pieces or [UNK]; accuracy and
size before and after are recorded (metadata.json, metrics.json: vocab_trim).

Outputs: bundle/, metrics.json (per-variant test metrics, same keys as
evaluate's), export.json (summary figures).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import os
import platform
import shutil

import numpy as np

from pipeline import bundle as B
from pipeline.errors import PipelineError
from pipeline.inference import TokenizedSplit, label_names, pad_id
from pipeline.metrics import classification_report
from pipeline.models import count_parameters, load_classifier
from pipeline.runner import write_json
from pipeline.summary import comparison_lines
from pipeline.tracking import redact_uri

log = logging.getLogger("pipeline")

READS = ["export"]
AFTER = ["prepare", "teacher", "distill"]
VERSION = 2

ALIAS = "candidate"


def run(ctx) -> dict:
    if not ctx.is_main:  # export, measurement and registration happen once
        return {}
    config, cfg = ctx.config, ctx.config.export
    prepare, teacher_dir, distill_dir = ctx.input("prepare"), ctx.input("teacher"), ctx.input("distill")
    names, pad = label_names(prepare), pad_id(prepare)
    max_length = json.loads((prepare / "stats.json").read_text())["max_length"]
    test = full_test = TokenizedSplit(prepare, "test")  # full_test: the teacher's own (untrimmed) vocabulary
    out = ctx.out / "bundle"
    work = ctx.out / "work"  # teacher graph and rejected int8 attempts; removed before the rename
    for folder in (out, work):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)

    # 1. fp32 ONNX and parity ------------------------------------------------------------
    student = load_classifier(str(distill_dir / "student"), attn_implementation="eager").eval()
    tokenizer_json = distill_dir / "student" / "tokenizer.json"
    reference = B.torch_logits(student, test, pad)  # the PyTorch student every variant is compared with
    fp32_path = (work if cfg.trim_vocab else out) / "model.onnx"
    fp32_logits, parity, ladder = export_checked(student, fp32_path, test, pad, reference, cfg)
    trim = None
    if cfg.trim_vocab:  # ship a smaller embedding table; the full-vocabulary graph above is the "before"
        before = variant_metrics(fp32_logits, reference, test.labels, names, fp32_path, count_parameters(student))
        student, test, tokenizer_json, trim = trimmed_student(student, prepare, tokenizer_json, work, test, max_length)
        pad = trim["pad_id"]
        fp32_path = out / "model.onnx"
        trimmed_reference = B.torch_logits(student, test, pad)
        fp32_logits, parity, ladder = export_checked(student, fp32_path, test, pad, trimmed_reference, cfg)
        after = variant_metrics(fp32_logits, reference, test.labels, names, fp32_path, count_parameters(student))
        trim.update({"before": _brief(before), "after": _brief(after)})
        log.info("[export] vocabulary trimmed to %d tokens: fp32 %.1f -> %.1f MB, test accuracy %.4f -> %.4f",
                 trim["kept_tokens"], before["file_mb"], after["file_mb"], before["accuracy"], after["accuracy"])
    max_diff, parity_agreement = parity["max_abs_logit_diff"], parity["prediction_agreement"]
    parameters = count_parameters(student)
    variants = {"onnx_fp32": variant_metrics(fp32_logits, reference, test.labels, names, fp32_path, parameters)}

    # 2. int8 with an accuracy budget ----------------------------------------------------
    quant, attempts, int8_logits = None, [], None
    if cfg.quantize:
        quant, attempts, int8_logits = quantize_with_budget(ladder, fp32_path, out / "model.int8.onnx", work, test, pad,
                                                            variants["onnx_fp32"]["accuracy"], cfg.max_int8_drop)
        variants["onnx_int8"] = variant_metrics(int8_logits, reference, test.labels, names, out / "model.int8.onnx", parameters)
        variants["onnx_int8"]["drop_points"] = quant["drop_points"]
    int8_ok = bool(quant and quant["within_budget"])
    recommended = "int8" if int8_ok else "fp32"

    # 3. ORT format ----------------------------------------------------------------------
    to_convert = ([out / "model.int8.onnx"] if cfg.quantize else []) + ([] if int8_ok else [fp32_path])
    ort_info = B.convert_to_ort(to_convert, out, cfg.ort_target_platform)
    for path in to_convert:  # every .ort must load and agree with its .onnx
        ort_file = out / ort_info["files"][path.name]
        ort_logits = B.onnx_logits(ort_file, test, pad)
        onnx_ref = fp32_logits if path == fp32_path else int8_logits
        agreement = float((ort_logits.argmax(-1) == onnx_ref.argmax(-1)).mean())
        ort_info.setdefault("agreement_with_onnx", {})[ort_file.name] = agreement
        if agreement < 1.0:
            log.warning("[export] %s disagrees with %s on %.2f%% of the test split", ort_file.name, path.name, 100 * (1 - agreement))

    # 4. the baseline a user would ship instead, and latency side by side -----------------
    teacher_eager = load_classifier(str(teacher_dir / "model"), attn_implementation="eager").eval()
    teacher_onnx, teacher_int8 = work / "teacher.onnx", work / "teacher.int8.onnx"  # measured, never shipped
    B.export_onnx(B.LogitsOnly(teacher_eager), teacher_onnx, cfg.opset)
    del teacher_eager
    baseline = int8_teacher_baseline(teacher_onnx, teacher_int8, quant, full_test, pad_id(prepare), names)
    teacher_pt = load_classifier(str(teacher_dir / "model")).eval()  # default attention backend, as users run it
    student_pt = load_classifier(str(distill_dir / "student")).eval()
    facts = B.tokenizer_facts(tokenizer_json)
    teacher_facts = B.tokenizer_facts(distill_dir / "student" / "tokenizer.json")
    sample = np.random.default_rng(config.seed).permutation(len(test))[: cfg.latency_sentences]
    full_ids, shipped_ids = [list(full_test.input_ids[i]) for i in sample], [list(test.input_ids[i]) for i in sample]

    def spec(runtime, factory, tokenizer_facts, model_config):
        specials = tokenizer_facts["special_token_ids"]
        return (runtime, factory, tokenizer_facts["vocab_size"], specials.get("[CLS]", 101), specials.get("[SEP]", 102),
                model_config.max_position_embeddings)

    models = {
        "teacher PyTorch fp32": spec("pytorch", lambda t: B.torch_runner(teacher_pt, t), teacher_facts, teacher_pt.config),
        "teacher ONNX fp32": spec("onnxruntime", lambda t: B.ort_runner(teacher_onnx, t), teacher_facts, teacher_pt.config),
        "student PyTorch fp32": spec("pytorch", lambda t: B.torch_runner(student_pt, t), teacher_facts, student_pt.config),
        "student ONNX fp32": spec("onnxruntime", lambda t: B.ort_runner(fp32_path, t), facts, student.config),
    }
    sentence_ids = {name: full_ids for name in models}
    sentence_ids["student ONNX fp32"] = shipped_ids
    if cfg.quantize:
        models["teacher ONNX int8"] = spec("onnxruntime", lambda t: B.ort_runner(teacher_int8, t), teacher_facts, teacher_pt.config)
        models["student ONNX int8"] = spec("onnxruntime", lambda t: B.ort_runner(out / "model.int8.onnx", t), facts, student.config)
        sentence_ids["teacher ONNX int8"], sentence_ids["student ONNX int8"] = full_ids, shipped_ids
    latency = measure_latency(cfg, models, sentence_ids)
    machine = f"{platform.machine()}, {platform.processor() or 'cpu'}, onnxruntime {_version('onnxruntime')}"
    write_json(out / "latency.json", {"batch": 1, "machine": machine, **latency["load"], "rows": latency["rows"],
                                      "skipped": latency["skipped"]})
    (out / "latency.md").write_text(B.latency_markdown(latency["rows"], machine, latency["load"]))
    comparison = None
    if baseline:
        shipped = {"variant": recommended, "accuracy": variants[f"onnx_{recommended}"]["accuracy"],
                   "file_mb": variants[f"onnx_{recommended}"]["file_mb"]}
        teacher_accuracy = json.loads((teacher_dir / "metrics.json").read_text())["test_accuracy"]
        comparison = baseline_comparison(cfg, teacher_accuracy, baseline, shipped, latency["rows"])
        for line in comparison_lines(comparison):
            log.info("[export] %s", line)

    # 5. the bundle files ----------------------------------------------------------------
    B.write_bundle_tokenizer(tokenizer_json, out / "tokenizer.json", out / "vocab.txt", max_length)
    write_json(out / "labels.json", {str(i): name for i, name in enumerate(names)})
    B.copy_predict_script(out / "predict.py")
    registered_name = f"attention-distill-{config.name}"
    register = cfg.register_model and ctx.tracker.enabled and ctx.tracker.stage_id is not None
    variant_files = {"fp32": ("model.onnx", "onnx_fp32", "model.ort" if not int8_ok else None)}
    if cfg.quantize:
        variant_files["int8"] = ("model.int8.onnx", "onnx_int8", "model.int8.ort")
    metadata = {
        "format_version": 1,
        "name": registered_name,
        "created_at": dt.datetime.now().isoformat(timespec="seconds"),
        "task": "single-label text classification",
        "config": config.name,
        "inputs": [{"name": n, "dtype": "int64", "shape": ["batch", "sequence"]} for n in B.INPUT_NAMES],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", len(names)],
                     "meaning": "unnormalised class scores (logits); apply softmax over the last axis for "
                                "probabilities; argmax is the label index in labels.json"}],
        "dynamic_axes": {n: {"0": "batch", "1": "sequence"} for n in B.INPUT_NAMES},
        "opset": cfg.opset,
        "max_length": max_length,
        "max_position_embeddings": student.config.max_position_embeddings,
        "labels": {str(i): name for i, name in enumerate(names)},
        "tokenizer": {**facts, "files": ["tokenizer.json", "vocab.txt"], "template": "[CLS] text [SEP]",
                      "pair_template": "[CLS] text [SEP] text_pair [SEP]", "truncation": f"longest first, to {max_length} tokens including specials",
                      "padding": "right, with [PAD], to the longest sequence of the batch; attention_mask 0 there"},
        "variants": {v: {"file": f, "ort_file": o, **{k: variants[key][k] for k in
                         ("accuracy", "macro_f1", "agreement_with_pytorch", "file_mb", "parameters")}}
                     for v, (f, key, o) in variant_files.items()},
        "recommended": recommended,
        "int8_recommended": int8_ok,
        "quantization": {**(quant or {"enabled": False}), "attempts": attempts, "max_int8_drop_points": cfg.max_int8_drop},
        "parity": {**parity, "tolerance": cfg.parity_tolerance, "split": "test", "examples": len(test)},
        "vocab_trim": trim or {"enabled": False},
        "versus_int8_teacher": comparison,
        "ort_format": ort_info,
        "evaluation": {"split": "test", "examples": len(test)},
        "latency_file": "latency.json",
        "source": {"mlflow_tracking_uri": redact_uri(getattr(ctx.tracker, "uri", "") or ""),
                   "mlflow_experiment": ctx.tracker.experiment, "mlflow_parent_run_id": ctx.tracker.parent_id,
                   "mlflow_export_run_id": ctx.tracker.stage_id, "registered_model": registered_name if register else None,
                   "registered_alias": ALIAS if register else None},
        "runtime": {"onnxruntime": _version("onnxruntime"), "onnx": _version("onnx"), "torch": _version("torch"),
                    "transformers": _version("transformers"), "tokenizers": _version("tokenizers")},
    }
    (out / "README.md").write_text(B.render_template("README.md", readme_values(config, metadata, variants, latency, test)))
    metadata["files"] = B.file_table(out)
    write_json(out / "metadata.json", metadata)
    shutil.rmtree(work)

    # 6. metrics, MLflow -----------------------------------------------------------------
    metrics = {"split": "test", "examples": len(test), **variants, "recommended": recommended, "int8_recommended": int8_ok,
               "parity_max_abs_diff": max_diff, "latency": latency["rows"], "vocab_trim": trim or {"enabled": False},
               "versus_int8_teacher": comparison}
    write_json(ctx.out / "metrics.json", metrics)
    summary = {"opset": cfg.opset, "parity_max_abs_diff": max_diff, "parity_agreement": parity_agreement,
               "fp32_accuracy": variants["onnx_fp32"]["accuracy"], "fp32_mb": variants["onnx_fp32"]["file_mb"],
               "recommended": recommended}
    if comparison:
        summary.update({"accuracy_kept": comparison["accuracy_kept"], "size_vs_int8_teacher": comparison["size_vs_int8_teacher"],
                        **{f"speedup_vs_int8_teacher_{k.replace('=', '')}": v for k, v in comparison["speedup_vs_int8_teacher"].items()},
                        "targets_met": comparison["all_met"]})
    if cfg.quantize:
        summary.update({"int8_accuracy": variants["onnx_int8"]["accuracy"], "int8_mb": variants["onnx_int8"]["file_mb"],
                        "int8_drop_points": quant["drop_points"], "int8_setting": quant["setting"]})
    flat = {f"{v}/{k}": variants[v][k] for v in variants for k in ("accuracy", "macro_f1", "agreement_with_pytorch", "file_mb")}
    flat.update({"parity_max_abs_diff": max_diff, "int8_recommended": float(int8_ok)})
    if cfg.quantize:
        flat["onnx_int8/drop_points"] = quant["drop_points"]
    flat.update({f"latency_ms/{r['model'].replace(' ', '_')}_{r['input'].replace('=', '')}_t{r['threads']}": r["median_ms"]
                 for r in latency["rows"]})
    if comparison:
        flat.update({"vs_int8_teacher/accuracy_kept": comparison["accuracy_kept"],
                     "vs_int8_teacher/size_ratio": comparison["size_vs_int8_teacher"],
                     "vs_int8_teacher/baseline_accuracy": baseline["accuracy"], "vs_int8_teacher/baseline_mb": baseline["file_mb"],
                     **{f"vs_int8_teacher/speedup_{k.replace('=', '')}": v for k, v in comparison["speedup_vs_int8_teacher"].items()}})
    ctx.tracker.log_metrics(flat)
    ctx.tracker.set_tags({"attention_distill.recommended_variant": recommended})
    ctx.tracker.log_artifacts(out, "bundle")
    ctx.tracker.log_artifact(ctx.out / "metrics.json")
    if register:
        chosen = metadata["variants"][recommended]
        registration = B.register_onnx(out / chosen["file"], ctx.tracker.stage_id, registered_name, ALIAS, {
            "variant": recommended, "file": chosen["file"], "sha256": metadata["files"][chosen["file"]]["sha256"],
            "test_accuracy": chosen["accuracy"], "config": config.name, "bundle_artifact_path": "bundle",
        })
        summary["registered_version"] = registration["version"]
        log.info("[export] registered %s version %s (alias '%s', %s)", registered_name, registration["version"], ALIAS, recommended)
    write_json(ctx.out / "export.json", summary)
    log.info("[export] parity max diff %.2e; fp32 acc %.4f (%.1f MB)%s; recommended %s; bundle %s",
             max_diff, variants["onnx_fp32"]["accuracy"], variants["onnx_fp32"]["file_mb"],
             f", int8 acc {variants['onnx_int8']['accuracy']:.4f} ({variants['onnx_int8']['file_mb']:.1f} MB, "
             f"{quant['setting']})" if cfg.quantize else "", recommended, ctx.run_dir / ctx.name / "bundle")
    return summary


def export_checked(student, path, split, pad, reference, cfg):
    """Export ``student`` to ``path``, strip exporter metadata, and fail loudly unless ONNX matches PyTorch on ``split``."""
    B.export_onnx(B.LogitsOnly(student), path, cfg.opset)
    ladder = B.quantization_ladder(path, student.config.num_hidden_layers)  # needs the exporter's node scopes
    B.strip_node_metadata(path)
    logits = B.onnx_logits(path, split, pad)
    max_diff = float(np.abs(reference - logits).max())
    agreement = float((reference.argmax(-1) == logits.argmax(-1)).mean())
    if max_diff > cfg.parity_tolerance:
        raise PipelineError(
            f"ONNX parity check failed: max |logit difference| {max_diff:.2e} on the test split is above "
            f"export.parity_tolerance={cfg.parity_tolerance} (prediction agreement {agreement:.4f}). "
            f"The exported graph does not compute what the PyTorch student computes; nothing was shipped."
        )
    return logits, {"max_abs_logit_diff": max_diff, "prediction_agreement": agreement}, ladder


def trimmed_student(student, prepare, tokenizer_json, work, test, max_length):
    """The student and tokenizer cut to the tokens train/validation use; test re-tokenized with the cut vocabulary."""
    keep = B.corpus_token_ids(prepare, tokenizer_json)
    trimmed_json = work / "tokenizer.trimmed.json"
    kept = B.trim_vocabulary(tokenizer_json, keep, trimmed_json)
    original_vocab = student.config.vocab_size
    student = B.trim_embeddings(copy.deepcopy(student), kept).eval()
    with open(prepare / "test.jsonl", encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    pairs = [r["text_pair"] for r in records] if records and "text_pair" in records[0] else None
    ids = B.tokenize_texts(trimmed_json, [r["text"] for r in records], max_length, pairs)
    split = B.IdSplit(ids, test.labels)
    facts = B.tokenizer_facts(trimmed_json)
    unk_new, unk_old = facts["special_token_ids"]["[UNK]"], B.tokenizer_facts(tokenizer_json)["special_token_ids"]["[UNK]"]
    changed = sum(a != [kept[i] for i in b] for a, b in zip(test.input_ids, ids))
    info = {"enabled": True, "kept_tokens": len(kept), "original_vocab": original_vocab, "source_splits": "train, validation, unlabeled",
            "test_unk_rate_before": _rate(test.input_ids, unk_old), "test_unk_rate_after": _rate(ids, unk_new),
            "test_texts_tokenized_differently": changed, "pad_id": facts["special_token_ids"]["[PAD]"]}
    return student, split, trimmed_json, info


def _rate(rows, token: int) -> float:
    total = sum(len(r) for r in rows)
    return sum(r.count(token) if isinstance(r, list) else list(r).count(token) for r in rows) / max(total, 1)


def _brief(metrics: dict) -> dict:
    return {k: metrics[k] for k in ("accuracy", "macro_f1", "file_mb", "parameters", "agreement_with_pytorch")}


def variant_metrics(logits, reference, labels, names, path, parameters) -> dict:
    """evaluate's metric keys for one exported variant, plus agreement with the PyTorch student and file facts."""
    report = classification_report(labels, logits.argmax(-1), names)
    return {**report, "agreement_with_pytorch": float((logits.argmax(-1) == reference.argmax(-1)).mean()),
            "max_abs_logit_diff_vs_pytorch": float(np.abs(logits - reference).max()),
            "file": path.name, "file_mb": path.stat().st_size / 1e6, "parameters": parameters,
            "onnx_initializer_elements": B.onnx_parameters(path)}


def quantize_with_budget(ladder, fp32_path, int8_path, work, test, pad, fp32_accuracy, budget):
    """Walk the quantization ladder until the accuracy drop fits the budget; keep the best attempt."""
    attempts, best = [], None
    for step, setting in enumerate(ladder):
        candidate = work / f"int8_{step}.onnx"
        settings = B.quantize_int8(fp32_path, candidate, setting)
        logits = B.onnx_logits(candidate, test, pad)
        accuracy = float((logits.argmax(-1) == test.labels).mean())
        drop = 100 * (fp32_accuracy - accuracy)
        attempt = {"setting": setting["name"], "why": setting["why"], "accuracy": accuracy, "drop_points": drop,
                   "file_mb": candidate.stat().st_size / 1e6, "excluded_nodes": len(setting["exclude"])}
        attempts.append(attempt)
        log.info("[export] int8 %s: accuracy %.4f (drop %.2f points, budget %.2f)", setting["name"], accuracy, drop, budget)
        if best is None or drop < best[0]["drop_points"] - 1e-12:
            best = (attempt, settings, candidate, logits)
        if drop <= budget:
            break
    attempt, settings, candidate, logits = best
    shutil.move(str(candidate), int8_path)
    within = attempt["drop_points"] <= budget
    note = (f"int8 accuracy is within {budget} points of fp32 on the test split" if within else
            f"int8 is NOT recommended: every setting tried dropped more than {budget} points "
            f"(best: {attempt['setting']}, {attempt['drop_points']:.2f} points); ship model.onnx")
    if not within:
        log.warning("[export] %s", note)
    return {**settings, "why": attempt["why"], "accuracy": attempt["accuracy"], "drop_points": attempt["drop_points"],
            "within_budget": within, "note": note, "decided_on": "test split"}, attempts, logits


def int8_teacher_baseline(teacher_onnx, teacher_int8, quant, test, pad, names) -> dict | None:
    """The teacher quantized exactly as the shipped student was (same quantizer and setting), on the test split."""
    if not quant:
        return None
    B.quantize_int8(teacher_onnx, teacher_int8, {"name": quant["setting"], "per_channel": quant["per_channel"],
                                                  "reduce_range": quant["reduce_range"], "op_types": quant["op_types"],
                                                  "exclude": []})
    report = classification_report(test.labels, B.onnx_logits(teacher_int8, test, pad).argmax(-1), names)
    return {"model": "teacher ONNX int8", "accuracy": report["accuracy"], "macro_f1": report["macro_f1"],
            "file_mb": teacher_int8.stat().st_size / 1e6, "setting": quant["setting"],
            "note": "the fine-tuned teacher exported to ONNX and quantized with the student's int8 setting (no distillation); "
                    "same test split, same latency inputs"}


def measure_latency(cfg, models: dict, sentence_ids: dict) -> dict:
    """Batch-1 latency rows, every model measured side by side (interleaved) in this process.

    ``models[name] = (runtime, runner factory(threads), vocab size, [CLS] id, [SEP] id, position embeddings)``;
    ``sentence_ids[name]``: real test sentences in that model's own vocabulary.
    Inputs: one sequence of exactly L tokens per configured length (lengths
    beyond a model's position table are skipped), and the real sentences.
    """
    load_before = os.getloadavg()[0]
    positions = min(m[5] for m in models.values())
    rows, skipped = [], []
    settings = []
    for length in cfg.latency_lengths:
        if length > positions:
            skipped.append({"length": length, "why": f"above the models' {positions} position embeddings"})
            continue
        settings.append((f"L={length}", length, {name: [B.latency_inputs(length, m[2], m[3], m[4])] for name, m in models.items()}))
    if cfg.latency_sentences:
        feeds = {name: [{"input_ids": np.asarray([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}
                        for ids in sentence_ids[name]] for name in models}
        mean_tokens = float(np.mean([len(ids) for ids in next(iter(sentence_ids.values()))]))
        settings.append(("sentences", round(mean_tokens, 1), feeds))
    for label, length, inputs in settings:
        for threads in cfg.latency_threads:
            runners = {name: m[1](threads) for name, m in models.items()}
            # A sentence pass is latency_sentences runs: one pass per round, one warm-up pass.
            runs, warmup = (cfg.latency_runs, cfg.latency_warmup) if label != "sentences" else (cfg.latency_rounds, 1)
            timed = B.interleaved_latency(runners, inputs, runs, warmup, cfg.latency_rounds)
            for name, figures in timed.items():
                rows.append({"model": name, "runtime": models[name][0], "batch": 1, "input": label, "length": length,
                             "threads": threads, **({"sentences": len(inputs[name])} if label == "sentences" else {}),
                             **figures})
    B.add_speedups(rows, {"teacher_pytorch": "teacher PyTorch fp32", "teacher_int8": "teacher ONNX int8"})
    for row in rows:
        for key in ("median_ms", "min_ms", "max_ms"):
            row[key] = round(row[key], 4)
    load = {"load_average_1m_before": round(load_before, 2), "load_average_1m_after": round(os.getloadavg()[0], 2),
            "cpu_count": os.cpu_count()}
    return {"rows": rows, "skipped": skipped, "load": load}


def baseline_comparison(cfg, teacher_accuracy: float, baseline: dict, shipped: dict, rows: list[dict]) -> dict:
    """The shipped student against what a user would ship without distillation: the int8 teacher.

    Three ratios (accuracy kept, speed-up, size) with the targets of export.targets, each marked met or not.
    """
    shipped_name = f"student ONNX {shipped['variant']}"
    threads = min(cfg.latency_threads)  # the headline is single-threaded where measured (phones run one model per core)
    speedups = {r["input"]: r["speedup_vs_teacher_int8"] for r in rows
                if r["model"] == shipped_name and r["threads"] == threads and r.get("speedup_vs_teacher_int8")}
    t = cfg.targets
    ratios = {
        "accuracy_kept": shipped["accuracy"] / teacher_accuracy,
        "accuracy_kept_vs_int8_teacher": shipped["accuracy"] / baseline["accuracy"],
        "speedup_vs_int8_teacher": speedups,
        "size_vs_int8_teacher": shipped["file_mb"] / baseline["file_mb"],
    }
    checks = {"accuracy_kept": ratios["accuracy_kept"] >= t.min_accuracy_kept,
              "size": ratios["size_vs_int8_teacher"] <= t.max_size_ratio}
    checks.update({f"speedup {name}": value >= t.min_speedup for name, value in speedups.items()})
    if not speedups:  # nothing timed (no lengths within the position table, no sentences): cannot count as met
        checks["speedup"] = False
    return {"baseline": baseline, "teacher_fp32_accuracy": teacher_accuracy, "shipped": shipped, "threads": threads, **ratios,
            "targets": t.model_dump(), "meets": checks, "all_met": all(checks.values())}


def readme_values(config, metadata, variants, latency, test) -> dict:
    facts, quant = metadata["tokenizer"], metadata["quantization"]
    specials = facts["special_token_ids"]
    recommended = metadata["recommended"]
    chosen = metadata["variants"][recommended]
    rows = ["| variant | file | accuracy | macro-F1 | agreement with PyTorch student | size MB |", "|---|---|---:|---:|---:|---:|"]
    for v, info in metadata["variants"].items():
        rows.append(f"| {v}{' (recommended)' if v == recommended else ''} | `{info['file']}` | {info['accuracy']:.4f} | "
                    f"{info['macro_f1']:.4f} | {info['agreement_with_pytorch']:.4f} | {info['file_mb']:.2f} |")
    lowercase = facts["lowercase"]
    accents = lowercase and facts.get("strip_accents") in (None, True)
    ort_version = metadata["runtime"]["onnxruntime"]
    if "int8" not in metadata["variants"]:
        verdict = "int8 quantization was switched off (export.quantize: false)."
    else:
        verdict = quant.get("note", "") + f" (setting `{quant.get('setting')}`: {quant.get('why', '') or _why(quant)})."
    return {
        "title": metadata["name"],
        "description": config.description or f"Distilled student of config `{config.name}`.",
        "num_labels": len(metadata["labels"]),
        "label_list": ", ".join(f"{i} = `{n}`" for i, n in metadata["labels"].items()),
        "recommended_file": chosen["file"], "recommended_variant": recommended,
        "recommended_note": "" if recommended == "int8" else ", int8 lost too much accuracy" if "int8" in metadata["variants"] else "",
        "recommended_ort": chosen["ort_file"] or "model.int8.ort",
        "recommended_ort_stem": (chosen["ort_file"] or "model.int8.ort").removesuffix(".ort"),
        "files_table": files_table(metadata),
        "opset": metadata["opset"], "max_length": metadata["max_length"], "positions": metadata["max_position_embeddings"],
        "test_examples": len(test), "variant_table": "\n".join(rows), "int8_verdict": verdict,
        "versus_int8_teacher": "" if not metadata.get("versus_int8_teacher") else (
            "Against what you would ship without distillation, the fine-tuned teacher quantized to int8 the same way:\n\n"
            + "\n".join(f"- {line}" for line in comparison_lines(metadata["versus_int8_teacher"]))),
        "accent_note": ", accents stripped" if accents else "",
        "subword_prefix": facts.get("continuing_subword_prefix") or "##", "max_chars": facts.get("max_input_chars_per_word") or 100,
        "pair_note": " (text pairs: `[CLS] a [SEP] b [SEP]`)",
        "cls_id": specials.get("[CLS]"), "sep_id": specials.get("[SEP]"), "pad_id": specials.get("[PAD]"), "unk_id": specials.get("[UNK]"),
        "vocab_size": facts["vocab_size"],
        "vocab_note": "" if not metadata["vocab_trim"]["enabled"] else (
            f" The vocabulary was trimmed to the {metadata['vocab_trim']['kept_tokens']} tokens the training text uses "
            f"(of {metadata['vocab_trim']['original_vocab']}): use this bundle's vocab.txt / tokenizer.json, never the "
            "original BERT vocabulary; words made of other pieces become shorter pieces or `[UNK]`."),
        "ort_version": ort_version, "ort_version_short": ".".join(ort_version.split(".")[:2]),
        "latency_table": B.latency_markdown(latency["rows"], "see latency.json", latency["load"]).split("\n", 2)[2].strip(),
        "config": config.name, "experiment": metadata["source"]["mlflow_experiment"],
        "parent_run": metadata["source"]["mlflow_parent_run_id"], "stage_run": metadata["source"]["mlflow_export_run_id"],
        "registered_model": (f"`{metadata['source']['registered_model']}` (alias `{ALIAS}`)"
                             if metadata["source"]["registered_model"] else "none (export.register_model off or MLflow disabled)"),
        "quant_summary": _why(quant) if quant.get("per_channel") is not None else "off",
    }


def files_table(metadata: dict) -> str:
    """The README's file list: only the files this bundle really has."""
    opset, max_length = metadata["opset"], metadata["max_length"]
    described = [("model.onnx", f"fp32 ONNX graph (opset {opset}, one file, dynamic batch and sequence)")]
    if "int8" in metadata["variants"]:
        described += [("model.int8.onnx", "the same graph with int8 MatMul weights (dynamic quantization)"),
                      ("model.int8.ort", "`model.int8.onnx` in ORT format, for ONNX Runtime Mobile")]
    if metadata["variants"]["fp32"]["ort_file"]:
        described.append(("model.ort", "`model.onnx` in ORT format, for ONNX Runtime Mobile"))
    described += [
        ("required_operators.config", "operators the `.ort` file(s) use: input of a reduced ONNX Runtime build"),
        ("tokenizer.json", f"the tokenizer (Hugging Face `tokenizers` format; truncation at {max_length}, no padding)"),
        ("vocab.txt", "the WordPiece vocabulary, one token per line; line number (from 0) = token id"),
        ("labels.json", "output index -> label name"),
        ("metadata.json", "inputs, outputs, tokenizer facts, accuracy and size per variant, sha256 of every other file"),
        ("latency.md, latency.json", "latency at batch 1 on the export machine (use the ratios, not the milliseconds)"),
        ("predict.py", "reference classifier (onnxruntime + tokenizers + numpy only): the executable spec"),
        ("README.md", "this file"),
    ]
    rows = ["| file | what it is |", "|---|---|"]
    rows += [f"| `{name}` | {what} |" if "," not in name else f"| `{name.split(', ')[0]}`, `{name.split(', ')[1]}` | {what} |"
             for name, what in described]
    return "\n".join(rows)


def _why(quant: dict) -> str:
    excluded = quant.get("nodes_excluded") or []
    embeddings = "; embedding tables int8" if "Gather" in quant.get("op_types", []) else ""
    return (f"dynamic int8, MatMul weights {'per channel' if quant.get('per_channel') else 'per tensor'}{embeddings}"
            f"{', 7-bit (reduce_range)' if quant.get('reduce_range') else ''}"
            f"{f', {len(excluded)} MatMul(s) kept fp32' if excluded else ''}; activations uint8 per tensor at run time")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"
