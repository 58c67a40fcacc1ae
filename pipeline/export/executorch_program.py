"""The student as an ExecuTorch program (model.pte), the second on-device runtime beside ONNX Runtime.

Mobile teams that build on PyTorch ship ``.pte`` files: the student is captured with ``torch.export`` (batch 1,
a dynamic sequence axis up to max_length), lowered to the XNNPACK delegate (ARM and x86 CPU kernels) and
serialised. Two variants:

* fp32: every XNNPACK-supported operator delegated; parity with PyTorch is checked by the export;
* int8 linears: torchao's 8-bit dynamic-activation, 8-bit per-channel-weight linears (``8da8w``) before
  export. The embedding table stays fp32: torchao's 8-bit embedding leaves a ``dequantize_affine`` that
  ExecuTorch 1.5.1 has no kernel for.

Attention is captured in its ``eager`` form (plain matmul + softmax), which XNNPACK lowers whole; the SDPA form
leaves more of the graph outside the delegate. Tokenisation stays with ``tokenizer.json`` (the app's tokenizer,
as for the ids-in ONNX model): there is no string operator set for ExecuTorch.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import multiprocessing
import os
import sys
import time
import warnings
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import PipelineError
from ..metrics import classification_report
from ..parent_death import end_with_parent

if TYPE_CHECKING:  # the build process imports this module first: no transformers before it has to
    from .variants import Inputs, Student

log = logging.getLogger("pipeline")

# executorch and torchao are imported inside the functions that use them: they are an optional extra (the
# `executorch` one), and this module is imported by every export to ask version() whether they are there.
INSTALL = "pip install executorch==1.5.1 (brings torchao 0.18; installs beside torch 2.13 without moving it)"


def version() -> str | None:
    """The installed executorch version, or None."""
    try:
        return installed("executorch")
    except PackageNotFoundError:
        return None


# What building and running a program imports: an install that is there but broken (a missing or mismatched native
# library, a torchao that does not fit) shows here, before anything is built.
MODULES = (
    "executorch.exir",
    "executorch.backends.xnnpack.partition.xnnpack_partitioner",
    "executorch.runtime",
    "executorch.extension.pybindings.portable_lib",
    "torchao.quantization",
)


def unusable() -> str | None:
    """Why ExecuTorch cannot build programs here (not installed, or installed but not importable), or None."""
    found = version()
    if found is None:
        return f"the executorch package is not installed ({INSTALL})"
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # ImportError, OSError from a native library, AttributeError from a version mismatch
            detail = " ".join(str(exc).split())[:300]
            return (
                f"the executorch package {found} is installed but {name} cannot be imported ({type(exc).__name__}: "
                f"{detail}); reinstall it: {INSTALL}"
            )
    return None


class _Logits(torch.nn.Module):
    """(input_ids, attention_mask) -> logits, the .pte's one method."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def export_pte(model, path: Path, max_length: int, int8_linears: bool = False) -> dict:
    """Lower ``model`` (eager attention, eval mode) to XNNPACK and write ``path``; returns what was done.

    The sequence axis is bounded by the model's position table (``max_position_embeddings``), not by
    ``max_length``: ExecuTorch plans memory for the bound and refuses longer inputs, and the ONNX graphs it is
    compared with take any length up to the position table too."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    started = time.perf_counter()
    module = _Logits(copy.deepcopy(model).float().eval())
    if int8_linears:
        from torchao.quantization import quantize_
        from torchao.quantization.granularity import PerAxis
        from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_(
                module, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
            )
    bound = int(getattr(model.config, "max_position_embeddings", None) or max_length)
    length = min(16, max_length)
    example = (torch.ones(1, length, dtype=torch.long), torch.ones(1, length, dtype=torch.long))
    sequence = torch.export.Dim("sequence", min=2, max=bound)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's and the exporter's deprecation notices, one per tensor
        exported = torch.export.export(module, example, dynamic_shapes=({1: sequence}, {1: sequence}), strict=False)
        program = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(program.buffer)
    tmp.replace(path)
    delegated = sum(
        1
        for node in program.exported_program().graph.nodes
        if node.op == "call_function" and "executorch_call_delegate" in str(node.target)
    )
    return {
        "file": path.name,
        "file_mb": path.stat().st_size / 1e6,
        "backend": "XNNPACK",
        "batch": 1,
        "sequence": f"2..{bound} (dynamic; the tokenizer truncates to {max_length})",
        "int8_linears": int8_linears,
        "quantization": (
            "torchao Int8DynamicActivationIntxWeightConfig (int8 per-channel weights, int8 dynamic "
            "per-token activations) on every Linear; embeddings fp32"
        )
        if int8_linears
        else None,
        "delegate_calls": delegated,
        "export_seconds": round(time.perf_counter() - started, 1),
        "executorch": version(),
    }


def load_runtime() -> None:
    """Import the ExecuTorch runtime (about 7 s on two cores) while the build process still lowers, instead of in the
    latency step. What fails here is left for :func:`runner` to meet and report where a program is run; the build
    process imported these modules before it could lower anything (:func:`unusable`)."""
    with contextlib.suppress(Exception), _quiet_stderr():
        for name in ("executorch.runtime", "executorch.extension.pybindings.portable_lib"):
            importlib.import_module(name)


def runner(path: Path, threads: int | None = None):
    """feeds (numpy input_ids / attention_mask, batch 1) -> logits [1, labels], through the ExecuTorch runtime.

    ``threads`` sizes ExecuTorch's own thread pool (XNNPACK's kernels run on it, not on torch's). The pool is one
    per process and a loaded program keeps using the pool it was loaded with (resizing it under a loaded program
    corrupts memory), so the pool is resized before loading: the runner made last decides, and programs loaded
    before it must not run again."""
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    with _quiet_stderr():  # the runtime's CPU probe prints "Failed to open midr file" lines on x86
        if threads and portable_lib._threadpool_get_thread_count() != threads:
            portable_lib._unsafe_reset_threadpool(threads)
        method = Runtime.get().load_program(Path(path)).load_method("forward")

    def run(feeds: dict) -> np.ndarray:
        ids = torch.from_numpy(np.ascontiguousarray(feeds["input_ids"]))
        mask = torch.from_numpy(np.ascontiguousarray(feeds["attention_mask"]))
        return method.execute((ids, mask))[0].numpy()

    return run


@contextlib.contextmanager
def _quiet_stderr():
    """Silence what native code writes to file descriptor 2 (Python's own stderr is left alone)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def logits(path: Path, split, threads: int | None = None) -> np.ndarray:
    """Logits for every example of a TokenizedSplit / IdSplit, one example per call (the .pte takes batch 1)."""
    run = runner(path, threads)
    rows = []
    for ids in split.input_ids:
        ids = np.asarray([list(ids)], dtype=np.int64)
        rows.append(run({"input_ids": ids, "attention_mask": np.ones_like(ids)})[0])
    return np.stack(rows)


class Building:
    """:func:`build` running in a child process, so that the ONNX steps run beside the lowering (a minute and a half
    of one core for bert_small's student). The process starts at once and loads torch and ExecuTorch (several
    seconds) while the pipeline prepares the student; ``start(student)`` hands it over, ``result()`` waits for it and
    gives build's answer or raises its error."""

    def __init__(self, inputs: Inputs, cfg, out: Path):
        self.inputs, self.cfg, self.out = inputs, cfg, out
        self.done: dict | None = None
        self.process: multiprocessing.process.BaseProcess | None = None
        if cfg.executorch == "off" or inputs.segments:  # answered in start(), without a process
            return
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch threads inherited through fork
        self.answers, sender = context.Pipe(duplex=False)
        receiver, self.students = context.Pipe(duplex=False)
        needs = SimpleNamespace(segments=False, max_length=inputs.max_length, names=inputs.names)
        # daemon: a pipeline that fails before result() ends it on exit; end_with_parent: a pipeline killed with -9 too
        self.process = context.Process(
            target=_build_in_child, args=(receiver, sender, os.getpid(), needs, cfg, out), daemon=True
        )
        self.process.start()
        sender.close()
        receiver.close()

    def start(self, student: Student) -> None:
        """Hand the student as shipped to the build process (or answer at once where no process is needed)."""
        from .tokenizer import IdSplit  # here, not at the top: the build process imports this module without it

        if self.process is None:
            self.done = build(student, self.inputs, self.cfg, self.out)
            return
        # What build reads, and nothing else: the student, its test split as plain lists, the figures it compares with.
        sent = SimpleNamespace(
            model=student.model,
            test=IdSplit([list(ids) for ids in student.test.input_ids], student.test.labels),
            pad=student.pad,
            reference=student.reference,
            own_logits=student.own_logits,
            trim=student.trim,
        )
        with contextlib.suppress(BrokenPipeError):  # a process that already died is reported by result()
            self.students.send(sent)
        self.students.close()

    def __enter__(self) -> Building:
        # the pipeline's own steps keep to one core while the build process has the other (the int8 program's
        # lowering took 44-45 s beside one torch thread, 54 s beside two, bert_small, 2026-12-05)
        self.threads = torch.get_num_threads()
        if self.process is not None:
            torch.set_num_threads(1)
        return self

    def __exit__(self, *exception) -> None:
        self.stop()
        torch.set_num_threads(self.threads)

    def stop(self) -> None:
        """End the build process if it still runs (a step beside it failed): no process outlives the export."""
        if self.process is not None and self.process.is_alive():
            self.process.terminate()
            self.process.join()

    def result(self) -> dict:
        if self.done is not None:
            return self.done
        assert self.process is not None  # start() answered at once where there is none
        self.students.close()  # no student will come after this (start() closed it already when it sent one)
        if not self.answers.poll():  # still lowering: this core is free, the runtime the latency step runs loads now
            load_runtime()
        try:
            kind, answer = self.answers.recv()
        except EOFError:  # the process ended without answering: a native abort in the lowering or the runtime
            self.process.join()
            why = (
                f"ExecuTorch {version()} ended the process building model.pte abnormally (exit code "
                f"{self.process.exitcode})"
            )
            for leftover in self.out.glob("model*.pte*"):
                leftover.unlink(missing_ok=True)
            if self.cfg.executorch == "on":
                raise PipelineError(
                    f"export.executorch is on, but {why}; set export.executorch: auto (or off) to export without "
                    "model.pte"
                ) from None
            log.warning("[export] no model.pte: %s", why)
            return {"built": False, "why": why}
        self.process.join()
        if kind == "error":
            name, message, expected = answer
            if expected:
                raise PipelineError(message)
            raise RuntimeError(f"{name} while building model.pte: {message}")
        return answer


def _build_in_child(receiver, sender, parent: int, inputs, cfg, out: Path) -> None:
    end_with_parent(parent)
    torch.set_num_threads(1)  # one core for the lowering, the other for the ONNX steps beside it
    handler = logging.StreamHandler(sys.stderr)  # its lines in the pipeline's log, as the pipeline writes them
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.handlers[:], log.propagate = [handler], False
    log.setLevel(logging.INFO)
    try:
        unusable()  # loads ExecuTorch (when installed) while the pipeline prepares the student
        try:
            student = receiver.recv()
        except EOFError:  # the pipeline ended (a step failed) before it had a student to send
            return
        sender.send(("done", build(student, inputs, cfg, out, threads=1)))
    except Exception as exc:  # handed to the pipeline, which reports it as it reports its own
        sender.send(("error", (type(exc).__name__, str(exc), isinstance(exc, PipelineError))))
    finally:
        sender.close()


def build(student: Student, inputs: Inputs, cfg, out: Path, threads: int | None = None) -> dict:
    """model.pte (fp32) and model.int8.pte (int8 linears) from the shipped PyTorch student (export_pte):
    parity of the fp32 program with PyTorch on the whole test split, accuracy one text per call, and the int8 one kept
    only within export.max_int8_drop of the fp32 program. Where it cannot be built, the reason."""
    if cfg.executorch == "off":
        return {"built": False, "why": "export.executorch is off"}
    why = unusable()
    if why is not None:
        if cfg.executorch == "on":
            raise PipelineError(
                f"export.executorch is on, but {why}; or set export.executorch: auto to build model.pte "
                "only where ExecuTorch is installed and works"
            )
        log.log(logging.INFO if version() is None else logging.WARNING, "[export] no model.pte: %s", why)
        return {"built": False, "why": why}
    if inputs.segments:
        return {
            "built": False,
            "why": "sentence pairs: the .pte takes input_ids and attention_mask only (no token_type_ids)",
        }
    own = student.own_logits  # the shipped PyTorch student's logits, in its own vocabulary
    variants: dict[str, dict] = {}
    dropped: dict[str, dict] = {}
    for name, file, int8_linears in (("fp32", "model.pte", False), ("int8", "model.int8.pte", True)):
        try:
            info = export_pte(student.model, out / file, inputs.max_length, int8_linears)
            scores = logits(out / file, student.test, threads)
        except Exception as exc:  # torch.export, the lowering or the runtime refusing this student
            for leftover in (out / file, out / (file + ".partial")):
                leftover.unlink(missing_ok=True)
            detail = " ".join(str(exc).split())[:400].replace("|", "/")
            why = (
                f"ExecuTorch {version()} could not build or run {file} for this student ({type(exc).__name__}: "
                f"{detail})"
            )
            if cfg.executorch == "on":
                raise PipelineError(
                    f"export.executorch is on, but {why}; set export.executorch: auto (or off) to "
                    "export without model.pte"
                ) from exc
            if name == "int8" and variants:  # the fp32 program stands; the int8 one is recorded as not shipped
                dropped[name] = {"file": file, "why": why}
                log.warning("[export] no %s: %s", file, why)
                continue
            for other in variants.values():
                (out / other["file"]).unlink(missing_ok=True)
            log.warning("[export] no model.pte: %s", why)
            return {"built": False, "why": why}
        report = classification_report(student.test.labels, scores.argmax(-1), inputs.names)
        info.update(
            {
                "accuracy": report["accuracy"],
                "macro_f1": report["macro_f1"],
                "agreement_with_pytorch": float((scores.argmax(-1) == student.reference.argmax(-1)).mean()),
                "max_abs_logit_diff_vs_pytorch": float(np.abs(scores - own).max()),
            }
        )
        if name == "fp32" and info["max_abs_logit_diff_vs_pytorch"] > cfg.parity_tolerance:
            (out / file).unlink()
            why = (
                f"model.pte does not compute what the PyTorch student computes: max |logit difference| "
                f"{info['max_abs_logit_diff_vs_pytorch']:.2e} on the test split, above export.parity_tolerance={cfg.parity_tolerance}"
            )
            log.warning("[export] no model.pte: %s", why)
            return {"built": False, "why": why}
        if name == "int8":
            info["drop_points"] = 100 * (variants["fp32"]["accuracy"] - info["accuracy"])
            if info["drop_points"] > cfg.max_int8_drop:
                (out / file).unlink()
                dropped[name] = {
                    **info,
                    "why": f"dropped {info['drop_points']:.2f} points against model.pte, above "
                    f"export.max_int8_drop={cfg.max_int8_drop}: not shipped",
                }
                log.info("[export] %s %s", file, dropped[name]["why"])
                continue
        variants[name] = info
        log.info(
            "[export] %s (ExecuTorch, XNNPACK%s): accuracy %.4f one text per call, %.1f MB, max |logit diff| vs "
            "PyTorch %.1e, lowered in %.0f s",
            file,
            ", int8 linears" if int8_linears else "",
            info["accuracy"],
            info["file_mb"],
            info["max_abs_logit_diff_vs_pytorch"],
            info["export_seconds"],
        )
    return {
        "built": True,
        "executorch": version(),
        "variants": variants,
        "not_shipped": dropped,
        "tokenizer": "tokenizer.json (the app tokenizes, as for the ids-in ONNX model)",
        "embeddings": "fp32 (8-bit embedding quantization has no ExecuTorch 1.5.1 kernel); the trimmed vocabulary "
        "is what keeps the table small"
        if (student.trim or {}).get("applied")
        else "fp32 (8-bit embedding quantization has no ExecuTorch 1.5.1 kernel)",
    }
