"""The runner: stages in order, fingerprints, skip/rerun, atomic outputs, a lock.

A stage module in ``stages/`` declares:

    READS = ["data", "seed", ...]   # every dotted config key it reads (tests/test_stage_reads.py checks)
    AFTER = ["prepare", ...]        # stages whose outputs it reads
    VERSION = 1                     # bump when the stage's code changes its output
    def run(ctx: StageContext) -> dict   # the stage's summary figures
    def fingerprint_inputs(config) -> dict   # optional: the part of READS that changes the output
                                             # (capture: students of another depth reuse the cache)
    FILE_READS = [...]              # optional: the READS keys whose local files it reads (default: all READS)
    UNAFFECTED_BY = {key: value}    # optional: keys an earlier stage reads that never change this stage's output;
                                    # its AFTER fingerprints are taken as if each held that value, and the files
                                    # those stages write only for such a key (their OUTPUTS_FOR) are left out of
                                    # the upstream identity (the teacher and peers never read
                                    # data.unlabeled_text's rows, so they are shared)
    OUTPUTS_FOR = {key: (prefix, ...)}  # optional: output files this stage writes only because of a key

Its fingerprint hashes its version, the values of READS (or fingerprint_inputs),
the contents of the local files behind them and the fingerprints of AFTER; a stage whose completed output carries the same fingerprint is
skipped. A stage writes into ``runs/<config>/<stage>.partial/`` (which also
holds its resumable checkpoints) and the folder is renamed to
``runs/<config>/<stage>/`` only when the stage has finished, so an interrupted
stage never looks done.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import functools
import hashlib
import importlib
import json
import logging
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, cast

from .config import PipelineConfig, to_yaml
from .errors import ConfigError, LockedError, PipelineError, disk_full_error
from .integrity import (
    MANIFEST,
    DigestCache,
    damaged_outputs,
    discard_resume_state,
    output_identity,
    output_listing,
    path_digest,
)
from .redaction import redact_uri
from .stage_api import Stage
from .tracking import Tracker, config_hash, run_status

log = logging.getLogger("pipeline")

STAGES = ["prepare", "teacher", "peers", "capture", "distill", "evaluate", "export"]


def replace_folder(finished: Path, target: Path) -> None:
    """Swap a finished folder into place: the old one out of the way first, then one rename.

    A crash in between leaves no "done" stage with stale content (the manifest
    check fails and the stage reruns).
    """
    if target.exists() or target.is_symlink():
        trash = target.with_name(f".{target.name}.old")
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(target, trash)
        os.replace(finished, target)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(finished, target)


def stage_module(name: str) -> Stage:
    return cast(Stage, importlib.import_module(f"stages.{name}"))


def local_inputs(config: PipelineConfig, reads: list[str]) -> dict[str, Path]:
    """The local files and folders behind the config keys a stage reads: their contents are inputs too.

    A hub name has no local files (its revision is not known offline); a reference that does not
    resolve is left to the stage, which fails with its own clear error.
    """
    from .data import data_file, rotten_tomatoes_path
    from .models import resolve_reference

    def data_path(key="path"):
        if config.data.source == "rotten_tomatoes":
            return rotten_tomatoes_path() if key == "path" else None
        if config.data.source == "hub":
            return None
        reference = getattr(config.data, key)
        return data_file(reference) if reference else None

    def model_folder(reference, tokenizer_only=False):
        if not reference or reference == "random":
            return None
        resolved = Path(resolve_reference(reference, tokenizer_only))
        return resolved if resolved.exists() else None

    student = config.student
    candidates: dict[str, Callable[[], Path | None]] = {
        "data.path": data_path,
        **{f"data.{split}": functools.partial(data_path, split) for split in ("train", "validation", "test")},
        "teacher.model": lambda: model_folder(config.teacher.model),
        "teacher.tokenizer": lambda: model_folder(config.teacher.tokenizer, tokenizer_only=True),
        "student.pretrained": lambda: model_folder(student.pretrained) if student.init == "pretrained" else None,
        "export.word_list": lambda: (
            data_file(config.export.word_list, "export.word_list") if config.export.word_list else None
        ),
        "export.word_corpus": lambda: (
            data_file(config.export.word_corpus.path, "export.word_corpus.path") if config.export.word_corpus else None
        ),
        "data.unlabeled_source": lambda: (
            data_file(config.data.unlabeled_source.path, "data.unlabeled_source.path")
            if config.data.unlabeled_source
            else None
        ),
    }
    found = {}
    for key, locate in candidates.items():
        if not any(key == r or key.startswith(r + ".") for r in reads):
            continue
        try:
            path = locate()
        except PipelineError:
            continue
        if path is not None and Path(path).exists():
            found[key] = Path(path)
    return found


# Keys added after runs were made with the sections that hold them, with the value that means "not used": left out
# of fingerprints while they hold it, so a finished run stays current; set, they change the fingerprint like any
# other key.
ADDED_KEYS = {
    "student.attention_heads": None,
    "student.static.bigram_buckets": 0,
    "student.static.pooling": "mean",
    "student.static.hidden": 0,
    "distill.class_weight": "none",
    "data.split_lines": False,
    "export.word_list": None,
    "teacher.ensemble": 1,
    "data.unlabeled_source": None,
    "export.trim_unlabeled_min_count": 1,
    "distill.loss.penultimate": 0.0,
    "student.token_pairs": 0,
    "distill.token_pairs_lr": None,
    "export.word_corpus": None,
}


def _reads(config: PipelineConfig, keys: list[str]) -> dict:
    return _without_unused_added_keys({key: config.section(key) for key in keys})


def _without_unused_added_keys(reads: dict) -> dict:
    """``reads`` ({dotted key: its section or value}) without the ADDED_KEYS that hold their "not used" value (also
    applied to a stage's own fingerprint_inputs, such as prepare's)."""
    for added, unused in ADDED_KEYS.items():
        if added in reads and reads[added] == unused:  # read as a key of its own (peers reads distill.class_weight)
            del reads[added]
        for key in list(reads):
            if added.startswith(key + ".") and isinstance(reads[key], dict):
                holder = reads[key]
                *parents, last = added[len(key) + 1 :].split(".")
                for part in parents:
                    holder = holder[part]
                if last in holder and holder[last] == unused:
                    del holder[last]
    return reads


def _holds(reads: dict, key: str) -> bool:
    """Whether a fingerprint's ``reads`` hold the dotted ``key``: as a key of its own or inside a section it reads."""
    for read, value in reads.items():
        if key == read:
            return True
        if key.startswith(read + "."):
            for part in key[len(read) + 1 :].split("."):
                if not isinstance(value, dict) or part not in value:
                    return False
                value = value[part]
            return True
    return False


def fingerprint(config: PipelineConfig, name: str, upstream: dict[str, str], cache: DigestCache | None = None) -> str:
    module = stage_module(name)
    reads = (
        _without_unused_added_keys(module.fingerprint_inputs(config))
        if hasattr(module, "fingerprint_inputs")
        else _reads(config, module.READS)
    )
    payload = {
        "stage": name,
        "version": module.VERSION,
        "reads": reads,
        "after": {dep: upstream[dep] for dep in module.AFTER},
    }
    # a file counts where its setting does: a key a stage's fingerprint_inputs leaves out (the export's word-model
    # files for a transformer student) brings no file digest either
    files = {
        key: path
        for key, path in local_inputs(config, getattr(module, "FILE_READS", module.READS)).items()
        if _holds(reads, key)
    }
    if files:
        cache = cache or DigestCache()
        payload["files"] = {key: path_digest(path, cache) for key, path in files.items()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fingerprints(config: PipelineConfig, runs_dir: Path | None = None, save: bool = True) -> dict[str, str]:
    """Every stage's fingerprint; with ``runs_dir``, input digests are remembered there between runs
    (``save=False``: read that memory, never write it; the other ranks of a distributed run)."""
    cache = DigestCache(Path(runs_dir) / ".digests.json" if runs_dir and Path(runs_dir).is_dir() else None)
    result = _fingerprints(config, cache)
    if save:
        cache.save()
    return result


def _fingerprints(config: PipelineConfig, cache: DigestCache) -> dict[str, str]:
    result: dict[str, str] = {}
    plain_results: dict[str, dict[str, str]] = {}  # per config its UNAFFECTED_BY stages' upstream is taken from
    for name in STAGES:
        plain = _as_unaffected(config, name)
        if plain is config:
            upstream = result
        else:  # teacher and peers share one (data.unlabeled_text off): computed once
            key = to_yaml(plain)
            if key not in plain_results:
                plain_results[key] = _fingerprints(plain, cache)
            upstream = plain_results[key]
        result[name] = fingerprint(config, name, upstream, cache)
    return result


def read_identity(reader: str, stage: str, manifest: dict) -> str:
    """The identity of ``stage``'s output as stage ``reader`` reads it: without the files ``stage`` writes only for a
    key ``reader`` is UNAFFECTED_BY (recorded when ``reader`` completes, compared before it is reused or skipped)."""
    outputs_for = getattr(stage_module(stage), "OUTPUTS_FOR", {})
    ignored = tuple(p for key in getattr(stage_module(reader), "UNAFFECTED_BY", {}) for p in outputs_for.get(key, ()))
    return output_identity(manifest, ignored)


def _as_unaffected(config: PipelineConfig, name: str) -> PipelineConfig:
    """``config`` with the keys stage ``name`` is UNAFFECTED_BY set to the value it is taken at (``config`` itself when
    they hold it already): the config its earlier stages' fingerprints are taken from."""
    changed = {
        key: value
        for key, value in getattr(stage_module(name), "UNAFFECTED_BY", {}).items()
        if config.section(key) != value
    }
    if not changed:
        return config
    raw = config.model_dump()
    for key, value in changed.items():
        *parents, last = key.split(".")
        holder = raw
        for part in parents:
            holder = holder[part]
        holder[last] = value
    return type(config).model_validate(raw)


def fingerprint_as_run(config: PipelineConfig, name: str, run_dir: Path, current: dict[str, str]) -> str:
    """``name``'s fingerprint from the outputs it will read now. Where an earlier stage's output is stale (``--only``
    runs one stage and leaves the others as they are), that output's own fingerprint stands in for the current one:
    the stage is then recorded as stale too, never as current on old inputs."""
    upstream = dict(current)
    stale = []
    for dep in stage_module(name).AFTER:
        manifest = read_manifest(run_dir / dep)
        if manifest is not None and manifest["fingerprint"] != current[dep]:
            upstream[dep] = manifest["fingerprint"]
            stale.append(dep)
    if not stale:
        return current[name]
    log.warning(
        "[%s] reads the stale output of %s (--only leaves it as it is): its output is recorded as stale too; run "
        "without --only to bring both up to date",
        name,
        ", ".join(stale),
    )
    memory = run_dir.parent / ".digests.json"
    return fingerprint(config, name, upstream, DigestCache(memory if memory.is_file() else None))


def dependents(name: str) -> list[str]:
    """Stages that read ``name``'s output, directly or through others."""
    found: list[str] = []
    for later in STAGES[STAGES.index(name) + 1 :]:
        if set(stage_module(later).AFTER) & {name, *found}:
            found.append(later)
    return found


def read_manifest(folder: Path) -> dict | None:
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return None
    return manifest if isinstance(manifest, dict) and "fingerprint" in manifest else None


def write_json(path: Path, data) -> None:
    """Write JSON atomically (temp file + rename)."""
    path = Path(path)
    # ranks may write the same file, from several machines on a shared folder, where pids alone can collide
    tmp = path.with_name(f"{path.name}.{socket.gethostname()}-{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


SHOW_BARS = sys.stderr.isatty()  # progress bars in terminals, not in CI logs
# Elsewhere (nohup, CI, a pipe) the same bar is written as a log line at most once a minute: a 50-minute teacher
# fine-tune on two cores must not look like a hang.
PROGRESS_LOG_INTERVAL_S = 60.0


class _ProgressLines:
    """A file for tqdm that turns each refresh of a bar into one log line."""

    def write(self, text: str) -> None:
        if line := text.strip("\r\n "):
            log.info("%s", line)

    def flush(self) -> None:
        pass


# How long a rank other than 0 keeps looking for an earlier stage's output that rank 0 has completed (NFS clients
# cache directory attributes: acdirmin/acdirmax in nfs(5)).
SHARED_FOLDER_PATIENCE_S = 90


@dataclass
class StageContext:
    """What a stage gets: the whole surface a stage uses (stages import nothing from the runner).

    Reading: ``config``, ``input(stage)`` (an earlier stage's complete folder).
    Writing: ``out`` (the stage's folder, renamed into place when ``run`` returns), ``write_json``.
    Processes: ``is_main``, ``rank``, ``world``, ``device``, ``barrier()``, ``autocast()``, ``unwrap(model)``;
    ``dist`` is for pipeline machinery (``training.fit``), not for stages.
    Tracking: ``log_metrics``, ``log_artifact``, ``log_artifacts``, ``set_tags``, ``mlflow_ids()``.
    Feedback: ``progress(total, desc)``, a tqdm bar shown on the main process in a terminal.
    """

    config: PipelineConfig
    name: str
    run_dir: Path
    out: Path  # the stage's partial folder; renamed into place when run() returns
    tracker: Tracker
    dist: "Distributed"
    cache_dir: Path | None = None  # runs/.cache (the export's teacher graph, by weights and exporter)

    def input(self, stage: str) -> Path:
        if stage not in stage_module(self.name).AFTER:
            # Its fingerprint would not cover that stage's: a rerun upstream would leave this stage's output stale.
            raise PipelineError(
                f"Stage '{self.name}' reads the output of '{stage}', which its AFTER list "
                f"({', '.join(stage_module(self.name).AFTER) or 'empty'}) does not name: its fingerprint would not "
                f"change when '{stage}' reruns. Add '{stage}' to AFTER in stages/{self.name}.py."
            )
        folder = self.run_dir / stage
        # The other ranks, maybe on other machines: rank 0 completed this stage before the barrier they passed, but a
        # network filesystem can show another machine a stale view of the folder for a while (attribute caching).
        patience = SHARED_FOLDER_PATIENCE_S if self.world > 1 and not self.is_main else 0
        deadline = time.monotonic() + patience
        while True:
            manifest = read_manifest(folder)
            problems = damaged_outputs(folder, manifest.get("outputs"))[0] if manifest is not None else []
            if (manifest is not None and not problems) or time.monotonic() >= deadline:
                break
            with contextlib.suppress(OSError):
                os.listdir(folder.parent)  # opening a directory makes an NFS client revalidate it
            time.sleep(1)
        if manifest is None:
            raise PipelineError(
                f"Stage '{self.name}' needs the output of '{stage}', which is not complete. Run without --only first."
            )
        if problems:
            raise PipelineError(
                f"Stage '{self.name}' needs the output of '{stage}', which is damaged ({'; '.join(problems[:3])}). "
                f"Run without --only: {stage} reruns first."
            )
        return folder

    @property
    def final(self) -> Path:
        """Where the output folder will be once the stage is complete."""
        return self.run_dir / self.name

    # -------------------------------------------------------------- processes
    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def world(self) -> int:
        return self.dist.world

    @property
    def device(self):
        return self.dist.device

    def barrier(self) -> None:
        self.dist.barrier()

    def autocast(self):
        """The configured mixed precision for forward passes outside training."""
        return self.dist.accelerator.autocast()

    def unwrap(self, model):
        return self.dist.accelerator.unwrap_model(model)

    # -------------------------------------------------------------- outputs
    def write_json(self, name: str | Path, data) -> Path:
        """Write ``data`` as JSON to ``out / name``, atomically."""
        path = self.out / name
        write_json(path, data)
        return path

    def progress(self, total: int, desc: str, initial: int = 0):
        from tqdm.auto import tqdm

        if SHOW_BARS or not self.is_main:
            return tqdm(
                total=total, initial=initial, desc=desc, disable=not self.is_main, dynamic_ncols=True, leave=False
            )
        return tqdm(
            total=total,
            initial=initial,
            desc=f"[{self.name}] {desc}",
            file=_ProgressLines(),
            ncols=110,
            mininterval=PROGRESS_LOG_INTERVAL_S,
            maxinterval=PROGRESS_LOG_INTERVAL_S,
            ascii=True,
            leave=False,
        )

    # -------------------------------------------------------------- tracking (no-ops when MLflow is off)
    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.tracker.log_metrics(metrics, step)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.tracker.log_artifact(path, artifact_path)

    def log_artifacts(self, folder: Path, artifact_path: str | None = None) -> None:
        self.tracker.log_artifacts(folder, artifact_path)

    def set_tags(self, tags: dict) -> None:
        self.tracker.set_tags(tags)

    def mlflow_ids(self) -> dict | None:
        """tracking_uri (password redacted), experiment, parent_run_id, stage_run_id of this stage's MLflow run;
        None when tracking is off."""
        if not (self.tracker.enabled and self.tracker.stage_id):
            return None
        return {
            "tracking_uri": redact_uri(self.tracker.uri),
            "experiment": self.tracker.experiment,
            "parent_run_id": self.tracker.parent_id,
            "stage_run_id": self.tracker.stage_id,
        }


def native_bf16() -> bool:
    """Does this machine compute bf16 in hardware (not emulated)?"""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(precision: str) -> str:
    if precision != "auto":
        return precision
    return "bf16" if native_bf16() else "fp32"


DIST_TIMEOUT_VAR = "PIPELINE_DIST_TIMEOUT"
# Seconds a rank waits in one collective (a barrier, a gradient all-reduce) before it gives up. A peer that died
# closes its connections and is noticed at once; this bounds the wait for one that froze or became unreachable.
# It must exceed the longest stretch one rank works alone while the others wait at a barrier (prepare, peers,
# export on rank 0: minutes for bert_small on a 2-core CPU), hence 30 min, torch's gloo default, for NCCL too
# (which would otherwise use its own default).
DEFAULT_DIST_TIMEOUT_S = 1800


SHARED_FOLDER_WAIT_VAR = "PIPELINE_SHARED_FOLDER_WAIT"
# Seconds the ranks other than 0 look for the file rank 0 has just written in the run folder before the job stops
# as not shared: a network filesystem may cache a missing file for a while.
DEFAULT_SHARED_FOLDER_WAIT_S = 20.0


def seconds_from_env(var: str, default: float, meaning: str, example: int) -> float:
    """$var as a positive number of seconds, or ``default`` when unset; anything else is a one-paragraph error."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1
    if not value > 0 or value != value:
        raise ConfigError(
            f"{var}={raw!r} is not a positive number of seconds. It is {meaning} (default {default:g}); set e.g. "
            f"{var}={example}, or unset it."
        )
    return value


def dist_timeout_seconds() -> float:
    """$PIPELINE_DIST_TIMEOUT (seconds) or the default."""
    return seconds_from_env(
        DIST_TIMEOUT_VAR,
        DEFAULT_DIST_TIMEOUT_S,
        "how long a rank waits for the others in one collective step before the run fails",
        600,
    )


def shared_folder_wait_seconds() -> float:
    """$PIPELINE_SHARED_FOLDER_WAIT (seconds) or the default."""
    return seconds_from_env(
        SHARED_FOLDER_WAIT_VAR,
        DEFAULT_SHARED_FOLDER_WAIT_S,
        "how long the other ranks look for the file rank 0 wrote in the run folder before the job stops as not shared",
        60,
    )


class Distributed:
    """Process-group facts and the Accelerator, created once per process."""

    def __init__(self, config: PipelineConfig):
        import torch
        from accelerate import Accelerator, DistributedDataParallelKwargs, InitProcessGroupKwargs

        self.precision = resolve_precision(config.precision)
        if self.precision == "fp16":
            if not torch.cuda.is_available():
                raise PipelineError(
                    "precision: fp16 needs a CUDA GPU; on this machine Accelerate would silently train in fp32. "
                    "Use precision: bf16 (runs on CPU) or fp32."
                )
        # fit() sets find_unused_parameters per training job on this handler.
        self.timeout_s = dist_timeout_seconds()
        self.shared_folder_wait_s = shared_folder_wait_seconds()
        kwargs = [DistributedDataParallelKwargs(), InitProcessGroupKwargs(timeout=dt.timedelta(seconds=self.timeout_s))]
        mp = "no" if self.precision == "fp32" else self.precision
        # Without CUDA, Accelerate only forms a process group (gloo, MULTI_CPU)
        # when told cpu=True; otherwise every launched process silently trains
        # alone as "rank 0 of 1".
        self.accelerator = Accelerator(mixed_precision=mp, kwargs_handlers=kwargs, cpu=not torch.cuda.is_available())
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched != self.world:
            raise PipelineError(
                f"{launched} processes were launched but Accelerate formed a group of {self.world} "
                f"({self.accelerator.distributed_type}); refusing to run {launched} independent copies. "
                "Launch with `make distill NPROC=n` (accelerate launch --multi_gpu) or torchrun."
            )
        self.is_main = self.accelerator.is_main_process
        self.device = self.accelerator.device

    def barrier(self) -> None:
        if self.world > 1:
            self.accelerator.wait_for_everyone()

    def autocast(self):
        return self.accelerator.autocast()

    def check_shared_folder(self, run_dir: Path) -> None:
        """Every rank must see the run folder rank 0 writes: stages read each other's outputs through it.

        Rank 0 writes a token; every rank looks for it (for up to $PIPELINE_SHARED_FOLDER_WAIT seconds, default 20:
        a network filesystem may cache a missing file for a while) and all ranks learn who could not, so they fail
        together with one message instead of the first stage failing on some machines while the others wait for them.
        """
        if self.world == 1:
            return
        from accelerate.utils import broadcast_object_list, gather_object

        path = run_dir / ".shared-folder-check"
        token = [
            f"{socket.gethostname()} pid {os.getpid()} {time.time_ns()}" if self.is_main else None,
            str(path.resolve()) if self.is_main else None,
        ]
        broadcast_object_list(token, from_process=0)
        if self.is_main:
            write_json(path, token[0])
        self.barrier()
        deadline = time.monotonic() + self.shared_folder_wait_s
        while True:
            try:
                sees = json.loads(path.read_text()) == token[0]
            except (OSError, ValueError):
                sees = False
            if sees or self.is_main or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        seen = gather_object([(self.rank, socket.gethostname(), sees)])
        if self.is_main:
            path.unlink(missing_ok=True)
        blind = [f"rank {rank} on {host}" for rank, host, ok in seen if not ok]
        if blind:
            raise PipelineError(
                f"The run folder {run_dir} is not shared between the machines of this job: "
                f"{', '.join(blind)} cannot see the file {token[1]} that rank 0 ({seen[0][1]}) wrote. Every node must "
                "see the same runs folder (a shared filesystem such as NFS, mounted at the same path, and the same "
                "--runs-dir / RUNS_DIR on every node): rank 0 writes each stage's output and the other ranks read it."
            )


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """An exclusive lock on the run folder; the error names the holder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / ".lock"
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown process"
        handle.close()
        raise LockedError(
            f"Run folder {run_dir} is in use by another pipeline ({holder}). Wait for it to finish, "
            "or stop that process; two pipelines must never write the same run folder."
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {dt.datetime.now().isoformat(timespec='seconds')}")
    handle.flush()
    try:
        yield
    finally:
        handle.seek(0)
        handle.truncate()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def check_stage(run_dir: Path, name: str, fingerprint: str) -> tuple[str, dict | None, list[str]]:
    """(state, manifest, problems): done, stale (other inputs), damaged (outputs changed on disk), pending."""
    folder = run_dir / name
    manifest = read_manifest(folder)
    if manifest is None:
        if folder.exists():  # a folder without a readable manifest: it was damaged, not never run
            return "damaged", None, [f"{name}/{MANIFEST} is missing or unreadable"]
        return ("running/interrupted" if (run_dir / f"{name}.partial").exists() else "pending"), None, []
    if manifest.get("fingerprint") != fingerprint:
        return "stale", manifest, []
    problems, refreshed = damaged_outputs(folder, manifest.get("outputs"))
    if problems:
        return "damaged", manifest, [f"{name}/{p}" for p in problems]
    if refreshed:  # same content, new mtimes (a copied runs folder): remember them, hash once
        with contextlib.suppress(OSError):
            write_json(folder / MANIFEST, manifest)
    for before, identity in (manifest.get("upstream") or {}).items():
        upstream = read_manifest(run_dir / before)
        if upstream is not None and read_identity(name, before, upstream) != identity:
            return "stale", manifest, [f"{before} was rerun with a different output since {name} read it"]
    return "done", manifest, []


def stage_states(run_dir: Path, current: dict[str, str]) -> dict[str, str]:
    """done / stale / damaged / pending / running-interrupted of every stage, for the given fingerprints."""
    return {name: check_stage(run_dir, name, current[name])[0] for name in STAGES if name in current}


def stage_status(config: PipelineConfig, runs_dir: Path) -> list[dict]:
    """done / stale / damaged / pending for every stage (used by `make status`)."""
    run_dir = Path(runs_dir) / config.name
    current = fingerprints(config, runs_dir)
    rows = []
    for name in STAGES:
        state, manifest, problems = check_stage(run_dir, name, current[name])
        rows.append({"stage": name, "state": state, "manifest": manifest, "problems": problems})
    return rows


def plan(
    config: PipelineConfig,
    run_dir: Path,
    force: bool,
    from_stage: str | None,
    only: str | None,
    to_stage: str | None = None,
    current: dict[str, str] | None = None,
) -> dict[str, bool]:
    """Which stages must run (True) and which are complete and current (False).

    A stage whose outputs were damaged on disk reruns, and so does everything that read them.
    """
    current = current or fingerprints(config, run_dir.parent)
    to_run = {name: False for name in STAGES}
    for name in STAGES:
        state, _, problems = check_stage(run_dir, name, current[name])
        forced = force or (from_stage is not None and STAGES.index(name) >= STAGES.index(from_stage))
        to_run[name] = to_run[name] or forced or state != "done"
        if state == "damaged":  # what read the damaged output reruns too, though its inputs' fingerprints did not move
            after = dependents(name)
            log.warning(
                "[%s] output damaged (%s); rerunning %s", name, "; ".join(problems[:3]), ", ".join([name, *after])
            )
            to_run.update({later: True for later in after})
    if only:
        to_run = {name: name == only for name in STAGES}  # --only always runs that one stage
    if to_stage:
        to_run = {name: run and STAGES.index(name) <= STAGES.index(to_stage) for name, run in to_run.items()}
    return to_run


def run_pipeline(
    config: PipelineConfig,
    runs_dir: Path,
    force: bool = False,
    from_stage: str | None = None,
    only: str | None = None,
    to_stage: str | None = None,
    run_dir: Path | None = None,
    sweep_run_id: str | None = None,
    run_name: str | None = None,
    reuse: Callable[[str, dict[str, str]], bool] | None = None,
) -> dict:
    """Run the stages that are not complete and current.

    ``run_dir`` defaults to ``runs_dir/<config name>``; a sweep gives each variant its own folder
    (``sweep_run_id``: the MLflow sweep run the variant's pipeline run is nested under, ``run_name`` its name)
    and ``reuse``, asked before a stage runs whether a finished copy was linked instead (pipeline/sweep/reuse.py).
    """
    runs_dir = Path(runs_dir)
    run_dir = Path(run_dir) if run_dir is not None else runs_dir / config.name
    dist = Distributed(config)
    lock = run_lock(run_dir) if dist.is_main else contextlib.nullcontext()
    with lock:
        dist.barrier()
        dist.check_shared_folder(run_dir)
        config_yaml = to_yaml(config)
        tracker = Tracker(
            runs_dir,
            run_dir,
            config.tracking.experiment or config.name,
            enabled=dist.is_main and config.tracking.enabled,
            sweep_run_id=sweep_run_id,
            run_name=run_name,
        )
        if dist.is_main:
            (run_dir / "config.yaml").write_text(config_yaml)
        current = fingerprints(config, runs_dir, save=dist.is_main)  # one writer of the shared digest memory
        to_run = plan(config, run_dir, force, from_stage, only, to_stage, current)
        if not any(to_run.values()):
            if dist.is_main:
                log.info("All stages are complete and current; nothing to do (use --force to rerun).")
            tracker.end_orphaned_runs()
            states = stage_states(run_dir, current)
            tracker.record_result(config, current, {s for s, state in states.items() if state == "done"})
            return {"ran": [], "fingerprints": current, "states": states}
        tracker.start_pipeline(config_yaml, config.flat(), config_hash(config_yaml))
        ran, status = [], "FAILED"
        try:
            for name in STAGES:
                if to_run[name] and reuse is not None and dist.is_main and reuse(name, current):
                    to_run[name] = False  # linked from another folder that has it, now that its upstream is here
                if not to_run[name]:
                    if dist.is_main and check_stage(run_dir, name, current[name])[0] == "done":
                        log.info("[%s] up to date (fingerprint %s), skipped", name, current[name])
                    elif dist.is_main:  # left out by --only / --to: say so, never "up to date"
                        log.info(
                            "[%s] not run: outside the stages asked for (--only / --to); its output is not current",
                            name,
                        )
                    continue
                try:
                    _run_stage(
                        config,
                        name,
                        runs_dir,
                        run_dir,
                        fingerprint_as_run(config, name, run_dir, current),
                        tracker,
                        dist,
                    )
                except Exception as exc:  # a full disk surfaces as many exception types
                    full = (
                        None
                        if isinstance(exc, PipelineError)
                        else disk_full_error(exc, run_dir / f"{name}.partial", f"the {name} stage")
                    )
                    if full is None:
                        with contextlib.suppress(AttributeError):
                            setattr(exc, "pipeline_stage", name)  # noqa: B010  (an attribute Exception does not declare) for the CLI's one-paragraph error
                        raise
                    raise full from exc
                ran.append(name)
            status = "FINISHED"
        except BaseException as exc:
            status = run_status(exc)
            raise
        finally:
            tracker.end_pipeline(status)
        states = stage_states(run_dir, current)  # checked once: the MLflow result and the CLI summary use them
        tracker.record_result(config, current, {s for s, state in states.items() if state == "done"})
        return {"ran": ran, "fingerprints": current, "states": states}


def _run_stage(
    config: PipelineConfig, name: str, runs_dir: Path, run_dir: Path, fp: str, tracker: Tracker, dist: Distributed
) -> None:
    module = stage_module(name)
    final = run_dir / name
    partial = run_dir / f"{name}.partial"
    if dist.is_main:
        marker = partial / ".fingerprint"
        # A partial folder from an interrupted run of the SAME inputs is kept: it
        # holds the checkpoints to resume from. Anything else starts clean.
        if partial.exists() and (not marker.is_file() or marker.read_text() != fp):
            shutil.rmtree(partial)
        partial.mkdir(parents=True, exist_ok=True)
        marker.write_text(fp)
    dist.barrier()
    log.info("[%s] running (fingerprint %s)", name, fp) if dist.is_main else None
    params = {k: config.section(k) for k in module.READS if not isinstance(config.section(k), dict)}
    started = time.time()
    with tracker.stage(name, fp, params) as stage_run_id:
        ctx = StageContext(
            config=config,
            name=name,
            run_dir=run_dir,
            out=partial,
            tracker=tracker,
            dist=dist,
            cache_dir=runs_dir / ".cache",
        )
        summary = module.run(ctx) or {}
        dist.barrier()
        duration = time.time() - started
        if dist.is_main:
            tracker.log_metrics({"stage_seconds": duration})
            freed = discard_resume_state(partial)  # checkpoints only resume a partial stage
            if freed:
                log.info("[%s] resume checkpoints deleted (%.1f GB freed)", name, freed / 1e9)
            manifest = {
                "stage": name,
                "fingerprint": fp,
                "version": module.VERSION,
                "completed_at": dt.datetime.now().isoformat(timespec="seconds"),
                "duration_s": round(duration, 2),
                "summary": summary,
                "mlflow_run_id": stage_run_id,
                "ran_in": ran_in(runs_dir, run_dir),  # a hard-linked copy elsewhere keeps it: who did the work
                "outputs": output_listing(partial),
                "upstream": {
                    before: read_identity(name, before, read_manifest(run_dir / before) or {})
                    for before in module.AFTER
                },
            }
            write_json(partial / "manifest.json", manifest)
            (partial / ".fingerprint").unlink(missing_ok=True)
            replace_folder(partial, final)
            log.info("[%s] done in %.1f s %s", name, duration, _short(summary))
    dist.barrier()


def ran_in(runs_dir: Path, run_dir: Path) -> str:
    """The run folder a stage ran in, relative to the runs folder (absolute where it lies outside)."""
    try:
        return Path(run_dir).resolve().relative_to(Path(runs_dir).resolve()).as_posix()
    except ValueError:
        return str(Path(run_dir).resolve())


def _short(summary: dict) -> str:
    items = [
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in summary.items()
        if not isinstance(v, (dict, list))
    ]
    return "(" + ", ".join(items[:4]) + ")" if items else ""
