"""MLflow tracking: one parent run per pipeline run, one nested run per stage.

Only the main process talks to MLflow; other ranks get a tracker whose calls do
nothing. The store is ``MLFLOW_TRACKING_URI`` when set, else a sqlite file at
``<runs>/mlflow.db`` with artifacts under ``<runs>/mlartifacts``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path

from .errors import PipelineError, brief
from .interrupts import WholeCalls
from .redaction import redact, redact_uri
from .run_record import GIT_COMMIT_TAG, GIT_DIRTY_TAG, git_tags, pipeline_result, split_datasets

log = logging.getLogger("pipeline")

RUN_FOLDER_TAG = "attention_distill.run_folder"
RESULT_TAG = "attention_distill.result"  # digest of the result last recorded on the pipeline run
NOTE_TAG = "mlflow.note.content"  # the run's description in the MLflow UI
NOTE_DIGEST_TAG = "attention_distill.note_digest"  # the description this pipeline wrote (an edited one is kept)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # "Machine learning" (model training) in the MLflow 3 UI
REPLACEABLE_KINDS = ("", "no_inferred_type", "genai_development_inferred", "custom_model_development_inferred")
MAX_NOTE = 8000  # MLflow's limit on a tag value


def store_error(exc: BaseException, uri: str, before_work: bool = True) -> PipelineError:
    """One paragraph for an MLflow store that cannot be used, by cause; the URI's password never shown."""
    shown = redact_uri(uri)
    text = redact(f"{type(exc).__name__}: {exc}").lower()
    local = uri.startswith("sqlite:")
    where = uri.removeprefix("sqlite:///") if local else shown
    if "unsupported uri" in text or "scheme" in text and "supported" in text:
        scheme = uri.split(":", 1)[0]
        cause = (
            f"has a scheme, '{scheme}', that MLflow does not know. Use http(s)://host:port for a tracking server, "
            "postgresql:// or mysql:// for a database, sqlite:///path or a folder"
        )
    elif isinstance(exc, ModuleNotFoundError) or "no module named" in text:
        module = getattr(exc, "name", None) or text.split("no module named", 1)[1].strip(" '\"")
        driver = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary", "pymysql": "pymysql"}.get(module, module)
        cause = f"needs a Python driver that is not installed (module '{module}'). Install it: .venv/bin/pip install {driver}"
    elif "file is not a database" in text or "malformed" in text:
        cause = (
            f"is not a readable sqlite database ({where} is damaged or not a database). Move it aside "
            f"(mv {where} {where}.bad) to start a fresh store; stage outputs under the runs folder are not affected"
        )
    elif "database is locked" in text:
        cause = "is locked by another process (an MLflow UI or pipeline in the middle of a write). Wait and rerun"
    elif "unable to open database" in text or "readonly database" in text or "permission denied" in text:
        cause = (
            f"cannot be opened for writing ({where}: permissions or a read-only folder). Make it writable "
            "or point --runs-dir at a writable folder"
        )
    elif local:
        brief = redact(str(exc)).splitlines()[0][:200] if str(exc) else ""
        cause = (
            f"refused the request ({type(exc).__name__}: {brief}). If the store was written by another MLflow "
            f"version or edited by hand, move {where} aside to start a fresh one"
        )
    else:
        cause = (
            f"is unreachable or refused the request ({type(exc).__name__}). Start the server (make server) or "
            "unset MLFLOW_TRACKING_URI to use the local sqlite store under the runs folder"
        )
    return PipelineError(
        f"MLflow tracking store {shown} {cause}. Or set tracking.enabled=false "
        f"to run without MLflow.{' Nothing was run.' if before_work else ''}"
    )


# How long a write to mlflow.db waits for another process's lock (an MLflow UI or pipeline writes briefly).
LOCK_WAIT_S = 30.0
# Columns of MLflow's sqlite schema that hold artifact locations (MLflow 3.x).
ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)


def relocate_artifacts(runs_dir: Path) -> None:
    """Point the local store's artifact locations at <runs_dir>/mlartifacts after the runs folder moved.

    MLflow stores absolute file:// locations and has no API to change an
    experiment's; without this, a moved runs folder shows runs whose artifacts
    are missing (or still read from the old copy).
    """
    import sqlite3

    db = Path(runs_dir) / "mlflow.db"
    if not db.is_file():
        return
    here = (Path(runs_dir).resolve() / "mlartifacts").as_uri()
    with contextlib.closing(sqlite3.connect(db, timeout=LOCK_WAIT_S)) as conn:
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "experiments" not in tables:
                return
            olds = {
                row[0]
                for row in conn.execute("SELECT artifact_location FROM experiments")
                if row[0] and row[0].startswith("file://") and row[0].endswith("/mlartifacts") and row[0] != here
            }
        except sqlite3.DatabaseError:
            return  # a damaged store is reported by the first real MLflow call
        for old in olds:
            with conn:
                for table, column in ARTIFACT_COLUMNS:
                    if table in tables:
                        # substr, not LIKE: sqlite's LIKE ignores case, a path does not
                        conn.execute(
                            f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE {column} = ? "
                            f"OR substr({column}, 1, ?) = ?",
                            (here, len(old) + 1, old, len(old) + 1, old + "/"),
                        )
            log.info("MLflow: the runs folder moved; artifact locations %s -> %s", old, here)


def tracking_uri(runs_dir: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(runs_dir).resolve() / 'mlflow.db'}"


class Tracker:
    """Thin wrapper over the mlflow client API; disabled on non-main ranks."""

    def __init__(
        self,
        runs_dir: Path,
        run_dir: Path,
        experiment: str,
        enabled: bool = True,
        sweep_run_id: str | None = None,
        run_name: str | None = None,
    ):
        self.enabled = enabled
        self.runs_dir = Path(runs_dir)
        self.run_dir = Path(run_dir)
        self.experiment = experiment
        self.sweep_run_id = sweep_run_id  # a sweep's variant: its pipeline run is nested under the sweep run
        self.run_name = run_name or f"{experiment}-pipeline"
        self.parent_id: str | None = None
        self.stage_id: str | None = None
        if not enabled:
            return
        import mlflow

        self.mlflow = mlflow
        self.uri = tracking_uri(self.runs_dir)
        # Read before set_tracking_uri, which exports MLFLOW_TRACKING_URI itself.
        self.local_store = not os.environ.get("MLFLOW_TRACKING_URI")
        # Fail fast on an unreachable server instead of retrying for minutes.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        with self._store_errors(), self._setup_lock():
            if self.local_store:
                relocate_artifacts(self.runs_dir)
            mlflow.set_tracking_uri(self.uri)
            # Every store call finishes before a Ctrl-C or SIGTERM stops the run (pipeline/interrupts.py).
            self.client = WholeCalls(mlflow.MlflowClient(self.uri))
            # The first use creates (or migrates) the sqlite schema: done here, under the lock.
            self.client.search_experiments(max_results=1)

    @contextlib.contextmanager
    def _setup_lock(self):
        """Serialise store set-up between pipelines sharing a runs folder: two configs started at
        once on a fresh folder would otherwise race in MLflow's schema creation and one would crash."""
        if not self.local_store:
            yield
            return
        import fcntl

        self.runs_dir.mkdir(parents=True, exist_ok=True)
        with open(self.runs_dir / ".mlflow-setup.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _store_errors(self):
        try:
            yield
        except PipelineError:
            raise
        except Exception as exc:
            raise store_error(exc, self.uri) from exc

    # ------------------------------------------------------------------ runs
    def ensure_experiment(self) -> str:
        """The experiment's id, created when missing (artifacts next to mlflow.db for a local store, never
        ./mlruns in the cwd) and marked as model training."""
        experiment = self.client.get_experiment_by_name(self.experiment)
        if experiment is None:
            location = (self.runs_dir.resolve() / "mlartifacts").as_uri() if self.local_store else None
            experiment_id = self.client.create_experiment(self.experiment, artifact_location=location)
        else:
            experiment_id = experiment.experiment_id
        self._mark_experiment_kind(experiment_id)
        return experiment_id

    def start_pipeline(self, config_yaml: str, flat_params: dict, config_hash: str) -> None:
        """Create or re-attach the parent run (same resolved config -> same parent)."""
        if not self.enabled:
            return
        mlflow = self.mlflow
        experiment_id = self.experiment_id = self.ensure_experiment()
        self.end_orphaned_runs()
        record = self.run_dir / "mlflow_run.json"
        previous = json.loads(record.read_text()) if record.is_file() else {}
        parent_id = None
        if previous.get("config_hash") == config_hash and previous.get("tracking_uri") == redact_uri(self.uri):
            with contextlib.suppress(Exception):
                run = self.client.get_run(previous["parent_run_id"])
                if run.info.lifecycle_stage == "active":
                    parent_id = run.info.run_id
        if parent_id is None:
            run = self.client.create_run(
                experiment_id,
                run_name=self.run_name,
                tags={
                    "attention_distill.role": "pipeline",
                    "attention_distill.config": self.experiment,
                    RUN_FOLDER_TAG: self.run_folder,
                    **({"mlflow.parentRunId": self.sweep_run_id} if self.sweep_run_id else {}),
                },
            )
            parent_id = run.info.run_id
            items = list(param_strings(flat_params).items())
            for i in range(0, len(items), 100):
                self.client.log_batch(parent_id, params=[mlflow.entities.Param(k, v) for k, v in items[i : i + 100]])
            self.client.log_text(parent_id, config_yaml, "config/resolved.yaml")
            log.info(
                "MLflow: new parent run %s in experiment '%s' (%s)", parent_id, self.experiment, redact_uri(self.uri)
            )
        else:
            self.client.update_run(parent_id, status="RUNNING")
            if self.sweep_run_id:  # a variant resumed under a (new) sweep run
                self.client.set_tag(parent_id, "mlflow.parentRunId", self.sweep_run_id)
            log.info("MLflow: re-attached to parent run %s", parent_id)
        self.parent_id = parent_id
        tmp = record.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "parent_run_id": parent_id,
                    "config_hash": config_hash,
                    "tracking_uri": redact_uri(self.uri),
                    "experiment_id": experiment_id,
                }
            )
        )
        tmp.replace(record)

    @property
    def run_folder(self) -> str:
        """Which run folder (on which machine) a run belongs to: tagged on every run."""
        import socket

        return f"{socket.gethostname()}:{self.run_dir.resolve()}"

    def end_orphaned_runs(self) -> None:
        """Mark KILLED the runs of this run folder still RUNNING: their process died (kill -9, power loss).

        The caller holds the run folder's lock, so no live pipeline owns them.
        """
        if not self.enabled:
            return
        experiment_id = getattr(self, "experiment_id", None)
        if experiment_id is None:  # a run with nothing to do never starts the pipeline run
            experiment = self.client.get_experiment_by_name(self.experiment)
            if experiment is None:
                return
            experiment_id = experiment.experiment_id
        for run in self._running_runs(experiment_id):
            if run.data.tags.get(RUN_FOLDER_TAG) == self.run_folder:
                self.client.set_terminated(run.info.run_id, status="KILLED")
                log.info(
                    "MLflow: run %s (%s) was left RUNNING by a process that died; marked KILLED",
                    run.info.run_id,
                    run.info.run_name,
                )

    def end_pipeline(self, status: str = "FINISHED") -> None:
        if not (self.enabled and self.parent_id):
            return
        if status != "FINISHED":  # a stage run a signal hit inside MLflow's create_run (no id came back) ends too
            try:
                for child in self._running_runs(self.experiment_id, f"tags.`mlflow.parentRunId` = '{self.parent_id}'"):
                    self._set_terminated(child.info.run_id, status)
            except Exception as exc:  # the error that stopped the run is the one the user must see
                log.warning("MLflow: could not end the stage runs of %s (%s)", self.parent_id, _brief_error(exc))
        self._set_terminated(self.parent_id, status)

    def _running_runs(self, experiment_id: str, where: str | None = None) -> list:
        """The experiment's runs still RUNNING (and matching ``where``, an MLflow filter), up to 1,000."""
        query = "attributes.status = 'RUNNING'" + (f" and {where}" if where else "")
        return self.client.search_runs([experiment_id], query, max_results=1000)

    def _set_terminated(self, run_id: str, status: str) -> None:
        """End an MLflow run. While a failure propagates (any status but FINISHED), MLflow failing as well (a full disk
        holds its database too) is one warning line: the error that stopped the run is the one the user must see."""
        try:
            self.client.set_terminated(run_id, status=status)
        except Exception as exc:
            if status == "FINISHED":
                raise
            log.warning("MLflow: could not mark run %s %s (%s)", run_id, status, _brief_error(exc))

    def _mark_experiment_kind(self, experiment_id: str) -> None:
        """Tag the experiment as model training, so the MLflow UI opens it in that view (not GenAI).

        A kind chosen in the UI (or by another tool) is kept; only an absent or inferred one is set.
        """
        try:
            experiment = self.client.get_experiment(experiment_id)
            if experiment.tags.get(EXPERIMENT_KIND_TAG, "") in REPLACEABLE_KINDS:
                self.client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        except Exception as exc:  # a nicety: never a reason to stop the pipeline
            log.warning("MLflow: could not mark experiment %s as model training (%s)", experiment_id, _brief_error(exc))

    # ------------------------------------------------------------------ the result, on the pipeline run
    def record_result(self, config, current: dict[str, str], done: set[str]) -> None:
        """Put the run's result on the pipeline (parent) run, so pipeline runs compare in the runs table.

        Headline metrics, a markdown description (results table, the command that reproduces the
        run), tags (teacher, student shape, data, precision, git commit, registered model version)
        and the train/validation/test splits as dataset inputs; figures only from stages that are
        complete and current. Called when a pipeline run finishes, and when nothing needed doing (a
        pipeline run recorded before its result was, or whose result changed, gets it then).
        Never fails the pipeline: MLflow refusing something is a warning. ``done``: the stages whose
        outputs are complete and current (the runner checks them; tracking never imports the runner).
        """
        if not self.enabled:
            return
        try:
            self._record_result(config, current, done)
        except Exception as exc:
            log.warning(
                "MLflow: the result was not recorded on the pipeline run (%s); the stage outputs are complete "
                "and the next run tries again",
                _brief_error(exc),
            )

    def _recorded_parent(self, config) -> str | None:
        """The parent run of an earlier pipeline run of this same resolved config in this store, if still active."""
        from .config import to_yaml

        record = self.run_dir / "mlflow_run.json"
        try:
            previous = json.loads(record.read_text())
        except (OSError, ValueError):
            return None
        if previous.get("config_hash") != config_hash(to_yaml(config)) or previous.get("tracking_uri") != redact_uri(
            self.uri
        ):
            return None
        try:
            run = self.client.get_run(previous["parent_run_id"])
        except Exception:
            return None
        return run.info.run_id if run.info.lifecycle_stage == "active" else None

    def _record_result(self, config, current: dict[str, str], done: set[str]) -> None:
        ran_now = self.parent_id is not None  # stages ran in this process (start_pipeline attached a parent)
        parent_id = self.parent_id or self._recorded_parent(config)
        if parent_id is None:
            log.debug("MLflow: no pipeline run of this config to record the result on")
            return
        run = self.client.get_run(parent_id)
        if not ran_now:
            self._mark_experiment_kind(run.info.experiment_id)
        result = pipeline_result(config, self.run_dir, done)
        datasets = "prepare" in done
        digest: str | None = hashlib.sha256(
            json.dumps([result, datasets and current.get("prepare")], sort_keys=True, default=str).encode()
        ).hexdigest()[:16]
        tags = dict(result["tags"])
        note, existing = result["note"], run.data.tags.get(NOTE_TAG, "")
        ours = run.data.tags.get(NOTE_DIGEST_TAG)
        if existing and (ours is None or ours != _text_digest(existing)):  # written or edited in the UI: kept
            log.info(
                "MLflow: the description of pipeline run %s was edited in the UI; kept (the results table is not "
                "written over it)",
                parent_id,
            )
        else:
            tags.update({NOTE_TAG: note[:MAX_NOTE], NOTE_DIGEST_TAG: _text_digest(note[:MAX_NOTE])})
        if ran_now or GIT_COMMIT_TAG not in run.data.tags:  # the code that produced the outputs, not of a no-op rerun
            tags.update(git_tags())
        if run.data.tags.get(RESULT_TAG) == digest:
            if ran_now:
                self._log(parent_id, {}, {k: v for k, v in tags.items() if k in (GIT_COMMIT_TAG, GIT_DIRTY_TAG)})
            return
        self._log(parent_id, result["metrics"], tags)
        if datasets:
            try:
                self.client.log_inputs(parent_id, datasets=split_datasets(config, self.run_dir))
            except Exception as exc:
                log.warning("MLflow: the data splits were not logged as dataset inputs (%s)", _brief_error(exc))
                digest = None  # tried again next time
        if digest:
            self.client.set_tag(parent_id, RESULT_TAG, digest)  # last: a partly recorded result is redone next time
        log.info("MLflow: result recorded on pipeline run %s (%d metrics)", parent_id, len(result["metrics"]))

    def _log(self, run_id: str, metrics: dict, tags: dict) -> None:
        import time

        now = int(time.time() * 1000)
        entries = [
            self.mlflow.entities.Metric(k, float(v), now, 0)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
        ]
        run_tags = [self.mlflow.entities.RunTag(k, str(v)) for k, v in tags.items() if v is not None]
        for i in range(0, max(len(entries), len(run_tags)), 100):
            self.client.log_batch(run_id, metrics=entries[i : i + 100], tags=run_tags[i : i + 100])

    # ------------------------------------------------------------------ stages
    @contextlib.contextmanager
    def stage(self, name: str, fingerprint: str, params: dict):
        if not self.enabled:
            yield None
            return
        run = self.client.create_run(
            self.experiment_id,
            run_name=name,
            tags={
                "mlflow.parentRunId": self.parent_id,
                "attention_distill.role": "stage",
                "attention_distill.stage": name,
                "attention_distill.fingerprint": fingerprint,
                RUN_FOLDER_TAG: self.run_folder,
            },
        )
        self.stage_id = run.info.run_id
        status = "FAILED"
        try:  # from here on the run is ended whatever stops it, a Ctrl-C while its params are logged included
            flat = param_strings(params)
            if flat:
                self.client.log_batch(self.stage_id, params=[self.mlflow.entities.Param(k, v) for k, v in flat.items()])
            yield self.stage_id
            status = "FINISHED"
        except BaseException as exc:
            status = run_status(exc)
            raise
        finally:
            self._set_terminated(self.stage_id, status)
            self.stage_id = None

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        if not self.enabled or not self.stage_id:
            return
        import time

        now = int(time.time() * 1000)
        entries = [
            self.mlflow.entities.Metric(k, float(v), now, step or 0)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and v == v
        ]
        if entries:
            self.client.log_batch(self.stage_id, metrics=entries)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if self.enabled and self.stage_id:
            self.client.log_artifact(self.stage_id, str(path), artifact_path)

    def log_artifacts(self, folder: Path, artifact_path: str | None = None) -> None:
        if self.enabled and self.stage_id:
            self.client.log_artifacts(self.stage_id, str(folder), artifact_path)

    def set_tags(self, tags: dict) -> None:
        if self.enabled and self.stage_id:
            for k, v in tags.items():
                self.client.set_tag(self.stage_id, k, str(v))


def param_strings(params: dict) -> dict[str, str]:
    """MLflow param values: strings, None as empty, cut to MLflow's 6000-character limit."""
    return {k: ("" if v is None else str(v))[:6000] for k, v in params.items()}


def run_status(exc: BaseException) -> str:
    """MLflow status for a run ended by ``exc``: Ctrl-C (also re-raised as a resumable exit-130 error) is KILLED."""
    if isinstance(exc, KeyboardInterrupt) or (isinstance(exc, PipelineError) and exc.exit_code == 130):
        return "KILLED"
    return "FAILED"


def config_hash(config_yaml: str) -> str:
    return hashlib.sha256(config_yaml.encode()).hexdigest()[:16]


def _brief_error(exc: BaseException) -> str:
    """One line for a log (errors.brief: never an SQLAlchemy error's SQL), secrets redacted."""
    return redact(brief(exc))


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
