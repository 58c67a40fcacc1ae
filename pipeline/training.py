"""The training loop shared by teacher fine-tuning and distillation.

Accelerate does the distribution (DDP), mixed precision and loss scaling; this
file does what Accelerate does not do exactly:

* data order is a pure function of (seed, epoch) and each rank takes a strided
  slice of every GLOBAL batch, so 1 and N processes see the same global batches
  and a resumed run sees the same remaining batches (Accelerate's own resume
  changes the order mid-epoch after epoch 0: accelerate issue 2016);
* checkpoints (every N optimizer steps, at each epoch end, and on Ctrl-C) hold
  model, optimizer, scheduler, scaler, the torch RNG of every rank and the
  position; written to a temp folder and renamed, so a half-written checkpoint
  is never loaded; loaded with safetensors / torch.load(weights_only=True);
* a non-finite loss stops the run naming the step and the loss term.

No step waits for the device: the loss is not read back per step (``.item()``
would make the host wait for the GPU, which then idles while the next batch is
built). ``FiniteWatch`` keeps the first non-finite step on the device; it is
read every LOG_EVERY steps with the logged metrics, before every checkpoint and
before validation, so a run stops at most LOG_EVERY steps after the bad one
and never saves weights trained through it. (fp16's GradScaler still reads
its overflow flag per step; bf16 and fp32 do not.)

Layout (torchtune's recipe, nanoGPT's configure_optimizers): ``fit`` is
``setup`` (``build_trainer``: ``configure_optimizer``, ``configure_scheduler``,
Accelerate's prepare; then resume) + ``train`` (epochs of ``_train_epoch``, each
batch one ``train_step``; ``_end_epoch`` validates and keeps the best weights)
+ loading the best weights back. ``train_step`` is public: bench/micro.py
times exactly it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file
from transformers import get_scheduler

from .config import TrainSettings
from .data import global_batches, rank_slice
from .errors import PipelineError, TrainingError
from .inference import model_inputs
from .integrity import RESUME_STATE_PREFIX

log = logging.getLogger("pipeline")

LOG_EVERY = 10  # optimizer steps between MLflow metric points (and finiteness reads)
NO_DECAY = ("bias", "LayerNorm.weight", "layer_norm.weight")  # parameter names trained without weight decay


@dataclass
class Progress:
    epoch: int = 0
    batches_done: int = 0  # global batches of `epoch` already trained on
    global_step: int = 0  # optimizer steps so far
    best_metric: float = -math.inf
    best_epoch: int = -1
    history: list = field(default_factory=list)


class Interrupted(PipelineError):
    exit_code = 130


def _trainable_state(modules: dict[str, torch.nn.Module], accelerator) -> dict[str, torch.Tensor]:
    state = {}
    for prefix, module in modules.items():
        for key, value in accelerator.unwrap_model(module).state_dict().items():
            state[f"{prefix}.{key}"] = value.detach().contiguous().cpu()
    return state


def _load_trainable_state(modules: dict[str, torch.nn.Module], state: dict, accelerator) -> None:
    for prefix, module in modules.items():
        part = {k[len(prefix) + 1 :]: v for k, v in state.items() if k.startswith(prefix + ".")}
        accelerator.unwrap_model(module).load_state_dict(part)


def _rng_state() -> dict:
    state: dict[str, torch.Tensor | list[torch.Tensor]] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpoints:
    """Numbered checkpoint folders under ``root``; only complete ones are visible."""

    def __init__(self, root: Path, keep: int):
        self.root = Path(root)
        self.keep = keep

    def latest(self) -> Path | None:
        done = sorted(p for p in self.root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
        return done[-1] if done else None

    def save(self, dist, modules, optimizer, scheduler, progress: Progress) -> Path:
        accelerator = dist.accelerator
        name = f"step-{progress.global_step:08d}-e{progress.epoch}b{progress.batches_done}"
        final = self.root / name
        tmp = self.root / (name + ".tmp")
        if final.is_dir():  # this position is already saved (Ctrl-C right after a checkpoint or a resume)
            return final
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        torch.save(_rng_state(), tmp / f"rng-rank{dist.rank}.pt")
        if dist.is_main:
            save_file(_trainable_state(modules, accelerator), tmp / "model.safetensors")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            if accelerator.scaler is not None:
                torch.save(accelerator.scaler.state_dict(), tmp / "scaler.pt")
            (tmp / "progress.json").write_text(json.dumps(asdict(progress)))
        dist.barrier()
        if dist.is_main:
            for f in tmp.iterdir():  # make the bytes durable before the rename publishes them
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            os.replace(tmp, final)
            for old in sorted(p for p in self.root.glob("step-*") if not p.name.endswith(".tmp"))[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return final

    def load(self, path: Path, dist, modules, optimizer, scheduler) -> Progress:
        accelerator = dist.accelerator
        _load_trainable_state(modules, load_file(path / "model.safetensors"), accelerator)
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
        if accelerator.scaler is not None and (path / "scaler.pt").exists():
            accelerator.scaler.load_state_dict(torch.load(path / "scaler.pt", weights_only=True))
        rng_file = path / f"rng-rank{dist.rank}.pt"
        if rng_file.exists():
            _set_rng_state(torch.load(rng_file, weights_only=True))
        return Progress(**json.loads((path / "progress.json").read_text()))


class FiniteWatch:
    """The first step whose loss was not finite, and the loss terms there, kept on the device (no sync per step)."""

    NONE = 2**62  # "no bad step yet": larger than any step

    def __init__(self):
        self.first_bad = None  # device int64 scalar once a step was seen
        self.terms = {}  # name -> device scalar: its value at first_bad, or the latest while all steps were finite

    def see(self, loss: torch.Tensor, terms: dict, step: int) -> None:
        loss = loss.detach()
        if self.first_bad is None:
            self.first_bad = torch.full((), self.NONE, dtype=torch.int64, device=loss.device)
        fresh = (self.first_bad == self.NONE) & ~torch.isfinite(loss)
        self.first_bad = torch.where(fresh, torch.full_like(self.first_bad, step), self.first_bad)
        update = fresh | (self.first_bad == self.NONE)  # after a bad step the terms stay as they were there
        for name, value in terms.items():  # a batch may lack a term (no relation rows): that one keeps its value
            value = torch.as_tensor(value, device=loss.device).detach().float().reshape(())
            self.terms[name] = torch.where(update, value, self.terms.get(name, value))

    def check(self, dist, tag: str) -> None:
        """Reads the flag (every rank calls this at the same points): raises if any rank saw a non-finite loss."""
        if self.first_bad is None:
            return
        first = self.first_bad
        if dist.world > 1:
            # The earliest bad step of any rank; Accelerate's reduce knows sum and max only: min(x) = -max(-x).
            first = -dist.accelerator.reduce(-first.to(dist.device), reduction="max")
        step = int(first.item())
        if step == self.NONE:
            return
        values = dict(zip(self.terms, torch.stack(list(self.terms.values())).tolist())) if self.terms else {}
        bad = [k for k, v in values.items() if not math.isfinite(v)] or ["total"]
        raise TrainingError(
            f"{tag}: the loss became non-finite at optimizer step {step} (term(s): {', '.join(bad)}; "
            f"values: {', '.join(f'{k}={v:.4g}' for k, v in values.items())}). The last good checkpoint is kept. "
            "Lower the learning rate, use precision: fp32 or bf16 instead of fp16, or check the data."
        )


@dataclass
class Trainer:
    """A training job once set up: the prepared modules, optimizer and schedule, and what a step needs.

    ``modules`` are the PREPARED modules (DDP-wrapped when several processes
    run); ``params`` the trainable parameters (clipped together).
    """

    dist: Any
    modules: dict[str, torch.nn.Module]
    optimizer: Any
    scheduler: Any
    params: list[torch.nn.Parameter]
    settings: TrainSettings
    tag: str
    watch: FiniteWatch = field(default_factory=FiniteWatch)

    @property
    def model(self) -> torch.nn.Module:
        return self.modules["model"]


def cross_entropy_loss(batch: dict, prepared: dict):
    """The teacher's fine-tuning loss, as fit's ``loss_fn``: cross-entropy of the model's logits (in fp32)."""
    logits = prepared["model"](**model_inputs(batch)).logits
    loss = torch.nn.functional.cross_entropy(logits.float(), batch["labels"])
    return loss, {"ce": loss.detach()}


def configure_optimizer(modules: dict[str, torch.nn.Module], settings: TrainSettings):
    """AdamW over every trainable parameter, without weight decay on biases and LayerNorm weights; the fused
    kernel where settings.fused_adamw and the device allow (bench/results/roofline_bert_small.md).

    Returns (optimizer, trainable parameters).
    """
    params = [p for m in modules.values() for p in m.parameters() if p.requires_grad]
    named = [(n, p) for m in modules.values() for n, p in m.named_parameters() if p.requires_grad]
    own_lr = settings.parameter_lrs()
    groups: list[dict[str, Any]] = [
        {"params": [p for n, p in named if fragment in n], "weight_decay": settings.weight_decay, "lr": lr}
        for fragment, lr in own_lr.items()
    ]
    named = [(n, p) for n, p in named if not any(fragment in n for fragment in own_lr)]
    groups += [
        {"params": [p for n, p in named if not n.endswith(NO_DECAY)], "weight_decay": settings.weight_decay},
        {"params": [p for n, p in named if n.endswith(NO_DECAY)], "weight_decay": 0.0},
    ]
    assert sum(len(g["params"]) for g in groups) == len(params)
    return torch.optim.AdamW(
        groups, lr=settings.lr, fused=settings.fused_adamw and fused_adamw_supported(params)
    ), params


def fused_adamw_supported(params) -> bool:
    """torch's fused AdamW takes floating-point parameters on CPU and CUDA (others fall back to the multi-tensor one)."""
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def configure_scheduler(optimizer, settings: TrainSettings, num_examples: int):
    """Warm-up then settings.schedule over every optimizer step of every epoch."""
    batches_per_epoch = math.ceil(num_examples / settings.batch_size)
    steps_per_epoch = math.ceil(batches_per_epoch / settings.grad_accum)
    total_steps = max(1, steps_per_epoch * settings.epochs)
    return get_scheduler(
        settings.schedule if settings.schedule != "constant" else "constant_with_warmup",
        optimizer,
        num_warmup_steps=int(settings.warmup_ratio * total_steps),
        num_training_steps=total_steps,
    )


def build_trainer(
    dist,
    modules: dict[str, torch.nn.Module],
    settings: TrainSettings,
    num_examples: int,
    tag: str,
    find_unused_parameters: bool = False,
) -> Trainer:
    """Optimizer and schedule for ``modules``, then Accelerate's prepare (device, DDP, mixed precision).

    ``dist``: the runner's Distributed (``ctx.dist``) or anything with its accelerator, rank, world and device.
    """
    accelerator = dist.accelerator
    optimizer, params = configure_optimizer(modules, settings)
    scheduler = configure_scheduler(optimizer, settings, num_examples)
    if accelerator.ddp_handler is not None:
        # Losses that never reach some parameters (attention-only distillation
        # leaves the classifier without gradient) need DDP to look for them.
        accelerator.ddp_handler.find_unused_parameters = find_unused_parameters
    prepared = accelerator.prepare(*modules.values(), optimizer)
    trainer = Trainer(dist, dict(zip(modules, prepared[:-1])), prepared[-1], scheduler, params, settings, tag)
    if settings.gradient_checkpointing:
        accelerator.unwrap_model(trainer.model).gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    return trainer


def train_step(
    trainer: Trainer, batch: dict, loss_fn: Callable, *, step: int, boundary: bool = True, weight: float = 1.0
):
    """One batch of one optimizer step: forward under autocast, finiteness noted (read later, see FiniteWatch), backward, and at
    ``boundary`` (the last batch of the step's gradient accumulation) clipping, optimizer and schedule
    step, zero_grad. Returns (loss, {term: value}) as ``loss_fn(batch, trainer.modules)`` gave them.

    ``weight`` re-weights this rank's mean loss (see ``_train_epoch``); the loss is divided by
    settings.grad_accum. ``step`` is the optimizer step the batch belongs to (named if the loss is
    not finite). Off a boundary with several processes, DDP does not synchronise the gradients.
    """
    dist, accelerator, settings = trainer.dist, trainer.dist.accelerator, trainer.settings
    sync = accelerator.no_sync(trainer.model) if not boundary and dist.world > 1 else contextlib.nullcontext()
    with sync:
        with accelerator.autocast():
            loss, terms = loss_fn(batch, trainer.modules)
            scaled = loss * weight / settings.grad_accum
        trainer.watch.see(loss, terms, step)
        accelerator.backward(scaled)
    if boundary:
        if settings.grad_clip:
            accelerator.clip_grad_norm_(trainer.params, settings.grad_clip)
        trainer.optimizer.step()
        trainer.scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
    return loss, terms


def setup(
    ctx,
    modules: dict[str, torch.nn.Module],
    settings: TrainSettings,
    num_examples: int,
    seed: int,
    tag: str,
    find_unused_parameters: bool = False,
) -> tuple[Trainer, Checkpoints, Progress]:
    """Seed, build the trainer, and resume from the latest complete checkpoint of ``tag`` if there is one."""
    dist = ctx.dist
    torch.manual_seed(seed + dist.rank)
    trainer = build_trainer(dist, modules, settings, num_examples, tag, find_unused_parameters)
    checkpoints = Checkpoints(checkpoints_folder(ctx.out, tag), settings.keep_checkpoints)
    progress = Progress()
    latest = checkpoints.latest()
    if latest is not None:
        progress = checkpoints.load(latest, dist, trainer.modules, trainer.optimizer, trainer.scheduler)
        if dist.is_main:
            log.info(
                "[%s] resuming from checkpoint %s (epoch %d, batch %d, step %d)",
                tag,
                latest.name,
                progress.epoch,
                progress.batches_done,
                progress.global_step,
            )
    return trainer, checkpoints, progress


def fit(
    ctx,
    *,
    modules: dict[str, torch.nn.Module],
    lengths,
    make_batch: Callable,
    loss_fn: Callable,
    validate: Callable,
    settings: TrainSettings,
    seed: int,
    tag: str,
    find_unused_parameters: bool = False,
) -> Progress:
    """Train ``modules['model']`` (plus any extra trainable modules) and keep the best epoch.

    ``lengths`` holds the token count of every training example (batches group
    similar lengths when ``settings.group_by_length`` is on).
    ``make_batch(indices)`` builds a batch dict for example indices;
    ``loss_fn(batch, modules)`` returns (loss, {term: value}) and
    ``validate(modules)`` returns {"accuracy": ...} on the validation split
    (called on every rank); both get the PREPARED modules (DDP-wrapped when
    several processes run, so gradients are synchronised).
    The best weights by validation accuracy end up in ``ctx.out/best-<tag>.safetensors``.
    """
    trainer, checkpoints, progress = setup(ctx, modules, settings, len(lengths), seed, tag, find_unused_parameters)
    best_path = best_weights_path(ctx.out, tag)
    train(
        ctx,
        trainer,
        checkpoints,
        progress,
        lengths=lengths,
        make_batch=make_batch,
        loss_fn=loss_fn,
        validate=validate,
        seed=seed,
        best_path=best_path,
    )
    accelerator = ctx.dist.accelerator
    if settings.epochs == 0 and ctx.dist.is_main:  # nothing trained: the initial weights are "best"
        save_file(_trainable_state(trainer.modules, accelerator), best_path)
    ctx.dist.barrier()
    # Load the best epoch's weights back into the (unwrapped) modules.
    _load_trainable_state(trainer.modules, load_file(best_path), accelerator)
    # Accelerate keeps a reference to everything it prepared: without this a second training in the process (a
    # teacher ensemble's next member, distill after the teacher) would keep this one's optimizer state alive.
    accelerator.free_memory()
    return progress


def checkpoints_folder(out: Path, tag: str) -> Path:
    return out / f"{RESUME_STATE_PREFIX}{tag}"  # the runner deletes these when the stage completes


def best_weights_path(out: Path, tag: str) -> Path:
    return out / f"best-{tag}.safetensors"


def discard_training_files(out: Path, tag: str) -> None:
    """Delete ``fit``'s checkpoints and best weights for ``tag`` from ``out``, once the model they made is saved
    elsewhere (a teacher ensemble's member: about 2.9 GB for a base-size one)."""
    shutil.rmtree(checkpoints_folder(out, tag), ignore_errors=True)
    best_weights_path(out, tag).unlink(missing_ok=True)


def train(
    ctx,
    trainer: Trainer,
    checkpoints: Checkpoints,
    progress: Progress,
    *,
    lengths,
    make_batch: Callable,
    loss_fn: Callable,
    validate: Callable,
    seed: int,
    best_path: Path,
) -> None:
    """The epochs from ``progress`` on: train, validate, keep the best weights, checkpoint; Ctrl-C saves and stops."""
    settings = trainer.settings
    try:
        while progress.epoch < settings.epochs:
            batches = global_batches(
                len(lengths),
                settings.batch_size,
                seed,
                progress.epoch,
                lengths=lengths if settings.group_by_length else None,
            )
            _train_epoch(ctx, trainer, checkpoints, progress, batches, make_batch, loss_fn)
            _end_epoch(ctx, trainer, progress, validate, best_path)
            _save(checkpoints, trainer, progress)
    except KeyboardInterrupt:
        # Ctrl-C: keep what was done. The position saved is the last completed
        # optimizer step; a partly accumulated step is simply redone on resume.
        if progress.batches_done % settings.grad_accum == 0:
            _save(checkpoints, trainer, progress)  # reads the finiteness first: raises instead of saving bad weights
        raise Interrupted(
            f"Interrupted during {trainer.tag} at epoch {progress.epoch + 1}, step {progress.global_step}; a checkpoint "
            f"is in {checkpoints.root}. Rerun the same command to resume from it."
        ) from None


def _save(checkpoints: Checkpoints, trainer: Trainer, progress: Progress) -> Path:
    trainer.watch.check(trainer.dist, trainer.tag)
    return checkpoints.save(trainer.dist, trainer.modules, trainer.optimizer, trainer.scheduler, progress)


def _train_epoch(
    ctx,
    trainer: Trainer,
    checkpoints: Checkpoints,
    progress: Progress,
    batches: list,
    make_batch: Callable,
    loss_fn: Callable,
) -> None:
    """The remaining batches of ``progress.epoch``: each rank takes its slice of every global batch."""
    dist, settings = trainer.dist, trainer.settings
    for m in trainer.modules.values():
        m.train()
    bar = ctx.progress(
        total=len(batches),
        initial=progress.batches_done,
        desc=f"{trainer.tag} epoch {progress.epoch + 1}/{settings.epochs}",
    )
    window = _Window()
    for b in range(progress.batches_done, len(batches)):
        global_batch = batches[b]
        local = rank_slice(global_batch, dist.rank, dist.world)
        boundary = (b + 1) % settings.grad_accum == 0 or b + 1 == len(batches)
        # Per-rank mean loss re-weighted so the DDP average equals the
        # mean over the global batch even when rank slices differ in size.
        weight = len(local) * dist.world / len(global_batch)
        loss, terms = train_step(
            trainer, make_batch(local), loss_fn, step=progress.global_step + 1, boundary=boundary, weight=weight
        )
        window.samples += len(global_batch)
        if boundary:
            progress.global_step += 1
        progress.batches_done = b + 1
        bar.update(1)
        if boundary and progress.global_step % LOG_EVERY == 0:
            trainer.watch.check(dist, trainer.tag)  # every rank
            if dist.is_main:
                _report_step(ctx, trainer, progress, bar, window, loss, terms)
        if boundary and progress.global_step % settings.checkpoint_every == 0 and b + 1 < len(batches):
            _save(checkpoints, trainer, progress)
    bar.close()


@dataclass
class _Window:
    """Throughput since the last logged metric point."""

    start: float = field(default_factory=time.time)
    samples: int = 0


def _report_step(ctx, trainer: Trainer, progress: Progress, bar, window: _Window, loss, terms) -> None:
    """Main rank, every LOG_EVERY optimizer steps: the bar's loss and samples/s, and the tracked metrics
    (one read from the device for all of them)."""
    values = torch.stack(
        [loss.detach().float().reshape(())]
        + [torch.as_tensor(v).detach().float().reshape(()).to(loss.device) for v in terms.values()]
    ).tolist()
    elapsed = max(time.time() - window.start, 1e-9)
    # refresh=False: the next update draws it, so a bar logged once a minute (no terminal) stays once a minute
    bar.set_postfix(loss=f"{values[0]:.4f}", samples_s=f"{window.samples / elapsed:.0f}", refresh=False)
    metrics = {f"train/{k}": v for k, v in zip(terms, values[1:])}
    metrics.update(
        {
            "train/loss": values[0],
            "train/lr": trainer.scheduler.get_last_lr()[0],
            "train/samples_per_s": window.samples / elapsed,
        }
    )
    ctx.tracker.log_metrics(metrics, step=progress.global_step)
    window.start, window.samples = time.time(), 0


def _end_epoch(ctx, trainer: Trainer, progress: Progress, validate: Callable, best_path: Path) -> None:
    """Validate, keep the best weights (main rank writes them), and move ``progress`` to the next epoch."""
    dist, epoch = trainer.dist, progress.epoch
    trainer.watch.check(dist, trainer.tag)  # never validate or keep weights trained through a non-finite loss
    for m in trainer.modules.values():
        m.eval()
    metrics = validate(trainer.modules)
    progress.history.append({"epoch": epoch + 1, **{f"val_{k}": v for k, v in metrics.items()}})
    if dist.is_main:
        ctx.tracker.log_metrics({f"val/{k}": v for k, v in metrics.items()}, step=progress.global_step)
        log.info(
            "[%s] epoch %d/%d: %s",
            trainer.tag,
            epoch + 1,
            trainer.settings.epochs,
            ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()),
        )
        if metrics["accuracy"] > progress.best_metric:
            tmp = best_path.with_suffix(".tmp")
            save_file(_trainable_state(trainer.modules, dist.accelerator), tmp)
            os.replace(tmp, best_path)
    if metrics["accuracy"] > progress.best_metric:
        progress.best_metric, progress.best_epoch = metrics["accuracy"], epoch + 1
    progress.epoch, progress.batches_done = epoch + 1, 0
