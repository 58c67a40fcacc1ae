"""Export machinery: ONNX export and parity, int8 quantization, ORT format, latency, the mobile bundle.

The export stage (stages/export.py) strings these together; each function
does one job and is usable on its own (tests, notebooks, bench scripts).

Shipped graphs have the signature ``(input_ids int64 [batch, sequence],
attention_mask int64 [batch, sequence]) -> logits float32 [batch, labels]``;
a sentence-pair model whose family has segment embeddings (BERT, ELECTRA) takes
a third input, ``token_type_ids int64 [batch, sequence]``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from .integrity import sha256_file

log = logging.getLogger("pipeline")

INPUT_NAMES = ["input_ids", "attention_mask"]
SEGMENT_INPUT = "token_type_ids"  # the third input of a sentence-pair graph


def input_names(segments: bool) -> list[str]:
    """The graph's inputs: input_ids, attention_mask (+ token_type_ids for sentence pairs with segment ids)."""
    return INPUT_NAMES + ([SEGMENT_INPUT] if segments else [])


def split_feeds(split, start: int, stop: int, pad: int) -> dict:
    """int64 numpy inputs for examples [start, stop) of a TokenizedSplit / IdSplit, right-padded to the longest;
    token_type_ids (padded with 0) when the split has them."""
    from .data import pad_batch, pad_segments

    ids, mask = pad_batch(split.input_ids[start:stop], pad)
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    if getattr(split, "token_type_ids", None) is not None:
        feeds[SEGMENT_INPUT] = pad_segments(split.token_type_ids[start:stop], ids.shape[1]).numpy()
    return feeds
OUTPUT_NAMES = ["logits"]
BUNDLE_TEMPLATES = Path(__file__).resolve().parent / "bundle_files"


# ---------------------------------------------------------------- ONNX export


class LogitsOnly(torch.nn.Module):
    """ONNX graph signature: (input_ids, attention_mask[, token_type_ids]) -> logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        segments = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **segments).logits


class HiddenStates(torch.nn.Module):
    """Feature-extractor signature: (input_ids, attention_mask[, token_type_ids]) -> last_hidden_state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        segments = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **segments).last_hidden_state


def export_onnx(module: torch.nn.Module, path: Path, opset: int, output_names: list[str] | None = None,
                segments: bool = False) -> None:
    """A single-file ONNX graph with dynamic batch and sequence axes (dynamo exporter).

    ``module`` takes (input_ids, attention_mask[, token_type_ids]); wrap a HF model in
    :class:`LogitsOnly` or :class:`HiddenStates`. ``segments`` adds the third input
    ``token_type_ids`` (sentence pairs for a family with segment embeddings). No
    external data file: mobile runtimes load one file.
    """
    # torch's exporter logs one warning per missing torchvision op; not ours to fix.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    example = (torch.ones(2, 16, dtype=torch.long), torch.ones(2, 16, dtype=torch.long))  # length 1 fails to export
    if segments:  # a pair's second segment: ones in the second half
        example += (torch.cat([torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long)], dim=1),)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    names = input_names(segments)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # raised inside torch.onnx on this version
        warnings.filterwarnings("ignore", message=".*axis name.*will not be used")  # dynamo's Dim renaming note
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module.eval(), example, str(path), dynamo=True, opset_version=opset,
                          input_names=names, output_names=output_names or OUTPUT_NAMES,
                          dynamic_shapes={name: {0: batch, 1: seq} for name in names},
                          external_data=False, optimize=True, verbose=False)
    if Path(str(path) + ".data").exists():
        raise RuntimeError(f"ONNX export of {path} wrote an external data file; the bundle needs a single file")
    # Below its native opset the exporter converts down and, when that fails, keeps
    # its own opset with only a log line: never ship a graph labelled with an opset it does not have.
    import onnx

    from .errors import ModelError

    imports = {entry.domain: entry.version for entry in onnx.load(str(path), load_external_data=False).opset_import}
    written = imports.get("", imports.get("ai.onnx"))
    if written != opset:
        raise ModelError(
            f"ONNX export of {Path(path).name} wrote opset {written}, not the requested export.opset {opset} "
            f"(torch {torch.__version__} cannot write opset {opset} for this model). Set export.opset to {written} "
            "or another opset the exporter writes (18..23).")


from .families import LAYER_SCOPE as _LAYER  # noqa: E402  (encoder layer N's module scope, every family)


def node_scopes(model) -> dict[str, str]:
    """Node name -> the innermost torch module path that produced it (from the dynamo exporter's metadata)."""
    scopes = {}
    for node in model.graph.node:
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.name_scopes":
                try:
                    names = json.loads(prop.value.replace("'", '"'))
                except json.JSONDecodeError:
                    names = re.findall(r"'([^']*)'", prop.value)
                if names:
                    scopes[node.name] = max(names, key=len)
    return scopes


def weight_matmuls(path: Path) -> list[dict]:
    """The MatMul / Gemm nodes with a constant weight, each with its module scope and encoder layer."""
    import onnx

    model = onnx.load(str(path))
    constants = {init.name for init in model.graph.initializer}
    constants |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    scopes = node_scopes(model)
    found = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in constants:
            continue
        scope = scopes.get(node.name, "")
        layer = _LAYER.search(scope)
        weight = node.input[1]
        head = any(key in scope or key in weight for key in ("pooler", "classifier"))
        found.append({"name": node.name, "op": node.op_type, "scope": scope, "head": head,
                      "layer": int(layer.group(1)) if layer else None})
    return found


def strip_node_metadata(path: Path) -> None:
    """Drop per-node exporter metadata (stack traces with build-machine paths, FX node dumps) from a shipped graph."""
    import onnx

    model = onnx.load(str(path))
    for node in model.graph.node:
        del node.metadata_props[:]
    onnx.save(model, str(path))


def onnx_parameters(path: Path) -> int:
    """Elements in the graph's initializers (weights, biases, quantization scales)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return int(sum(np.prod(init.dims, dtype=np.int64) for init in model.graph.initializer))


# ---------------------------------------------------------------- inference


def ort_session(path: Path, threads: int | None = None, custom_ops: str | None = None):
    """A CPU onnxruntime session; ``threads`` pins one sequential pool (the way latency is measured), ``custom_ops``
    registers an operator library (onnxruntime-extensions for the text-in model)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if custom_ops:
        options.register_custom_ops_library(custom_ops)
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_logits(path_or_session, split, pad: int, batch_size: int = 1) -> np.ndarray:
    """Logits of an ONNX classifier for every example of a TokenizedSplit, in order (token_type_ids fed when the
    split has them: the graph must then take them).

    One example per call by default, unpadded: the way an app calls the model, and what every recorded accuracy
    means. ``batch_size`` > 1 is a speed option; dynamic int8 then scales activations over the whole padded
    batch, so its answers depend on the other texts (see :func:`batch_invariance`)."""
    session = ort_session(path_or_session) if isinstance(path_or_session, (str, Path)) else path_or_session
    parts = []
    for start in range(0, len(split), batch_size):
        parts.append(session.run(OUTPUT_NAMES, split_feeds(split, start, start + batch_size, pad))[0])
    return np.concatenate(parts)


def batch_invariance(path, split, pad: int, one_per_call: np.ndarray, batch_size: int = 64) -> dict:
    """Whether a graph answers the same one text per call and in padded batches of ``batch_size``:
    predictions changed and the largest logit difference (``one_per_call``: its batch-1 logits)."""
    batched = onnx_logits(path, split, pad, batch_size)
    changed = int((batched.argmax(-1) != one_per_call.argmax(-1)).sum())
    diff = float(np.abs(batched - one_per_call).max())
    return {"batch_size": batch_size, "predictions_changed": changed, "max_abs_logit_diff": diff,
            "invariant": changed == 0 and diff <= 1e-4}


@torch.no_grad()
def torch_logits(model, split, pad: int, batch_size: int = 64) -> np.ndarray:
    """fp32 PyTorch logits, same batching and inputs as :func:`onnx_logits` (the parity reference)."""
    parts = []
    for start in range(0, len(split), batch_size):
        feeds = split_feeds(split, start, start + batch_size, pad)
        parts.append(model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.float().numpy())
    return np.concatenate(parts)


# ---------------------------------------------------------------- quantization


def quantization_ladder(path: Path, num_layers: int) -> list[dict]:
    """int8 settings from most to least aggressive; the stage stops at the first within the accuracy budget.

    1. per-channel int8 weights on every weight MatMul and int8 embedding
       tables (Gather): the embeddings are most of a small student's bytes,
    2. per-channel int8 weights on every weight MatMul, embeddings fp32,
    3. the same, keeping the pooler and classifier in fp32,
    4. also keeping the first (if deeper than 2 layers) and last encoder layers
       in fp32, with reduce_range (7-bit weights).
    Activations are quantized dynamically (uint8, per tensor, at run time).
    Settings that would leave nothing quantized are dropped.
    """
    nodes = weight_matmuls(path)
    head = [n["name"] for n in nodes if n["head"]]
    edge_layers = {num_layers - 1} | ({0} if num_layers > 2 else set())
    edges = [n["name"] for n in nodes if n["layer"] in edge_layers]
    candidates = [
        {"name": "per_channel_embeddings", "per_channel": True, "reduce_range": False, "exclude": [],
         "op_types": ["MatMul", "Gather"], "why": "all weight MatMuls and the embedding tables int8, per-channel scales"},
        {"name": "per_channel", "per_channel": True, "reduce_range": False, "exclude": [],
         "why": "all weight MatMuls int8, per-channel scales"},
        {"name": "per_channel_fp32_head", "per_channel": True, "reduce_range": False, "exclude": head,
         "why": "pooler and classifier kept fp32"},
        {"name": "per_channel_fp32_head_edges_reduce_range", "per_channel": True, "reduce_range": True,
         "exclude": head + edges,
         "why": f"pooler, classifier and encoder layer(s) {sorted(edge_layers)} kept fp32; 7-bit weights"},
    ]
    ladder, seen = [], set()
    for setting in candidates:
        key = (tuple(sorted(setting["exclude"])), setting["reduce_range"], tuple(setting.get("op_types", ["MatMul"])))
        if key in seen or len(set(setting["exclude"])) >= len(nodes):
            continue
        seen.add(key)
        ladder.append(setting)
    return ladder


def quantize_int8(source: Path, target: Path, setting: dict) -> dict:
    """Dynamic int8 quantization of MatMul weights; returns the settings as recorded in metadata."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    exclude = list(setting.get("exclude", []))
    # quantize_dynamic rewrites Gemm (pooler / classifier) into '<name>_MatMul' before quantizing.
    names = sorted(set(exclude) | {f"{name}_MatMul" for name in exclude})
    op_types = setting.get("op_types", ["MatMul"])
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=setting["per_channel"],
                     reduce_range=setting["reduce_range"], op_types_to_quantize=op_types, nodes_to_exclude=names)
    return {"method": "onnxruntime.quantization.quantize_dynamic", "weight_type": "int8 (QInt8, symmetric)",
            "activations": "uint8, dynamic per-tensor (computed at run time)", "op_types": op_types,
            "per_channel": setting["per_channel"], "reduce_range": setting["reduce_range"],
            "nodes_excluded": exclude, "setting": setting["name"]}


def quantize_static_int8(source: Path, target: Path, calibration: list[dict], excluded: list[str] = ()) -> dict:
    """Static QDQ int8: weights int8 per channel (every weight MatMul/Gemm and the embedding tables), activations
    uint8 with per-tensor scales fixed from ``calibration`` (batch-1 feeds of training text; MinMax), so no
    scale depends on the batch. QuantizeLinear/DequantizeLinear pairs: the format NNAPI and CoreML read."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.items = iter(calibration)

        def get_next(self):
            return next(self.items, None)

    names = sorted(set(excluded) | {f"{name}_MatMul" for name in excluded})
    with tempfile.TemporaryDirectory(dir=Path(target).parent) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Please consider to run pre-processing before quantization"
        quantize_static(str(source), str(target), Feeds(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=["MatMul", "Gemm", "Gather"], nodes_to_exclude=names,
                        calibrate_method=CalibrationMethod.MinMax,
                        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True, "CalibTensorRangeSymmetric": False,
                                       "CalibIntermediateOutputPath": str(Path(tmp) / "augmented.onnx")})
    return {"method": "onnxruntime.quantization.quantize_static (QDQ)", "weight_type": "int8 (QInt8, symmetric, per channel)",
            "activations": "uint8, static per-tensor scales (MinMax over the calibration texts)",
            "op_types": ["MatMul", "Gemm", "Gather"], "calibration_examples": len(calibration), "nodes_excluded": list(excluded)}


def quantized_node_count(path: Path) -> int:
    import onnx

    return sum(node.op_type in ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat")
               for node in onnx.load(str(path)).graph.node)


# ---------------------------------------------------------------- ORT format


def convert_to_ort(models: list[Path], out_dir: Path, target_platform: str = "arm", custom_op_library: str | None = None) -> dict:
    """ORT-format copies of ``models`` in ``out_dir`` plus one required_operators.config for all of them.

    The config lists the operators (and opsets) the models use: the input of an
    onnxruntime reduced build (build.sh --include_ops_by_config) for mobile.
    ``custom_op_library`` (the onnxruntime-extensions library) is needed when a
    model uses its operators (the text-in model); they appear in the config
    under the ai.onnx.contrib domain.
    """
    from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        work = Path(tmp) / "models"
        work.mkdir()
        for model in models:
            shutil.copy2(model, work / Path(model).name)
        chatter = io.StringIO()  # the converter prints progress lines and logs one INFO line
        logging.getLogger("ort_format_model.utils").setLevel(logging.WARNING)  # set to DEBUG at its import
        with contextlib.redirect_stdout(chatter):
            convert_onnx_models_to_ort(work, output_dir=Path(tmp) / "ort", optimization_styles=[OptimizationStyle.Fixed],
                                       target_platform=target_platform,
                                       custom_op_library_path=Path(custom_op_library) if custom_op_library else None)
        produced = {}
        for model in models:
            ort_file = Path(tmp) / "ort" / (Path(model).name[: -len(".onnx")] + ".ort")
            shutil.move(str(ort_file), out_dir / ort_file.name)
            produced[Path(model).name] = ort_file.name
        shutil.move(str(Path(tmp) / "ort" / "required_operators.config"), out_dir / "required_operators.config")
    return {"files": produced, "config": "required_operators.config", "optimization_style": "Fixed",
            "optimization_level": "all", "target_platform": target_platform}


# ---------------------------------------------------------------- latency


def latency_inputs(length: int, vocab_size: int, cls_id: int, sep_id: int, seed: int = 0, segments: bool = False) -> dict:
    """One sequence of exactly ``length`` tokens (cls ... sep: [CLS] ... [SEP], <s> ... </s>), batch 1, int64.

    ``segments``: a sentence pair of two equal halves, [CLS] a [SEP] b [SEP], with token_type_ids 0 then 1.
    """
    rng = np.random.default_rng(seed)
    low = 1000 if vocab_size > 2000 else 1  # skip BERT's unused/special block when the vocabulary is large
    ids = rng.integers(low, vocab_size, size=(1, length), dtype=np.int64)
    ids[0, 0], ids[0, -1] = cls_id, sep_id
    feeds = {"input_ids": ids, "attention_mask": np.ones((1, length), dtype=np.int64)}
    if segments:
        middle = length // 2
        ids[0, middle - 1] = sep_id
        feeds[SEGMENT_INPUT] = (np.arange(length) >= middle).astype(np.int64)[None, :]
    return feeds


def ort_runner(path: Path, threads: int):
    """A zero-argument-per-input callable: one batch-1 run of the ONNX graph at ``path``."""
    session = ort_session(path, threads)
    return lambda inputs: session.run(OUTPUT_NAMES, inputs)


def torch_runner(model, threads: int):
    def run(inputs):
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with torch.inference_mode():
                model(**{name: torch.from_numpy(value) for name, value in inputs.items()})
        finally:
            torch.set_num_threads(previous)
    return run


def add_speedups(rows: list[dict], references: dict[str, str]) -> None:
    """``speedup_vs_<key>``: the reference model's median / the row's median, on the same input and threads."""
    for key, reference in references.items():
        base = {(r["input"], r["threads"]): r["median_ms"] for r in rows if r["model"] == reference}
        for row in rows:
            ref = base.get((row["input"], row["threads"]))
            row[f"speedup_vs_{key}"] = round(ref / row["median_ms"], 3) if ref else None


def latency_markdown(rows: list[dict], machine: str, load: dict | None = None) -> str:
    busy = ""
    if load and load.get("cpu_count") and max(load["load_average_1m_before"], load["load_average_1m_after"]) > 0.75 * load["cpu_count"]:
        busy = (f" The machine was busy while measuring (1-minute load {load['load_average_1m_before']:.1f} -> "
                f"{load['load_average_1m_after']:.1f} on {load['cpu_count']} cores): multi-thread rows especially are "
                "pessimistic; compare rows measured together, and rerun the export on an idle machine for absolute figures.")
    lines = [
        "# Latency (batch 1)", "",
        f"Measured on the export machine ({machine}); all models of one input and thread count were timed side by side, "
        "interleaved round by round. `L=n`: one sequence of exactly n tokens; `sentences`: real test sentences one at a "
        "time, ms per sentence (length = their mean token count). ms: the median over rounds of a round's mean per call; "
        "middle half: the 25th-75th percentile of single calls. Speed-up vs the int8 teacher: the median of per-round "
        "ratios (each round times both) with its 95% interval; rounds are added until every interval is within "
        "export.latency_max_spread of its median, and a target is met only at the interval's lower bound. "
        f"Phones differ: use this table for ratios, not absolute figures.{busy}", "",
        "| model | runtime | input | tokens | threads | median ms | middle half, ms | rounds | speed-up vs teacher int8 "
        "(95% interval) | vs teacher PyTorch |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def speed(value):
        return f"{value:.2f}x" if value else "-"

    def paired(r):
        if not r.get("speedup_vs_teacher_int8"):
            return "-"
        low, high = r.get("speedup_vs_teacher_int8_low"), r.get("speedup_vs_teacher_int8_high")
        return f"{r['speedup_vs_teacher_int8']:.2f}x" + (f" ({low:.2f}-{high:.2f})" if low is not None else "")

    for r in rows:
        lines.append(f"| {r['model']} | {r['runtime']} | {r['input']} | {r['length']} | {r['threads']} | {r['median_ms']:.3f} | "
                     f"{r['p25_ms']:.3f}-{r['p75_ms']:.3f} | {r['rounds']} | {paired(r)} | "
                     f"{speed(r.get('speedup_vs_teacher_pytorch'))} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- tokenizer files

# Special-token roles the bundle records, each with the transformers attribute(s) that name it, in order of preference.
ROLES = {"cls": ("cls_token", "bos_token"), "sep": ("sep_token", "eos_token"), "pad": ("pad_token",),
         "unk": ("unk_token",), "mask": ("mask_token",)}
_ROLE_NAMES = {"cls": ("[CLS]", "<s>", "<cls>", "[BOS]", "<bos>"), "sep": ("[SEP]", "</s>", "<sep>", "[EOS]", "<eos>"),
               "pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "mask": ("[MASK]", "<mask>")}
_UNICODE_FORMS = ("NFC", "NFD", "NFKC", "NFKD")


def role_tokens_from_config(folder: Path) -> dict[str, str]:
    """{role: token string} from a save_pretrained folder's tokenizer_config.json / special_tokens_map.json (transformers' view)."""
    found: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the later file wins
        path = Path(folder) / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        for role, keys in ROLES.items():
            for key in keys:
                value = config.get(key)
                value = value.get("content") if isinstance(value, dict) else value  # older files store AddedToken dicts
                if isinstance(value, str) and value:
                    found[role] = value
                    break
    return found


def _flatten(component, key: str) -> list[dict]:
    """A normalizer / pre-tokenizer / post-processor with its Sequence wrappers unwrapped, in order."""
    if not component:
        return []
    if component.get("type") == "Sequence":
        return [part for child in component.get(key, []) for part in _flatten(child, key)]
    return [component]


def _token_ids(spec: dict) -> dict[str, int]:
    """token -> id for the model vocabulary (WordPiece/BPE dict, Unigram [piece, score] list) and the added tokens."""
    vocab = (spec.get("model") or {}).get("vocab") or {}
    ids = dict(vocab) if isinstance(vocab, dict) else {entry[0]: i for i, entry in enumerate(vocab)}
    ids.update({t["content"]: t["id"] for t in spec.get("added_tokens", [])})
    return ids


def _templates(spec: dict) -> tuple[list[str] | None, list[str] | None]:
    """Single and pair templates as token lists ("$A", "$B" for the texts); None, None without a special-token post-processor."""
    for post in _flatten(spec.get("post_processor"), "processors"):
        kind = post.get("type")
        if kind in ("BertProcessing", "RobertaProcessing"):
            cls, sep = post["cls"][0], post["sep"][0]
            pair = [cls, "$A", sep, sep, "$B", sep] if kind == "RobertaProcessing" else [cls, "$A", sep, "$B", sep]
            return [cls, "$A", sep], pair
        if kind == "TemplateProcessing":
            def render(items):
                return [item["SpecialToken"]["id"] if "SpecialToken" in item else "$" + item["Sequence"]["id"] for item in items]
            return render(post.get("single", [])), render(post.get("pair", []))
    return None, None


def tokenizer_facts(tokenizer_json: Path, role_tokens: dict[str, str] | None = None) -> dict:
    """What a mobile team needs to reproduce tokenization, read from tokenizer.json.

    Special tokens are recorded by role (cls, sep, pad, unk, mask) in ``special_tokens``; ``role_tokens``
    ({role: token}) names them, by default from the tokenizer_config.json next to ``tokenizer_json`` (what
    transformers calls cls_token, sep_token, ...), else from the post-processor's template and the usual names.
    ``special_token_ids`` keeps the older token -> id mapping of every special token.
    """
    tokenizer_json = Path(tokenizer_json)
    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    kind = model.get("type")
    normalizers = _flatten(spec.get("normalizer"), "normalizers")
    pre_tokenizers = _flatten(spec.get("pre_tokenizer"), "pretokenizers")
    ids = _token_ids(spec)
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    vocab = model.get("vocab") or {}
    if isinstance(vocab, dict):
        for token in ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"):
            if token not in specials and token in vocab:
                specials[token] = vocab[token]
    single, pair = _templates(spec)
    unk = model.get("unk_token")
    if kind == "Unigram" and model.get("unk_id") is not None and isinstance(vocab, list):
        unk = vocab[model["unk_id"]][0]
    given = role_tokens if role_tokens is not None else role_tokens_from_config(tokenizer_json.parent)
    roles = {}
    for role in ROLES:
        token = given.get(role)
        if token is None and single and role in ("cls", "sep"):
            marks = [t for t in single if not t.startswith("$")]
            token = (marks[0] if role == "cls" else marks[-1]) if marks else None
        if token is None and role == "unk":
            token = unk
        if token is None:
            token = next((name for name in _ROLE_NAMES[role] if name in ids), None)
        if token is not None and token in ids:
            roles[role] = {"token": token, "id": ids[token]}
    lowercase = any(n.get("type") == "Lowercase" or (n.get("type") == "BertNormalizer" and n.get("lowercase"))
                    for n in normalizers)
    strip = next((n.get("strip_accents") for n in normalizers if n.get("type") == "BertNormalizer"), None)
    if any(n.get("type") == "StripAccents" for n in normalizers):
        strip = True
    byte_level = next((p for p in pre_tokenizers if p.get("type") == "ByteLevel"), None)
    metaspace = next((p for p in pre_tokenizers if p.get("type") == "Metaspace"), None)

    def text(template):
        if not template:
            return "text" if template is not None or single is None else None
        return " ".join({"$A": "text", "$B": "text_pair"}.get(t, t) for t in template)

    return {
        "type": kind,
        "lowercase": lowercase,
        "strip_accents": strip,
        "normalizer": (spec.get("normalizer") or {}).get("type"),
        "normalizers": [n.get("type") for n in normalizers],
        "unicode_normalization": next((n["type"] for n in normalizers if n.get("type") in _UNICODE_FORMS), None),
        "pre_tokenizer": (spec.get("pre_tokenizer") or {}).get("type"),
        "pre_tokenizers": [p.get("type") for p in pre_tokenizers],
        "byte_level": byte_level is not None,
        "add_prefix_space": bool(byte_level.get("add_prefix_space")) if byte_level else None,
        "metaspace": ({"replacement": metaspace.get("replacement"), "prepend_scheme": metaspace.get("prepend_scheme")}
                      if metaspace else None),
        "continuing_subword_prefix": model.get("continuing_subword_prefix"),
        "max_input_chars_per_word": model.get("max_input_chars_per_word"),
        "merges": len(model.get("merges") or []) if kind == "BPE" else None,
        "byte_fallback": model.get("byte_fallback"),
        "unk_token": unk,
        "vocab_size": len(vocab),
        "special_token_ids": specials,
        "special_tokens": roles,
        "template": text(single) if single is not None else "text",
        "pair_template": text(pair) if pair is not None else "text text_pair",
    }


def tokenizer_files(facts: dict) -> list[str]:
    """The tokenizer files a bundle ships: tokenizer.json, plus vocab.txt for WordPiece (line number = id)."""
    return ["tokenizer.json", "vocab.txt"] if facts.get("type") == "WordPiece" else ["tokenizer.json"]


def write_bundle_tokenizer(source: Path, target_json: Path, target_vocab: Path, max_length: int) -> list[str]:
    """tokenizer.json with truncation at ``max_length`` and no padding, plus for WordPiece vocab.txt (one token per line,
    line number = id). Other models (BPE, Unigram) need their merges or scores, which only tokenizer.json holds.
    Returns the names of the files written."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source))
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    tokenizer.save(str(target_json))
    kind = json.loads(Path(target_json).read_text(encoding="utf-8")).get("model", {}).get("type")
    if kind != "WordPiece":
        return [Path(target_json).name]
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise RuntimeError("tokenizer ids are not contiguous; vocab.txt cannot represent them")
    target_vocab.write_text("".join(token + "\n" for token, _ in by_id), encoding="utf-8")
    return [Path(target_json).name, Path(target_vocab).name]


# ---------------------------------------------------------------- vocabulary trimming


class IdSplit:
    """Token ids + label ids (+ token_type_ids for pairs) in split order (duck-types TokenizedSplit for
    onnx_logits / torch_logits)."""

    def __init__(self, input_ids: list[list[int]], labels: np.ndarray, token_type_ids: list[list[int]] | None = None):
        self.input_ids = input_ids
        self.token_type_ids = token_type_ids
        self.labels = np.asarray(labels)
        self.lengths = np.asarray([len(x) for x in input_ids])

    def __len__(self) -> int:
        return len(self.input_ids)


def corpus_token_ids(prepare_dir: Path, tokenizer_json: Path,
                     splits: tuple[str, ...] = ("train", "validation", "unlabeled")) -> set[int]:
    """Every token id the training-side text uses, tokenized WITHOUT truncation.

    Untruncated: a word cut by truncation still needs all its pieces, or greedy
    WordPiece turns the whole word into [UNK]. The test split is left out, so
    its unseen words show what trimming costs on new text.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    ids: set[int] = set()
    for split in splits:
        path = Path(prepare_dir) / f"{split}.jsonl"
        if not path.is_file():
            continue
        with open(path, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        items = [(r["text"], r["text_pair"]) if "text_pair" in r else r["text"] for r in records]
        for encoding in tokenizer.encode_batch(items):
            ids.update(encoding.ids)
    return ids


def trim_vocabulary(tokenizer_json: Path, keep: set[int], target: Path) -> list[int]:
    """A WordPiece tokenizer.json restricted to ``keep`` plus every special token; returns the kept old ids, new-id order.

    Words whose pieces are all kept tokenize exactly as before (greedy longest
    match finds the same pieces); other words fall back to shorter pieces or [UNK].
    """
    from tokenizers import Tokenizer

    spec = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        raise ValueError(f"vocabulary trimming supports WordPiece tokenizers, not {model.get('type')}")
    vocab = model["vocab"]
    specials = {t["id"] for t in spec.get("added_tokens", [])}
    kept = sorted(set(keep) | specials | {vocab[model["unk_token"]]})
    new_id = {old: new for new, old in enumerate(kept)}
    token_of = {i: t for t, i in vocab.items()}
    model["vocab"] = {token_of[old]: new for new, old in enumerate(kept)}
    for token in spec.get("added_tokens", []):
        token["id"] = new_id[token["id"]]
    post = spec.get("post_processor") or {}
    for entry in (post.get("special_tokens") or {}).values():
        entry["ids"] = [new_id[i] for i in entry["ids"]]
    for key in ("sep", "cls"):  # BertProcessing / RobertaProcessing store [token, id]
        if isinstance(post.get(key), list):
            post[key][1] = new_id[post[key][1]]
    if spec.get("padding"):
        spec["padding"]["pad_id"] = new_id[spec["padding"]["pad_id"]]
    Path(target).write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    Tokenizer.from_file(str(target))  # must load
    return kept


def trim_embeddings(model, kept: list[int]):
    """``model`` (modified in place) with its word-embedding table cut to the rows in ``kept``, in that order."""
    if hasattr(model, "keep_tokens"):  # the static student: a second per-token table (its pooling weights) too
        model.keep_tokens(kept)
    else:
        old = model.get_input_embeddings()
        index = torch.tensor(kept, dtype=torch.long)
        new = torch.nn.Embedding(len(kept), old.embedding_dim, dtype=old.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(old.weight[index])
        model.set_input_embeddings(new)
    model.config.vocab_size = len(kept)
    if getattr(model.config, "pad_token_id", None) is not None:
        model.config.pad_token_id = kept.index(model.config.pad_token_id)
    return model


def tokenize_texts(tokenizer_json: Path, texts: list[str], max_length: int, pairs: list[str] | None = None,
                   segments: bool = False):
    """Token ids as the bundle's predict.py computes them (tokenizers library, truncation, no padding);
    with ``segments`` a pair (ids, type ids)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    items = list(zip(texts, pairs)) if pairs is not None else list(texts)
    encodings = tokenizer.encode_batch(items)
    if segments:
        return [e.ids for e in encodings], [e.type_ids for e in encodings]
    return [e.ids for e in encodings]


# ---------------------------------------------------------------- bundle files


def file_table(folder: Path, skip: tuple[str, ...] = ("metadata.json",)) -> dict:
    """{file: {sha256, bytes}} for every file in the bundle folder (and its demo/ folder, as "demo/<name>") except ``skip``."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.relative_to(folder).as_posix() not in skip}


def render_template(name: str, values: dict) -> str:
    """A file from pipeline/bundle_files with {{key}} placeholders filled (Kotlin/Swift braces stay intact)."""
    text = (BUNDLE_TEMPLATES / name).read_text(encoding="utf-8")
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    left = re.findall(r"\{\{(\w+)\}\}", text)
    if left:
        raise KeyError(f"template {name} has unfilled placeholders: {sorted(set(left))}")
    return text


def copy_predict_script(target: Path) -> None:
    shutil.copy2(BUNDLE_TEMPLATES / "predict.py", target)


# The browser demo's runtime: installed by `npm ci --ignore-scripts` in pipeline/bundle_files/web (package-lock.json).
WEB_RUNTIME = BUNDLE_TEMPLATES / "web" / "node_modules"
WEB_FILES = {  # file in the bundle's demo/ folder: where it comes from
    "ort.wasm.min.mjs": "onnxruntime-web/dist/ort.wasm.min.mjs",
    "ort-wasm-simd-threaded.mjs": "onnxruntime-web/dist/ort-wasm-simd-threaded.mjs",
    "ort-wasm-simd-threaded.wasm": "onnxruntime-web/dist/ort-wasm-simd-threaded.wasm",
    "tokenizers.min.mjs": "@huggingface/tokenizers/dist/tokenizers.min.mjs",
}


def write_demo(out: Path, title: str, model_file: str, max_length: int) -> dict:
    """demo.html (type a sentence, see the label and probabilities) and the onnxruntime-web and tokenizer files it
    runs on, in ``out``/demo/; without the installed web runtime, nothing is written and the reason is returned."""
    missing = [source for source in WEB_FILES.values() if not (WEB_RUNTIME / source).is_file()]
    if missing:
        return {"shipped": False, "why": (f"the browser runtime is not installed ({', '.join(missing)} missing under "
                                          f"{WEB_RUNTIME}); run `npm ci --ignore-scripts` in {WEB_RUNTIME.parent} and "
                                          "export again to get demo.html")}
    demo = Path(out) / "demo"
    demo.mkdir()
    for name, source in WEB_FILES.items():
        shutil.copy2(WEB_RUNTIME / source, demo / name)
    (Path(out) / "demo.html").write_text(render_template("demo.html", {"title": title, "model_file": model_file,
                                                                       "max_length": max_length}), encoding="utf-8")
    versions = {package: json.loads((WEB_RUNTIME / package / "package.json").read_text())["version"]
                for package in ("onnxruntime-web", "@huggingface/tokenizers")}
    return {"shipped": True, "file": "demo.html", "model": model_file, "runtime": versions,
            "files": ["demo.html", *(f"demo/{name}" for name in WEB_FILES)],
            "bytes": sum((demo / name).stat().st_size for name in WEB_FILES),
            "serve": "python -m http.server (in the bundle folder), then open http://127.0.0.1:8000/demo.html"}


# ---------------------------------------------------------------- MLflow registry


def register_onnx(model_path: Path, run_id: str, registered_name: str, alias: str, tags: dict) -> dict:
    """Log the ONNX graph as an MLflow model under ``run_id``, register it, point ``alias`` at the new version."""
    import mlflow
    import onnx
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    signature = ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.int64), (-1, -1), name) for name in INPUT_NAMES]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, -1), OUTPUT_NAMES[0])]),
    )
    active = mlflow.active_run()
    context = contextlib.nullcontext() if active and active.info.run_id == run_id else mlflow.start_run(run_id=run_id)
    with context, warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):  # "Created version ..." lines
        warnings.simplefilter("ignore")
        info = mlflow.onnx.log_model(onnx.load(str(model_path)), name="onnx_model", registered_model_name=registered_name,
                                     save_as_external_data=False, signature=signature)
    version = str(info.registered_model_version)
    client = mlflow.MlflowClient()
    client.set_registered_model_alias(registered_name, alias, version)
    for key, value in tags.items():
        client.set_model_version_tag(registered_name, version, key, str(value))
    return {"registered_model": registered_name, "version": version, "alias": alias, "model_uri": info.model_uri}
