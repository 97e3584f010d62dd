"""Reliability under torchrun (issue 33, items 3 and 4; issue 31's refusals): `train` and `export-hidden`
started with garbage, partial or contradictory RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE /
MASTER_ADDR / MASTER_PORT, with no peer to meet (rendezvous bounded by runtime.dist_timeout_s), or with a
target.tensor_parallel that does not divide the processes or the target's heads: each fails with one line
naming the variable or the setting, exit code 2, and changes nothing (contract in reliability_support.check).
The cases without a peer run in a subprocess: a process waiting for peers listens on a port. On main 737560a
every case failed: tracebacks (garbage values), a silent single-process run without the run folder's lock
(RANK=1 alone), waits of 30 minutes (train) and 24 hours (export-hidden) for a missing peer, and an unknown
recipe key (tensor_parallel); the vLLM cases are new settings (issue 31)."""

import socket
import sys

import reliability_support
from reliability_support import Case, check, param, run_cli

w = reliability_support.w  # the shared world, a module fixture

SINGLE = {"MASTER_ADDR": None, "MASTER_PORT": None, "LOCAL_RANK": None, "LOCAL_WORLD_SIZE": None,
          "RANK": None, "WORLD_SIZE": None, "TORCHELASTIC_USE_AGENT_STORE": None}


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def env(**values):
    """A torchrun environment made of exactly these variables (every other one unset)."""
    return lambda w, t: {**SINGLE, **{k: str(v) for k, v in values.items()}}


def no_peer(rank: int):
    """WORLD_SIZE=2, this process rank `rank`, a free port on 127.0.0.1: the other process never comes."""
    return lambda w, t: {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}


def train(w, t):
    return ["train", str(w.recipe)]


def export(w, t):
    return ["export-hidden", str(w.recipe), "--set", f"data.cache_dir={t / 'cache'}"]


ENV_CASES = [
    ("rank-garbage", "RANK=abc WORLD_SIZE=2", env(RANK="abc", WORLD_SIZE=2), r"RANK='abc' is not a non-negative integer"),
    ("world-size-garbage", "WORLD_SIZE=x", env(WORLD_SIZE="x"), r"WORLD_SIZE='x' is not a non-negative integer"),
    ("world-size-alone", "WORLD_SIZE=2 alone", env(WORLD_SIZE=2), r"WORLD_SIZE=2 is set but RANK is not"),
    ("rank-beyond-world", "RANK=3 WORLD_SIZE=1", env(RANK=3, WORLD_SIZE=1), r"RANK=3 is not below WORLD_SIZE=1"),
    ("rank-alone", "RANK=1 without WORLD_SIZE (trained silently, without the run folder's lock)", env(RANK=1),
     r"RANK=1 is set but WORLD_SIZE is not"),
    ("world-size-zero", "WORLD_SIZE=0 RANK=0", env(RANK=0, WORLD_SIZE=0), r"WORLD_SIZE=0 is not between 1 and"),
    ("world-size-huge", "WORLD_SIZE=10**12 RANK=0", env(RANK=0, WORLD_SIZE=10**12), r"WORLD_SIZE=1000000000000 is beyond"),
    ("local-rank-negative", "LOCAL_RANK=-1 (RANK=0 WORLD_SIZE=1)", env(RANK=0, WORLD_SIZE=1, LOCAL_RANK=-1),
     r"LOCAL_RANK='-1' is not a non-negative integer"),
    ("local-rank-beyond", "LOCAL_RANK=2 LOCAL_WORLD_SIZE=2 (RANK=0 WORLD_SIZE=2)",
     env(RANK=0, WORLD_SIZE=2, LOCAL_RANK=2, LOCAL_WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=29500),
     r"LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
    ("local-rank-above-rank", "LOCAL_RANK=1 with RANK=0", env(RANK=0, WORLD_SIZE=2, LOCAL_RANK=1, MASTER_ADDR="h",
                                                             MASTER_PORT=29500), r"LOCAL_RANK=1 exceeds RANK=0"),
    ("local-world-beyond-world", "LOCAL_WORLD_SIZE=8 with WORLD_SIZE=2",
     env(RANK=0, WORLD_SIZE=2, LOCAL_WORLD_SIZE=8, MASTER_ADDR="h", MASTER_PORT=29500),
     r"LOCAL_WORLD_SIZE=8 is not between 1 and WORLD_SIZE=2"),
    ("master-addr-missing", "WORLD_SIZE=2 RANK=0 without MASTER_ADDR", env(RANK=0, WORLD_SIZE=2, MASTER_PORT=29500),
     r"WORLD_SIZE=2 but MASTER_ADDR is not set"),
    ("master-port-garbage", "MASTER_PORT=99999", env(RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=99999),
     r"MASTER_PORT='99999' is not a port number"),
    ("master-addr-garbage", "MASTER_ADDR with a space in it",
     env(RANK=0, WORLD_SIZE=2, MASTER_ADDR="bad host", MASTER_PORT=29500), r"MASTER_ADDR='bad host' is not a host"),
]

CASES = [Case(cmd, name, f"`{cmd}` with {what}", argv, expect, env=e)
         for cmd, argv in (("train", train), ("export-hidden", export))
         for name, what, e, expect in ENV_CASES]
CASES += [
    Case("train", "no-peer", "WORLD_SIZE=2 RANK=0 and no second process (runtime.dist_timeout_s=2)",
         lambda w, t: [*train(w, t), "--set", "runtime.dist_timeout_s=2"],
         r"rank 0: rank 1 of WORLD_SIZE=2 did not join at 127\.0\.0\.1:\d+ within runtime\.dist_timeout_s=2 s",
         subprocess=True, env=no_peer(0)),
    Case("export-hidden", "no-peer", "WORLD_SIZE=2 RANK=0 and no second process (runtime.dist_timeout_s=2)",
         lambda w, t: [*export(w, t), "--set", "runtime.dist_timeout_s=2"],
         r"rank 0: rank 1 of WORLD_SIZE=2 did not join", subprocess=True, env=no_peer(0)),
    Case("export-hidden", "no-rank-0", "WORLD_SIZE=2 RANK=1 and no rank 0 to meet (runtime.dist_timeout_s=2)",
         lambda w, t: [*export(w, t), "--set", "runtime.dist_timeout_s=2"],
         r"rank 1: nothing answered at MASTER_ADDR:MASTER_PORT 127\.0\.0\.1:\d+ within runtime\.dist_timeout_s=2 s",
         subprocess=True, env=no_peer(1)),
    Case("export-hidden", "tensor-parallel-one-process", "target.tensor_parallel=2 without torchrun",
         lambda w, t: [*export(w, t), "--set", "target.tensor_parallel=2"],
         r"target\.tensor_parallel 2 does not divide the 1 process\(es\)", env=env()),
    Case("train", "tensor-parallel-three-of-two", "target.tensor_parallel=3 with WORLD_SIZE=2",
         lambda w, t: [*train(w, t), "--set", "target.tensor_parallel=3"],
         r"target\.tensor_parallel 3 does not divide the 2 process\(es\)",
         env=env(RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=29500)),
    Case("export-hidden", "tensor-parallel-heads", "target.tensor_parallel=2 for a target with 1 key/value head",
         lambda w, t: [*export(w, t), "--set", "target.tensor_parallel=2"],
         r"target\.tensor_parallel 2 does not divide target '.*'s num_key_value_heads \(1\)",
         env=env(RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=29500)),
    Case("export-hidden", "vllm-python-missing", "data.regenerate_engine=vllm with a data.vllm_python that does not exist",
         lambda w, t: [*export(w, t), "--set", "data.regenerate=true", "--set", "data.regenerate_engine=vllm",
                       "--set", f"data.vllm_python={t / 'nope' / 'python'}"],
         r"data\.vllm_python .*nope/python: no such interpreter", env=env()),
    Case("export-hidden", "vllm-not-installed", "data.regenerate_engine=vllm with an interpreter that has no vLLM",
         lambda w, t: [*export(w, t), "--set", "data.regenerate=true", "--set", "data.regenerate_engine=vllm",
                       "--set", f"data.vllm_python={sys.executable}"],
         r"data\.vllm_python .*: vLLM is not installed for this interpreter", env=env()),
    Case("export-hidden", "vllm-args-model", "data.vllm_args naming the model pdraft sets",
         lambda w, t: [*export(w, t), "--set", "data.vllm_args={model: other}"],
         r"data\.vllm_args: model is set by pdraft", env=env()),
    Case("train", "dist-timeout-zero", "runtime.dist_timeout_s=0",
         lambda w, t: [*train(w, t), "--set", "runtime.dist_timeout_s=0"],
         r"runtime\.dist_timeout_s: expected a value greater than or equal to 1", env=env()),
]


@param(CASES)
def test_case(case, w, tmp_path, monkeypatch):
    check(case, w, tmp_path, monkeypatch)


def test_a_process_waiting_for_a_peer_says_whom_it_waits_for(w, tmp_path, monkeypatch):
    """Before giving up, the waiting process says whom it waits for and where (issue 33, item 3)."""
    monkeypatch.chdir(tmp_path)
    res = run_cli([*export(w, tmp_path), "--set", "runtime.dist_timeout_s=3"], subprocess_=True,
                  env=no_peer(0)(w, tmp_path))
    assert res.code == 2, res.err
    assert "rank 0: waiting for rank 1 to join at 127.0.0.1:" in res.err, res.err


SILENT_PEER = """
import os, signal, sys, torch
from pdraft.errors import PdraftError
from pdraft.runtime import join_group, leave_group, wait_for_peers
join_group(torch.device("cpu"), 4)
wait_for_peers("the first step")  # both arrive: a wait that ends
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGSTOP)  # hangs, heartbeat and all
try:
    wait_for_peers("the second step")
except PdraftError as e:
    print("error: " + e.one_line(), flush=True)
    sys.exit(2)
"""


def test_a_peer_that_falls_silent_ends_the_wait_in_one_line(tmp_path):
    """A wait on another process's work lasts as long as its heartbeat; a hung peer ends it after
    runtime.dist_timeout_s (4 s here) with one line naming it, not a wait forever (issue 33, item 3)."""
    from test_distributed import torchrun

    script = tmp_path / "silent.py"
    script.write_text(SILENT_PEER)
    res = torchrun(2, [str(script)], timeout=120)
    assert res.returncode != 0
    assert "error: rank 0: rank 1 stopped answering while we wait to finish the second step" in res.stdout, \
        res.stdout + res.stderr[-3000:]
    assert "rank 0: waiting for rank 1 to finish the second step" in res.stderr, res.stderr[-3000:]
