"""Why two latency harnesses disagree: the shipped student against the int8 teacher, one text per call, one
thread, timed five ways on the same finished run, each paired against the teacher within its own rounds.

    python bench/latency_harness.py runs/bert_small [--rounds 8] [--out bench/results/latency_harness.md]

1. ids in, the export's sample (the run's seed, export.latency_sentences texts): what latency.json records;
2. ids in, another seeded sample of twice as many texts (a different length mix);
3. ids in, the teacher and the student each fed their own tokenization of the text;
4. from raw text through `tokenizers` + the ids-in graph for both (what predict.py and an app with a tokenizer
   port do: tokenization inside the timing);
5. from raw text, the student's text-in model (tokenizer operators in the graph) against (4)'s teacher;
6. as (1), with the fp32 teacher in PyTorch timed in the same rounds, as the export's table does (its 90 MB of
   weights pass through the caches between the two ONNX models).

The teacher's int8 graph is rebuilt here exactly as the export builds it (pipeline/export/variants.export_teacher). Every
speed-up is the median of per-round ratios with its 95% interval (pipeline/timing.py).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
from common import command_line, cpu_flags, emit  # (also puts the repository on the import path)

from pipeline import timing
from pipeline.config import PipelineConfig
from pipeline.export import from_text as FT
from pipeline.export.latency import ort_runner, torch_runner
from pipeline.export.onnx_graph import LogitsOnly, export_onnx
from pipeline.export.quantize import quantize_like_student
from pipeline.export.tokenizer import tokenize_texts
from pipeline.models import load_classifier


def feeds(ids: list[int]) -> dict:
    return {"input_ids": np.asarray([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a finished run folder (runs/<config> or a sweep variant's)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds at least (more until intervals are narrow)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="times to run every harness, one after the other (the machine's state drifts between repeats)",
    )
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    import yaml

    config = PipelineConfig.model_validate(yaml.safe_load((args.run / "config.yaml").read_text()))
    bundle = args.run / "export" / "bundle"
    metadata = json.loads((bundle / "metadata.json").read_text())
    student_graph = bundle / metadata["variants"][metadata["recommended"]]["file"]
    records = [
        json.loads(line) for line in (args.run / "prepare" / "test.jsonl").read_text().splitlines() if line.strip()
    ]
    texts = [r["text"] for r in records]
    max_length = metadata["max_length"]
    quant = metadata["quantization"]
    with tempfile.TemporaryDirectory() as tmp:
        teacher_onnx, teacher_int8 = Path(tmp) / "teacher.onnx", Path(tmp) / "teacher.int8.onnx"
        eager = load_classifier(str(args.run / "teacher" / "model"), attn_implementation="eager").eval()
        export_onnx(LogitsOnly(eager), teacher_onnx, config.export.opset)
        quantize_like_student(teacher_onnx, teacher_int8, quant)
        teacher_tokenizer = args.run / "distill" / "student" / "tokenizer.json"  # the original vocabulary
        n = config.export.latency_sentences
        samples = {
            "export": np.random.default_rng(config.seed).permutation(len(texts))[:n].tolist(),
            "twice as many": np.random.default_rng(config.seed + 1).permutation(len(texts))[: 2 * n].tolist(),
        }
        teacher_ids = tokenize_texts(teacher_tokenizer, texts, max_length)
        student_ids = tokenize_texts(bundle / "tokenizer.json", texts, max_length)
        teacher_run, student_run = ort_runner(teacher_int8, 1), ort_runner(student_graph, 1)
        settings = {
            "1. ids in, the export's sample": (
                {"teacher": teacher_run, "student": student_run},
                {
                    "teacher": [feeds(teacher_ids[i]) for i in samples["export"]],
                    "student": [feeds(student_ids[i]) for i in samples["export"]],
                },
            ),
            "2. ids in, twice as many texts": (
                {"teacher": teacher_run, "student": student_run},
                {
                    "teacher": [feeds(teacher_ids[i]) for i in samples["twice as many"]],
                    "student": [feeds(student_ids[i]) for i in samples["twice as many"]],
                },
            ),
            "3. ids in, the teacher's ids for both": (
                {"teacher": teacher_run, "student": student_run},
                {
                    "teacher": [feeds(teacher_ids[i]) for i in samples["export"]],
                    "student": [feeds(teacher_ids[i]) for i in samples["export"]],
                },
            )
            if metadata["vocab_trim"].get("applied") is not True
            else None,
            "4. raw text, tokenizers + ids-in graph": (
                {
                    "teacher": FT.tokenizer_runner(teacher_tokenizer, teacher_int8, max_length),
                    "student": FT.tokenizer_runner(bundle / "tokenizer.json", student_graph, max_length),
                },
                {"teacher": [texts[i] for i in samples["export"]], "student": [texts[i] for i in samples["export"]]},
            ),
        }
        pytorch_teacher = load_classifier(str(args.run / "teacher" / "model")).eval()
        settings["6. as 1, the PyTorch teacher timed in the same rounds"] = (
            {"teacher": teacher_run, "student": student_run, "pytorch": torch_runner(pytorch_teacher, 1)},
            {
                "teacher": [feeds(teacher_ids[i]) for i in samples["export"]],
                "student": [feeds(student_ids[i]) for i in samples["export"]],
                "pytorch": [feeds(teacher_ids[i]) for i in samples["export"]],
            },
        )
        if metadata["text_model"].get("shipped"):
            settings["5. raw text, the student's text-in model"] = (
                {
                    "teacher": FT.tokenizer_runner(teacher_tokenizer, teacher_int8, max_length),
                    "student": FT.text_model_runner(bundle / metadata["text_model"]["file"]),
                },
                {"teacher": [texts[i] for i in samples["export"]], "student": [texts[i] for i in samples["export"]]},
            )
        lines = [
            f"# Latency harnesses: {args.run} ({metadata['recommended']} student vs int8 teacher)",
            "",
            f"{cpu_flags()}, {os.cpu_count()} cores, 1 thread, batch 1, load average {os.getloadavg()[0]:.2f} at the "
            f"start; `python bench/latency_harness.py {args.run} --repeats {args.repeats}`. Each cell: the speed-up "
            "(median of per-round ratios) with its 95% interval, teacher / student ms, rounds; the repeats ran one "
            "after the other.",
            "",
            "| harness | texts | " + " | ".join(f"repeat {i + 1}" for i in range(args.repeats)) + " |",
            "|---|---:|" + "---:|" * args.repeats,
        ]
        cells = {name: [] for name in settings}
        for repeat in range(args.repeats):
            for name, setting in settings.items():
                if setting is None:
                    cells[name].append("skipped: the shipped vocabulary is trimmed")
                    continue
                runners, inputs = setting
                timed = timing.interleaved(
                    runners,
                    inputs,
                    warmup=1,
                    min_rounds=args.rounds,
                    max_rounds=5 * args.rounds,
                    reference="teacher",
                    max_spread=0.05,
                    watch=["student"],
                )
                s = timed["student"]
                cells[name].append(
                    f"{s['speedup']:.2f}x ({s['speedup_low']:.2f}-{s['speedup_high']:.2f}); "
                    f"{timed['teacher']['median_ms']:.2f} / {s['median_ms']:.3f} ms; {s['rounds']}"
                )
                print(f"repeat {repeat + 1} {name}: {cells[name][-1]}", flush=True)
        for name, setting in settings.items():
            count = len(setting[1]["student"]) if setting else "-"
            lines.append(f"| {name} | {count} | " + " | ".join(cells[name]) + " |")
    emit(lines, args.out, command=command_line("bench/latency_harness.py", argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
