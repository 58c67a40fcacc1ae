"""What a stage is, as types: the module contract every file of stages/ fulfils (``Stage``) and the context its
``run`` receives (``Context``).

Stages type ``run(ctx: Context) -> dict`` against this module, not against the runner, so a stage imports nothing
from the orchestration layer and a test can hand it any object with these members (tests/reliability's peers
tests do). The runner's ``StageContext`` is the one implementation; tests/test_stage_api.py checks that it has every
member named here and that every stage module has the contract's names with these types. The config is imported for
its type only: nothing here runs at import time.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .config import PipelineConfig

Model = TypeVar("Model")


class Context(Protocol):
    """The runner's side of a stage: its config, its folders, its processes, its outputs and its tracking."""

    config: PipelineConfig
    name: str
    out: Path  # the stage's partial folder; renamed into place when run() returns
    # runs/.cache: what may be reused across runs and sweep variants, keyed by what it depends on (deletable)
    cache_dir: Path | None

    @property
    def final(self) -> Path: ...  # where ``out`` will be once the stage is complete

    def input(self, stage: str) -> Path: ...  # a completed stage's folder; only stages named in AFTER

    # processes
    @property
    def is_main(self) -> bool: ...

    @property
    def rank(self) -> int: ...

    @property
    def world(self) -> int: ...

    @property
    def device(self) -> Any: ...  # a torch.device (torch is not imported here)

    def barrier(self) -> None: ...

    def autocast(self) -> AbstractContextManager[Any]: ...

    def unwrap(self, model: Model) -> Model: ...

    # outputs and feedback
    def write_json(self, name: str | Path, data: Any) -> Path: ...

    def progress(self, total: int, desc: str, initial: int = 0) -> Any: ...  # a tqdm bar

    # tracking (no-ops when MLflow is off)
    def log_metrics(self, metrics: dict, step: int | None = None) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...

    def log_artifacts(self, folder: Path, artifact_path: str | None = None) -> None: ...

    def set_tags(self, tags: dict) -> None: ...

    def mlflow_ids(self) -> dict | None: ...


class Stage(Protocol):
    """A file of stages/ as a module: what it reads, what it runs after, its output version and its step."""

    READS: list[str]  # config keys (dotted) whose values are inputs: the fingerprint covers them
    AFTER: list[str]  # stages whose outputs are inputs: ``ctx.input`` refuses any other
    VERSION: int  # bump when the output changes for the same inputs

    def run(self, ctx: Context) -> dict: ...  # the summary the runner records in the manifest and MLflow
