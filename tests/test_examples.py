"""Every command example the user reads (README.md, docs/*.md and the command line's --help) parses as the command
line parses it, names a config and a sweep file that exist, and gives overrides and picks the schema accepts: the
example is what the command would run, checked without running it (issue 29; `sweep ... --pick ... distill.epochs=3`
from the README used to end in "unrecognized arguments")."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from pipeline import cli
from pipeline.config import load_config
from pipeline.sweep import load_sweep, parse_pick
from tests.helpers import ROOT

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
    sources = {path.relative_to(ROOT).as_posix(): path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
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


@pytest.mark.parametrize("where, line", EXAMPLES, ids=[f"{w}: {l}" for w, l in EXAMPLES])
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


@pytest.mark.parametrize("line", MAKE_EXAMPLES)
def test_make_runs_what_the_example_is_checked_as(line):
    """`make -n` (the Makefile's own expansion, nothing run) gives the pipeline command as_argv checks above; the
    launcher for several processes or nodes accepts its settings (--dry-run)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under `make test`
    make = subprocess.run(["make", "-n", "--no-print-directory", *shlex.split(line)[1:]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert make.returncode == 0, make.stderr
    lines = make.stdout.replace("\\\n", " ").strip().splitlines()
    command = shlex.split(next(line for line in reversed(lines) if " -m pipeline" in line))
    assert command[0].endswith("python") and command[1] == "-m", command
    if command[2] == "pipeline.launch":  # NPROC / NNODES: the launcher, then `pipeline run` with what follows --
        dry = subprocess.run([sys.executable, *command[1:command.index("--")], "--dry-run", *command[command.index("--"):]],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, dry.stderr
        argv = ["run", *command[command.index("--") + 1:]]
    else:
        assert command[2] == "pipeline", command
        argv = command[3:]
    assert argv[-2] == "--runs-dir"
    assert argv[:-2] == as_argv(line), (line, command)
