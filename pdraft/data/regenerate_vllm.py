"""Regenerate training responses with vLLM (`data.regenerate_engine: vllm`) instead of transformers'
`generate()`: one or two orders of magnitude faster at batch generation, and able to shard a target pdraft's
own processes could not hold (`data.vllm_args`: tensor_parallel_size, pipeline_parallel_size, ...).

**A driven interpreter, not an import.** vLLM pins its own torch and transformers, so it usually lives in a
venv of its own (the engine check keeps it in .venv-vllm); `data.vllm_python` names that interpreter (null:
the one running pdraft, for a single venv that has both). pdraft starts `pdraft/data/vllm_worker.py` with it
as a child process and speaks JSON lines to it; the child imports vLLM and nothing of pdraft. A child also
means vLLM's GPU memory (it reserves `gpu_memory_utilization` of every device) is handed back when it exits,
before pdraft loads the target for the capture pass, and vLLM's engine processes never meet torchrun's
process group: under torchrun rank 0 drives vLLM and the others wait (pdraft.runtime.wait_for_peers).

**The same responses file as transformers** (pdraft.data.regenerate): the same batches k of
`data.regenerate_batch_size` prompts are the resumable unit (a chunk is sent only when some of its samples are
missing, its samples appended and fsynced when it comes back), the same chat template (pdraft renders and
tokenizes every prompt and sends token ids), the same stop ids (every eos id of the target's generation
config, config and tokenizer), the same per-prompt cap (max_new_tokens, within the target's context), and the
same per-prompt seeds (`request_seeds`, passed as `SamplingParams(seed=...)`, so a sample does not depend on
its chunk), the same per-prompt sampling (temperature, top-k, top-p; greedy for the prompts of a mix's greedy
share: `RegenerateSettings.sampling_of`). The responses file's metadata records the engine, and a rerun with the other refuses to mix them.
Sampled responses follow the target's distribution in both engines but are not the same draws (different
random number streams); greedy ones agree up to float near-ties (docs/SCALING.md states the measured share).
vLLM's log goes to `<responses file>.vllm.log`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdraft.data.prompts import Conversation
from pdraft.data.regenerate import (RegenerateSettings, with_responses, cut_at_stop, open_responses,
                                    response_row)
from pdraft.data.templates import encode_prompt, eos_ids
from pdraft.errors import PdraftError
from pdraft.streams import request_seeds

WORKER = Path(__file__).with_name("vllm_worker.py")
_EXCEPTION_LINE = re.compile(r"\b((?:[A-Z]\w*(?:Error|Exception)): .*)$")
ENGINE = "vllm"
# torchrun's variables would make vLLM believe it was started by torchrun itself.
_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                       "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class VllmSettings:
    python: str
    llm_args: dict = field(default_factory=dict)  # vllm.LLM(**llm_args): model, tokenizer, seed, dtype, ...

    @classmethod
    def from_recipe(cls, recipe, target) -> VllmSettings:
        """The interpreter and the LLM(...) arguments: the target's folder, runtime.seed and the runtime's dtype,
        then data.vllm_args as given."""
        dtype = str(target.runtime.dtype).removeprefix("torch.") if target.runtime else "auto"
        folder = str(Path(target.path).resolve())
        args = {"model": folder, "tokenizer": folder, "seed": int(recipe.runtime.seed),
                "dtype": dtype, **recipe.data.vllm_args}
        return cls(python=recipe.data.vllm_python or sys.executable, llm_args=args)


    def check(self) -> None:
        """Refuse, before anything is written, an interpreter that does not exist or has no vLLM (a quick probe:
        importing vLLM itself takes seconds)."""
        python = Path(self.python).expanduser().absolute()
        if not python.is_file() or not os.access(python, os.X_OK):
            raise PdraftError(f"data.vllm_python {self.python}: no such interpreter",
                              hint="point it at the python of the venv vLLM is installed in, e.g. .venv-vllm/bin/python")
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
        try:
            found = subprocess.run([str(python), "-c", probe], capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PdraftError(f"data.vllm_python {self.python}: cannot run it ({type(e).__name__})") from None
        if not found:
            raise PdraftError(f"data.vllm_python {self.python}: vLLM is not installed for this interpreter",
                              hint="point it at the python of the venv vLLM is installed in (tests/engines/vllm_check.sh "
                                   "makes one in .venv-vllm)")


def log_path(path: Path) -> Path:
    return path.with_name(path.name + ".vllm.log")


class VllmWorker:
    """The child process running vllm_worker.py: started and its engine built on entering, stopped on exit."""

    def __init__(self, settings: VllmSettings, log: Path, seeded: bool = False, purpose: str = "regeneration"):
        self.settings, self.log, self.seeded = settings, log, seeded  # seeded: some request samples
        self.purpose = purpose  # what the engine is for, in its error lines
        self.proc: subprocess.Popen | None = None
        self._log_file = None
        self.speculative_config: dict | None = None  # the engine's resolved one, as it reported it

    def __enter__(self) -> VllmWorker:
        self.settings.check()
        python = Path(self.settings.python).expanduser().absolute()
        env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARIABLES and not k.startswith("TORCHELASTIC_")}
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log, "w", encoding="utf-8")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen([str(python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log_file, text=True, env=env)
        reply = self._ask({"llm": self.settings.llm_args, "seeded": self.seeded})
        if reply.get("import"):
            raise PdraftError(f"data.vllm_python {self.settings.python}: {reply['error']}",
                              hint="point it at the python of the venv vLLM is installed in")
        self.version = reply.get("vllm")
        self.speculative_config = reply.get("speculative_config")
        return self

    def _ask(self, message: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the reply read below says what happened
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise PdraftError(f"vLLM exited with code {code} before answering; its log: {self.log}",
                              hint=self._last_log_line())
        reply = json.loads(line)
        if "error" in reply:
            cause = self._root_cause()
            raise PdraftError(f"vLLM {self.purpose}: {reply['error']}{'; first cause: ' + cause if cause else ''}; "
                              f"its log: {self.log}")
        return reply

    def _log_lines(self) -> list[str]:
        self._log_file.flush()
        try:
            return [x for x in self.log.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return []

    def _last_log_line(self) -> str | None:
        lines = self._log_lines()
        return lines[-1][:300] if lines else None

    def _root_cause(self) -> str | None:
        """The first exception line vLLM logged (its engine processes fail with a generic error after it)."""
        for line in self._log_lines():
            m = _EXCEPTION_LINE.search(line)
            if m and "Engine core initialization failed" not in line:
                return m.group(1)[:400]
        return None

    def generate(self, requests: list[dict], stop_ids: list[int]) -> list[dict]:
        """Each request carries its own sampling (temperature, top_k, top_p) and seed."""
        return self._ask({"requests": requests, "stop_token_ids": stop_ids})["results"]

    def serve(self, requests: list[dict], *, temperature: float, top_k: int, top_p: float, stop_ids: list[int],
              concurrency: int) -> dict:
        """Serve `requests` ({prompt_ids, max_tokens, seed}) keeping `concurrency` in flight (vllm_worker.py):
        {"results": [...], "seconds": wall}."""
        return self._ask({"serve": {"requests": requests, "temperature": temperature, "top_k": top_k,
                                    "top_p": top_p, "stop_token_ids": stop_ids, "concurrency": concurrency}})

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            try:
                if self.proc.poll() is None:
                    self.proc.stdin.write(json.dumps({"exit": True}) + "\n")
                    self.proc.stdin.flush()
                self.proc.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def regenerate_vllm(target, records: Sequence[Conversation], path: str | Path, settings: RegenerateSettings,
                    vllm: VllmSettings, fresh: bool = False,
                    progress: Callable[[int], None] | None = None) -> list[Conversation]:
    """Records with `response`/`response_ids` generated by vLLM, resuming from `path` (see the module docstring).
    `target` needs no weights: a pdraft.target.loader.TargetInfo does. One process only (rank 0 under torchrun)."""
    path = Path(path)
    done, out_path = open_responses(target, records, path, settings, fresh=fresh, engine=ENGINE)
    if progress:
        progress(len(done))
    stops = sorted(set(eos_ids(target, target.tokenizer)))
    bs = settings.batch_size
    seeds = request_seeds(settings.seed, 0, len(records))  # prompt i's stream, as the transformers engine draws it
    chunks = []  # every prompt's request, checked before the engine starts
    for k in range(0, (len(records) + bs - 1) // bs):
        indices = [i for i in range(k * bs, min((k + 1) * bs, len(records))) if i not in done]
        if not indices:
            continue
        requests = []
        for i in indices:
            ids = encode_prompt(target.tokenizer, records[i].prompt, settings.chat_template, settings.enable_thinking)
            cap = min(settings.max_new_tokens, target.max_context - len(ids))
            if cap < 1:
                raise PdraftError(f"a prompt of {len(ids)} tokens leaves no room to generate within the target's "
                                  f"context of {target.max_context} tokens", hint="lower data.max_length or drop long prompts")
            sampling = settings.sampling_of(i)  # greedy or sampled per prompt, as the transformers engine decides
            requests.append({"index": i, "prompt_ids": ids, "max_tokens": cap,
                             "seed": seeds[i] if sampling.temperature > 0 else None,
                             "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p})
        chunks.append(requests)
    if not chunks:
        return with_responses(records, done)
    seeded = any(r["seed"] is not None for requests in chunks for r in requests)
    with VllmWorker(vllm, log_path(path), seeded) as worker, open(out_path, "a", encoding="utf-8") as out:
        for requests in chunks:
            results = worker.generate(requests, stops)
            for r in results:
                i = int(r["index"])
                row = response_row(target, records[i], i, cut_at_stop(list(r["token_ids"]), set(stops)))
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                done[i] = row
            out.flush()
            os.fsync(out.fileno())
            if progress:
                progress(len(results))
    return with_responses(records, done)
