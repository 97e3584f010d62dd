"""vLLM driven as a child process: `pdraft/engines/vllm_worker.py`, run by the interpreter that has vLLM
(`data.vllm_python`; vLLM pins its own torch and transformers, so it usually lives in a venv of its own, the
engine check's .venv-vllm), speaking JSON lines (pdraft.engines.channel). The worker imports vLLM and nothing of
pdraft. A child also means vLLM's GPU memory (it reserves `gpu_memory_utilization` of every device) is handed back
when it exits, and vLLM's engine processes never meet torchrun's process group.

VllmSettings (the interpreter, LLM(...)'s arguments, the deadlines) and VllmWorker (started and its engine built
on entering, stopped on exit, every reply validated) serve both callers: regeneration
(pdraft.data.regenerate_vllm, `data.regenerate_engine: vllm`) and the serving engine (pdraft.serving.vllm:
bench, check-serving, the cost table)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from pdraft.children import run_bounded
from pdraft.engines.channel import ChildChannel, printable
from pdraft.errors import PdraftError
from pdraft.readback import Schema

WORKER = Path(__file__).with_name("vllm_worker.py")
_EXCEPTION_LINE = re.compile(r"\b((?:[A-Z]\w*(?:Error|Exception)): .*)$")
NAME = "vllm"

# torchrun's variables would make vLLM believe it was started by torchrun itself.
_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                       "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class VllmSettings:
    python: str
    llm_args: dict = field(default_factory=dict)  # vllm.LLM(**llm_args): model, tokenizer, seed, dtype, ...
    start_timeout_s: float = 30.0  # data.vllm_start_timeout_s: the interpreter's probe, and the worker's first line
    load_timeout_s: float = 1800.0  # data.vllm_load_timeout_s: the engine loading (weights, graphs)
    chunk_timeout_s: float = 3600.0  # data.vllm_chunk_timeout_s: one chunk of prompts generated

    @classmethod
    def from_recipe(cls, recipe, target) -> VllmSettings:
        """The interpreter and the LLM(...) arguments: the target's folder, runtime.seed and the runtime's dtype,
        then data.vllm_args as given."""
        dtype = str(target.runtime.dtype).removeprefix("torch.") if target.runtime else "auto"
        folder = str(Path(target.path).resolve())
        args = {"model": folder, "tokenizer": folder, "seed": int(recipe.runtime.seed),
                "dtype": dtype, **recipe.data.vllm_args}
        return cls(python=recipe.data.vllm_python or sys.executable, llm_args=args,
                   start_timeout_s=recipe.data.vllm_start_timeout_s, load_timeout_s=recipe.data.vllm_load_timeout_s,
                   chunk_timeout_s=recipe.data.vllm_chunk_timeout_s)

    def check(self) -> None:
        """Refuse, before anything is written, an interpreter that does not exist, does not answer within
        `start_timeout_s` or has no vLLM (a quick probe: importing vLLM itself takes seconds). The probe is a
        bounded run (pdraft.children): an interpreter that hangs or floods its output costs its deadline and a
        bounded buffer."""
        python = Path(self.python).expanduser().absolute()
        if not python.is_file() or not os.access(python, os.X_OK):
            raise PdraftError(f"data.vllm_python {self.python}: no such interpreter",
                              hint="point it at the python of the venv vLLM is installed in, e.g. .venv-vllm/bin/python")
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
        try:
            done = run_bounded([str(python), "-c", probe], timeout_s=self.start_timeout_s, max_bytes=4096)
        except OSError as e:
            raise PdraftError(f"data.vllm_python {self.python}: cannot run it ({e.strerror or type(e).__name__})") from None
        if done.timed_out:
            raise PdraftError(f"data.vllm_python {self.python}: no answer within {self.start_timeout_s:g} s to a "
                              f"one-line probe; it was stopped", hint="data.vllm_start_timeout_s sets the wait")
        if done.returncode != 0:
            raise PdraftError(f"data.vllm_python {self.python}: vLLM is not installed for this interpreter",
                              hint="point it at the python of the venv vLLM is installed in (tests/engines/vllm_check.sh "
                                   "makes one in .venv-vllm)")


# ---- the worker's replies: input, read like a file pdraft reads back (pdraft.engines.channel) ------------------
class _Failed(Schema):
    error: str
    import_: bool = Field(False, alias="import")


class _Started(Schema):
    """The worker's first line, sent before it reads anything or imports vLLM: the interpreter runs it."""

    started: Literal[True]
    python: str = Field(max_length=100)


class _Ready(Schema):
    ready: Literal[True]
    vllm: str = Field(max_length=100)
    load_s: float = Field(ge=0)
    speculative_config: dict | None = None  # the engine's resolved one (every plain field), None without


class _Served(Schema):
    """One request's answer to a `serve` message (vllm_worker.py): its tokens and the engine's own figures."""

    token_ids: list[int]
    finish_reason: str | None = Field(None, max_length=100)
    per_step_accepted: list[int] | None = None
    per_step_drafted: list[int] | None = None
    first_token_ts: float | None = None
    last_token_ts: float | None = None


class _ServedSet(Schema):
    results: list[_Served]
    seconds: float = Field(ge=0)


class _SpsMeasured(Schema):
    """The reply to an `sps` message (vllm_worker.py _sps): median seconds per B, and what was measured."""

    seconds: list[float] = Field(max_length=1 << 16)
    context: int = Field(ge=1)  # the cached context per request, cut to the prefix cache's grain
    cache_unit: int = Field(ge=1)
    torch: str = Field(max_length=100)
    device: str | None = Field(None, max_length=200)  # the engine's GPU by name; None on a CPU
    max_num_batched_tokens: int = Field(ge=1)


class _Result(Schema):
    index: int = Field(ge=0)
    token_ids: list[int]
    finish_reason: str | None = Field(None, max_length=100)


class _Results(Schema):
    results: list[_Result]
    seconds: float = Field(ge=0)


MAX_READY_BYTES = 16384  # {"ready": true, "vllm": "...", "load_s": ..., "speculative_config": {...}} or a one-line error
MAX_ID_BYTES = 24  # one token id in a JSON list: up to 20 digits (a 64-bit id, the most a sane engine sends), ", "


def reply_bytes(requests: list[dict]) -> int:
    """The most bytes a reply to `requests` can need: each request's max_tokens ids and its fields."""
    return MAX_READY_BYTES + sum(128 + int(r["max_tokens"]) * MAX_ID_BYTES for r in requests)


class VllmWorker:
    """The child process running vllm_worker.py: started and its engine built on entering, stopped on exit.
    Every reply is validated (pdraft.engines.channel): a banner, a missing answer, an id outside the target's
    vocabulary, a flood or a silence past `data.vllm_load_timeout_s` / `data.vllm_chunk_timeout_s` stops the
    child in one line."""

    def __init__(self, settings: VllmSettings, log: Path, vocab_size: int, seeded: bool = False,
                 purpose: str = "regeneration"):
        self.settings, self.log, self.vocab_size = settings, log, vocab_size
        self.seeded = seeded  # some request samples
        self.purpose = purpose  # what the engine is for, in its error lines
        self.channel: ChildChannel | None = None
        self.speculative_config: dict | None = None  # the engine's resolved one, as it reported it

    def __enter__(self) -> VllmWorker:
        self.settings.check()
        python = Path(self.settings.python).expanduser().absolute()
        env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARIABLES and not k.startswith("TORCHELASTIC_")}
        self.channel = ChildChannel([str(python), str(WORKER)], log=self.log, what="the vLLM worker", env=env)
        try:
            self._reply(_Started, "the vLLM worker to start", self.settings.start_timeout_s, MAX_READY_BYTES)
            self.channel.send({"llm": self.settings.llm_args, "seeded": self.seeded})
            reply = self._reply(_Ready, "the vLLM engine to load", self.settings.load_timeout_s, MAX_READY_BYTES)
        except BaseException:
            self.channel.close()
            raise
        self.version = reply.vllm
        self.speculative_config = reply.speculative_config
        return self

    def _reply(self, schema, waiting_for: str, timeout_s: float, max_bytes: int):
        """The next reply, as `schema` or the worker's own error (raised as one line)."""
        line = self.channel.read_line(waiting_for=waiting_for, timeout_s=timeout_s, max_bytes=max_bytes)
        data = self.channel.parse(line, waiting_for)
        if isinstance(data, dict) and "error" in data:
            failed = self.channel.check(_Failed, data, waiting_for)
            if failed.import_:
                raise PdraftError(f"data.vllm_python {self.settings.python}: {printable(failed.error)}",
                                  hint="point it at the python of the venv vLLM is installed in")
            cause = self._root_cause()
            raise PdraftError(f"vLLM {self.purpose}: {printable(failed.error)}"
                              f"{'; first cause: ' + printable(cause) if cause else ''}; its log: {self.log}")
        return self.channel.check(schema, data, waiting_for)

    def _root_cause(self) -> str | None:
        """The first exception line vLLM logged (its engine processes fail with a generic error after it)."""
        for line in self.channel.log_lines():
            m = _EXCEPTION_LINE.search(line)
            if m and "Engine core initialization failed" not in line:
                return m.group(1)
        return None

    def generate(self, requests: list[dict], stop_ids: list[int]) -> list[dict]:
        """Token ids per request (each request carries its own sampling and seed), each answer checked against
        what was asked: every index once, at most max_tokens ids, every id in [0, the target's vocabulary)."""
        what = f"a chunk of {len(requests)} prompt(s) (indices {requests[0]['index']}..{requests[-1]['index']})"
        self.channel.send({"requests": requests, "stop_token_ids": stop_ids})
        reply = self._reply(_Results, what, self.settings.chunk_timeout_s, reply_bytes(requests))
        asked = {int(r["index"]): int(r["max_tokens"]) for r in requests}
        seen: set[int] = set()
        for n, r in enumerate(reply.results):
            where = f"its reply to {what}: results.{n}"
            if r.index not in asked or r.index in seen:
                raise self.channel.violation(f"{where}.index: {r.index} was {'answered twice' if r.index in seen else 'not asked'}")
            seen.add(r.index)
            if len(r.token_ids) > asked[r.index]:
                raise self.channel.violation(f"{where}.token_ids: {len(r.token_ids)} tokens, more than the "
                                             f"{asked[r.index]} asked")
            bad = next((t for t in r.token_ids if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise self.channel.violation(f"{where}.token_ids: token id {printable(bad, 40)} is outside the "
                                             f"target's vocabulary [0, {self.vocab_size})")
        missing = sorted(set(asked) - seen)
        if missing:
            raise self.channel.violation(f"its reply to {what} has no answer for prompt {missing[0]} "
                                         f"({len(missing)} missing)")
        return [r.model_dump() for r in reply.results]

    def serve(self, requests: list[dict], *, temperature: float, top_k: int, top_p: float, stop_ids: list[int],
              concurrency: int) -> dict:
        """Serve `requests` ({prompt_ids, max_tokens, seed}) keeping `concurrency` in flight (vllm_worker.py):
        {"results": [one per request, in order], "seconds": wall}, each answer checked as generate's are."""
        what = f"a set of {len(requests)} request(s) at concurrency {concurrency}"
        self.channel.send({"serve": {"requests": requests, "temperature": temperature, "top_k": top_k,
                                     "top_p": top_p, "stop_token_ids": stop_ids, "concurrency": concurrency}})
        steps = sum(2 * 8 * (int(r["max_tokens"]) + 2) for r in requests)  # per-step counts and timestamps
        reply = self._reply(_ServedSet, what, self.settings.chunk_timeout_s,
                            reply_bytes([{**r, "index": i} for i, r in enumerate(requests)]) + steps)
        if len(reply.results) != len(requests):
            raise self.channel.violation(f"its reply to {what} has {len(reply.results)} answers")
        for n, (r, asked) in enumerate(zip(reply.results, requests)):
            if len(r.token_ids) > int(asked["max_tokens"]) or any(not 0 <= t < self.vocab_size for t in r.token_ids):
                raise self.channel.violation(f"its reply to {what}: results.{n}.token_ids: more tokens than asked or "
                                             f"an id outside the target's vocabulary [0, {self.vocab_size})")
        return {"results": [r.model_dump() for r in reply.results], "seconds": reply.seconds}

    def sps(self, points: list[int], *, context: int, requests: int, repeats: int, seed: int) -> _SpsMeasured:
        """The engine's step times for calibrate-threshold's cost table (vllm_worker.py _sps), one per B of
        `points`, each a finite number > 0."""
        what = f"the SPS profile of {len(points)} batch sizes"
        self.channel.send({"sps": {"points": points, "context": context, "requests": requests, "repeats": repeats,
                                   "vocab_size": self.vocab_size, "seed": seed}})
        reply = self._reply(_SpsMeasured, what, self.settings.chunk_timeout_s, MAX_READY_BYTES + 32 * len(points))
        if len(reply.seconds) != len(points) or not all(0 < t < float("inf") for t in reply.seconds):
            raise self.channel.violation(f"its reply to {what}: {len(reply.seconds)} step times, or one not > 0")
        return reply

    def __exit__(self, exc_type, *exc) -> None:
        """Done: the worker is asked to exit and given time to release the engine. Left on an error or an
        interrupt: its process group is stopped at once (the worker does not share pdraft's terminal group,
        so a Ctrl-C reaches pdraft alone)."""
        if self.channel is not None:
            if exc_type is None:
                self.channel.close(exit_message={"exit": True}, grace_s=120)
            else:
                self.channel.close()
