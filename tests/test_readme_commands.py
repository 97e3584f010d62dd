"""Every command shown in a fenced ```bash block of README.md and of docs/*.md is exercised, so an example that
stops working fails CI. The commands run in a scratch workspace that looks like the quickstart's: `recipes/` holds the
real recipes, except that `recipes/quickstart.yaml` is the real file shrunk to a tiny random target (its drafter
block size and bench gamma sweep are kept, so the README's `bench --gamma 10..20` must fit its drafters), and
`runs/quickstart/` is made by running the tiny quickstart first. Each `pdraft` command then runs as typed,
in-process through `pdraft.cli.main.main`, and must exit 0 without a traceback. Names the README uses for the
user's own files (`./my-qwen3`, `prompts.jsonl`, a Hub id) are mapped to tiny stand-ins in SUBSTITUTE; long
one-off builds are rewritten to their tiny variant in REWRITE; commands that need the network, a GPU or several
processes (or an hour-long build) are listed in PARSE_ONLY with the reason and only have their arguments parsed
(the real parser, with every command's body replaced by a recorder); install commands (venv, activate, pip,
pytest) and the benchmark scripts (minutes to hours each; benchmarks/README.md has their figures) are checked for
shape only. A command none of these covers fails with a message saying where to register it: nothing is
skipped silently. The extractor and the runner are also tested on a small synthetic README, including a broken
command that must fail."""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from reliability_support import run_cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))  # the README is a door; the pages behind it hold most commands
HOW_TO_REGISTER = ("register it in tests/test_readme_commands.py: SUBSTITUTE (a tiny stand-in for a file or Hub id), "
                   "REWRITE (a tiny variant of a long build), PARSE_ONLY (network / GPU / several processes, with "
                   "the reason) or SHAPE_CHECKS (install tooling)")

# ------------------------------------------------------------------------------------------------- registry

# The real quickstart recipe shrunk to seconds: every other key (above all drafter.block_size and bench.gamma)
# is kept from recipes/quickstart.yaml. `target` is replaced whole by the embedded target's seconds-long test
# variant (same tokenizer, mask token and chat template as builtin:tiny-stdlib; 2 layers, so the layer ids are
# given: decoder layer 0, not the last layer).
SHRINK = {
    "data": {"max_samples": 8, "max_length": 64, "regenerate_max_new_tokens": 8, "regenerate_batch_size": 8,
             "shard_tokens": 512},
    "drafter": {"num_layers": 1, "markov_rank": 8, "draft_vocab_size": 64},  # EAGLE-3's: the tiny target has 512
    "train": {"steps": 2, "batch_size": 2, "warmup_steps": 0, "num_anchors": 2, "checkpoint_every": 1,
              "eval_every": 2, "log_every": 1},
    "calibrate": {"num_prompts": 4, "max_new_tokens": 6, "min_samples": 1, "sps_max_batch_tokens": 4,
                  "sps_repeats": 1},
    "decode": {"max_new_tokens": 6},
    "bench": {"num_prompts": 1, "max_new_tokens": 6},
    "runtime": {"device": "cpu", "threads": 1, "offline": True},
}
KEPT = ("drafter.block_size", "drafter.kind", "bench.gamma", "bench.prompt_sets")  # what SHRINK must not touch


def _hub_copy(ws: Path, repo_id: str, source: str) -> str:
    """Put the tiny drafter `source` into the workspace's Hugging Face cache under `repo_id`: the README's
    command then runs as typed, offline, against the cached copy."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_hub_support import folder_files, put_in_cache

    if not (ws / "hf-cache" / f"models--{repo_id.replace('/', '--')}").exists():
        put_in_cache(ws / "hf-cache", repo_id, folder_files(ws / source))
    return repo_id


# README name of a user's file or Hub id -> its tiny stand-in (a function of the workspace, returning the
# argument to pass). Paths that exist in the workspace (recipes/..., runs/quickstart/...) need no entry.
SUBSTITUTE = {
    "./my-qwen3": lambda ws: str(ws / "tiny" / "target"),  # a copy of builtin:tiny-stdlib-test
    "./my-drafter": lambda ws: "runs/quickstart/dspark/final",
    "./drafter": lambda ws: "runs/quickstart/dspark/final",
    "prompts.jsonl": lambda ws: str(ws / "tiny" / "prompts.jsonl"),
    "recipe.yaml": lambda ws: "recipes/quickstart.yaml",  # docs/SCALING.md's user recipe: the tiny quickstart
    "./llama-3.1-70b-config": lambda ws: str(ws / "tiny" / "target"),  # a config-only folder: the tiny target's
    "../shared/datasets/humaneval.jsonl": lambda ws: str(ws / "tiny" / "prompts.jsonl"),
    "deepseek-ai/dspark_qwen3_4b_block7": lambda ws: _hub_copy(ws, "deepseek-ai/dspark_qwen3_4b_block7",
                                                               "runs/quickstart/dspark/final"),
}

# Option values that are outputs (created by the command, relative to the workspace), never looked up.
OUTPUT_OPTIONS = {"--out", "--prompts-out", "--metrics"}


def _tiny_build(args: list[str]) -> list[str]:
    """`target build|eval tiny-stdlib` takes an hour: the same code path on the seconds-long test variant."""
    args = ["tiny-stdlib-test" if a == "tiny-stdlib" else a for a in args]
    return args + (["--tokens", "256"] if args[:2] == ["target", "eval"] and "--tokens" not in args else [])


def _monitor_once(args: list[str]) -> list[str]:
    """monitor follows the stream forever: render one frame, and let the OS pick the Prometheus port."""
    args = list(args)
    if "--prometheus-port" in args:
        args[args.index("--prometheus-port") + 1] = "0"
    return args + ["--once"]


# pdraft sub-command -> how its README form is run instead (the reason is in each function's docstring).
REWRITE = {("target", "build"): _tiny_build, ("target", "eval"): _tiny_build, ("monitor",): _monitor_once}

# Regular expression on the command text -> why it is only parsed. A GPU entry applies only without CUDA.
PARSE_ONLY = {
    r"^pdraft push\b": "uploads to the Hugging Face Hub (network and a token)",
    r"^torchrun\b": "several processes, one per GPU",
    r"runtime\.device=cuda|--device[ =]cuda": "needs a CUDA device",
    r"tiny-stdlib-candidate": "builds or uses the candidate target, a 63-minute build (docs/TARGET.md)",
    r"--concurrency 1,4,16,32": "the docs' serving sweep, about 10 minutes (docs/BENCH.md has its figures); the "
                                "done-when command beside it runs for real",
    r"smollm2": "converts and runs the 135M-parameter SmolLM2 target (its lifecycle takes hours on 2 cores); "
                "tests/test_smollm2_target.py runs its conversion, `target eval` and recipe for real",
    r"check-serving|--format vllm .*--check\b": "serves the export in vLLM's own venv (an engine start is minutes on "
                                                "a CPU); tests/test_serving_check_vllm.py and .ci/run run it for real",
}


# Regular expression on the command text -> a bug this test found that another module owns. The case is a strict
# xfail: it must fail now, and it fails the suite the moment the bug is fixed, so the entry gets removed.
KNOWN_BROKEN: dict[str, str] = {}  # pattern -> why; a strict xfail, so a fixed command turns the suite red


def _needs_gpu(reason: str) -> bool:
    return "CUDA" in reason


# ------------------------------------------------------------------------------------------------ extractor


@dataclass
class Command:
    text: str  # one logical command line (continuations joined, trailing comment dropped)
    line: int  # its line in the file
    parts: list[list[str]] = field(default_factory=list)  # the && chain, one argv per simple command
    error: str | None = None  # shell syntax the runner does not support
    where: str = "README.md"  # the file it is shown in

    @property
    def id(self) -> str:
        return f"{self.where}:L{self.line}:{self.text[:70]}"


FENCE = re.compile(r"^(\s*)```+\s*(\w*)")


def extract_commands(markdown: str, where: str = "README.md") -> list[Command]:
    """Every command line of every fenced bash/sh/shell block, in order."""
    commands: list[Command] = []
    lang, pending, start = None, "", 0
    for number, line in enumerate(markdown.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            lang = None if lang is not None else (m.group(2) or "").lower()
            continue
        if lang not in ("bash", "sh", "shell"):
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        if text and not text.startswith("#"):
            command = split_command(text, start)
            command.where = where
            commands.append(command)
    return commands


def split_command(text: str, line: int) -> Command:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError as e:
        return Command(text, line, error=f"cannot split it as a shell command: {e}")
    shown = text.split(" #")[0].strip()
    parts: list[list[str]] = [[]]
    for tok in tokens:
        if tok == "&&":
            parts.append([])
        elif tok and set(tok) <= set("|&;<>()"):
            return Command(shown, line, error=f"shell syntax {tok!r} is not supported by the README runner")
        else:
            parts[-1].append(tok)
    return Command(shown, line, [p for p in parts if p])


# ---------------------------------------------------------------------------------------------- shape checks


def _check_venv(argv, state):
    assert argv[-3:-1] == ["-m", "venv"] or argv[1:3] == ["-m", "venv"], argv
    state["venv"] = argv[-1]


def _check_activate(argv, state):
    assert len(argv) == 2 and argv[1] == f"{state.get('venv', '.venv')}/bin/activate", \
        f"activates {argv[1]!r}, but the venv made before is {state.get('venv')!r}"


def _check_pip(argv, state):
    """Each requirement parses (a pinned version where one is given); `-e PATH[extras]` names this project and
    extras it defines."""
    import tomllib

    from packaging.requirements import Requirement

    args = argv[argv.index("install") + 1:]
    assert args, "pip install with nothing to install"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    editable = False
    for a in args:
        if editable or a in (".",) or a.startswith(".["):
            m = re.fullmatch(r"\.(\[([\w,-]+)\])?", a)
            assert m, f"editable install of {a!r}: expected . or .[extra]"
            for extra in filter(None, (m.group(2) or "").split(",")):
                assert extra in project.get("optional-dependencies", {}), f"extra {extra!r} not in pyproject.toml"
            editable = False
        elif a == "-e":
            editable = True
        elif a == "--no-deps":  # installs one package without moving pdraft's pins (z-lab's reference code)
            continue
        elif a == "--no-compile":  # no byte-compiling at install: Python compiles the modules it imports
            continue
        else:
            assert not a.startswith("-"), f"pip option {a!r}: add it to _check_pip if it is meant"
            Requirement(a)
    assert not editable, "-e without a path"


def _check_pytest(argv, state):
    """The suite's own command: not run from inside the suite; its options must be pytest's."""
    assert argv[1:3] == ["-m", "pytest"], argv
    for a in argv[3:]:
        assert a in ("-q", "-x", "-v") or (ROOT / a.split("::")[0]).exists(), f"pytest argument {a!r}"


def _check_benchmark_script(argv, state):
    """A script of benchmarks/ (its figures take minutes to hours and are quoted with their command): it exists
    and its --help runs (it imports and its arguments are declared)."""
    import subprocess

    script = next(a for a in argv[1:] if a.startswith("benchmarks/"))
    assert (ROOT / script).is_file(), f"{script} does not exist"
    res = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, f"{script} --help fails: {res.stderr[-1000:]}"


def _check_engine_script(argv, state):
    """A serving-engine check (tests/engines/): it installs an engine from the registry and trains for minutes,
    so .ci/run runs it for real and the suite checks that it exists and parses."""
    import subprocess

    path = ROOT / argv[1]
    assert path.is_file(), f"{argv[1]} does not exist"
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, f"{argv[1]} does not parse: {res.stderr}"


def shape_check_for(argv: list[str]):
    prog = argv[0]
    if prog == "bash" and len(argv) > 1 and argv[1].startswith("tests/engines/"):
        return _check_engine_script
    if prog in ("python", "python3") and argv[1:3] == ["-m", "venv"]:
        return _check_venv
    if prog in (".", "source"):
        return _check_activate
    if prog in ("pip", "pip3") or (prog in ("python", "python3") and argv[1:4] == ["-m", "pip", "install"]):
        return _check_pip
    if prog in ("python", "python3") and argv[1:3] == ["-m", "pytest"]:
        return _check_pytest
    if prog in ("python", "python3") and len(argv) > 1 and argv[1].startswith("benchmarks/"):
        return _check_benchmark_script
    return None


SHAPE_CHECKS = ("venv, activate, pip install, python -m pytest, bash tests/engines/*, python benchmarks/* "
                "(see shape_check_for)")

# -------------------------------------------------------------------------------------------------- runner


def pdraft_args(argv: list[str]) -> list[str] | None:
    """The pdraft arguments of `pdraft ...` or `python -m pdraft.cli.main ...`; None for anything else."""
    if argv[0] == "pdraft":
        return argv[1:]
    if argv[0] in ("python", "python3") and argv[1:3] == ["-m", "pdraft.cli.main"]:
        return argv[3:]
    return None


def subcommand(args: list[str]) -> tuple[str, ...]:
    words = [a for a in args if not a.startswith("-")]
    return tuple(words[:2]) if words and words[0] in ("target", "recipe") else tuple(words[:1])


def map_arguments(args: list[str], ws: Path, where: str) -> list[str]:
    """Replace the README's names of the user's files by tiny stand-ins; refuse a path nothing maps."""
    out = []
    for i, a in enumerate(args):
        previous = args[i - 1] if i else ""
        if a in SUBSTITUTE:
            out.append(SUBSTITUTE[a](ws))
            continue
        key, eq, value = a.partition("=")
        if previous == "--set" and eq and value in SUBSTITUTE:  # --set target.id=./my-qwen3
            out.append(f"{key}={SUBSTITUTE[value](ws)}")
            continue
        looks_like_path = not a.startswith("-") and previous not in ("--set", "--prompt") and (
            "/" in a or re.search(r"\.(ya?ml|jsonl?|safetensors|py|txt)$", a))
        if looks_like_path and previous in OUTPUT_OPTIONS:
            assert not os.path.isabs(a) and ".." not in Path(a).parts, \
                f"{where}: output {a!r} would land outside the test workspace"
        elif looks_like_path and not (ws / a).exists():
            pytest.fail(f"{where}: {a!r} is neither in the tiny quickstart workspace nor a known stand-in; "
                        f"{HOW_TO_REGISTER}", pytrace=False)
        out.append(a)
    return out


def parse_only(args: list[str], monkeypatch) -> None:
    """Parse `pdraft ARGS` with the real typer app, every command's body replaced by a recorder: an unknown
    option, a missing argument or a bad value still fails; nothing runs."""
    from pdraft.cli import main as main_mod

    called = []

    def stub(info):
        @functools.wraps(info.callback)
        def record(*a, **kw):
            called.append(info.name or info.callback.__name__)
        return record

    def patch(typer_app):
        for info in typer_app.registered_commands:
            monkeypatch.setattr(info, "callback", stub(info))
        for group in typer_app.registered_groups:
            patch(group.typer_instance)

    patch(main_mod.app)
    res = run_cli(args)
    assert res.code == 0 and called, f"pdraft {shlex.join(args)}: arguments do not parse\n{res.err[-2000:]}"


def run_command(cmd: Command, ws: Path, monkeypatch, where: str = "README.md") -> list[str]:
    """Run or check one README command in the workspace; returns what was done per part (for reports)."""
    where = f"{where}:{cmd.line}: `{cmd.text}`"
    if cmd.error:
        pytest.fail(f"{where}: {cmd.error}; {HOW_TO_REGISTER}", pytrace=False)
    monkeypatch.chdir(ws)
    done, state = [], {}
    for argv in cmd.parts:
        env = {}
        while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
            key, _, value = argv[0].partition("=")
            env[key] = value
            argv = argv[1:]
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        text = shlex.join(argv)
        reason = next((r for pattern, r in PARSE_ONLY.items() if re.search(pattern, text)), None)
        if reason and _needs_gpu(reason):
            import torch

            reason = None if torch.cuda.is_available() else reason
        check = shape_check_for(argv)
        args = pdraft_args(argv)
        if argv[0] == "torchrun" and reason:
            inner = _torchrun_inner(argv, where)
            parse_only(inner, monkeypatch)
            done.append(f"parsed (torchrun: {reason}): {text}")
        elif check is not None:
            check(argv, state)
            done.append(f"shape: {text}")
        elif args is None:
            pytest.fail(f"{where}: no way to run `{text}`; {HOW_TO_REGISTER}", pytrace=False)
        elif reason:
            parse_only(args, monkeypatch)
            done.append(f"parsed ({reason}): {text}")
        else:
            rewrite = REWRITE.get(subcommand(args))
            args = map_arguments(rewrite(args) if rewrite else args, ws, where)
            res = run_cli(args)
            shown = f"{where}\n  ran: pdraft {shlex.join(args)}\n  exit {res.code}\n{res.err[-3000:]}"
            assert "Traceback" not in res.err + res.out, shown
            assert res.code == 0, shown
            done.append(f"ran: pdraft {shlex.join(args)}")
    return done


def _torchrun_inner(argv: list[str], where: str) -> list[str]:
    """torchrun's own options parsed by torch's parser; the script must be pdraft, whose arguments come back."""
    from torch.distributed.run import get_args_parser

    ns = get_args_parser().parse_args(argv[1:])
    script, rest = ns.training_script, list(ns.training_script_args)
    if ns.module and script == "pdraft.cli.main" or Path(script).name == "pdraft":
        return rest
    pytest.fail(f"{where}: torchrun runs {script!r}, not pdraft; {HOW_TO_REGISTER}", pytrace=False)


# ---------------------------------------------------------------------------------------------- workspace


TINY_TARGET = {"id": "builtin:tiny-stdlib-test", "layer_ids": [0]}


def tiny_quickstart_recipe(real: dict) -> dict:
    body = {k: (dict(v) if isinstance(v, dict) else v) for k, v in real.items()}
    body["target"] = dict(TINY_TARGET)
    for section, values in SHRINK.items():
        body[section] = {**(body.get(section) or {}), **values}
    return body


@pytest.fixture(scope="module")
def ws(tmp_path_factory, builtin_test_target, builtin_test_cache):
    """The scratch workspace, after the tiny quickstart ran in it (runs/quickstart/{dflash,dspark}/final,
    the calibration, bench) and `decode --metrics` fed runs/metrics.jsonl."""
    ws = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "recipes", ws / "recipes")
    shutil.copytree(builtin_test_target, ws / "tiny" / "target")
    (ws / "tiny" / "prompts.jsonl").write_text(
        '{"turns": ["def add(a, b):"]}\n{"turns": ["The quick brown fox"]}\n', encoding="utf-8")
    real = yaml.safe_load((ROOT / "recipes" / "quickstart.yaml").read_text())
    (ws / "recipes" / "quickstart.yaml").write_text(yaml.safe_dump(tiny_quickstart_recipe(real), sort_keys=False))
    cwd, saved = os.getcwd(), {k: os.environ.get(k) for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "PDRAFT_CACHE_DIR")}
    os.environ.update(HF_HUB_CACHE=str(ws / "hf-cache"), HF_HUB_OFFLINE="1", PDRAFT_CACHE_DIR=str(builtin_test_cache))
    os.chdir(ws)
    try:
        for argv in (["quickstart", "recipes/quickstart.yaml"],
                     ["decode", "--recipe", "recipes/quickstart.yaml", "--drafter", "runs/quickstart/dspark/final",
                      "--prompt", "def f", "--metrics", "runs/metrics.jsonl"]):
            res = run_cli(argv)
            assert res.code == 0, f"building the workspace: pdraft {' '.join(argv)}\n{res.err[-3000:]}"
    finally:
        os.chdir(cwd)
    yield ws
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def env(ws, monkeypatch, builtin_test_cache):
    """The workspace, with the Hub cache and pdraft's cache (where the session built tiny-stdlib-test) set."""
    monkeypatch.setenv("HF_HUB_CACHE", str(ws / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PDRAFT_CACHE_DIR", str(builtin_test_cache))  # where tiny-stdlib-test is built once
    return ws


# ------------------------------------------------------------------------------------------------- tests

README_COMMANDS = extract_commands(README.read_text(encoding="utf-8"))
DOC_COMMANDS = [c for page in DOCS for c in extract_commands(page.read_text(encoding="utf-8"),
                                                              page.relative_to(ROOT).as_posix())]


def test_readme_has_the_headline_commands():
    """The door shows the two commands and one example of each command; the pages behind it hold the rest."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200
    assert len(DOC_COMMANDS) >= 30 and {c.where for c in DOC_COMMANDS} >= {
        "docs/RECIPES.md", "docs/TARGETS.md", "docs/TRAIN.md", "docs/DECODE.md", "docs/CALIBRATE.md",
        "docs/BENCH.md", "docs/ENGINES.md", "docs/SCALING.md"}
    texts = [c.text for c in README_COMMANDS]
    assert len(texts) >= 15, texts
    for needle in ("pdraft quickstart recipes/quickstart.yaml", "pdraft train recipes/quickstart.yaml",
                   "pdraft bench recipes/quickstart.yaml --gamma 10..20", "pdraft pull deepseek-ai/"):
        assert any(needle in t for t in texts), needle


def test_tiny_quickstart_keeps_the_real_sweep_and_block():
    """The shrunk recipe differs from recipes/quickstart.yaml only in sizes: the README's sweep must fit the
    real quickstart's drafters, so block size and gammas are the real ones (and the real recipe is valid)."""
    from pdraft.bench.sweep import parse_gammas

    real = yaml.safe_load((ROOT / "recipes" / "quickstart.yaml").read_text())
    tiny = tiny_quickstart_recipe(real)
    for key in KEPT:
        section, name = key.split(".")
        assert tiny[section].get(name) == real[section].get(name), key
    assert max(parse_gammas(real["bench"]["gamma"])) <= real["drafter"]["block_size"]
    res = run_cli(["recipe", "check", str(ROOT / "recipes" / "quickstart.yaml")])
    assert res.code == 0, res.err


def _case(cmd: Command):
    reason = next((r for pattern, r in KNOWN_BROKEN.items() if re.search(pattern, cmd.text)), None)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(cmd, marks=marks, id=cmd.id)


@pytest.mark.parametrize("cmd", [_case(c) for c in README_COMMANDS + DOC_COMMANDS])
def test_readme_command(cmd, env, monkeypatch):
    run_command(cmd, env, monkeypatch, where=cmd.where)


# ------------------------------------------------------------------------ the runner on a synthetic README

SYNTHETIC = """# demo
```bash
pdraft recipe explain drafter
python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e '.[test]'
pdraft bench recipes/quickstart.yaml --gamma 2 \\
    --num-prompts 1        # a continuation line and a comment
```
```python
pdraft this is python, not a command
```
```bash
pdraft recipe explain drafter.no_such_key
pdraft recipe explian drafter
pdraft decode --target ./somebody-elses-model --prompt hi
cat README.md | head
curl https://example.com/install.sh
. .venv/bin/activate && pip install -e '.[nosuchextra]'
pdraft push runs/quickstart/dspark/final me/x --privat
```
"""


def test_extractor_reads_fences_continuations_and_chains():
    cmds = extract_commands(SYNTHETIC)
    assert [c.line for c in cmds] == [3, 4, 5, 12, 13, 14, 15, 16, 17, 18]
    assert cmds[1].parts == [["python3", "-m", "venv", ".venv"], [".", ".venv/bin/activate"],
                             ["pip", "install", "torch==2.13.0"], ["pip", "install", "-e", ".[test]"]]
    assert cmds[2].parts == [["pdraft", "bench", "recipes/quickstart.yaml", "--gamma", "2", "--num-prompts", "1"]]
    assert cmds[6].error and "'|'" in cmds[6].error


def test_runner_passes_good_commands_and_fails_broken_ones(env, monkeypatch):
    cmds = extract_commands(SYNTHETIC)
    assert run_command(cmds[0], env, monkeypatch)[0].startswith("ran: pdraft recipe explain drafter")
    assert [d.split(":")[0] for d in run_command(cmds[1], env, monkeypatch)] == ["shape"] * 4
    broken = {3: "exit 2", 4: "exit 2", 5: "neither in the tiny quickstart workspace nor a known stand-in",
              6: "not supported", 7: "no way to run", 8: "extra 'nosuchextra' not in pyproject.toml",
              9: "arguments do not parse"}
    for index, message in broken.items():
        with pytest.raises((pytest.fail.Exception, AssertionError)) as info:
            run_command(cmds[index], env, monkeypatch)
        assert message in str(info.value), (cmds[index].text, str(info.value)[-500:])
    # A broken command fails; each unmapped one names where to register it.
    with pytest.raises(pytest.fail.Exception, match="register it in tests/test_readme_commands.py"):
        run_command(cmds[5], env, monkeypatch)


def test_parse_only_still_catches_a_bad_flag(env, monkeypatch):
    (good,) = extract_commands("```bash\npdraft push runs/quickstart/dspark/final me/x --private\n```\n")
    assert run_command(good, env, monkeypatch) == [
        "parsed (uploads to the Hugging Face Hub (network and a token)): "
        "pdraft push runs/quickstart/dspark/final me/x --private"]
    (torchrun,) = extract_commands("```bash\ntorchrun --nproc_per_node 2 -m pdraft.cli.main train "
                                   "recipes/quickstart.yaml --set train.steps=2\n```\n")
    assert run_command(torchrun, env, monkeypatch)[0].startswith("parsed (torchrun")
    (bad,) = extract_commands("```bash\ntorchrun --nproc_per_node 2 -m pdraft.cli.main train --no-such-flag\n```\n")
    with pytest.raises(AssertionError, match="arguments do not parse"):
        run_command(bad, env, monkeypatch)


def test_engine_script_shape_check_catches_a_missing_script(env, monkeypatch):
    (good,) = extract_commands("```bash\nbash tests/engines/vllm_check.sh\n```\n")
    assert run_command(good, env, monkeypatch)[0].startswith("shape")
    (bad,) = extract_commands("```bash\nbash tests/engines/no_such_check.sh\n```\n")
    with pytest.raises(AssertionError, match="does not exist"):
        run_command(bad, env, monkeypatch)
