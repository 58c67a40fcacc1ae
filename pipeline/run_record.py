"""What a pipeline run records about itself on its MLflow parent run: its result (headline metrics, the
description shown in the UI, tags) read from its stages' outputs, the commands that reproduce it, the git commit
of the code that ran, and its data splits as MLflow dataset inputs."""

from __future__ import annotations

import json
from pathlib import Path

GIT_COMMIT_TAG = "mlflow.source.git.commit"
GIT_DIRTY_TAG = "attention_distill.git_dirty"
REGISTERED_TAG = "attention_distill.registered_model"
SPLIT_CONTEXTS = {"train": "training", "validation": "validation", "test": "test"}


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def pipeline_result(config, run_dir: Path, done: set[str]) -> dict:
    """metrics, note (markdown description) and tags of the pipeline run, from the outputs of the stages in ``done``."""
    from .summary import headline_metrics, markdown_results, summary_rows

    rows, setting, evaluate, export = summary_rows(run_dir, done)
    metrics = headline_metrics(evaluate, export)
    tags = result_tags(config, run_dir, done)
    registered = tags.get(REGISTERED_TAG)
    lines = [config.description.strip() or f"Attention distillation, config `{config.name}`.", ""]
    facts = [f"config `{config.name}`", f"teacher `{tags['attention_distill.teacher']}`"]
    if "attention_distill.student_layers" in tags:
        shape = f"{tags['attention_distill.student_layers']} layer{'s' if tags['attention_distill.student_layers'] != '1' else ''}"
        if "attention_distill.student_ffn" in tags:
            shape += f", FFN {tags['attention_distill.student_ffn']}"
        facts.append(f"student {shape}")
    facts += [f"data {tags['attention_distill.data']}", f"precision {config.precision}"]
    examples = evaluate.get("examples") or export.get("examples")
    lines += [f"**Results**{f' (test split, {examples} examples)' if examples else ''}: " + "; ".join(facts) + ".", ""]
    lines += [markdown_results(rows, setting, evaluate, export), ""]
    if registered:
        name, _, version = registered.rpartition("/")
        lines += [f"Registered model: [{name} version {version}](#/models/{name}/versions/{version}).", ""]
    lines += [
        "**Reproduce**",
        "",
        "```sh",
        *reproduce_commands(config),
        "```",
        "",
        "The exact resolved configuration is this run's artifact `config/resolved.yaml`; "
        "`python -m pipeline run resolved.yaml` reruns it as recorded.",
    ]
    return {"metrics": metrics, "note": "\n".join(lines), "tags": tags}


def result_tags(config, run_dir: Path, done: set[str]) -> dict[str, str]:
    """Teacher, student shape, data, precision and the registered model version of a pipeline run."""
    teacher = config.teacher.model
    if teacher == "random" and config.teacher.random is not None:
        shape = config.teacher.random
        teacher = f"random ({shape.num_layers} layers, hidden {shape.hidden_size}, FFN {shape.intermediate_size})"
    tags = {
        "attention_distill.teacher": teacher,
        "attention_distill.data": data_source(config),
        "attention_distill.precision": config.precision,
    }
    student = _read_json(run_dir / "distill" / "student" / "config.json") if "distill" in done else {}
    layers = student.get("num_hidden_layers") or config.student_depth()
    ffn = student.get("intermediate_size") or config.student.ffn_size
    if layers:
        tags["attention_distill.student_layers"] = str(layers)
    if ffn:
        tags["attention_distill.student_ffn"] = str(ffn)
    if student.get("hidden_size"):
        tags["attention_distill.student_width"] = (
            f"{student['hidden_size']} ({student.get('num_attention_heads')} heads)"
        )
    if "export" in done:
        version = _read_json(run_dir / "export" / "export.json").get("registered_version")
        name = (_read_json(run_dir / "export" / "bundle" / "metadata.json").get("source") or {}).get("registered_model")
        if version and name:
            tags[REGISTERED_TAG] = f"{name}/{version}"
    return tags


def data_source(config) -> str:
    """Where a config's data comes from, in a few words."""
    data = config.data
    if data.source == "rotten_tomatoes":
        where = "rotten_tomatoes (packaged)"
    elif data.source == "hub":
        where = f"hub {data.hub_name}" + (f"/{data.hub_config}" if data.hub_config else "")
    elif data.path:
        where = f"{data.source} {data.path}"
    else:
        where = f"{data.source} " + ", ".join(f"{s}={getattr(data, s)}" for s in SPLIT_CONTEXTS if getattr(data, s))
    return where + (f", first {data.max_examples} examples" if data.max_examples else "")


def override_args(config) -> list[str] | None:
    """key=value overrides that turn configs/<name>.yaml into this resolved config; None when no such file rebuilds it."""
    import shlex

    import yaml

    from .config import flatten, load_config

    try:
        base = load_config(config.name).model_dump(mode="json")
    except Exception:
        return None
    target = config.model_dump(mode="json")
    flat_base, flat_target = flatten(base), flatten(target)
    overrides = []
    for key, value in flat_target.items():
        if key in flat_base and flat_base[key] == value:
            continue
        if isinstance(value, str):
            text = value
            try:
                plain = yaml.safe_load(value) == value and value.strip() == value and value != ""
            except yaml.YAMLError:
                plain = False
            if not plain:
                text = json.dumps(value)
        else:
            text = json.dumps(value)
        overrides.append(f"{key}={text}")
    try:
        if load_config(config.name, overrides).model_dump(mode="json") != target:
            return None
    except Exception:
        return None
    return [shlex.quote(item) for item in overrides]


def reproduce_commands(config) -> list[str]:
    """The commands that rerun this configuration (make and python -m pipeline)."""
    overrides = override_args(config)
    if overrides is None:
        return [f"python -m pipeline run {config.name}   # as resolved: this run's artifact config/resolved.yaml"]
    args = " ".join(overrides)
    commands = []
    if not any(c in args for c in '"$`\\'):
        commands += [f"make distill CONFIG={config.name}" + (f' ARGS="{args}"' if args else ""), "# or"]
    commands.append(f"python -m pipeline run {config.name}" + (f" {args}" if args else ""))
    return commands


def git_tags() -> dict[str, str]:
    """The git commit of the pipeline's code (and whether tracked files differ from it); empty outside a repository."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return {}
        tags = {GIT_COMMIT_TAG: head.stdout.strip()}
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if status.returncode == 0:
            tags[GIT_DIRTY_TAG] = "true" if status.stdout.strip() else "false"
        return tags
    except (OSError, subprocess.SubprocessError):
        return {}


def split_datasets(config, run_dir: Path) -> list:
    """The prepare stage's train/validation/test records as MLflow dataset inputs, context training/validation/test."""
    import warnings

    import pandas as pd
    from mlflow.data.pandas_dataset import from_pandas
    from mlflow.entities import DatasetInput, InputTag

    inputs = []
    for split, context in SPLIT_CONTEXTS.items():
        path = (Path(run_dir) / "prepare" / f"{split}.jsonl").resolve()
        with open(path, encoding="utf-8") as handle:
            frame = pd.DataFrame.from_records([json.loads(line) for line in handle if line.strip()])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "source can be interpreted in multiple ways": a local file either way
            dataset = from_pandas(
                frame, source=str(path), targets="label" if "label" in frame else None, name=f"{config.name}-{split}"
            )
        inputs.append(DatasetInput(dataset._to_mlflow_entity(), [InputTag("mlflow.data.context", context)]))
    return inputs
