"""The bundle's README.md: pipeline/bundle_files/README.md and its section templates (bundle_files/sections/)
filled from metadata.json and the latency figures; the sections that depend on what the bundle holds (the
tokenizer it ships, the text-in model, ExecuTorch, the mobile checker, the peers) are chosen here."""

from __future__ import annotations

from . import from_text, mobile
from .files import render_template
from .latency import comparison_lines, latency_markdown
from .measurements import ALIAS
from .tokenizer import role_token, tokenizer_files


def readme_values(config, metadata: dict, latency: dict) -> dict:
    """The README's placeholders, rendered from metadata.json and the latency figures."""
    facts, quant = metadata["tokenizer"], metadata["quantization"]
    recommended = metadata["recommended"]
    chosen = metadata["variants"][recommended]
    rows = [
        "| variant | file | accuracy | macro-F1 | agreement with PyTorch student | size MB | in batches of 64 |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for v, info in metadata["variants"].items():
        batch = info["batch_invariance"]
        same = "same answers" if batch["invariant"] else f"{batch['predictions_changed']} answers change"
        rows.append(
            f"| {v.replace('_', ' ')}{' (recommended)' if v == recommended else ''} | `{info['file']}` | {info['accuracy']:.4f} | "
            f"{info['macro_f1']:.4f} | {info['agreement_with_pytorch']:.4f} | {info['file_mb']:.2f} | {same} |"
        )
    rows += [
        "",
        "Accuracy is measured one text per call, as an app (and `predict.py`, the code below, the text-in model) "
        "calls the model. Dynamic int8 scales activations over the whole padded batch, so in batches some answers "
        "depend on the other texts; static int8 fixed its scales on training text and answers the same either way.",
        "",
        f"Recommended: {recommended.replace('_', ' ')}, because {metadata.get('recommended_because', '')}.",
    ]
    ort_version = metadata["runtime"]["onnxruntime"]
    if "int8" not in metadata["variants"]:
        verdict = "int8 quantization was switched off (export.quantize: false)."
    else:
        verdict = quant.get("note", "") + f" (setting `{quant.get('setting')}`: {quant.get('why', '') or _why(quant)})."
        if quant.get("measured_on"):  # 8-bit weights saturate on some x86 CPUs: say which kind chose the setting
            verdict += f" Measured on {quant['measured_on']}."
    static = metadata.get("static_quantization") or {}
    if static.get("method"):
        verdict += (
            f" Static QDQ int8: {static['drop_points']:+.2f} points of drop against fp32 "
            f"({'within' if static['within_budget'] else 'NOT within'} the budget), activation scales from "
            f"{static['calibration']['examples']} training texts (MinMax), kept fp32: {static['kept_fp32']}."
        )
    return {
        "title": metadata["name"],
        "description": config.description or f"Distilled student of config `{config.name}`.",
        "num_labels": len(metadata["labels"]),
        "label_list": ", ".join(f"{i} = `{n}`" for i, n in metadata["labels"].items()),
        "recommended_file": chosen["file"],
        "recommended_variant": recommended,
        "recommended_note": ""
        if recommended != "fp32"
        else ", int8 lost too much accuracy"
        if "int8" in metadata["variants"]
        else "",
        "recommended_ort": chosen["ort_file"] or "model.int8.ort",
        "recommended_ort_stem": (chosen["ort_file"] or "model.int8.ort").removesuffix(".ort"),
        "files_table": files_table(metadata),
        "opset": metadata["opset"],
        "max_length": metadata["max_length"],
        "positions": metadata["max_position_embeddings"],
        "test_examples": metadata["evaluation"]["examples"],
        "variant_table": "\n".join(rows),
        "int8_verdict": verdict,
        "versus_int8_teacher": ""
        if not metadata.get("versus_int8_teacher")
        else (
            "Against what you would ship without distillation, the fine-tuned teacher quantized to int8 the same way:\n\n"
            + "\n".join(f"- {line}" for line in comparison_lines(metadata["versus_int8_teacher"]))
        ),
        "peers_section": peers_section(metadata.get("from_text") or {}),
        "tokenize_section": tokenize_section(facts, metadata["max_length"], metadata["vocab_trim"]),
        "cls_token": role_token(facts, "cls"),
        "sep_token": role_token(facts, "sep"),
        "pad_note": (
            f"`{facts['special_tokens']['pad']['token']}` = {facts['special_tokens']['pad']['id']}"
            if "pad" in facts.get("special_tokens", {})
            else "any id (this tokenizer has no pad token; masked out)"
        ),
        "empty_text": _empty_text(facts),
        "segment_row": ""
        if "token_type_ids" not in [i["name"] for i in metadata["inputs"]]
        else (
            "\n| `token_type_ids` | int64 | [batch, sequence] | sentence pairs: the encoding's type ids (0 for the first "
            "text and its special tokens, 1 for the second text and its final separator), 0 at padding; add it to the "
            "inputs of the code below |"
        ),
        "ort_version": ort_version,
        "ort_version_short": ".".join(ort_version.split(".")[:2]),
        "latency_table": latency_markdown(latency["rows"], "see latency.json", latency["load"])
        .split("\n", 2)[2]
        .strip(),
        "config": config.name,
        "experiment": metadata["source"]["mlflow_experiment"] or "none (tracking off)",
        "parent_run": metadata["source"]["mlflow_parent_run_id"] or "none",
        "stage_run": metadata["source"]["mlflow_export_run_id"] or "none",
        "registered_model": (
            f"`{metadata['source']['registered_model']}` (alias `{ALIAS}`)"
            if metadata["source"]["registered_model"]
            else "none (export.register_model off or MLflow disabled)"
        ),
        "quant_summary": _why(quant) if quant.get("per_channel") is not None else "off",
        "text_model_section": text_model_section(metadata),
        "mobile_section": mobile_section(metadata),
        "executorch_section": executorch_section(metadata, latency),
    }


def files_table(metadata: dict) -> str:
    """The README's file list: only the files this bundle really has."""
    opset, max_length = metadata["opset"], metadata["max_length"]
    described = [("model.onnx", f"fp32 ONNX graph (opset {opset}, one file, dynamic batch and sequence)")]
    if "int8" in metadata["variants"]:
        described += [
            ("model.int8.onnx", "the same graph with int8 MatMul weights (dynamic quantization)"),
            ("model.int8.ort", "`model.int8.onnx` in ORT format, for ONNX Runtime Mobile"),
        ]
    if "int8_static" in metadata["variants"]:
        described += [
            (
                "model.int8.static.onnx",
                "static QDQ int8: activation scales calibrated on training text (the same "
                "answer whatever the batch; the form NNAPI and CoreML read)",
            ),
            ("model.int8.static.ort", "`model.int8.static.onnx` in ORT format, for ONNX Runtime Mobile"),
        ]
    if metadata["variants"]["fp32"]["ort_file"]:
        described.append(("model.ort", "`model.onnx` in ORT format, for ONNX Runtime Mobile"))
    for name, info in ((metadata.get("executorch") or {}).get("variants") or {}).items():
        described.append(
            (
                info["file"],
                f"ExecuTorch program (XNNPACK, batch 1{', int8 linears' if name == 'int8' else ''}): "
                "for apps on PyTorch's mobile runtime",
            )
        )
    text = metadata.get("text_model") or {}
    if text.get("shipped"):
        described += [
            (
                text["file"],
                f"text in, probabilities out: the tokenizer (onnxruntime-extensions operators) in front "
                f"of `{text['classifier']}`; needs the extensions library",
            ),
            (text["ort_file"], f"`{text['file']}` in ORT format, for ONNX Runtime Mobile + extensions"),
        ]
    described += [
        ("required_operators.config", "operators the `.ort` file(s) use: input of a reduced ONNX Runtime build"),
        ("tokenizer.json", f"the tokenizer (Hugging Face `tokenizers` format; truncation at {max_length}, no padding)"),
        *(
            [("vocab.txt", "the WordPiece vocabulary, one token per line; line number (from 0) = token id")]
            if "vocab.txt" in metadata["tokenizer"].get("files", ["vocab.txt"])
            else []
        ),
        ("labels.json", "output index -> label name"),
        (
            "metadata.json",
            "inputs, outputs, tokenizer facts, accuracy and size per variant, sha256 of every other file",
        ),
        ("latency.md, latency.json", "latency at batch 1 on the export machine (use the ratios, not the milliseconds)"),
        ("predict.py", "reference classifier (onnxruntime + tokenizers + numpy only): the executable spec"),
        *(
            [
                (
                    "demo.html",
                    "type a sentence, see the label and probabilities: the model in your browser (onnxruntime-web, "
                    "files in `demo/`; serve the folder with `python -m http.server`)",
                )
            ]
            if (metadata.get("demo") or {}).get("shipped")
            else []
        ),
        *[
            (name, "the demo's runtime: onnxruntime-web (WebAssembly) or the JavaScript tokenizer, copied from npm")
            for name in (metadata.get("demo") or {}).get("files", [])[1:]
        ],
        ("README.md", "this file"),
    ]
    rows = ["| file | what it is |", "|---|---|"]
    rows += [
        f"| `{name}` | {what} |"
        if "," not in name
        else f"| `{name.split(', ')[0]}`, `{name.split(', ')[1]}` | {what} |"
        for name, what in described
    ]
    return "\n".join(rows)


def peers_section(measured: dict) -> str:
    """The bundle README's comparison with what mobile teams ship instead (TF-IDF, fastText, static embeddings)."""
    if not measured.get("measured"):
        return f"Not compared with TF-IDF, fastText or static embeddings: {measured.get('why', 'not measured')}."
    text = (
        "Beside what mobile teams ship instead, each trained on the same splits (stage `peers`), every model from "
        "raw text to label, one text per call, one thread (accuracy on every test text; latency the median over "
        f"{measured['timed_texts']} test texts, interleaved):\n\n" + from_text.markdown(measured)
    )
    c = measured.get("versus_peers")
    if c:
        text += (
            f"\n\nThis student is {c['accuracy_margin_points']:+.2f} points from the most accurate peer "
            f"({c['best_peer_title']}, {c['best_peer_accuracy']:.4f}) and takes {c['latency_vs_fastest_peer']:.2f}x "
            f"the time of the fastest ({c['fastest_peer_title']}, {c['fastest_peer_ms']:.3f} ms per text)."
        )
        if "macro_f1_margin_points" in c:
            text += (
                f" By macro-F1 it is {c['macro_f1_margin_points']:+.2f} points from the best peer "
                f"({c['best_macro_f1_peer_title']}, {c['best_peer_macro_f1']:.4f})."
            )
    for name, why in (measured.get("skipped_peers") or {}).items():  # the peers stage could not train it
        text += f"\n\nNot compared with {name}: {why.rstrip('.')}."
    return text


def executorch_section(metadata: dict, latency: dict) -> str:
    """The README's "ExecuTorch" section: the .pte files, their figures and how to run them, or why there are none."""
    pte = metadata.get("executorch") or {}
    if not pte.get("built"):
        return f"No `.pte` in this bundle: {pte.get('why', 'not built')}."
    speed = {r["model"]: r for r in latency["rows"] if r["input"] == "sentences" and r["threads"] == 1}
    rows = [
        "| file | accuracy (one text per call) | macro-F1 | size MB | max logit diff vs PyTorch | ms per sentence, 1 thread "
        "| speed-up vs teacher ONNX int8 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, info in pte["variants"].items():
        r = speed.get(f"student ExecuTorch {name}", {})
        ms = f"{r['median_ms']:.3f}" if r else "-"
        up = (
            f"{r['speedup_vs_teacher_int8']:.2f}x ({r['speedup_vs_teacher_int8_low']:.2f}-{r['speedup_vs_teacher_int8_high']:.2f})"
            if r.get("speedup_vs_teacher_int8")
            else "-"
        )
        rows.append(
            f"| `{info['file']}` | {info['accuracy']:.4f} | {info['macro_f1']:.4f} | {info['file_mb']:.1f} | "
            f"{info['max_abs_logit_diff_vs_pytorch']:.1e} | {ms} | {up} |"
        )
    for info in (pte.get("not_shipped") or {}).values():
        if "accuracy" not in info:  # not built at all (the lowering or the runtime refused it): only the reason
            rows.append(f"| ~~`{info['file']}`~~ | - | - | - | - | - | {info['why']} |")
            continue
        rows.append(
            f"| ~~`{info['file']}`~~ | {info['accuracy']:.4f} | {info['macro_f1']:.4f} | {info['file_mb']:.1f} | "
            f"{info['max_abs_logit_diff_vs_pytorch']:.1e} | - | {info['why']} |"
        )
    best = "model.int8.pte" if "int8" in pte["variants"] else "model.pte"
    return render_template(
        "sections/executorch.md",
        {
            "table": "\n".join(rows),
            "version": pte["executorch"],
            "best": best,
            "best_stem": best[:-4],
            "max_length": metadata["max_length"],
            "embeddings": pte["embeddings"],
        },
    )


def mobile_section(metadata: dict) -> str:
    """The README's "Mobile execution providers" section: the usability checker's verdicts."""
    checked = metadata["mobile_usability"]
    lines = [mobile.markdown(checked["shipped"])]
    if "fp32" in checked:
        fp32 = checked["fp32"]["providers"]
        lines += [
            "",
            "The fp32 graph `model.onnx` for comparison: "
            + ", ".join(
                f"{name} {p['as_shipped']['supported_nodes']}/{p['as_shipped']['nodes']} nodes, {p['verdict']} "
                f"({p['verdict_with_fixed_shapes']} with fixed shapes)"
                for name, p in fp32.items()
            )
            + ".",
        ]
    static = checked.get("static_qdq_int8") or {}
    if static.get("built") and checked["shipped"]["model"] != static["model"]:
        lines += [
            "",
            f"The static QDQ int8 graph `{static['model']}`: "
            + ", ".join(
                f"{name} {p['as_shipped']['supported_nodes']}/{p['as_shipped']['nodes']} nodes, {p['verdict']} "
                f"({p['verdict_with_fixed_shapes']} with fixed shapes)"
                for name, p in static["providers"].items()
            )
            + ".",
        ]
    elif not static.get("built"):
        lines += ["", f"No static QDQ int8 graph: {static.get('why', 'not built')}."]
    lines += ["", "The text-in model runs on the CPU provider: its tokenizer operators exist only there."]
    return "\n".join(lines)


def text_model_section(metadata: dict) -> str:
    """The README's "Text in, probabilities out" section: how to run model.text.ort on Android and iOS, or why there is none."""
    text, labels = metadata.get("text_model") or {}, len(metadata["labels"])
    if not text.get("shipped"):
        return (
            "This bundle has no text-in model: " + text.get("why", "it was not built") + ". Tokenize as in step 1 and "
            "feed the ids-in model as in steps 2 and 3."
        )
    check, ort_version = text["check"], metadata["runtime"]["onnxruntime"]
    ext = text.get("onnxruntime_extensions", "0.15.2")
    differences = "\n".join(f"- {line}" for line in text.get("known_differences", []))
    return words_paragraph(metadata) + render_template(
        "sections/text_model.md",
        {
            "file": text["file"],
            "ort": text["ort_file"],
            "ort_stem": text["ort_file"].removesuffix(".ort"),
            "classifier": text["classifier"],
            "max_length": text["truncation"],
            "labels": labels,
            "same": check["token_ids_identical"],
            "examples": check["examples"],
            "agreement": f"{check['prediction_agreement']:.4f}",
            "ort_version": ort_version,
            "ext": ext,
            "ext_short": ".".join(ext.split(".")[:2]),
            "differences": differences,
            "operator": text["operator"].split(" ", 1)[1],
        },
    )


def words_paragraph(metadata: dict) -> str:
    """For a static student with a word model: what it is and how much faster it answers, before the text-in section."""
    words = metadata.get("word_model") or {}
    if not words.get("shipped"):
        return ""
    rows = {row["model"]: row for row in (metadata.get("from_text") or {}).get("rows", [])}
    speed = ""
    if "student_words" in rows and "student" in rows:
        speed = (
            f" One text per call it took {rows['student_words']['median_ms']:.3f} ms per test text against "
            f"{rows['student']['median_ms']:.3f} ms for `{metadata['text_model']['file']}`."
        )
    check = words["check"]
    listed, corpus = words.get("word_list"), words.get("word_corpus")
    source = (
        f", and {listed['words']} words of the word list `{listed['source']}`: its licence applies to the app"
        if listed
        else ""
    )
    if corpus:
        found = "every word" if corpus["min_count"] == 1 else f"the words found at least {corpus['min_count']} times"
        source += (
            f", and {found} ({corpus['words']}) in {corpus['texts']} texts of `{corpus['source']}`: the words ship in "
            "the table, the texts do not; whether the corpus's licence asks for a notice in the app is the app's to check"
        )
    return (
        f"**Fastest for this static student: `{words['file']}`** (ORT format: `{words.get('ort_file', '-')}`), the "
        "same input `text` and outputs `probabilities` and `label` (no `input_ids`), one text per call (shape [1]; "
        "for batches use the text-in model), the same extensions library. It "
        f"adds up rows summed at export for the {words['words_in_table']} words of its table (the training text's, "
        f"the vocabulary's whole words{source}) and splits only "
        "other words into pieces (texts over the truncation length go the piece route). Checked at export: the same "
        f"prediction as the fp32 graph on {check['examples']} of {check['examples']} test texts (probabilities within "
        f"{check['max_abs_probability_diff']:.1e}).{speed}\n\n"
    )


def tokenize_section(facts: dict, max_length: int, trim: dict) -> str:
    """The README's "1. Tokenize" text for the tokenizer the bundle really ships (WordPiece, byte-level BPE, Unigram...)."""
    kind, cls, sep, unk = (
        facts.get("type"),
        role_token(facts, "cls"),
        role_token(facts, "sep"),
        role_token(facts, "unk"),
    )
    template, pair = facts.get("template", "text"), facts.get("pair_template", "")
    pair_note = f" (text pairs: `{pair.replace('text_pair', 'b').replace('text', 'a')}`)" if pair else ""
    truncate = (
        f"Truncate to **{max_length} tokens including `{cls}` and `{sep}`** (drop pieces from the end, keep the "
        f"final `{sep}`)."
        if template != "text"
        else f"Truncate to **{max_length} tokens** (drop pieces from the end)."
    )
    vocab_size = facts["vocab_size"]
    if trim.get("enabled"):
        files = " / ".join(tokenizer_files(facts))
        fallback = f" or `{unk}`" if "unk" in facts.get("special_tokens", {}) else ""
        vocab_note = (
            f" The vocabulary was trimmed to the {trim['kept_tokens']} tokens the training text uses "
            f"(of {trim['original_vocab']}): use this bundle's {files}, never the original model's "
            f"vocabulary; words made of other pieces become shorter pieces{fallback}."
        )
    elif trim.get("requested"):
        vocab_note = f" The vocabulary was not trimmed (export.trim_vocab): {trim.get('reason', '')}."
    else:
        vocab_note = ""
    if kind == "WordPiece" and facts.get("pre_tokenizer") == "BertPreTokenizer":
        lowercase = facts.get("lowercase")
        accents = ", accents stripped" if lowercase and facts.get("strip_accents") in (None, True) else ""
        case = f"**uncased** (lower-case{accents})" if lowercase else "**cased** (no lower-casing)"
        prefix, max_chars = facts.get("continuing_subword_prefix") or "##", facts.get("max_input_chars_per_word") or 100
        return "\n".join(
            [
                f"WordPiece, {case}, exactly as `tokenizer.json` does it:",
                "",
                "1. Normalize: drop control characters, map whitespace to spaces, put spaces around CJK characters"
                + (f", lower-case{accents}." if lowercase else "."),
                "2. Pre-tokenize: split on whitespace and around every punctuation character.",
                "3. WordPiece each word: greedy longest match from the start of the word against `vocab.txt`; pieces after the",
                f"   first carry the `{prefix}` prefix; a word with no match (or longer than {max_chars} characters) becomes `{unk}`.",
                f"4. Add special tokens: `{template}`{pair_note}.",
                f"5. {truncate}",
                "",
                f"{_specials_line(facts)}",
                f"Vocabulary size {vocab_size}.{vocab_note} Check your port against `predict.py` on a few hundred sentences: "
                "the ids must be identical.",
                "Libraries that read `tokenizer.json` or `vocab.txt` directly save you writing this (for example a BERT WordPiece",
                "tokenizer in your app's ML kit of choice), but keep the "
                + ("lower-casing and the " if lowercase else "")
                + "truncation length.",
            ]
        )
    pre = facts.get("pre_tokenizers", [])
    if facts.get("byte_level"):
        prefix = (
            " A space is first added in front of the text, so the first word is treated like any other."
            if facts.get("add_prefix_space")
            else ""
        )
        pre_step = (
            "Pre-tokenize (byte-level, GPT-2 / RoBERTa style): split into words, numbers, punctuation and "
            "whitespace runs with the GPT-2 regular expression, keeping a word's leading space; then map every "
            "UTF-8 byte to one printable character (GPT-2's byte-to-unicode table: a space becomes `Ġ`)." + prefix
        )
    elif facts.get("metaspace"):
        meta = facts["metaspace"]
        first = {
            "always": " and add one in front of the text",
            "first": " and add one in front of the text",
            "never": "",
        }.get(meta.get("prepend_scheme"), "")
        pre_step = (
            f"Pre-tokenize (SentencePiece style, Metaspace): replace every space with `{meta.get('replacement')}`"
            f"{first}; each `{meta.get('replacement')}` starts a new word."
        )
    elif "BertPreTokenizer" in pre:
        pre_step = "Pre-tokenize: split on whitespace and around every punctuation character."
    elif pre:
        pre_step = f"Pre-tokenize: {', then '.join(pre)} (see `tokenizer.json` -> `pre_tokenizer`)."
    else:
        pre_step = "Pre-tokenize: none (the model splits the whole normalized text)."
    if kind == "BPE":
        name = "byte-level BPE" if facts.get("byte_level") else "BPE"
        model_step = (
            f"BPE each word: start from single characters{' (bytes)' if facts.get('byte_level') else ''} and "
            f"apply the {facts.get('merges') or 0} merges of `tokenizer.json` -> `model.merges`, always the "
            "highest-priority (earliest listed) pair present, until none applies; each resulting piece's id is "
            "`model.vocab[piece]`."
            + (
                " Every byte is in the vocabulary, so no text is unknown."
                if facts.get("byte_level")
                else f" Pieces not in the vocabulary become `{unk}`."
            )
        )
    elif kind == "Unigram":
        name = "Unigram (SentencePiece)"
        model_step = (
            "Unigram each word: of all ways to cut it into pieces of `tokenizer.json` -> `model.vocab` "
            "([piece, log-probability] pairs, id = position), take the one with the highest total log-probability "
            f"(Viterbi); characters no piece covers become `{unk}`."
        )
    elif kind == "WordPiece":
        name = "WordPiece"
        model_step = (
            f"WordPiece each word: greedy longest match against the vocabulary; pieces after the first carry the "
            f"`{facts.get('continuing_subword_prefix') or '##'}` prefix; a word with no match becomes `{unk}`."
        )
    else:
        name = str(kind)
        model_step = f"{kind} model: see `tokenizer.json` -> `model`."
    return "\n".join(
        [
            f"{name}, {'**uncased** (lower-cased)' if facts.get('lowercase') else '**cased**'}, exactly as `tokenizer.json` does it:",
            "",
            f"1. {_normalize_step(facts)}",
            f"2. {pre_step}",
            f"3. {model_step}",
            f"4. Add special tokens: `{template}`{pair_note}."
            if template != "text"
            else "4. Add special tokens: none.",
            f"5. {truncate}",
            "",
            f"{_specials_line(facts)}",
            f"Vocabulary size {vocab_size}.{vocab_note} Check your port against `predict.py` on a few hundred sentences: "
            "the ids must be identical.",
            "Writing this by hand is error-prone: prefer a library that loads Hugging Face `tokenizer.json` files directly, "
            "and keep the truncation length.",
        ]
    )


def _empty_text(facts: dict) -> str:
    """What an empty text tokenizes to: the single template's special tokens alone."""
    marks = [t for t in facts.get("template", "text").split() if t not in ("text", "text_pair")]
    return f"`{' '.join(marks)}`" if marks else "no tokens at all"


def _specials_line(facts: dict) -> str:
    roles = facts.get("special_tokens", {})
    parts = [f"`{entry['token']}` = {entry['id']} ({role})" for role, entry in roles.items()]
    return "Special token ids: " + (", ".join(parts) if parts else "none") + "."


def _normalize_step(facts: dict) -> str:
    """One sentence for the normalizer of a non-WordPiece tokenizer.json."""
    steps = []
    for kind in facts.get("normalizers", []):
        steps.append(
            {
                "NFC": "Unicode NFC",
                "NFD": "Unicode NFD",
                "NFKC": "Unicode NFKC",
                "NFKD": "Unicode NFKD",
                "Lowercase": "lower-case",
                "StripAccents": "strip accents (combining marks)",
                "Strip": "strip surrounding whitespace",
                "Replace": "replace patterns (see tokenizer.json)",
                "Prepend": "prepend a marker (see tokenizer.json)",
                "Precompiled": "SentencePiece's precompiled character map (NFKC-like; see tokenizer.json)",
                "BertNormalizer": "BERT cleaning" + (", lower-case" if facts.get("lowercase") else ""),
            }.get(kind, kind)
        )
    return (
        "Normalize: " + ", then ".join(steps) + "."
        if steps
        else "Normalize: nothing (**cased**: the text is used as is, no lower-casing or Unicode normalization)."
    )


def _why(quant: dict) -> str:
    excluded = quant.get("nodes_excluded") or []
    embeddings = "; embedding tables int8" if "Gather" in quant.get("op_types", []) else ""
    return (
        f"dynamic int8, MatMul weights {'per channel' if quant.get('per_channel') else 'per tensor'}{embeddings}"
        f"{', 7-bit (reduce_range)' if quant.get('reduce_range') else ''}"
        f"{f', {len(excluded)} MatMul(s) kept fp32' if excluded else ''}; activations uint8 per tensor at run time"
    )
