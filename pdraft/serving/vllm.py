"""vLLM as a bench engine (`pdraft bench ... --engine vllm`): the contenders that run the bench's requests in vLLM
instead of pdraft's loop, and fill the same table from vLLM's own figures; and the serving check's vLLM
(`pdraft check-serving --engine vllm`). ENGINE (pdraft.serving.api.Engine) is all pdraft.serving registers of it.

Each drafter is exported to vLLM's format (pdraft.hub.export, `--format vllm`) in a scratch folder, and vLLM
runs in its own interpreter (pdraft/engines/vllm_worker.py, as `data.regenerate_engine: vllm` does: data.vllm_python,
else $VLLM_VENV/bin/python, else the interpreter running pdraft), one engine per (drafter, gamma) with
`num_speculative_tokens` = gamma, plus one without speculation: the baseline this engine's speedups count
against. The engines are started before the sweep decodes anything (`prepare`); one that vLLM refuses (its
CPU build serves neither DSpark nor DFlash2) or that cannot be exported leaves one line in the report and the
rest runs. Requests are fed keeping C in flight (the workload's concurrency; the batch size in the gamma
sweep), greedy or sampled with the per-request stream seeds of pdraft's runs (vLLM draws its own numbers: sampled
outputs are not the same draws).

Figures: tau, acceptance per position and verification counts come from vLLM's per-request speculative metrics
(`per_request_spec_decode_metrics="detailed"`: accepted and drafted per verify step, vllm/v1/metrics/stats.py
RequestSpecDecodeMetrics), turned into pdraft's RoundRecords (one per verify step, plus the request's first
token, which vLLM takes from the prefill); TPOT per request from vLLM's first and last token timestamps
(RequestStateStats) and total tokens/s over the wall time of the whole set (pdraft.metrics.summarize_engine).
vLLM has no per-round draft or verify time to report. Verification: full blocks only (pdraft's other policies
are refused in one line: vLLM's adaptive verification is not wired here, and its CPU build refuses it).

The scheduler's cost table measured in vLLM (`pdraft calibrate-threshold --engine vllm`, `sps_profiler`): what one
engine step costs when it holds B new tokens in total over requests whose KV caches already hold `context` tokens,
which is what a verify step of B tokens is to the engine (the anchors and drafts of min(B, requests) requests
appended to their caches in one forward). vLLM offers no way to hand it a verify batch of pdraft's choosing, so the
target is served alone with prefix caching on: each request's context (random ids, the nearest whole number of
the prefix cache's blocks: 128 tokens on the CPU build) is prefilled once, then each timed call sends min(B,
requests) requests, each its context plus its share of B fresh ids, with max_tokens 1, so the scheduler runs one
step whose new tokens are exactly those B over cached contexts (vllm_worker.py `_sps`; every request must report
its whole context in RequestOutput.num_cached_tokens, else the run fails rather than time a prefill; B beyond
max_num_batched_tokens is refused: it would take two steps). The median over `calibrate.sps_repeats` calls after
a warm-up gives SPS(B) = 1 / median, smoothed and stored as pdraft's own (pdraft.calibrate.sps.cost_table). Where
it differs from a verify step: the call also pays request admission and output handling of its min(B, requests)
requests (an engine step of running requests pays the scheduling of as many), and the target computes logits at
the last new token of each request, not at all B (a verify step needs them all): with a large vocabulary a verify
step's LM head costs more than this figure holds. The timing is taken inside the worker, away from the pipe to pdraft.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pdraft.bench.contenders import Decoded, Workload
from pdraft.errors import PdraftError
from pdraft.hub.export import export
from pdraft.metrics import RoundRecord, summarize_engine
from pdraft.policies import FULL
from pdraft.serving.api import Engine
from pdraft.streams import request_seeds

NAME = "vllm"
# vLLM's finish reasons in pdraft's words
_REASONS = {"stop": "eos", "length": "length"}


def vllm_python(recipe=None) -> str:
    """The interpreter with vLLM: data.vllm_python, else $VLLM_VENV/bin/python, else the running one."""
    if recipe is not None and recipe.data.vllm_python:
        return recipe.data.vllm_python
    venv = os.environ.get("VLLM_VENV")
    return str(Path(venv) / "bin" / "python") if venv else sys.executable


def timeouts(recipe=None) -> dict:
    """How long the worker may take to start, load and answer (data.vllm_*_timeout_s), as VllmSettings takes them."""
    if recipe is None:
        return {}
    d = recipe.data
    return {"start_timeout_s": d.vllm_start_timeout_s, "load_timeout_s": d.vllm_load_timeout_s,
            "chunk_timeout_s": d.vllm_chunk_timeout_s}


def engine_dtype(dtype: torch.dtype) -> str:
    """vLLM's name for the dtype pdraft's own loop runs in (`runtime.dtype`, resolved), so that both sides of a
    bench compute in the same precision (bf16 on a CPU with bf16 units under `auto`)."""
    return str(dtype).removeprefix("torch.")


MIN_MEMORY_SHARE, MAX_MEMORY_SHARE = 0.05, 0.9


def memory_share(target_dir: str) -> float:
    """vLLM's CPU build reserves gpu_memory_utilization of the machine's memory for the weights, its profiling
    pass and the KV cache together, and fails at start when the weights leave the KV cache nothing (a float32
    SmolLM2, 538 MB, asked -0.61 GiB of KV at 0.05 of 23.5 GiB). The share that holds three times the target's
    weight files (weights, drafter and the profiling pass's activations) plus 1 GiB of KV, within 0.05..0.9."""
    weights = sum(f.stat().st_size for f in Path(target_dir).glob("*.safetensors") if f.is_file())
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return MIN_MEMORY_SHARE
    need = 3 * weights + (1 << 30)
    return round(min(MAX_MEMORY_SHARE, max(MIN_MEMORY_SHARE, need / total)), 3)


def llm_args(target_dir: str, recipe=None, *, dtype: str = "float32", **extra) -> dict:
    """vllm.LLM(...) keywords: the target's folder, in `dtype` (the bench passes the dtype pdraft's loop runs in;
    the serving check float32 on both sides, where it compares formats, not rounding), eager (no compilation on
    the clock), a KV reservation sized from the target's weights (memory_share: vLLM's CPU build takes
    gpu_memory_utilization of the machine's memory), statistics on (they carry the per-request timestamps); then
    data.vllm_args as given."""
    args = {"model": target_dir, "tokenizer": target_dir, "dtype": dtype, "seed": 0, "enforce_eager": True,
            "max_model_len": 1024, "gpu_memory_utilization": memory_share(target_dir), "disable_log_stats": False}
    if recipe is not None:
        args["seed"] = int(recipe.runtime.seed)
        args.update(recipe.data.vllm_args)
    args.update(extra)
    return args


def speculative_config(command: str) -> dict:
    """The --speculative-config of the `vllm serve` command pdraft.hub.export printed."""
    argv = shlex.split(command.splitlines()[0])
    if "--speculative-config" not in argv:
        raise PdraftError(f"pdraft export printed no vLLM speculative config: {command}")
    return json.loads(argv[argv.index("--speculative-config") + 1])


def served_config(spec: dict, export_dir: Path, num_speculative: int) -> dict:
    """The --speculative-config vLLM is asked for: the printed one, serving `export_dir` with `num_speculative`."""
    return {**spec, "model": str(export_dir), "num_speculative_tokens": num_speculative}


def engine_records(results: list[dict], speculative: bool, first_request: int = 0) -> tuple[list, list, list]:
    """(RoundRecords, outputs, per-request (decode seconds, tokens after the first)) of vLLM's results: the first
    token of a request is one target-only record (vLLM takes it from the prefill); then one record per verify step
    (gamma = l = drafted, a = accepted, committed = a + 1 up to what the output holds: vLLM drafts the last block
    in full and trims after), or one per token without speculation. Every record has its own round number:
    vLLM reports no shared batched rounds."""
    records: list[RoundRecord] = []
    outputs, times = [], []
    rnd = 0
    for i, r in enumerate(results):
        request = first_request + i
        tokens = list(r["token_ids"])
        outputs.append(tokens)
        if not tokens:
            continue
        records.append(RoundRecord(request, rnd, 0, 0, 0, 1))
        rnd += 1
        left = len(tokens) - 1
        steps = zip(r["per_step_accepted"] or [], r["per_step_drafted"] or []) if speculative else ()
        for accepted, drafted in steps:
            if left <= 0:
                break
            committed = min(accepted + 1, left)
            records.append(RoundRecord(request, rnd, drafted, drafted, accepted, committed))
            rnd, left = rnd + 1, left - committed
        for _ in range(left):  # tokens no verify step accounts for (none with speculation, all without)
            records.append(RoundRecord(request, rnd, 0, 0, 0, 1))
            rnd += 1
        if r.get("first_token_ts") is not None and r.get("last_token_ts") is not None:
            times.append((float(r["last_token_ts"]) - float(r["first_token_ts"]), len(tokens) - 1))
    return records, outputs, times


@dataclass
class VllmContender:
    """One row of the bench run by vLLM: the target alone (`export_dir` None) or a drafter exported for it."""

    label: str
    kind: str
    python: str
    args: dict  # vllm.LLM(...) keywords, without the speculative config
    vocab_size: int  # the target's: every token id the engine returns is checked against it
    log_dir: Path
    export_dir: Path | None = None
    method: str | None = None  # vLLM's speculative method (dflash, eagle3, dspark)
    max_gamma: int | None = None  # the exported num_speculative_tokens; None for the target alone
    path: str | None = None
    has_confidence: bool = False
    verify: object = None
    engine: str = NAME
    tree: tuple[int, int] | None = None  # vLLM verifies chains here (its tree verification is not wired)
    chain: str | None = None
    # Requests may be sampled with their own seeds: vLLM's CPU build then runs without chunked prefill (it cannot
    # rewind a seeded generator over a split prefill: pdraft/engines/vllm_worker.py); greedy-only users pass False.
    seeded: bool = True
    timeouts: dict = field(default_factory=dict)  # VllmSettings' start/load/chunk timeouts, from the recipe's data section
    # vLLM's speculative_config draft_sample_method (vllm/config/speculative.py: "greedy" by default there), asked
    # for where the bench samples, so vLLM's rows draw drafts as pdraft's do (decode.draft_sample_method); None:
    # greedy runs, where both rules are the argmax and vLLM's default is left alone.
    draft_sample_method: str | None = None
    _workers: dict = field(default_factory=dict, repr=False)  # gamma -> a started VllmWorker
    _requested: dict = field(default_factory=dict, repr=False)  # gamma -> the speculative config asked for

    @property
    def baseline(self) -> bool:
        return self.export_dir is None

    def refusal(self, policy: str) -> str | None:
        if policy == FULL:
            return None
        return (f"vLLM verifies the full block here: pdraft's {policy} policy has no wired vLLM counterpart "
                f"(its adaptive verification is refused by the CPU build)")

    def prepare(self, gammas) -> str | None:
        """Start one engine per gamma (one without speculation for the target alone); a one-line refusal, with
        every engine of this contender stopped, when vLLM will not serve it."""
        from pdraft.engines.vllm_driver import VllmSettings, VllmWorker

        for gamma in [0] if self.baseline else list(gammas):
            args = dict(self.args, **({} if self.baseline else {
                "speculative_config": {"method": self.method, "model": str(self.export_dir),
                                       "num_speculative_tokens": gamma,
                                       **({"draft_sample_method": self.draft_sample_method}
                                          if self.draft_sample_method else {})},
                "per_request_spec_decode_metrics": "detailed"}))
            log = self.log_dir / f"vllm-{_slug(self.label)}-g{gamma}.log"
            worker = VllmWorker(VllmSettings(self.python, args, **self.timeouts), log, self.vocab_size, seeded=self.seeded,
                                purpose="bench")
            try:
                worker.__enter__()  # stops its child itself when the engine does not start
            except PdraftError as e:
                self.close()
                return f"vLLM refuses {self.label}" + (f" at gamma {gamma}" if gamma else "") + f": {e.message}"
            self._requested[gamma] = args.get("speculative_config")
            self._workers[gamma] = worker
        return None

    def run(self, work: Workload, stream=None) -> Decoded:
        worker = self._workers.get(work.gamma)
        if worker is None:
            raise PdraftError(f"{self.label}: no vLLM engine started for gamma {work.gamma}")
        d = work.decode
        t = d.sampling.temperature
        seeds = request_seeds(d.seed, 0, len(work.prompts))
        requests = [{"prompt_ids": list(p), "max_tokens": d.max_new_tokens, "seed": seeds[i] if t > 0 else None}
                    for i, p in enumerate(work.prompts)]
        reply = worker.serve(requests, temperature=t, top_k=d.sampling.top_k, top_p=d.sampling.top_p,
                             stop_ids=sorted(set(work.eos_token_ids)),
                             concurrency=work.concurrency or d.batch_size)
        results = reply["results"]
        records, outputs, times = engine_records(results, not self.baseline)
        if stream is not None:
            for r in records:
                stream.write_round(r)
        info = {"name": NAME, "version": worker.version, "speculative_config": worker.speculative_config,
                "requested_speculative_config": self._requested[work.gamma],
                "llm_args": {k: v for k, v in worker.settings.llm_args.items() if k != "speculative_config"}}
        return Decoded(records, outputs, [_REASONS.get(r["finish_reason"], str(r["finish_reason"])) for r in results],
                       backend=f"vLLM {worker.version}", summary=summarize_engine(records, times, reply["seconds"]),
                       engine_info=info)

    def close(self) -> None:
        for worker in self._workers.values():
            worker.__exit__(None, None, None)
        self._workers.clear()


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:80]


def draft_rule(recipe) -> str | None:
    """The draft_sample_method vLLM's drafter rows are asked for: the recipe's decode.draft_sample_method where the
    bench samples at some temperature, None where every run is greedy (both rules are the argmax there)."""
    b = recipe.bench
    return recipe.decode.draft_sample_method if any(float(t) > 0 for t in b.temperatures or [b.temperature]) else None


def contenders(recipe, target, drafters: list, *, scratch: Path | None = None,
               warn=lambda _: None) -> tuple[list[VllmContender], list[tuple[str, str]]]:
    """The target alone in vLLM and every drafter that exports to vLLM's format: (contenders, (label, one line)
    for each drafter that does not). `drafters` are pdraft's own contenders (label, kind, path)."""
    scratch = Path(scratch or tempfile.mkdtemp(prefix="pdraft-vllm-bench-"))
    target_dir = str(Path(target.path).resolve())
    python, args = vllm_python(recipe), llm_args(target_dir, recipe, dtype=engine_dtype(target.model.dtype))
    vocab = int(target.vocab_size)
    waits = timeouts(recipe)
    rule = draft_rule(recipe)
    out = [VllmContender("vLLM target alone", "target", python, args, vocab, scratch, timeouts=waits)]
    refused = []
    for i, c in enumerate(drafters):
        try:
            exported = export(c.path, "vllm", scratch / f"export-{i}", target=target_dir)
        except PdraftError as e:
            refused.append((f"vLLM {c.label}", f"vLLM {c.label}: not exported ({e.message})"))
            continue
        spec = speculative_config(exported.command)
        out.append(VllmContender(f"vLLM {c.label}", c.kind, python, args, vocab, scratch, exported.path, spec["method"],
                                 int(spec["num_speculative_tokens"]), c.path, c.has_confidence, timeouts=waits,
                                 draft_sample_method=rule))
    return out, refused


def replay_contender(recipe, served: Path, ours, export_dir: Path, spec: dict, gamma: int, *, vocab_size: int,
                     dtype: str, context: int, scratch: Path) -> VllmContender:
    """check-serving's vLLM: `served` (the target folder) in `dtype`, serving `export_dir` at `gamma`, greedy (no
    per-request seeds: vLLM's CPU build then keeps chunked prefill), with room for `context` tokens."""
    return VllmContender(f"vLLM {ours.label}", ours.kind, vllm_python(recipe),
                         llm_args(str(served), recipe, dtype=dtype, max_model_len=max(context, 256)), vocab_size,
                         scratch, Path(export_dir), spec["method"], gamma, ours.path, seeded=False,
                         timeouts=timeouts(recipe))


def sps_profiler(recipe, target, points: list[int], *, context: int, requests: int,
                 repeats: int) -> tuple[list[float], dict]:
    """The cost table's step times measured in vLLM (Engine.sps_profiler; the module docstring says how): the target
    alone, in the dtype pdraft's loop runs in, prefix caching on, room for the context and the widest share."""
    from pdraft.engines.vllm_driver import VllmSettings, VllmWorker

    scratch = Path(tempfile.mkdtemp(prefix="pdraft-vllm-sps-"))
    target_dir = str(Path(target.path).resolve())
    longest = -(-max(points) // min(requests, max(points)))  # the widest request's new tokens at the largest B
    # room for the context once vLLM rounds it to its prefix cache's grain (vllm_worker.py _sps), within the target's
    # own context
    args = llm_args(target_dir, recipe, dtype=engine_dtype(target.model.dtype), enable_prefix_caching=True,
                    max_model_len=min(int(target.max_context), max(1024, 2 * context + longest)))
    with VllmWorker(VllmSettings(vllm_python(recipe), args, **timeouts(recipe)), scratch / "vllm-sps.log", int(target.vocab_size),
                    purpose="SPS profile") as worker:
        m = worker.sps(points, context=context, requests=requests, repeats=repeats, seed=int(recipe.runtime.seed))
    return m.seconds, {
        "measured_in": {"engine": NAME, "version": worker.version},
        "measured": (f"vLLM engine step: min(B, requests) requests of a {m.context}-token prefix-cached context "
                     "each, B new tokens in total, max_tokens 1 (pdraft.serving.vllm)"),
        "device": m.device, "torch_version": m.torch, "context_tokens": m.context,
        "llm_args": {k: v for k, v in args.items() if k not in ("model", "tokenizer")}}


ENGINE = Engine(
    NAME, "vLLM", "vllm", contenders, speculative_config, served_config, replay_contender,
    sps_profiler=sps_profiler,
    cause_notes={
        "layer-ids": "vLLM adds 1 to the ids it reads: vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
        "mask-token": "vllm/model_executor/models/qwen3_dflash.py reads dflash_config.mask_token_id",
    })
