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
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from transformers import get_scheduler

from .config import TrainSettings
from .data import global_batches, rank_slice
from .errors import PipelineError, TrainingError

log = logging.getLogger("pipeline")

LOG_EVERY = 10  # optimizer steps between MLflow metric points


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
        part = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
        accelerator.unwrap_model(module).load_state_dict(part)


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
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
    The best weights by validation accuracy end up in ``ctx.out/best.safetensors``.
    """
    dist = ctx.dist
    accelerator = dist.accelerator
    torch.manual_seed(seed + dist.rank)
    params = [p for m in modules.values() for p in m.parameters() if p.requires_grad]
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
    named = [(n, p) for m in modules.values() for n, p in m.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if not n.endswith(no_decay)], "weight_decay": settings.weight_decay},
        {"params": [p for n, p in named if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    assert sum(len(g["params"]) for g in groups) == len(params)
    optimizer = torch.optim.AdamW(groups, lr=settings.lr)
    num_examples = len(lengths)
    batches_per_epoch = math.ceil(num_examples / settings.batch_size)
    steps_per_epoch = math.ceil(batches_per_epoch / settings.grad_accum)
    total_steps = max(1, steps_per_epoch * settings.epochs)
    scheduler = get_scheduler(settings.schedule if settings.schedule != "constant" else "constant_with_warmup",
                              optimizer, num_warmup_steps=int(settings.warmup_ratio * total_steps),
                              num_training_steps=total_steps)
    names = list(modules)
    if accelerator.ddp_handler is not None:
        # Losses that never reach some parameters (attention-only distillation
        # leaves the classifier without gradient) need DDP to look for them.
        accelerator.ddp_handler.find_unused_parameters = find_unused_parameters
    prepared = accelerator.prepare(*modules.values(), optimizer)
    prepared_modules = dict(zip(names, prepared[:-1]))
    optimizer = prepared[-1]
    model = prepared_modules["model"]
    if settings.gradient_checkpointing:
        accelerator.unwrap_model(model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    checkpoints = Checkpoints(ctx.out / f"checkpoints-{tag}", settings.keep_checkpoints)
    progress = Progress()
    latest = checkpoints.latest()
    if latest is not None:
        progress = checkpoints.load(latest, dist, prepared_modules, optimizer, scheduler)
        if dist.is_main:
            log.info("[%s] resuming from checkpoint %s (epoch %d, batch %d, step %d)", tag, latest.name,
                     progress.epoch, progress.batches_done, progress.global_step)
    best_path = ctx.out / f"best-{tag}.safetensors"

    def save_checkpoint():
        return checkpoints.save(dist, prepared_modules, optimizer, scheduler, progress)

    try:
        while progress.epoch < settings.epochs:
            epoch = progress.epoch
            for m in prepared_modules.values():
                m.train()
            batches = global_batches(num_examples, settings.batch_size, seed, epoch,
                                     lengths=lengths if settings.group_by_length else None)
            bar = ctx.progress(total=len(batches), initial=progress.batches_done, desc=f"{tag} epoch {epoch + 1}/{settings.epochs}")
            window_start, window_samples = time.time(), 0
            for b in range(progress.batches_done, len(batches)):
                global_batch = batches[b]
                local = rank_slice(global_batch, dist.rank, dist.world)
                batch = make_batch(local)
                boundary = (b + 1) % settings.grad_accum == 0 or b + 1 == len(batches)
                # Per-rank mean loss re-weighted so the DDP average equals the
                # mean over the global batch even when rank slices differ in size.
                weight = len(local) * dist.world / len(global_batch)
                sync = accelerator.no_sync(model) if not boundary and dist.world > 1 else contextlib.nullcontext()
                with sync, accelerator.autocast():
                    loss, terms = loss_fn(batch, prepared_modules)
                    scaled = loss * weight / settings.grad_accum
                _check_finite(loss, terms, progress.global_step + 1, dist, tag)
                with sync:
                    accelerator.backward(scaled)
                window_samples += len(global_batch)
                if boundary:
                    if settings.grad_clip:
                        accelerator.clip_grad_norm_(params, settings.grad_clip)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                    progress.global_step += 1
                progress.batches_done = b + 1
                bar.update(1)
                if boundary and dist.is_main:
                    elapsed = max(time.time() - window_start, 1e-9)
                    bar.set_postfix(loss=f"{loss.item():.4f}", samples_s=f"{window_samples / elapsed:.0f}")
                    if progress.global_step % LOG_EVERY == 0:
                        metrics = {f"train/{k}": float(v) for k, v in terms.items()}
                        metrics.update({"train/loss": loss.item(), "train/lr": scheduler.get_last_lr()[0],
                                        "train/samples_per_s": window_samples / elapsed})
                        ctx.tracker.log_metrics(metrics, step=progress.global_step)
                        window_start, window_samples = time.time(), 0
                if boundary and progress.global_step % settings.checkpoint_every == 0 and b + 1 < len(batches):
                    save_checkpoint()
            bar.close()
            # End of epoch: validate, keep the best weights, checkpoint.
            for m in prepared_modules.values():
                m.eval()
            metrics = validate(prepared_modules)
            record = {"epoch": epoch + 1, **{f"val_{k}": v for k, v in metrics.items()}}
            progress.history.append(record)
            if dist.is_main:
                ctx.tracker.log_metrics({f"val/{k}": v for k, v in metrics.items()}, step=progress.global_step)
                log.info("[%s] epoch %d/%d: %s", tag, epoch + 1, settings.epochs,
                         ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
                if metrics["accuracy"] > progress.best_metric:
                    tmp = best_path.with_suffix(".tmp")
                    save_file(_trainable_state(prepared_modules, accelerator), tmp)
                    os.replace(tmp, best_path)
            if metrics["accuracy"] > progress.best_metric:
                progress.best_metric, progress.best_epoch = metrics["accuracy"], epoch + 1
            progress.epoch, progress.batches_done = epoch + 1, 0
            save_checkpoint()
    except KeyboardInterrupt:
        # Ctrl-C: keep what was done. The position saved is the last completed
        # optimizer step; a partly accumulated step is simply redone on resume.
        if progress.batches_done % settings.grad_accum == 0:
            save_checkpoint()
        raise Interrupted(
            f"Interrupted during {tag} at epoch {progress.epoch + 1}, step {progress.global_step}; a checkpoint "
            f"is in {checkpoints.root}. Rerun the same command to resume from it."
        ) from None
    if settings.epochs == 0 and dist.is_main:  # nothing trained: the initial weights are "best"
        save_file(_trainable_state(prepared_modules, accelerator), best_path)
    dist.barrier()
    # Load the best epoch's weights back into the (unwrapped) modules.
    _load_trainable_state(prepared_modules, load_file(best_path), accelerator)
    return progress


def _check_finite(loss, terms, step, dist, tag):
    finite = torch.isfinite(loss.detach()).float()
    if dist.world > 1:
        finite = dist.accelerator.reduce(finite.to(dist.device), reduction="min")
    if finite.item() < 1:
        bad = [k for k, v in terms.items() if not math.isfinite(float(v))] or ["total"]
        raise TrainingError(
            f"{tag}: the loss became non-finite at optimizer step {step} (term(s): {', '.join(bad)}; "
            f"values: {', '.join(f'{k}={float(v):.4g}' for k, v in terms.items())}). The last good checkpoint is kept. "
            "Lower the learning rate, use precision: fp32 or bf16 instead of fp16, or check the data."
        )
