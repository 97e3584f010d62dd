"""A child engine's replies are input (issue 45, class 2): the vLLM worker is replaced by a test double
(tests/fake_vllm_worker.py) that prints a banner, sends ids outside the vocabulary, negative or past 2**64,
drops, repeats or invents answers, floods its stdout, nests a reply 40 levels deep, never finishes
loading or never answers a chunk. Every case must end in one PdraftError line naming what the worker did (and,
for a silence, what pdraft waited for), with the child stopped and no response written; the good double's
replies are written (the negative proof). Also class 1 for the child's log: a symbolic link at the log's name
is refused, and the user's file it points to keeps its bytes."""

import os
import sys
import time
from pathlib import Path

import pytest

from pdraft.engines import channel, vllm_driver as vllm_engine
from pdraft.data.prompts import load_prompts
from pdraft.data.regenerate import RegenerateSettings
from pdraft.data.regenerate_vllm import log_path, regenerate_vllm as run_regeneration
from pdraft.engines.vllm_driver import VllmSettings
from pdraft.errors import PdraftError
from pdraft.recipe import TargetSection
from pdraft.targets.loader import inspect_target
from test_data_tinytarget import make_tiny_target, write_chat_jsonl

FAKE = Path(__file__).with_name("fake_vllm_worker.py")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("worker")
    target = inspect_target(TargetSection(id=str(make_tiny_target(root / "target")), num_layer_ids=2))
    records = list(load_prompts(str(write_chat_jsonl(root / "data.jsonl", 4))))
    fake_vllm = root / "site"  # the interpreter check looks for a `vllm` package; the double imports none
    (fake_vllm / "vllm").mkdir(parents=True)
    (fake_vllm / "vllm" / "__init__.py").write_text("")
    return target, records, fake_vllm


@pytest.fixture
def children(monkeypatch, world):
    """The channels the cases start (to check each child was stopped), with the double as the worker."""
    started = []
    real_init = channel.ChildChannel.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        started.append(self)

    monkeypatch.setattr(channel.ChildChannel, "__init__", init)
    monkeypatch.setattr(vllm_engine, "WORKER", FAKE)
    monkeypatch.setenv("PYTHONPATH", str(world[2]))
    return started


def regenerate(world, tmp: Path, mode: str, *, load_s: float = 30, chunk_s: float = 30, start_s: float = 30,
               python: str = sys.executable):
    target, records, _ = world
    vllm = VllmSettings(python=python, llm_args={"fake": mode, "fake_vocab": target.vocab_size},
                        start_timeout_s=start_s, load_timeout_s=load_s, chunk_timeout_s=chunk_s)
    settings = RegenerateSettings(max_new_tokens=4, batch_size=2)
    return run_regeneration(target, records, tmp / "regenerated.jsonl", settings, vllm)


CASES = [  # (mode, what the one line must say)
    ("banner", r"not a JSON line \(it starts 'INFO 12-02 vLLM engine starting"),
    ("bad-id", r"token_ids: token id \d+ is outside the target's vocabulary \[0, \d+\)"),
    ("negative-id", r"token id -1 is outside the target's vocabulary"),
    ("huge-id", r"token id 18446744073709551616 is outside the target's vocabulary"),
    ("missing", r"has no answer for prompt 1 \(1 missing\)"),
    ("twice", r"results\.2\.index: 0 was answered twice"),
    ("extra", r"results\.2\.index: 1000000 was not asked"),
    ("too-long", r"token_ids: 5 tokens, more than the 4 asked"),
    ("flood", r"more than [\d,]+ bytes without a line end while waiting for a chunk of 2 prompt"),
    ("deep", r"nested deeper than 32 levels"),
    ("wrong-type", r"results\.0\.token_ids: expected a valid list, found '1 2 3'"),
    ("exit", r"the vLLM worker exited with code 3 while pdraft waited for the vLLM engine to load"),
    ("error", r"vLLM regeneration: \[bold red\]boom\[/\]"),
]


@pytest.mark.parametrize("mode,expect", CASES, ids=[c[0] for c in CASES])
def test_a_bad_reply_stops_the_worker_in_one_line(world, children, tmp_path, mode, expect):
    import re

    t0 = time.monotonic()
    with pytest.raises(PdraftError) as e:
        regenerate(world, tmp_path, mode)
    line = e.value.one_line()
    assert re.search(expect, line), line
    assert "\n" not in line and "\x1b" not in line
    assert time.monotonic() - t0 < 25, "a bad reply must be refused at once, not after a timeout"
    assert children and all(c.proc.poll() is not None for c in children), "the worker was left running"
    assert not any(tmp_path.glob("regenerated.jsonl")) or (tmp_path / "regenerated.jsonl").read_text() == ""


@pytest.mark.parametrize("mode,waits", [("load-hang", "the vLLM engine to load"),
                                        ("hang", r"a chunk of 2 prompt\(s\) \(indices 0\.\.1\)")])
def test_a_silent_worker_is_stopped_at_its_deadline_naming_what_pdraft_waited_for(world, children, tmp_path,
                                                                                mode, waits):
    import re

    t0 = time.monotonic()
    with pytest.raises(PdraftError) as e:
        regenerate(world, tmp_path, mode, load_s=2, chunk_s=2)
    assert re.search(rf"no reply within 2 s while waiting for {waits}", e.value.one_line()), e.value.one_line()
    assert time.monotonic() - t0 < 20 + 2 * channel.STOP_GRACE_S
    assert all(c.proc.poll() is not None for c in children)


def test_good_replies_are_written(world, children, tmp_path):
    """The negative proof: the same double, answering as the worker does, regenerates every record."""
    out = regenerate(world, tmp_path, "good")
    assert len(out) == len(world[1]) and all(r.response_ids == [10, 11, 12] for r in out)
    assert all(c.proc.poll() is not None for c in children)
    assert "fake vLLM worker, mode good" in log_path(tmp_path / "regenerated.jsonl").read_text()


def test_a_link_at_the_workers_log_is_refused_and_its_target_kept(world, children, tmp_path):
    mine = tmp_path / "my-notes.txt"
    mine.write_text("precious\n")
    os.symlink(mine, log_path(tmp_path / "regenerated.jsonl"))
    with pytest.raises(PdraftError, match="symbolic link"):
        regenerate(world, tmp_path, "good")
    assert mine.read_text() == "precious\n"
    assert not children, "the worker must not start when its log cannot be opened"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its parent is gone as far as work goes
        return f.read().split(") ")[1].startswith("Z")


@pytest.mark.parametrize("start,expect", [
    ("hang", r"no reply within 2 s while waiting for the vLLM worker to start"),
    ("silent", r"the vLLM worker exited with code 0 while pdraft waited for the vLLM worker to start")])
def test_an_interpreter_that_never_runs_the_worker_is_stopped_at_the_start_deadline(world, children, tmp_path,
                                                                                  monkeypatch, start, expect):
    """An interpreter that answers the probe but never runs the worker (issue 60: it waited for the 1800 s load
    deadline): the worker's first line comes before vLLM is imported, and its own short deadline bounds it."""
    import re

    monkeypatch.setenv("FAKE_VLLM_START", start)
    t0 = time.monotonic()
    with pytest.raises(PdraftError) as e:
        regenerate(world, tmp_path, "good", start_s=2, load_s=3600)
    assert re.search(expect, e.value.one_line()), e.value.one_line()
    assert time.monotonic() - t0 < 15
    assert all(c.proc.poll() is not None for c in children)


def test_what_the_worker_started_is_stopped_with_it(world, children, tmp_path, monkeypatch):
    """A grandchild of the worker (vLLM's engine-core processes) holding the reply pipe goes with the worker's
    process group when pdraft stops it, and pdraft's read does not wait on the pipe it keeps open."""
    pid_file = tmp_path / "orphan.pid"
    monkeypatch.setenv("FAKE_VLLM_ORPHAN_PID", str(pid_file))
    with pytest.raises(PdraftError, match="no reply within 2 s while waiting for the vLLM engine to load"):
        regenerate(world, tmp_path, "orphan", load_s=2)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pid), "the worker's own child outlived it"


def _interpreter(tmp_path: Path, body: str) -> str:
    """A fake `python`: a shell script that does `body` whatever it is asked."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("body,expect", [
    ("sleep 3600", r"no answer within 2 s to a one-line probe; it was stopped"),
    ("sleep 3600 & wait", r"no answer within 2 s to a one-line probe; it was stopped"),  # a grandchild holds the pipe
    ("yes flood", r"no answer within 2 s to a one-line probe"),
    ("yes flood | head -c 50000000; exit 1", r"vLLM is not installed for this interpreter"),
    ("exit 0", r"no reply within|exited with code 0 while pdraft waited for the vLLM worker to start"),
], ids=["hang", "grandchild", "flood", "flood-then-exit", "answers-nothing"])
def test_a_hostile_interpreter_costs_its_deadline_and_a_bounded_buffer(world, children, tmp_path, body, expect):
    """data.vllm_python that hangs, floods its stdout or runs nothing (issue 60: one flooding the probe drove
    pdraft past 5 GB; one never answering waited for the load deadline): one line within the start deadline,
    pdraft's memory unmoved."""
    import re

    import psutil

    rss0 = psutil.Process().memory_info().rss
    t0 = time.monotonic()
    with pytest.raises(PdraftError) as e:
        regenerate(world, tmp_path, "good", start_s=2, load_s=3600, python=_interpreter(tmp_path, body))
    assert re.search(expect, e.value.one_line()), e.value.one_line()
    assert time.monotonic() - t0 < 20
    assert psutil.Process().memory_info().rss - rss0 < 100 << 20


def test_no_module_beside_the_worker_shadows_what_it_imports():
    """The worker runs as a script, so its own folder is first on its sys.path: a module there named like one it
    imports (vllm, torch, json, ...) would be imported instead (pdraft/engines/vllm.py once hid vLLM itself, and
    the worker died with "No module named 'pdraft'"). Every top-level name the worker imports, against the folder."""
    import ast

    worker = Path(vllm_engine.WORKER)
    names = set()
    for node in ast.walk(ast.parse(worker.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    assert {"vllm", "torch", "json"} <= names  # the walk sees the worker's imports
    beside = {p.stem for p in worker.parent.glob("*.py")} | {p.name for p in worker.parent.iterdir() if p.is_dir()}
    assert not names & beside, f"modules beside {worker.name} shadow its imports: {sorted(names & beside)}"
