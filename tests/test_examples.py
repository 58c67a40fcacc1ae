"""Every command example the user reads (README.md, docs/*.md and the command line's --help) parses as the command
line parses it, names a config and a sweep file that exist, and gives overrides and picks the schema accepts (issue
29; `sweep ... --pick ... distill.epochs=3` from the README used to end in "unrecognized arguments"); `make` examples
expand to the command checked; and every `run` / `status` / `validate` example runs to completion, as written but on
the tiny config (a bert_small run takes 14 minutes), its stages done afterwards. Those that rerun the export add
export.executorch=off: the ExecuTorch lowering is 29 s of each tiny export, and the session's tiny run covers it.
Sweep examples name bert_small's sweep files, whose teacher layers tiny does not have: they are parsed and every
variant validated here, and the same command shape (`sweep tiny <file> --pick ...`) runs in tests/test_sweep.py;
several processes or nodes run in tests/test_multiprocess.py and tests/test_multinode.py."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from pipeline import cli
from pipeline.config import load_config
from pipeline.runner import STAGES, stage_status
from pipeline.sweep import load_sweep, parse_pick
from tests.helpers import ROOT
from tests.reliability.helpers import cli as run_in_process

COMMAND = re.compile(r"(python -m pipeline(?=[\s`]|$)|make (?:distill|sweep|status)\b)([^`\n#]*)")


def help_texts() -> dict[str, str]:
    parser = cli.build_parser()
    texts = {"python -m pipeline --help": parser.format_help()}
    for action in parser._subparsers._group_actions:  # each subcommand's own --help
        for name, sub in action.choices.items():
            texts[f"python -m pipeline {name} --help"] = sub.format_help()
    return texts


def examples() -> list[tuple[str, str]]:
    """(where, command line) for every example, as a user would copy it."""
    sources = {
        path.relative_to(ROOT).as_posix(): path.read_text()
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    }
    sources.update(help_texts())
    found = []
    for where, text in sources.items():
        for match in COMMAND.finditer(text):
            line = (match.group(1) + match.group(2)).strip().rstrip(".,;:)")
            # a pattern (<name>, `make distill ... X=1`, `NNODES=`) or a usage line, not an example
            if re.search(r"<\w+>|\[|=$|\.\.\.|name$", line):
                continue
            found.append((where, line))
    return sorted(set(found))


def as_argv(line: str) -> list[str]:
    """The pipeline's own argv for an example: `make` targets as the Makefile expands them."""
    words = shlex.split(line)
    if words[:3] == ["python", "-m", "pipeline"]:
        return words[3:]
    target, settings = words[1], dict(word.split("=", 1) for word in words[2:])
    extra = shlex.split(settings.get("ARGS", ""))
    config = settings.get("CONFIG", "bert_small")
    if target == "sweep":
        pick = ["--pick", settings["PICK"]] if "PICK" in settings else []
        return ["sweep", config, settings.get("SWEEP", "configs/sweeps/depth.yaml"), *extra, *pick]
    return ["run" if target == "distill" else target, config, *extra]


EXAMPLES = examples()


def test_the_examples_are_found():
    commands = {line for _, line in EXAMPLES}
    assert len(EXAMPLES) >= 20
    assert any(line.startswith("make distill CONFIG=bert_small") for line in commands)
    assert any("--pick" in line and "distill.epochs=1" in line for line in commands)  # the README's sweep case


@pytest.mark.parametrize("where, line", EXAMPLES, ids=[f"{where}: {line}" for where, line in EXAMPLES])
def test_every_example_parses_and_validates(where, line):
    argv = as_argv(line)
    if "--help" in argv:
        with pytest.raises(SystemExit) as exit_:
            cli.parse(argv)
        assert exit_.value.code == 0
        return
    args = cli.parse(argv)  # argparse errors exit 2: the example would not even start
    if args.command == "sweep":
        sweep = load_sweep(args.config, ROOT / args.sweep, args.overrides)
        assert sweep.variants, line
        if args.pick:
            assert parse_pick(args.pick), line
    else:
        config = load_config(args.config, args.overrides)
        assert config.name, line


MAKE_EXAMPLES = sorted({line for _, line in EXAMPLES if line.startswith("make ")})


@pytest.mark.process
@pytest.mark.parametrize("line", MAKE_EXAMPLES)
def test_make_runs_what_the_example_is_checked_as(line):
    """`make -n` (the Makefile's own expansion, nothing run) gives the pipeline command as_argv checks above; the
    launcher for several processes or nodes accepts its settings (--dry-run)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under `make test`
    make = subprocess.run(
        ["make", "-n", "--no-print-directory", *shlex.split(line)[1:]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert make.returncode == 0, make.stderr
    lines = make.stdout.replace("\\\n", " ").strip().splitlines()
    command = shlex.split(next(line for line in reversed(lines) if " -m pipeline" in line))
    assert command[0].endswith("python") and command[1] == "-m", command
    if command[2] == "pipeline.launch":  # NPROC / NNODES: the launcher, then `pipeline run` with what follows --
        dry = subprocess.run(
            [sys.executable, *command[1 : command.index("--")], "--dry-run", *command[command.index("--") :]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert dry.returncode == 0, dry.stderr
        argv = ["run", *command[command.index("--") + 1 :]]
    else:
        assert command[2] == "pipeline", command
        argv = command[3:]
    assert argv[-2] == "--runs-dir"
    assert argv[:-2] == as_argv(line), (line, command)


# ---------------------------------------------------------------- the examples, run


NO_PTE = "export.executorch=off"


def on_tiny(argv: list[str]) -> list[str]:
    """The example's argv with its config replaced by tiny: every option and override kept as written."""
    return [argv[0], "tiny", *argv[2:]]


RUNNABLE = []  # (argv on tiny, where it was read), each distinct command once
for _where, _line in EXAMPLES:
    if "NPROC=" in _line or "NNODES=" in _line:
        continue
    _argv = as_argv(_line)
    if (
        _argv[0] in ("run", "status", "validate")
        and "--help" not in _argv
        and on_tiny(_argv) not in [a for a, _ in RUNNABLE]
    ):
        RUNNABLE.append((on_tiny(_argv), _where))
# They share one run folder: those without overrides first (they find the session's run complete), then those with
# overrides, the one that changes the seed (everything reruns) last.
RUNNABLE.sort(key=lambda item: (any("=" in word for word in item[0]), any(w.startswith("seed=") for w in item[0])))


def test_the_runnable_examples_are_found():
    commands = [" ".join(argv) for argv, _ in RUNNABLE]
    for expected in (
        "run tiny",
        "run tiny distill.epochs=1 seed=3",
        "run tiny --from distill",
        "run tiny --only evaluate --force",
        "run tiny --to evaluate",
        "status tiny",
        "validate tiny",
    ):
        assert expected in commands, commands


@pytest.fixture(scope="module")
def example_runs(tiny_run, tmp_path_factory):
    """A copy of the session's complete tiny run that the examples run in, one after another."""
    runs_dir = tmp_path_factory.mktemp("example_runs")
    shutil.copytree(tiny_run["runs_dir"], runs_dir, dirs_exist_ok=True)
    return runs_dir


def parsed(argv: list[str]):
    """The command line as the command reads it: --from / --only / --to as single stages (cli.stage_range)."""
    args = cli.parse(argv)
    if args.command == "run":
        cli.stage_range(args)
    return args


def covered_stages(args) -> list[str]:
    first, last = args.only or args.from_stage or STAGES[0], args.only or args.to_stage or STAGES[-1]
    return STAGES[STAGES.index(first) : STAGES.index(last) + 1]


@pytest.mark.parametrize("argv, where", RUNNABLE, ids=[" ".join(a) for a, _ in RUNNABLE])
def test_every_run_example_runs_to_completion(example_runs, argv, where):
    """The example exits 0 without a traceback; afterwards every stage it covers is done for its config and
    overrides; the stages a --force / --from example asks to rerun were written by it."""
    args = parsed(argv)
    if args.command == "run" and "export" in covered_stages(args) and (args.force or args.from_stage or args.overrides):
        argv = [*argv, NO_PTE]
        args = parsed(argv)
    config = cli._resolved(load_config(args.config, args.overrides))  # as the command resolves it (precision auto)
    started = time.time()
    result = run_in_process(*argv, "--runs-dir", str(example_runs))
    assert result.returncode == 0, (where, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    if args.command == "validate":
        assert result.stdout.startswith("name: tiny"), result.stdout[:2000]
        return
    states = {row["stage"]: row for row in stage_status(config, example_runs)}
    if args.command == "status":
        for stage in STAGES:
            assert re.search(rf"^{stage} +{states[stage]['state']} ", result.stdout, re.M), result.stdout
        return
    covered = covered_stages(args)
    assert {s: states[s]["state"] for s in covered} == {s: "done" for s in covered}, result.stderr[-3000:]
    rerun = covered if args.force or args.from_stage else []
    for stage in rerun:
        written = (example_runs / "tiny" / stage / "manifest.json").stat().st_mtime
        assert written >= started, f"{where}: `{' '.join(argv)}` did not rerun {stage}"
