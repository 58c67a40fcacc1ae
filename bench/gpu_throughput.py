"""GPU throughput at BERT-base scale (issue 17): samples/s, model-FLOPs utilisation, SDPA kernel, peak memory.

    python bench/gpu_throughput.py --out bench/results/gpu_throughput_h200         # the lent GPU (H200)
    python bench/gpu_throughput.py --out bench/results/gpu_throughput_h200_compile \\
        --compile --batches 256 --precisions bf16 --kinds full                      # the torch.compile figures
    python bench/gpu_throughput.py --smoke --out /tmp/gpu_throughput               # tiny model on CPU (< 30 s)

On the lent machine (where .gpu/ carries the missing packages) the same two runs
are `bash bench/gpu_check.sh throughput` and `bash bench/gpu_check.sh
throughput-compile`, two calls of one lease, results under $OUT.

Time on an H200: 16 bf16 rows (batch 32 and 256, both kinds, four stages) took
under a minute of measuring on 2026-12-04 (bench/results/gpu_throughput_base*_h200.md);
the default run (72 rows, an ESTIMATE from FLOP counts) about 3-5 minutes, most of it the fp32 rows at batch 256 and the
cached distillation rows, whose cache reads run on the host; the --compile line
above about 3-5 minutes (compilation dominates). To fit a device lease (15
minutes including start-up, 10 minutes a command) a row stops timing after
--max-row-seconds (15) and after --budget-seconds (420) of measuring the
remaining rows are recorded as skipped; narrow a run with --batches,
--precisions, --kinds, --stages, --steps.

Models: the config's teacher (default configs/gpu_base.yaml: BERT-base-shaped
random teacher, 12 layers, hidden 768, 12 heads, FFN 3072, vocabulary 30522)
and the student the distill stage builds from it (teacher layers [0, 3, 7, 11]),
with the config's loss terms. Sequences of --length tokens (default 128), random
token ids from the vocabulary (throughput does not depend on the ids), two batch
kinds built through the product's ``TrainingData`` (an Arrow split saved as the
prepare stage saves it):

  full     every row --length tokens: no padding (``padded: False``)
  padded   row lengths uniform in [length/4, length], one full row per batch, so
           the batch is padded to --length (``padded: True``)

``TrainingData.batch`` marks each batch ``padded`` or not (decided on the host)
and every model call goes through ``pipeline.inference.model_inputs``, which
calls the model without an attention mask when nothing is padded (PyTorch's
flash kernel, no ``mask.all()`` sync in transformers). The SDPA table shows what
actually ran and whether a mask was passed.

Stages, each per (kind, batch size, precision), precision set the way the
pipeline sets it (``pipeline.runner.Distributed``: the Accelerator's
mixed_precision; fp16 on CPU is refused there and recorded as such):

  teacher         teacher fine-tuning step: cross-entropy, ``pipeline.training.build_trainer``
                  + ``train_step`` (autocast, finiteness check, backward, clipping, AdamW, schedule)
  capture         ``stages.capture.capture_shard`` over one batch: teacher forward with the
                  projection hooks (``teacher_targets``), targets flattened into cache records
                  and logits copied to the host
  distill-cached  distillation step (``DistillObjective``), targets read from a teacher cache
                  written by the capture code (``TeacherCache.batch``)
  distill-online  distillation step with the teacher run inside it (``teacher_targets``)

Timing: --warmup steps (excluded; the first one is timed alone: with --compile it
holds the compilation, reported as first step minus the median step), then
--steps steps each timed on its own (CUDA events on a GPU, no synchronisation
between them; perf_counter on a CPU); samples/s per step, median and min-max.
After the timed steps the step's finiteness flag is read once: a non-finite loss
(fp16 overflow) makes the row an error.

Model FLOPs per step (what MFU counts; the loss terms' relation matrices, the
optimizer and the embeddings' lookups are not counted):

  forward(B, L) = 2 * W_token * B * L + 2 * W_seq * B + 4 * L^2 * H * layers * B

  W_token: weights of every nn.Linear inside the encoder layers (per layer
  4 H^2 + 2 H * FFN for BERT), W_seq: the other nn.Linear weights (pooler,
  classifier; applied once per sequence), H the hidden size; 4 L^2 H per layer
  and sequence are the two attention matmuls (Q K^T and P V). Padded positions are
  computed, so they count. Training is 3x forward (backward twice the forward):

  teacher = 3 F_teacher, capture = F_teacher, distill-cached = 3 F_student,
  distill-online = F_teacher + 3 F_student

MFU = FLOPs per step / step time / the device's dense peak for the precision
(H200 / H100 SXM: bf16 and fp16 989 TFLOPS, TF32 494, fp32 67; H100 PCIe
756 / 378 / 51; A100: 312 / 156 / 19.5); fp32 uses the TF32 peak when
torch lets fp32 matmuls run in TF32. Any other device (a CPU): no peak, MFU "-".
Peak memory: torch.cuda.max_memory_allocated per row on CUDA; on a CPU the
process's peak resident set (ru_maxrss), which only grows over the run.

Errors of one row (OOM, a kernel that does not exist for a dtype) are recorded
in the table, and the run goes on. Output: a markdown report on stdout; with
--out DIR also DIR/gpu_throughput.md and DIR/gpu_throughput.json.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import gc
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import spread  # (also puts the repository on the path)

STAGES = ("teacher", "capture", "distill-cached", "distill-online")
KINDS = ("full", "padded")
PRECISIONS = ("fp32", "bf16", "fp16")
DEFAULT = {
    "config": "gpu_base",
    "batches": [32, 128, 256],
    "length": 128,
    "warmup": 2,
    "steps": 8,
    "precisions": list(PRECISIONS),
}
SMOKE = {"config": "tiny", "batches": [2, 4], "length": 16, "warmup": 1, "steps": 2, "precisions": list(PRECISIONS)}
# Dense peak TFLOPS (no sparsity) by device name, first match wins: bf16/fp16 tensor cores, TF32, plain fp32.
PEAKS = (
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("H200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
)
LABELS = ["negative", "positive"]


# ---------------------------------------------------------------- FLOPs and peaks


def forward_flops(model, batch: int, length: int) -> int:
    """Model FLOPs of one forward over ``batch`` sequences of ``length`` tokens (formula in the module docstring)."""
    import torch

    from pipeline.families import encoder_layers

    layers = encoder_layers(model)
    inside = {id(m) for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)}
    w_token = w_seq = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            if id(module) in inside:
                w_token += module.in_features * module.out_features
            else:
                w_seq += module.in_features * module.out_features
    hidden = model.config.hidden_size
    return 2 * w_token * batch * length + 2 * w_seq * batch + 4 * length * length * hidden * len(layers) * batch


def stage_flops(stage: str, teacher, student, batch: int, length: int) -> int:
    f_teacher, f_student = forward_flops(teacher, batch, length), forward_flops(student, batch, length)
    return {
        "teacher": 3 * f_teacher,
        "capture": f_teacher,
        "distill-cached": 3 * f_student,
        "distill-online": f_teacher + 3 * f_student,
    }[stage]


def device_peaks(name: str) -> dict | None:
    """Dense peak TFLOPS of the device named ``name`` by precision, None for a device not in the table."""
    for key, peaks in PEAKS:
        if key.lower() in name.lower():
            return peaks
    return None


def peak_tflops(peaks: dict | None, precision: str) -> tuple[float | None, str | None]:
    """(peak TFLOPS, which peak) for ``precision``: fp32 counts the TF32 peak when torch allows TF32 matmuls."""
    import torch

    if peaks is None:
        return None, None
    if precision == "fp32":
        tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
        return (peaks["tf32"], "tf32") if tf32 else (peaks["fp32"], "fp32")
    return peaks[precision], precision


# ---------------------------------------------------------------- set-up


def synthetic_rows(kind: str, pool: int, length: int, every: int, vocab: int, seed: int) -> list[list[int]]:
    """``pool`` rows of random token ids between [CLS] and [SEP]: all ``length`` long (full), or lengths uniform in
    [length/4, length] with every ``every``-th row full length, so each batch of >= ``every`` consecutive rows is
    padded to ``length`` (padded)."""
    rng = np.random.default_rng([seed, 17, KINDS.index(kind)])
    if kind == "full":
        lengths = np.full(pool, length)
    else:
        lengths = rng.integers(max(3, length // 4), length + 1, size=pool)
        lengths[::every] = length
    cls, sep, low = (101, 102, 999) if vocab > 2000 else (1, 2, 3)
    return [[cls, *rng.integers(low, vocab, size=n - 2).tolist(), sep] for n in lengths]


def make_dist(config_name: str, overrides: list[str], precision: str):
    """The runner's ``Distributed`` (Accelerator with the precision's mixed_precision) for ``precision``.

    Accelerate keeps one AcceleratorState per process; it is reset so that each precision gets its own."""
    from accelerate.state import AcceleratorState

    from pipeline.config import load_config
    from pipeline.runner import Distributed

    AcceleratorState._reset_state()
    return Distributed(load_config(config_name, [*overrides, f"precision={precision}"]))


def error_text(exc: BaseException) -> str:
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "OOM"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:240]}"


def raise_recompile_limit() -> None:
    """Every (batch, kind, precision) is its own compiled graph: lift dynamo's per-function limit of 8."""
    import torch._dynamo

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))


def step_function(
    stage: str,
    teacher,
    run_teacher,
    student,
    plan,
    config,
    dist,
    data,
    cache,
    batches: list,
    layout,
    pad: int,
    compile_models: bool,
):
    """``step(i)``: one step of ``stage`` on ``batches[i % len]`` (capture: on the rows of that batch).

    ``teacher`` / ``student``: the eager models, copied for training; ``run_teacher``: the frozen teacher that
    capture and online distillation run (the compiled copy with --compile)."""
    from micro import training_job

    from pipeline.training import train_step
    from stages.capture import capture_shard

    if stage == "capture":

        def capture(i):
            first, last = batches[i % len(batches)]["range"]
            capture_shard(run_teacher, data, first, last, plan, layout, last - first, pad, dist)

        return capture

    # the teacher stage's fine-tuning step, or the distill stage's with targets from the cache / the teacher in the step
    kind = {"teacher": "plain", "distill-cached": "cached", "distill-online": "online"}[stage]
    model = copy.deepcopy(teacher).requires_grad_(True) if stage == "teacher" else copy.deepcopy(student)
    if compile_models:
        model.compile()
    trainer, loss_fn = training_job(
        kind,
        model,
        run_teacher,
        plan,
        cache,
        config,
        dist,
        len(data),
        config.teacher if stage == "teacher" else config.distill,
        tag=f"gpu-{stage}",
    )

    def step(i):
        train_step(trainer, batches[i % len(batches)]["batch"], loss_fn, step=i + 1)

    def check():  # the step leaves finiteness on the device (FiniteWatch); read it once, after the timing
        trainer.watch.check(dist, trainer.tag)

    step.check = check
    return step


def time_steps(step, warmup: int, steps: int, cuda: bool, max_seconds: float = 0) -> tuple[float, list[float]]:
    """(seconds of the first warm-up step, seconds of each timed step). With ``max_seconds`` the timed steps stop
    once they took that long on the host clock (never before 3 steps): a slow row gets fewer steps."""
    import torch

    def sync():
        if cuda:
            torch.cuda.synchronize()

    sync()
    start = time.perf_counter()
    step(0)
    sync()
    first = time.perf_counter() - start
    for i in range(1, warmup):
        step(i)
    sync()
    if cuda:  # events on the stream: no synchronisation between the timed steps
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        start = time.perf_counter()
        for k, (begin, end) in enumerate(events):
            begin.record()
            step(warmup + k)
            end.record()
            if max_seconds and k >= 2 and time.perf_counter() - start > max_seconds:
                events = events[: k + 1]
                break
        torch.cuda.synchronize()
        return first, [begin.elapsed_time(end) / 1000 for begin, end in events]
    times, start = [], time.perf_counter()
    for k in range(steps):
        begin = time.perf_counter()
        step(warmup + k)
        times.append(time.perf_counter() - begin)
        if max_seconds and k >= 2 and time.perf_counter() - start > max_seconds:
            break
    return first, times


def sdpa_report(model, batch: dict, dist) -> dict:
    """The aten ops whose name holds ``scaled_dot_product`` in one eval forward of ``model`` (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pipeline.inference import model_inputs

    inputs = model_inputs(batch)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), dist.autocast(), profile(activities=[ProfilerActivity.CPU]) as prof:
            model(**inputs)
    finally:
        model.train(was_training)
    ops = sorted({e.key for e in prof.key_averages() if "scaled_dot_product" in e.key})
    return {
        "ops": ops,
        "kernels": [op for op in ops if "_scaled_dot_product" in op],
        "mask_passed": "attention_mask" in inputs,
    }


def peak_memory(cuda: bool) -> tuple[int, str]:
    import torch

    if cuda:
        return int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process peak RSS (ru_maxrss, whole run so far)"


# ---------------------------------------------------------------- the run


def run(
    config_name: str,
    overrides: list[str],
    batches: list[int],
    precisions: list[str],
    kinds: list[str],
    stages: list[str],
    length: int,
    warmup: int,
    steps: int,
    compile_models: bool,
    work_dir: Path | None = None,
    max_row_seconds: float = 0,
    budget_seconds: float = 0,
    log=print,
) -> dict:
    """Every row (precision x kind x stage x batch); after ``budget_seconds`` the remaining rows are recorded as
    skipped, so a run fits a device lease."""
    import accelerate
    import torch
    import transformers
    from micro import bf16_check, training_data, write_cache
    from tqdm.auto import tqdm
    from transformers import set_seed

    from pipeline.cache import TeacherCache
    from pipeline.config import load_config
    from pipeline.families import encoder_layers, usable_positions
    from pipeline.models import build_student, build_teacher_for_finetune, count_parameters, teacher_model_config
    from pipeline.objective import target_plan
    from pipeline.pruning import ffn_importance

    config = load_config(config_name, overrides)
    positions = usable_positions(teacher_model_config(config))
    if positions is not None and length > positions:
        raise SystemExit(
            f"gpu_throughput: --length {length} is above the teacher's {positions} position embeddings "
            f"(config {config.name}); give --length {positions} or less."
        )
    cuda = torch.cuda.is_available()
    device_name = torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or platform.machine()})"
    peaks = device_peaks(device_name) if cuda else None
    if compile_models:
        raise_recompile_limit()
    set_seed(config.seed)
    vocab = teacher_model_config(config).vocab_size
    teacher = build_teacher_for_finetune(config, LABELS, vocab)
    teacher.requires_grad_(False)
    plan = target_plan(config, teacher.config)
    every = min(batches)
    pool = -(-max(batches) // every) * every  # a multiple of the smallest batch: each window holds a full row
    rows, sdpa = [], []
    began = time.perf_counter()
    gc.freeze()  # what is alive now stays: each row's garbage collection then scans only that row's objects
    progress = tqdm(
        total=len(precisions) * len(kinds) * len(stages) * len(batches),
        desc="gpu_throughput",
        file=sys.stderr,
        disable=None,
    )
    with tempfile.TemporaryDirectory(dir=work_dir, prefix="gpu_throughput-") as tmp:
        data = {
            kind: training_data(
                Path(tmp) / kind,
                synthetic_rows(kind, pool, length, every, vocab, config.seed),
                [i % len(LABELS) for i in range(pool)],
            )
            for kind in kinds
        }
        caches, layouts, students, teachers = {}, {}, {}, {}
        for precision in precisions:
            try:
                dist = make_dist(config_name, overrides, precision)
            except Exception as exc:  # fp16 without CUDA: the runner refuses it; every row says so
                for kind in kinds:
                    sdpa.append({"precision": precision, "kind": kind, "error": error_text(exc)})
                    for stage in stages:
                        for batch_size in batches:
                            rows.append(
                                {
                                    "stage": stage,
                                    "kind": kind,
                                    "batch": batch_size,
                                    "precision": precision,
                                    "compiled": compile_models,
                                    "error": error_text(exc),
                                }
                            )
                            progress.update(1)
                continue
            if not students:  # once, on the first device set up: the student as the distill stage builds it
                teacher.to(dist.device).eval()
                scores = None
                if config.student.ffn_size is not None:
                    probe = data[kinds[0]].batch(np.arange(min(pool, 64)), 0, dist.device)
                    scores = ffn_importance(teacher, iter([probe]), encoder_layers(teacher))
                    teacher.requires_grad_(False)
                students["eager"] = build_student(config, teacher, scores).to(dist.device)
                teachers["eager"] = teacher
                if compile_models:  # compiled copies; the eager teacher writes the caches
                    teachers["run"] = copy.deepcopy(teacher)
                    teachers["run"].compile()
                else:
                    teachers["run"] = teacher
            student, run_teacher = students["eager"], teachers["run"]
            for kind in kinds:
                probe = data[kind].batch(np.arange(min(batches)), 0, dist.device)
                try:
                    sdpa.append(
                        {
                            "precision": precision,
                            "kind": kind,
                            "padded": probe.get("padded"),
                            **sdpa_report(teacher, probe, dist),
                        }
                    )
                except Exception as exc:
                    sdpa.append({"precision": precision, "kind": kind, "error": error_text(exc)})
                if kind not in caches and any(s in stages for s in ("capture", "distill-cached")):
                    log(f"[gpu_throughput] writing the {kind} teacher cache ({pool} examples)")
                    info = write_cache(Path(tmp) / f"cache-{kind}", teacher, plan, config, data[kind], 0, dist)
                    layouts[kind] = info["layout"]
                    caches[kind] = TeacherCache(Path(tmp) / f"cache-{kind}")
                for stage in stages:
                    for batch_size in batches:
                        progress.set_postfix_str(f"{precision} {kind} {stage} {batch_size}")
                        row = {
                            "stage": stage,
                            "kind": kind,
                            "batch": batch_size,
                            "precision": precision,
                            "compiled": compile_models,
                        }
                        if budget_seconds and time.perf_counter() - began > budget_seconds:
                            row["error"] = f"skipped: the run passed --budget-seconds {budget_seconds:g}"
                            rows.append(row)
                            progress.update(1)
                            continue
                        starts = range(0, pool - batch_size + 1, batch_size)
                        if cuda:
                            torch.cuda.reset_peak_memory_stats()
                        step = chosen = None
                        try:
                            chosen = [
                                {
                                    "range": (s, s + batch_size),
                                    "batch": data[kind].batch(np.arange(s, s + batch_size), 0, dist.device),
                                }
                                for s in starts
                            ]
                            row["padded"] = chosen[0]["batch"].get("padded")
                            step = step_function(
                                stage,
                                teacher,
                                run_teacher,
                                student,
                                plan,
                                config,
                                dist,
                                data[kind],
                                caches.get(kind),
                                chosen,
                                layouts.get(kind),
                                0,
                                compile_models,
                            )
                            first, times = time_steps(step, warmup, steps, cuda, max_row_seconds)
                            if hasattr(step, "check"):  # training steps: a non-finite loss makes the row an error
                                step.check()
                            flops = stage_flops(stage, teacher, student, batch_size, length)
                            median = spread(times)["median"]
                            peak, which = peak_tflops(peaks, precision)
                            memory, memory_kind = peak_memory(cuda)
                            row.update(
                                {
                                    "samples_per_s": spread([batch_size / t for t in times]),
                                    "step_ms": spread([1000 * t for t in times]),
                                    "first_step_s": first,
                                    "compile_s": max(0.0, first - median) if compile_models else None,
                                    "flops_per_step": flops,
                                    "tflops": flops / median / 1e12,
                                    "mfu": flops / median / (peak * 1e12) if peak else None,
                                    "peak_used": which,
                                    "peak_memory_bytes": memory,
                                    "memory_kind": memory_kind,
                                }
                            )
                        except Exception as exc:  # one row's failure (OOM, a missing kernel) is a figure too
                            row["error"] = error_text(exc)
                        rows.append(row)
                        step = chosen = None  # the trainer and batches go before the next row
                        dist.accelerator.free_memory()  # prepared models, optimizers; empties the CUDA cache
                        progress.update(1)
            del dist
    progress.close()
    gc.unfreeze()
    support = {"cuda": cuda}
    if cuda:
        support.update(
            {
                "bf16": torch.cuda.is_bf16_supported(),
                "fp16": True,
                "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
                "flash_sdp": torch.backends.cuda.flash_sdp_enabled(),
                "mem_efficient_sdp": torch.backends.cuda.mem_efficient_sdp_enabled(),
                "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(),
            }
        )
    else:
        support.update({"bf16": bf16_check(), "fp16": "refused by pipeline.runner.Distributed without CUDA"})
    return {
        "device": device_name,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "accelerate": accelerate.__version__,
            "cuda": torch.version.cuda,
        },
        "precision_support": support,
        "peaks_tflops": peaks,
        "config": config.name,
        "overrides": overrides,
        "teacher": {
            "layers": teacher.config.num_hidden_layers,
            "hidden": teacher.config.hidden_size,
            "heads": teacher.config.num_attention_heads,
            "ffn": teacher.config.intermediate_size,
            "vocab": vocab,
            "parameters": count_parameters(teacher),
            "attn_implementation": teacher.config._attn_implementation,
        },
        "student": {
            "layers": students["eager"].config.num_hidden_layers if students else None,
            "teacher_layers": list(config.student.teacher_layers or []),
            "parameters": count_parameters(students["eager"]) if students else None,
        },
        "loss_weights": config.distill.loss.model_dump(),
        "layer_pairs": plan.pairs,
        "settings": {
            "length": length,
            "batches": batches,
            "precisions": precisions,
            "kinds": kinds,
            "stages": stages,
            "warmup": warmup,
            "steps": steps,
            "compile": compile_models,
            "examples_per_kind": pool,
            "max_row_seconds": max_row_seconds,
            "budget_seconds": budget_seconds,
        },
        "rows": rows,
        "sdpa": sdpa,
    }


# ---------------------------------------------------------------- report


def _short(error: str) -> str:
    """An error as a table cell: its first sentence, at most 90 characters (the JSON keeps it whole)."""
    first = error.split(". ")[0]
    return first if len(first) <= 90 else first[:87] + "..."


def _rate(row: dict) -> str:
    if row.get("error"):
        return _short(row["error"])
    s = row["samples_per_s"]
    return f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})"


def _find(rows, **key):
    return next((r for r in rows if all(r.get(k) == v for k, v in key.items())), None)


def _ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or a.get("error") or b.get("error"):
        return "-"
    return f"{a['samples_per_s']['median'] / b['samples_per_s']['median']:.2f}x"


def markdown(result: dict) -> str:
    s, rows = result["settings"], result["rows"]
    v, t, st = result["versions"], result["teacher"], result["student"]
    memory_kind = next((r["memory_kind"] for r in rows if "memory_kind" in r), "")
    lines = [
        f"Ran on **{result['device']}** ({result['date']}): torch {v['torch']}, transformers {v['transformers']}, "
        f"accelerate {v['accelerate']}, CUDA {v['cuda'] or '-'}.",
        "",
        f"Config `{result['config']}`{' with ' + ' '.join(result['overrides']) if result['overrides'] else ''}: teacher "
        f"{t['layers']} layers, hidden {t['hidden']}, {t['heads']} heads, FFN {t['ffn']}, vocabulary {t['vocab']} "
        f"({t['parameters'] / 1e6:.1f}M parameters, attention {t['attn_implementation']}); student "
        f"{st['layers']} layers from teacher layers {st['teacher_layers']}"
        + (f" ({st['parameters'] / 1e6:.1f}M parameters)" if st["parameters"] else "")
        + f"; loss weights {', '.join(f'{k} {w:g}' for k, w in result['loss_weights'].items())}, layer pairs "
        f"{result['layer_pairs']}. Length {s['length']}; {s['warmup']} warm-up + {s['steps']} timed steps per row"
        f"{'; models wrapped in torch.compile' if s['compile'] else ''}. Precision support: "
        f"{json.dumps(result['precision_support'], default=str)}.",
        "",
        "| stage | kind | batch | precision | samples/s median (min-max) | step ms | TFLOP/s | MFU | peak memory GB |"
        + (" compile s |" if s["compile"] else ""),
        "|---|---|---:|---|---:|---:|---:|---:|---:|" + ("---:|" if s["compile"] else ""),
    ]
    for r in rows:
        ok = not r.get("error")
        cells = [
            r["stage"],
            r["kind"],
            str(r["batch"]),
            r["precision"],
            _rate(r),
            f"{r['step_ms']['median']:.1f}" if ok else "-",
            f"{r['tflops']:.3g}" if ok else "-",
            f"{100 * r['mfu']:.1f}%" if ok and r["mfu"] is not None else "-",
            f"{r['peak_memory_bytes'] / 1e9:.2f}" if ok else "-",
        ]
        if s["compile"]:
            cells.append(f"{r['compile_s']:.1f}" if ok else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Peak memory: {memory_kind}, with the resident teacher and student. MFU: model FLOPs (bench/gpu_throughput.py docstring) / step time / "
        f"dense peak {json.dumps(result['peaks_tflops']) if result['peaks_tflops'] else '(no peak known for this device: -)'}.",
        "",
        "Which SDPA kernel ran (teacher, one eval forward under torch.profiler):",
        "",
        "| precision | kind | attention mask passed | aten ops |",
        "|---|---|---|---|",
    ]
    for e in result["sdpa"]:
        if e.get("error"):
            lines.append(f"| {e['precision']} | {e['kind']} | - | {_short(e['error'])} |")
        else:
            lines.append(
                f"| {e['precision']} | {e['kind']} | {'yes' if e['mask_passed'] else 'no'} | "
                f"{', '.join(e['ops']) or 'none'} |"
            )
    lines += [
        "",
        "Cached vs online teacher (distillation samples/s, median):",
        "",
        "| kind | batch | precision | cached | online | cached / online |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for kind in s["kinds"]:
        for batch in s["batches"]:
            for precision in s["precisions"]:
                c = _find(rows, stage="distill-cached", kind=kind, batch=batch, precision=precision)
                o = _find(rows, stage="distill-online", kind=kind, batch=batch, precision=precision)
                if c or o:
                    lines.append(
                        f"| {kind} | {batch} | {precision} | {_rate(c) if c else '-'} | {_rate(o) if o else '-'} "
                        f"| {_ratio(c, o)} |"
                    )
    if "fp32" in s["precisions"] and len(s["precisions"]) > 1:
        others = [p for p in s["precisions"] if p != "fp32"]
        lines += [
            "",
            "Speed-up over fp32 (samples/s ratio of the medians):",
            "",
            "| stage | kind | batch | " + " | ".join(f"{p} / fp32" for p in others) + " |",
            "|---|---|---:|" + "---:|" * len(others),
        ]
        for stage in s["stages"]:
            for kind in s["kinds"]:
                for batch in s["batches"]:
                    base = _find(rows, stage=stage, kind=kind, batch=batch, precision="fp32")
                    lines.append(
                        f"| {stage} | {kind} | {batch} | "
                        + " | ".join(
                            _ratio(_find(rows, stage=stage, kind=kind, batch=batch, precision=p), base) for p in others
                        )
                        + " |"
                    )
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _list(kind, choices=None):
    def parse(text: str):
        items = [kind(x) for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"'{text}' names nothing; give a comma-separated list")
        if choices is not None:
            bad = [x for x in items if x not in choices]
            if bad:
                raise argparse.ArgumentTypeError(f"{bad} not among {', '.join(choices)}")
        if kind is int and min(items) < 1:
            raise argparse.ArgumentTypeError(f"batch sizes must be positive, got {items}")
        return items

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny random model (config tiny), batches 2,4, length 16, 1 warm-up + 2 steps",
    )
    parser.add_argument("--config", help="config name or path (default gpu_base; tiny with --smoke)")
    parser.add_argument("--batches", type=_list(int), help="comma-separated batch sizes (default 32,128,256)")
    parser.add_argument(
        "--precisions", type=_list(str, PRECISIONS), help="comma-separated, of fp32,bf16,fp16 (default all)"
    )
    parser.add_argument("--kinds", type=_list(str, KINDS), default=list(KINDS), help="full,padded (default both)")
    parser.add_argument(
        "--stages", type=_list(str, STAGES), default=list(STAGES), help=f"of {','.join(STAGES)} (default all)"
    )
    parser.add_argument("--length", type=int, help="tokens per sequence (default 128; 16 with --smoke)")
    parser.add_argument("--warmup", type=int, help="untimed steps per row, at least 1 (default 2; 1 with --smoke)")
    parser.add_argument("--steps", type=int, help="timed steps per row (default 8; 2 with --smoke)")
    parser.add_argument(
        "--max-row-seconds",
        type=float,
        default=15.0,
        help="stop a row's timed steps after this many seconds, never before 3 (default 15; 0: no cap)",
    )
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=420.0,
        help="after this many seconds of measuring, record the remaining rows as skipped (default 420, "
        "to fit a 15-minute device lease; 0: no budget)",
    )
    parser.add_argument("--compile", action="store_true", help="wrap the teacher and student in torch.compile")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default torch's; 1 with --smoke, which keeps a shared CPU from oversubscribing)",
    )
    parser.add_argument("--out", type=Path, help="write gpu_throughput.json and gpu_throughput.md here")
    parser.add_argument("--work-dir", type=Path, help="folder for the temporary splits and teacher caches")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, as for the pipeline")
    args = parser.parse_args(argv)
    preset = SMOKE if args.smoke else DEFAULT
    length = args.length or preset["length"]
    warmup = preset["warmup"] if args.warmup is None else args.warmup
    steps = args.steps or preset["steps"]
    threads = args.threads or (1 if args.smoke else None)
    if threads:
        import torch

        torch.set_num_threads(threads)
    if length < 4 or warmup < 1 or steps < 1:
        parser.error(f"--length must be >= 4 (got {length}), --warmup >= 1 (got {warmup}), --steps >= 1 (got {steps})")
    result = run(
        args.config or preset["config"],
        args.overrides,
        args.batches or preset["batches"],
        args.precisions or preset["precisions"],
        args.kinds,
        args.stages,
        length,
        warmup,
        steps,
        args.compile,
        args.work_dir,
        args.max_row_seconds,
        args.budget_seconds,
        log=lambda m: print(m, file=sys.stderr),
    )
    result["command"] = "python bench/gpu_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report = markdown(result)
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out / "gpu_throughput.json", json.dumps(result, indent=2, default=str) + "\n")
        from common import header_lines  # the header bench/report.py reads

        head = header_lines(result["command"], machine=result["device"], date=result["date"][:10])
        write_atomic(args.out / "gpu_throughput.md", "\n".join(head) + "\n" + report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
