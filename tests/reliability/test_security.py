"""Security: weights never unpickled, remote code off unless asked, YAML safe,
the UI bound to localhost, credentials never in logs, errors or MLflow."""

from __future__ import annotations

import ast
import logging
import subprocess

import pytest

from tests.helpers import ROOT
from tests.reliability.helpers import CONFIG_NAME, cli, expect_error, write_config

PRODUCT_CODE = ["pipeline", "stages", "scripts", "bench"]
FAKE_TOKEN = "hf_fake_secret_123456"


def product_sources():
    files = [p for d in PRODUCT_CODE for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 20
    return files


def dotted(node) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value.value if isinstance(kw.value, ast.Constant) else kw.value
    return None


def test_no_pickle_loading_in_the_source_tree():
    """torch.load only with weights_only=True; no pickle / unsafe YAML / allow_pickle anywhere."""
    problems = []
    for path in product_sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name, where = dotted(node.func), f"{path.relative_to(ROOT)}:{node.lineno}"
            if name.endswith("torch.load") and keyword(node, "weights_only") is not True:
                problems.append(f"{where} torch.load without weights_only=True")
            if name in ("pickle.load", "pickle.loads", "cloudpickle.load", "joblib.load", "dill.load", "marshal.loads"):
                problems.append(f"{where} {name}")
            if name in ("yaml.load", "yaml.unsafe_load", "yaml.full_load"):
                problems.append(f"{where} {name} (use yaml.safe_load)")
            if keyword(node, "allow_pickle") is True:
                problems.append(f"{where} allow_pickle=True")
            if keyword(node, "trust_remote_code") is True:
                problems.append(f"{where} trust_remote_code=True hard-coded")
            if name in ("eval", "exec"):
                problems.append(f"{where} {name}()")
    assert not problems, "\n".join(problems)


@pytest.fixture
def recorded(monkeypatch):
    """Record the kwargs of every transformers loader the pipeline calls."""
    import pipeline.models as models

    calls = []

    def recorder(kind, real):
        def load(reference, *args, **kwargs):
            calls.append((kind, kwargs))
            return real(reference, *args, **kwargs)

        return load

    for kind, cls in (
        ("model", models.AutoModelForSequenceClassification),
        ("config", models.AutoConfig),
        ("tokenizer", models.AutoTokenizer),
    ):
        monkeypatch.setattr(cls, "from_pretrained", recorder(kind, cls.from_pretrained))
    return calls


@pytest.fixture(scope="module")
def teacher_folder(base_run):
    return base_run.runs_dir / CONFIG_NAME / "teacher" / "model"


def test_teacher_loader_uses_safetensors_and_no_remote_code(recorded, teacher_folder):
    from pipeline.config import load_config
    from pipeline.models import build_teacher_for_finetune, load_classifier, load_tokenizer, teacher_model_config

    config = load_config("tiny", [f"teacher.model={teacher_folder}", "teacher.finetune=false"])
    teacher_model_config(config)
    build_teacher_for_finetune(config, ["fresh", "rotten"], 30522)
    load_classifier(str(teacher_folder))  # how capture / distill / evaluate reload the teacher
    load_tokenizer(str(teacher_folder))
    kinds = {kind for kind, _ in recorded}
    assert kinds == {"model", "config", "tokenizer"}
    for kind, kwargs in recorded:
        assert kwargs.get("trust_remote_code") is False, (kind, kwargs)
        if kind == "model":
            assert kwargs.get("use_safetensors") is True, kwargs


def test_trust_remote_code_only_when_the_config_says_so(recorded, teacher_folder):
    from pipeline.config import load_config
    from pipeline.models import build_teacher_for_finetune, load_tokenizer, teacher_model_config, tokenizer_reference

    assert load_config("tiny").teacher.trust_remote_code is False  # the default
    config = load_config(
        "tiny", [f"teacher.model={teacher_folder}", "teacher.finetune=false", "teacher.trust_remote_code=true"]
    )
    teacher_model_config(config)
    build_teacher_for_finetune(config, ["fresh", "rotten"], 30522)
    load_tokenizer(tokenizer_reference(config), config.teacher.trust_remote_code)
    assert recorded and all(kwargs.get("trust_remote_code") is True for _, kwargs in recorded)
    assert all(kwargs.get("use_safetensors") is True for kind, kwargs in recorded if kind == "model")


@pytest.mark.parametrize("where", ["file", "override"])
def test_yaml_object_tags_are_rejected(tmp_path, where):
    marker = tmp_path / "pwned"
    payload = f'!!python/object/apply:os.system ["touch {marker}"]'
    if where == "file":
        path = write_config(tmp_path, CONFIG_NAME, f"seed: 1\ndescription: {payload}\n")
        expect_error(
            "validate", str(path), code=2, phrases=(f"{path}, line 2", "not valid yaml", "python/object/apply")
        )
    else:
        expect_error(
            "validate", "tiny", f"description={payload}", code=2, phrases=("override 'description=", "not valid yaml")
        )
    assert not marker.exists()


@pytest.mark.process
def test_make_ui_binds_localhost():
    dry = subprocess.run(["make", "-n", "ui", "RUNS_DIR=/tmp/rel-ui"], cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in dry.stdout.splitlines() if "mlflow ui" in line or "mlflow server" in line]
    assert lines, dry.stdout + dry.stderr
    for line in lines:
        assert "--host 127.0.0.1" in line and "0.0.0.0" not in line, line
    makefile = (ROOT / "Makefile").read_text()
    assert "0.0.0.0" not in makefile
    server_script = (ROOT / "scripts" / "mlflow_server.sh").read_text()
    assert "HOST=${MLFLOW_HOST:-127.0.0.1}" in server_script and "0.0.0.0" not in server_script


def test_redact_uri():
    from pipeline.redaction import redact_uri

    assert redact_uri("http://bob:pa55word@mlflow.internal:5000/api") == "http://***@mlflow.internal:5000/api"
    assert redact_uri("postgresql://user:pw@db/mlflow") == "postgresql://***@db/mlflow"
    assert redact_uri("https://token123@host") == "https://***@host"
    assert redact_uri("sqlite:////tmp/runs/mlflow.db") == "sqlite:////tmp/runs/mlflow.db"
    assert redact_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_redacting_filter_masks_messages_args_and_tracebacks(monkeypatch):
    import io

    from pipeline.redaction import RedactingFilter, redact

    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://alice:uri-secret-99@127.0.0.1:1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # short, non-secret values are left alone
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("rel-redaction-test")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)  # the CLI sets the root logger to ERROR
    try:
        logger.warning("token %s and password %s", FAKE_TOKEN, "uri-secret-99")
        try:
            raise RuntimeError(f"request failed with Authorization: Bearer {FAKE_TOKEN}")
        except RuntimeError:
            logger.exception("while calling the hub")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert FAKE_TOKEN not in text and "uri-secret-99" not in text
    assert "token *** and password ***" in text and "Bearer ***" in text and "Traceback" in text
    assert redact("parallelism false") == "parallelism false"


def test_fake_token_never_reaches_logs_errors_or_mlflow(run_copy, tmp_path):
    import mlflow

    env = {"HF_TOKEN": FAKE_TOKEN, "HUGGING_FACE_HUB_TOKEN": FAKE_TOKEN, "MLFLOW_TRACKING_TOKEN": FAKE_TOKEN}
    result = cli(
        "run", run_copy.config, "seed=7", "--only", "prepare", "--debug", "--runs-dir", str(run_copy.runs_dir), env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # An error whose text would contain the secret (a value pasted into the wrong key) is printed redacted.
    failing = cli("validate", run_copy.config, f"seed={FAKE_TOKEN}", "--debug", env=env)
    assert failing.returncode == 2 and "Traceback" in failing.stderr and '(got "***")' in failing.stderr
    for output in (result.stdout, result.stderr, failing.stdout, failing.stderr):
        assert FAKE_TOKEN not in output
    client = mlflow.MlflowClient(f"sqlite:///{run_copy.runs_dir / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs
    for run in runs:
        for value in [*run.data.params.values(), *run.data.tags.values(), *run.data.params.keys()]:
            assert FAKE_TOKEN not in str(value), run.info.run_name
    stored = [run_copy.runs_dir / "mlflow.db", *[p for p in run_copy.runs_dir.rglob("*") if p.is_file()]]
    assert not [str(p) for p in stored if FAKE_TOKEN.encode() in p.read_bytes()]
