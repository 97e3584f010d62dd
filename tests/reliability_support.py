"""Shared helpers of the reliability suite (tests/test_reliability_*.py); no tests here. One small world of
artifacts is built once per process (a tiny target and a second one of another width, a prompt file, a
hidden-state cache, a briefly trained DSpark drafter with its checkpoints, saved DSpark and DFlash drafters, a
metrics stream, a Hugging Face cache holding a pushed drafter); every case runs one command through the real
entry point `pdraft.cli.main.main` on a bad input, and `check` asserts the user-error contract: exit code 2,
the error as the last line of stderr (`error: ...`, exactly one such line) or typer's usage box, no
traceback, and no change to any artifact (the list of files and folders and the SHA-256 of every file, of the
world and of the case's own folder, before and after).

`python tests/reliability_support.py` runs the reliability cases and the fault tests, records each test's
outcome and, per case, how many existing files and folders it removed or changed (docs/reliability-results.json,
which also lists every case and fault with its result), and writes docs/RELIABILITY.md (the contract, the totals,
the classes of bad input) and the README's totals row from those measurements: the totals are counted from what
ran, not restated from the tables. `--render` writes the three again from the recorded results, running nothing. tests/test_reliability_totals.py fails when the document, the README row,
the recorded results and the tables disagree."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
DOC = ROOT / "docs" / "RELIABILITY.md"
FAKE_TOKEN = "hf_reliabilityFakeToken0123456789abcdef"  # never a real credential; must never be printed


# ---- running a command -------------------------------------------------------------------------------------
@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]


def run_cli(argv: list[str], *, subprocess_: bool = False, env: dict | None = None) -> Result:
    """Run `pdraft ARGV` through main() in this process (an escaped exception becomes code 1 with its
    traceback on stderr, as the console script would show it), or through `python -m pdraft.cli.main`."""
    if subprocess_:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
        try:
            res = subprocess.run([sys.executable, "-m", "pdraft.cli.main", *argv], capture_output=True, text=True,
                                 env=full_env, cwd=os.getcwd(), timeout=HANG_S)
        except subprocess.TimeoutExpired as e:  # a hang: what the user would see is nothing, then a kill
            return Result(-9, (e.stdout or b"").decode("utf-8", "replace") if isinstance(e.stdout, bytes)
                          else (e.stdout or ""), f"(killed after {HANG_S} s: a hang)\n")
        return Result(res.returncode, res.stdout, res.stderr)
    from pdraft.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except BaseException:  # noqa: BLE001 - what the user would see: a traceback and exit code 1
            err.write(traceback.format_exc())
            code = 1
    return Result(code, out.getvalue(), err.getvalue())


def invoke_command(name: str, command: Callable, args: list[str]) -> tuple[int, str, str]:
    """Invoke one command function as `pdraft NAME ARGS` in a local typer app, with typer's CliRunner (its
    output width, unlike main()'s console), mapping errors as pdraft.cli.main does: a PdraftError gives
    (2, stdout, its one line); otherwise (exit code, stdout, stderr). Other exceptions propagate."""
    import typer
    from typer.testing import CliRunner

    from pdraft.errors import PdraftError

    app = typer.Typer()
    app.command(name)(command)
    app.command("noop")(lambda: None)  # two commands, so typer keeps the sub-command name
    result = CliRunner().invoke(app, [name, *args])
    if isinstance(result.exception, PdraftError):
        return 2, result.stdout, result.exception.one_line()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


# ---- artifacts ---------------------------------------------------------------------------------------------
def snapshot(*folders: Path) -> dict[str, str]:
    """Every file and folder under `folders` -> SHA-256 of its bytes ('dir' for folders, the target for links,
    the file type for a named pipe or device)."""
    state: dict[str, str] = {}
    for folder in folders:
        for dirpath, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for d in dirs:
                state[os.path.join(dirpath, d)] = "dir"
            for f in files:
                p = os.path.join(dirpath, f)
                if os.path.islink(p):
                    state[p] = "link:" + os.readlink(p)
                    continue
                if not stat.S_ISREG(os.stat(p).st_mode):  # a case's named pipe: opening it would block
                    state[p] = f"special:{stat.S_IFMT(os.stat(p).st_mode):o}"
                    continue
                h = hashlib.sha256()
                with open(p, "rb") as fh:  # in slices: a case's 3 GB file must not count as the command's memory
                    while block := fh.read(1 << 24):
                        h.update(block)
                state[p] = h.hexdigest()
    return state


def diff(before: dict[str, str], after: dict[str, str]) -> list[str]:
    lost = [f"removed {p}" for p in before if p not in after]
    changed = [f"changed {p}" for p in before if p in after and before[p] != after[p]]
    added = [f"added {p}" for p in after if p not in before]
    return lost + changed + added


# ---- damaged inputs ----------------------------------------------------------------------------------------
def truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def bitflip(path: Path, at: float = 0.75) -> Path:
    """Flip one bit in the tensor bytes (past the safetensors header), so the header still parses."""
    data = bytearray(path.read_bytes())
    header = int.from_bytes(data[:8], "little") + 8
    i = header + int((len(data) - header) * at)
    data[i] ^= 0x10
    path.write_bytes(bytes(data))
    return path


def copy_tree(src: Path, dest: Path, damage: Callable[[Path], object] | None = None) -> Path:
    """Copy the folder `src` to `dest` (links kept as links), then apply `damage` to the copy if given."""
    import shutil

    shutil.copytree(src, dest, symlinks=True)
    if damage is not None:
        damage(dest)
    return dest


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# ---- the world ---------------------------------------------------------------------------------------------
@dataclass
class World:
    root: Path
    target: Path  # tiny Qwen3, hidden 32, 4 layers, context 512
    other_target: Path  # hidden 48: every drafter and cache of `target` mismatches it
    data: Path  # DeepSpec-layout JSONL with responses
    recipe: Path  # the good recipe every case starts from
    cache: Path  # hidden-state cache of `target`
    run_dir: Path  # a short DSpark training run: checkpoints/, final/
    dspark: Path  # saved DSpark drafter of `target` (confidence head)
    dflash: Path  # saved DFlash drafter of `target`
    dspark_other: Path  # DSpark drafter of `other_target`
    metrics: Path  # a metrics stream written by decode --metrics
    hf_cache: Path  # huggingface_hub cache layout holding someone/tiny-dspark

    @property
    def trained(self) -> Path:
        return self.run_dir / "final"

    def recipe_with(self, tmp: Path, name: str = "r.yaml", **sections) -> Path:
        """The good recipe with some sections' keys replaced (`train={"steps": 3}`), written to tmp."""
        import yaml

        body = yaml.safe_load(self.recipe.read_text())
        for section, values in sections.items():
            if isinstance(values, dict) and isinstance(body.get(section), dict):
                body[section] = {**body[section], **values}
            else:
                body[section] = values
        return write(tmp / name, yaml.safe_dump(body, sort_keys=False))


_WORLD: dict[str, World] = {}


def good_recipe(root: Path, target: Path, data: Path) -> str:
    return (
        f"name: reliability\noutput_dir: {root / 'runs'}\n"
        f"target:\n  id: {target}\n  num_layer_ids: 2\n"
        f"data:\n  source: {data}\n  shard_tokens: 512\n  cache_dir: {root / 'cache'}\n  max_length: 96\n"
        "drafter:\n  kind: dspark\n  num_layers: 1\n  block_size: 4\n  markov_rank: 8\n  mask_token_id: 0\n"
        f"train:\n  output_dir: {root / 'runs' / 'dspark'}\n  steps: 2\n  batch_size: 2\n  warmup_steps: 0\n"
        "  num_anchors: 2\n  checkpoint_every: 1\n  eval_every: 2\n  log_every: 1\n"
        f"calibrate:\n  prompts: {data}\n  num_prompts: 4\n  max_new_tokens: 6\n  min_samples: 2\n"
        "  sps_max_batch_tokens: 2\n  sps_repeats: 1\n  bins: 4\n"
        "decode:\n  max_new_tokens: 4\n"
        f"bench:\n  gamma: '2'\n  prompt_sets: [{data}]\n  num_prompts: 1\n  max_new_tokens: 4\n"
        f"  output_dir: {root / 'bench'}\n"
        "runtime:\n  device: cpu\n  threads: 1\n  offline: true\n"
    )


def world() -> World:
    """Build the shared artifacts once per process (a few seconds on one core)."""
    if "w" in _WORLD:
        return _WORLD["w"]
    sys.path.insert(0, str(TESTS))
    from test_data_tinytarget import make_tiny_target, write_chat_jsonl
    from transformers import AutoConfig

    from pdraft.models import build_drafter, save_drafter

    root = Path(tempfile.mkdtemp(prefix="pdraft-reliability-"))
    import atexit
    import shutil

    atexit.register(shutil.rmtree, root, True)
    target = make_tiny_target(root / "target")
    other = make_tiny_target(root / "other-target", hidden=48, seed=1)
    data = write_chat_jsonl(root / "data.jsonl", 6)
    recipe = write(root / "recipe.yaml", good_recipe(root, target, data))
    cfg, other_cfg = AutoConfig.from_pretrained(target), AutoConfig.from_pretrained(other)
    drafters = root / "drafters"
    for name, kind, c in (("dspark", "dspark", cfg), ("dflash", "dflash", cfg), ("dspark-other", "dspark", other_cfg)):
        extra = {"markov_rank": 8} if kind == "dspark" else {}
        d = build_drafter(kind, c, seed=0, mask_token_id=0, num_hidden_layers=1, block_size=4, **extra)
        save_drafter(d, drafters / name)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for argv in (["export-hidden", str(recipe)], ["train", str(recipe)],
                     ["decode", "--recipe", str(recipe), "--drafter", str(drafters / "dspark"), "--prompt", "def f",
                      "--metrics", str(root / "metrics.jsonl"), "--json"]):
            res = run_cli(argv)
            assert res.code == 0, f"building the world: pdraft {' '.join(argv)} failed:\n{res.err[-3000:]}"
    finally:
        os.chdir(cwd)
    from test_hub_support import folder_files, put_in_cache

    hf_cache = root / "hf-cache"
    put_in_cache(hf_cache, "someone/tiny-dspark", folder_files(drafters / "dspark"))
    w = World(root=root, target=target, other_target=other, data=data, recipe=recipe, cache=root / "cache",
              run_dir=root / "runs" / "dspark", dspark=drafters / "dspark", dflash=drafters / "dflash",
              dspark_other=drafters / "dspark-other", metrics=root / "metrics.jsonl", hf_cache=hf_cache)
    _WORLD["w"] = w
    return w


@pytest.fixture(scope="module")
def w() -> World:
    """The shared world as a fixture. A test module takes it with `w = reliability_support.w` (an assignment,
    not `from reliability_support import w`, which linters read as an unused import)."""
    return world()


# ---- cases -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One bad input to one command. `argv(world, tmp)` builds the arguments (and any damaged file, inside
    tmp); `expect` is a regular expression the error must match; `usage` marks typer's own usage errors."""

    command: str
    name: str
    input: str  # what the user did, for the document
    argv: Callable[[World, Path], list[str]]
    expect: str
    usage: bool = False
    subprocess: bool = False
    env: Callable[[World, Path], dict] = field(default=lambda w, t: {})

    @property
    def id(self) -> str:
        return f"{self.command.replace(' ', '-')}:{self.name}"


def check(case: Case, w: World, tmp: Path, monkeypatch) -> Result:
    """Run one case and assert the user-error contract; returns the result for extra assertions."""
    tmp.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(tmp)  # relative default outputs (runs/...) would land here and be seen
    env = case.env(w, tmp)
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    argv = case.argv(w, tmp)
    before = snapshot(w.root, tmp)
    t0 = time.perf_counter()
    res = run_cli(argv, subprocess_=case.subprocess, env=env)
    seconds = time.perf_counter() - t0
    after = snapshot(w.root, tmp)
    changes = diff(before, after)
    ARTIFACTS_LOST[case.id] = sum(1 for d in changes if not d.startswith("added "))  # before asserting
    OBSERVED[case.id] = {  # what the case did, recorded before any assertion can stop it
        "traceback": "Traceback" in res.err + res.out,
        "hang": res.code == -9 or seconds > HANG_S,
        "seconds": round(seconds, 3),
        "peak_rss_mb": peak_rss_mb(),
        "files_deleted": sum(1 for d in changes if d.startswith("removed ")),
        "secret_printed": FAKE_TOKEN in res.out + res.err,
    }
    shown = f"pdraft {' '.join(map(str, argv))}\n--- exit {res.code}\n--- stderr:\n{res.err[-3000:]}"
    assert "Traceback" not in res.err + res.out, shown
    assert res.code == 2, shown
    if case.usage:
        assert "Usage:" in res.err and re.search(case.expect, res.err, re.I), shown
    else:
        lines = res.err.rstrip("\n").splitlines()
        assert len(res.error_lines) == 1 and lines[-1].startswith("error: "), shown
        assert re.search(case.expect, lines[-1]), f"expected /{case.expect}/\n{shown}"
    assert diff(before, after) == [], f"artifacts changed: {diff(before, after)[:5]}\n{shown}"
    assert FAKE_TOKEN not in res.out + res.err
    return res


def param(cases: list[Case]):
    """pytest.mark.parametrize over cases, one test id per case."""
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), "duplicate case ids"
    return pytest.mark.parametrize("case", cases, ids=ids)


# ---- measuring -----------------------------------------------------------------------------------------------
# Filled by `check` as the cases run: case id -> files and folders that existed before the case and were removed
# or changed by it (the artifacts it lost), and what else the case did (OBSERVED: a traceback, a hang, the memory
# high-water mark after it, files it deleted, the fake token in its output).
ARTIFACTS_LOST: dict[str, int] = {}
OBSERVED: dict[str, dict] = {}
HANG_S = 120  # a case that runs longer than this is a hang (the slowest case takes a few seconds)
MEMORY_LIMIT_MB = 2048


def peak_rss_mb() -> float:
    """The memory high-water mark so far of this process and of the subprocesses it waited for, in MB. It only
    grows, so the case during which it first passes a limit is the case that used that much: in-process cases
    share this process, subprocess cases are its children."""
    import resource

    kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return round(kb / 1024, 1)
RESULTS = ROOT / "docs" / "reliability-results.json"


class Recorder:
    """A pytest plugin that records each test's outcome by node id: "failed" if any phase failed, else "skipped"
    if any phase skipped, else "passed"."""

    def __init__(self):
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        old = self.outcomes.get(report.nodeid)
        if report.failed or old == "failed":
            self.outcomes[report.nodeid] = "failed"
        elif report.skipped or old == "skipped":
            self.outcomes[report.nodeid] = "skipped"
        elif report.when == "call":
            self.outcomes[report.nodeid] = "passed"


def measure(extra_args: list[str] = ()) -> dict:
    """Run every reliability case and fault test in this process; their recorded results."""
    import datetime

    import torch

    recorder = Recorder()
    modules = [str(ROOT / "tests" / f"{m}.py") for m in RELIABILITY_MODULES]
    fault_tests = [test for _, test, _ in all_faults()]
    ARTIFACTS_LOST.clear()
    OBSERVED.clear()
    pytest.main([f"--rootdir={ROOT}", "-q", "-p", "no:cacheprovider", *modules,
                 *(str(ROOT / t) for t in fault_tests), *extra_args], plugins=[recorder])
    nodes = {node for _, node in case_nodes()} | set(fault_tests)
    return {"schema": "pdraft.reliability_results/1",
            "measured": datetime.date.today().isoformat(), "torch": torch.__version__,
            "outcomes": {n: recorder.outcomes[n] for n in sorted(nodes) if n in recorder.outcomes},
            "artifacts_lost": {k: ARTIFACTS_LOST[k] for k in sorted(ARTIFACTS_LOST)},
            "observed": {k: OBSERVED[k] for k in sorted(OBSERVED)}}


def load_results(path: Path = RESULTS) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {"outcomes": {}, "artifacts_lost": {}}


# ---- the document ------------------------------------------------------------------------------------------
RELIABILITY_MODULES = ("test_reliability_recipe", "test_reliability_train", "test_reliability_run",
                       "test_reliability_hub", "test_reliability_hostile", "test_reliability_torchrun",
                       "test_reliability_eagle3", "test_reliability_files", "test_reliability_round3",
                       "test_reliability_round4")
FAULT_MODULES = ("test_faults_calibrate", "test_faults_push", "test_faults_disk")


def case_nodes() -> list[tuple[Case, str]]:
    """Every case with the pytest node id of the test that runs it."""
    import importlib

    sys.path.insert(0, str(TESTS))
    return [(c, f"tests/{m}.py::test_case[{c.id}]") for m in RELIABILITY_MODULES
            for c in importlib.import_module(m).CASES]


def all_cases() -> list[Case]:
    return [c for c, _ in case_nodes()]


def all_faults() -> list[tuple[str, str, str]]:
    """(fault, where it is tested, what must hold) for every fault scenario, the existing ones included."""
    import importlib

    sys.path.insert(0, str(TESTS))
    return [f for m in FAULT_MODULES for f in importlib.import_module(m).FAULTS]


def totals(results: dict) -> dict:
    """The totals, counted from recorded results: a case or fault with no recorded outcome was not tried."""
    outcomes, lost = results.get("outcomes", {}), results.get("artifacts_lost", {})
    observed = results.get("observed", {})
    nodes = case_nodes()
    tried = [(c, n) for c, n in nodes if outcomes.get(n) in ("passed", "failed")]
    seen = [observed.get(c.id, {}) for c, _ in tried]
    faults = all_faults()
    peaks = [o["peak_rss_mb"] for o in seen if "peak_rss_mb" in o]
    over, high = 0, 0.0
    for mb in peaks:  # a running high-water mark: count the cases that pushed it past the limit
        over += high <= MEMORY_LIMIT_MB < mb
        high = max(high, mb)
    return {"cases": len(nodes), "tried": len(tried),
            "observed": sum(bool(o) for o in seen),
            "tracebacks": sum(bool(o.get("traceback")) for o in seen),
            "hangs": sum(bool(o.get("hang")) for o in seen),
            "over_memory": over, "peak_rss_mb": max(peaks, default=None),
            "files_deleted": sum(int(o.get("files_deleted", 0)) for o in seen),
            "secrets_printed": sum(bool(o.get("secret_printed")) for o in seen),
            "held": sum(outcomes[n] == "passed" for _, n in tried),
            "failed": [c.id for c, n in tried if outcomes[n] == "failed"],
            "faults": len(faults), "faults_survived": sum(outcomes.get(test) == "passed" for _, test, _ in faults),
            "artifacts_lost": sum(int(lost.get(c.id, 0)) for c, _ in tried),
            "commands": sorted({c.command for c, _ in nodes} - {"pdraft"})}  # "pdraft": the top level


def readme_row(results: dict) -> str:
    t = totals(results)
    peak = "-" if t["peak_rss_mb"] is None else f"{t['over_memory']} (peak {t['peak_rss_mb'] / 1024:.2f} GB)"
    return (f"| {t['tried']} bad inputs over {len(t['commands'])} commands ({t['held']} held the contract) | "
            f"{t['tracebacks']} | {t['hangs']} | {peak} | {t['artifacts_lost']} | {t['files_deleted']} | "
            f"{t['secrets_printed']} | "
            f"{t['faults_survived']} of {t['faults']} (SIGKILL during export-hidden, training, calibration and push; "
            f"a full disk while checkpointing) |")


# What each module's cases try, in one line; the module's docstring says it in full.
CLASSES = {
    "test_reliability_recipe": "recipes and usage: malformed YAML, unknown keys, wrong types, out-of-range values, "
                               "missing or unreadable files, bad `--set` overrides, unknown options",
    "test_reliability_train": "building a drafter: broken targets and prompt files, truncated or bit-flipped cache "
                              "shards, a cache or run folder of another kind, damaged checkpoints",
    "test_reliability_run": "using a drafter: missing, damaged or mismatched drafters, gamma and sampling out of "
                            "range, broken prompt files, SPS tables and metrics streams",
    "test_reliability_hub": "sharing: bad Hub ids and revisions, offline, interrupted downloads, damaged folders, "
                            "no token, a refused commit, an occupied `--out`",
    "test_reliability_hostile": "hostile input: links to a user's file, outputs over inputs, unbounded counts and "
                                "numbers, endless or growing files",
    "test_reliability_torchrun": "under torchrun: garbage or contradictory RANK / WORLD_SIZE / MASTER_ADDR values, no "
                                 "peer to meet, a tensor-parallel size that does not divide",
    "test_reliability_eagle3": "EAGLE-3: recipes and checkpoints that are not EAGLE-3's, a missing vocabulary map or "
                               "target layers, another target's drafter, exports no engine could run",
    "test_reliability_files": "files pdraft reads back: calibration and cost sidecars holding NaN, text, deep nesting "
                              "or 3 GB; malformed configs, trainer states, pointers and weight indexes",
    "test_reliability_round3": "EAGLE-3 vocabulary maps out of range or inconsistent; temperatures below the floor",
    "test_reliability_round4": "contradictory EAGLE-3 layer ids, exports that do not fit their target, stale build "
                               "folders of a killed target build",
}


def listing(results: dict) -> dict:
    """Every case and fault, one record each, with its recorded result: the per-case half of the results file."""
    outcomes = results.get("outcomes", {})  # what a case did is under "observed" and "artifacts_lost", by its id
    cases = [{"id": c.id, "class": node.split("::")[0].removeprefix("tests/").removesuffix(".py"),
              "command": c.command, "input": c.input, "expect": c.expect, "usage": c.usage,
              "subprocess": c.subprocess, "test": node, "result": outcomes.get(node, "not run")}
             for c, node in case_nodes()]
    faults = [{"fault": fault, "test": test, "must_hold": holds, "result": outcomes.get(test, "not run")}
              for fault, test, holds in all_faults()]
    return {"cases": cases, "faults": faults}


def render_doc(results: dict) -> str:
    cases, faults = case_nodes(), all_faults()
    t = totals(results)
    outcomes = results.get("outcomes", {})
    failed = f"; failed: {', '.join(t['failed'])}" if t["failed"] else ""
    lines = [
        "# Reliability",
        "",
        "What pdraft does with the bad inputs a user will produce and the faults a machine will suffer. Every case",
        "and fault is a test. `python tests/reliability_support.py` runs them all and records each one's outcome,",
        "the artifacts each case lost and what it did in `docs/reliability-results.json`, with every case listed",
        "there (command, input, expected error, result); it writes this file and the README's totals row from that",
        "record, and `python tests/reliability_support.py --render` writes them again from it without running",
        "anything. `tests/test_reliability_totals.py` fails when they are stale.",
        "",
        "## The contract each case asserts",
        "",
        "The command runs through the real entry point (`pdraft.cli.main.main`, or `python -m pdraft.cli.main` in",
        "a subprocess for the cases marked `subprocess` in the listing) and must: exit with code 2; end stderr with",
        "exactly one line that starts with `error:` (progress lines printed before the failure are allowed), or print",
        "typer's usage box for a usage error; show no traceback; leave every file and folder of the shared artifacts",
        "and of the case's own folder unchanged (none added, none removed, none modified); never print the fake",
        "`HF_TOKEN` set for the hub cases.",
        "",
        "Unreadable files: the tests run as root, where `chmod 000` does not block reads, so an unreadable file",
        "is simulated by what root cannot read either: a folder where a file is expected, or a file of binary /",
        "invalid UTF-8 bytes.",
        "",
        f"## Totals (measured {results.get('measured', 'never')}, torch {results.get('torch', '-')})",
        "",
        "| cases tried | tracebacks | hangs | over 2 GB | artifacts changed | files deleted | secrets printed | "
        "faults survived |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        readme_row(results),
        "",
        f"- cases tried: **{t['tried']}** of {t['cases']} bad inputs over {len(t['commands'])} commands "
        f"({', '.join(t['commands'])}) and the top-level `pdraft` (an unknown command); **{t['held']}** held the "
        f"contract{failed}",
        f"- faults survived: **{t['faults_survived']}** of {t['faults']} (SIGKILL, full disk): the fault's test "
        "passed, so the previous state was intact and a rerun completed",
        f"- artifacts lost: **{t['artifacts_lost']}**: files and folders that existed before a case and were removed "
        "or changed after it (file list and SHA-256 of every file compared), summed over the cases tried; of them "
        f"deleted: **{t['files_deleted']}**",
        f"- tracebacks: **{t['tracebacks']}**; hangs (a case running over {HANG_S} s, a subprocess killed then): "
        f"**{t['hangs']}**; secrets printed (the fake `HF_TOKEN` in a case's output): **{t['secrets_printed']}**, "
        f"observed on {t['observed']} of the {t['tried']} cases tried",
        f"- cases that pushed memory past {MEMORY_LIMIT_MB // 1024} GB: **{t['over_memory']}**; the memory high-water "
        "mark of the process running the in-process cases and of every subprocess case, after the last case: "
        + ("not recorded" if t["peak_rss_mb"] is None else f"**{t['peak_rss_mb'] / 1024:.2f} GB**")
        + " (it only grows, so no case used more)",
        "",
        "## The classes of bad input",
        "",
        "One test module per class; the module's docstring describes the class in full, and",
        "`docs/reliability-results.json` lists its cases one by one.",
        "",
        "| class | what its cases try | commands | cases | held | failed | never ran |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for module in RELIABILITY_MODULES:
        mine = [(c, n) for c, n in cases if n.startswith(f"tests/{module}.py::")]
        results_of = [outcomes.get(n, "not run") for _, n in mine]
        commands = sorted({c.command for c, _ in mine})
        lines.append(f"| `tests/{module}.py` | {CLASSES[module]} | {len(commands)} | {len(mine)} | "
                     f"{results_of.count('passed')} | {results_of.count('failed')} | "
                     f"{len(results_of) - results_of.count('passed') - results_of.count('failed')} |")
    lines += ["", "## Faults", "", "| # | fault | test | what must hold | result |", "| --- | --- | --- | --- | --- |"]
    for i, (fault, test, holds) in enumerate(faults, 1):
        lines.append(f"| {i} | {fault} | `{test}` | {holds} | {outcomes.get(test, 'not run')} |")
    lines += ["", "## Cases that did not hold or never ran", ""]
    amiss = [(c, n) for c, n in cases if outcomes.get(n) != "passed"]
    if amiss:
        lines += ["| case | input | result |", "| --- | --- | --- |"]
        lines += [f"| `{c.id}` | {c.input} | {outcomes.get(n, 'not run')} |" for c, n in amiss]
    else:
        lines.append("None: every case ran and held the contract.")
    lines += ["", "## Security", "",
              "`tests/test_security.py` scans every module of the package for `pickle.load`/`pickle.loads`,",
              "`torch.load` without `weights_only=True`, `trust_remote_code=True` and `eval`/`exec`, and checks",
              "that a token set in `HF_TOKEN` never appears in the output of push and pull.", ""]
    return "\n".join(lines)


def write_readme_row(results: dict, readme: Path = ROOT / "README.md") -> None:
    text = readme.read_text()
    new, n = re.subn(r"^\| \d+ bad inputs over .*$", lambda m: readme_row(results), text, count=1, flags=re.M)
    if n != 1:
        raise SystemExit("README.md has no reliability totals row to update")
    readme.write_text(new)


def write_all(results: dict) -> None:
    """The results file (what was measured, and every case and fault listed with its result), the document and
    the README's totals row, all from one record."""
    RESULTS.write_text(json.dumps({**results, **listing(results)}, indent=1) + "\n")
    DOC.write_text(render_doc(results))
    write_readme_row(results)


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # The test modules import this file as `reliability_support`, not `__main__`: use that module, whose
    # ARTIFACTS_LOST `check` fills.
    import reliability_support as rs

    if sys.argv[1:] == ["--render"]:  # the document from the recorded run, nothing run again
        results = rs.load_results()
    else:
        results = rs.measure(sys.argv[1:])
    rs.write_all(results)
    print(json.dumps({k: v for k, v in rs.totals(results).items() if k != "commands"}))
