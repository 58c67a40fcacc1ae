"""The sweep's own MLflow run: re-attached when the same sweep is rerun, the variants' pipeline runs nested under
it, the table, plot and pick logged on it at the end."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import to_yaml
from ..tracking import MAX_NOTE, NOTE_TAG, Tracker, config_hash
from .spec import Sweep
from .table import write_text

log = logging.getLogger("pipeline")

SWEEP_RECORD = "mlflow_sweep.json"


@dataclass
class SweepTracker:
    """The sweep's own MLflow run (re-attached when the same sweep is rerun); nothing when tracking is off."""

    sweep: Sweep
    runs_dir: Path
    sweep_dir: Path
    run_id: str | None = None
    client: Any = field(default=None, repr=False)  # an mlflow.MlflowClient once started

    def start(self) -> None:
        config = self.sweep.base
        if not config.tracking.enabled:
            return
        tracker = Tracker(
            self.runs_dir, self.sweep_dir, config.tracking.experiment or config.name
        )  # store set-up, errors
        self.client = tracker.client
        experiment_id = tracker.ensure_experiment()
        record = self.sweep_dir / SWEEP_RECORD
        previous = json.loads(record.read_text()) if record.is_file() else {}
        identity = self.identity()
        if previous.get("identity") == identity:
            with contextlib.suppress(Exception):
                run = self.client.get_run(previous["run_id"])
                if run.info.lifecycle_stage == "active":
                    self.run_id = run.info.run_id
                    self.client.update_run(self.run_id, status="RUNNING")
                    log.info("MLflow: re-attached to sweep run %s", self.run_id)
        if self.run_id is None:
            run = self.client.create_run(
                experiment_id,
                run_name=f"{config.name}-sweep-{self.sweep.name}",
                tags={
                    "attention_distill.role": "sweep",
                    "attention_distill.config": config.name,
                    "attention_distill.sweep": self.sweep.name,
                    "attention_distill.run_folder": tracker.run_folder,
                },
            )
            self.run_id = run.info.run_id
            self.client.log_text(self.run_id, self.sweep.path.read_text(), f"sweep/{self.sweep.path.name}")
            self.client.log_param(self.run_id, "variants", ",".join(self.sweep.variants))
            log.info("MLflow: new sweep run %s in experiment '%s'", self.run_id, tracker.experiment)
        write_text(record, json.dumps({"run_id": self.run_id, "identity": identity}))

    def identity(self) -> str:
        """Same variants with the same resolved configs -> the same sweep run."""
        return config_hash(json.dumps({name: to_yaml(c) for name, c in self.sweep.configs.items()}, sort_keys=True))

    def adopt(self, run_dir: Path) -> None:
        """Nest a variant's pipeline run under this sweep run (also one recorded by an earlier sweep run)."""
        if not self.run_id:
            return
        with contextlib.suppress(OSError, ValueError, KeyError):
            parent = json.loads((run_dir / "mlflow_run.json").read_text())["parent_run_id"]
            self.client.set_tag(parent, "mlflow.parentRunId", self.run_id)

    def finish(
        self, status: str, note: str | None = None, artifacts: Sequence[Path] = (), tags: dict | None = None
    ) -> None:
        if not self.run_id:
            return
        try:
            if note is not None:
                self.client.set_tag(self.run_id, NOTE_TAG, note[:MAX_NOTE])
            for key, value in (tags or {}).items():
                self.client.set_tag(self.run_id, key, str(value))
            for path in artifacts:
                self.client.log_artifact(self.run_id, str(path), "sweep")
        except Exception as exc:  # the sweep's own outputs are on disk: MLflow refusing is a warning
            log.warning("MLflow: the sweep's results were not all logged (%s: %s)", type(exc).__name__, str(exc)[:200])
        finally:
            self.client.set_terminated(self.run_id, status=status)
