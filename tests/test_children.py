"""Every child process pdraft starts goes through one rule (pdraft.children; issue 60, class 1): its own process
group, stopped with pdraft, its output bounded, its run ended at a deadline. The walk holds the rule: no module of
the package starts a process any other way."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from pdraft.children import run_bounded

PACKAGE = Path(__file__).resolve().parents[1] / "pdraft"
HOME = "pdraft/children.py"
STARTERS = {("subprocess", "run"), ("subprocess", "Popen"), ("subprocess", "call"), ("subprocess", "check_call"),
            ("subprocess", "check_output"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput"),
            ("os", "system"), ("os", "popen"), ("os", "spawnv"), ("os", "spawnvp"), ("os", "execv"),
            ("os", "execvp"), ("os", "fork"), ("os", "posix_spawn")}


def process_starts(source: str) -> list[int]:
    """Lines of `source` that start a process other than through pdraft.children."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in STARTERS:
            found.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "os") \
                and any((node.module, a.name) in STARTERS for a in node.names):
            found.append(node.lineno)
    return found


def test_no_module_starts_a_process_but_through_the_one_rule():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel in (HOME, "pdraft/engines/vllm_worker.py"):  # the rule itself; the worker runs in vLLM's interpreter
            continue
        offenders += [f"{rel}:{n}" for n in process_starts(path.read_text())]
    assert not offenders, f"processes started outside {HOME}: {offenders}"


def test_the_walk_finds_a_second_way_to_start_a_process():
    assert process_starts("import subprocess\nsubprocess.run(['ls'])\n") == [2]
    assert process_starts("from subprocess import Popen\n") == [1]
    assert process_starts("import os\nos.system('ls')\n") == [2]
    assert process_starts("from pdraft.children import run_bounded\nrun_bounded(['ls'], timeout_s=1)\n") == []


def test_a_flood_keeps_a_bounded_buffer_and_ends_at_the_deadline():
    rss0 = psutil.Process().memory_info().rss
    t0 = time.monotonic()
    done = run_bounded([sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"],
                       timeout_s=2, max_bytes=4096)
    assert done.timed_out and done.cut and len(done.stdout) == 4096
    assert time.monotonic() - t0 < 2 + 12
    assert psutil.Process().memory_info().rss - rss0 < 50 << 20


def test_a_grandchild_holding_the_pipes_ends_with_the_deadline(tmp_path):
    pid_file = tmp_path / "pid"
    script = textwrap.dedent(f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
    """)  # the child exits at once; its own child keeps stdout and stderr open
    t0 = time.monotonic()
    done = run_bounded([sys.executable, "-c", script], timeout_s=3)
    assert done.timed_out and time.monotonic() - t0 < 3 + 12
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_normal_run_keeps_its_output_and_code():
    done = run_bounded([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                       timeout_s=30)
    assert (done.returncode, done.stdout.strip(), done.first_error_line(), done.cut) == (3, "out", "err", False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the death signal is Linux's")
def test_a_child_goes_when_pdraft_is_killed_outright(tmp_path):
    """pdraft killed with SIGKILL (no cleanup runs) still leaves no child behind: the death signal stops it."""
    pid_file = tmp_path / "pid"
    parent = textwrap.dedent(f"""
        import os, subprocess, sys, time
        from pdraft.children import popen
        child = popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(3600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    assert psutil.pid_exists(pid)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, \
        "the child outlived a pdraft killed outright"
