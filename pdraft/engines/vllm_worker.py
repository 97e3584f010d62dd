"""The vLLM side of `data.regenerate_engine: vllm`, run as a script by the interpreter in `data.vllm_python`
(vLLM usually lives in its own venv, with its own torch), so it imports nothing but the standard library and
vLLM: never pdraft. pdraft.engines.vllm_driver (VllmWorker) starts it and speaks to it in JSON lines: on stdin an `init`
message (the `vllm.LLM` keyword arguments, and whether requests will be seeded), then one message per chunk of prompts (token ids, already
rendered with pdraft's chat template; per-prompt max tokens, seeds and sampling; the stop ids), then
`exit`; on the reply stream one line per message. vLLM's own logging goes to stderr: the reply stream is a
private copy of stdout taken before vLLM is imported, and stdout itself is pointed at stderr.

The bench and the serving check (pdraft.serving.vllm, pdraft.serving.check) send `serve` messages
instead: the requests are fed to the engine keeping at most `concurrency` in flight (a client with C streams;
the engine batches what it holds), and each result carries the engine's own per-request figures: the per-step
accepted and drafted counts (`per_request_spec_decode_metrics="detailed"`, vllm/v1/metrics/stats.py
RequestSpecDecodeMetrics) and the first and last token timestamps (RequestStateStats, kept when the LLM is
built with disable_log_stats=False), with the wall seconds of the whole set. calibrate-threshold's `--engine
vllm` sends one `sps` message: the cost table's step times measured here (`_sps`), away from the pipe's latency.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _replies():
    """A private copy of stdout for the replies; fd 1 then points at stderr, where vLLM's prints go."""
    reply = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return reply


def _send(reply, message: dict) -> None:
    reply.write(json.dumps(message) + "\n")
    reply.flush()


def _first_line(e: BaseException) -> str:
    """The exception in one line; for a config validation error, the line that says what was refused (vLLM's own
    "Value error, ..." under pydantic's "1 validation error for VllmConfig")."""
    text = [line.strip() for line in str(e).strip().splitlines()]
    said = next((line.removeprefix("Value error, ").split(" [type=")[0] for line in text[1:]
                 if line.startswith("Value error, ")), None)
    if said:
        return f"{type(e).__name__}: {said[:300]}"
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def main() -> int:
    reply = _replies()
    _send(reply, {"started": True, "python": sys.version.split()[0]})  # the interpreter runs us: before any import
    try:
        init = json.loads(sys.stdin.readline())
    except ValueError as e:
        _send(reply, {"error": f"bad init message ({e})"})
        return 2
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except Exception as e:  # noqa: BLE001 - any import failure: not a usable vLLM
        _send(reply, {"error": f"cannot import vllm with {sys.executable} ({_first_line(e)})", "import": True})
        return 2
    start = time.perf_counter()
    args = dict(init["llm"])
    if init.get("seeded") and "enable_chunked_prefill" not in args:
        from vllm.platforms import current_platform

        # A seeded request whose prefill is split in chunks has its discarded sample undone by rewinding its
        # generator's offset, which only CUDA generators have (vllm/v1/worker/gpu_model_runner.py): on the CPU
        # build the engine dies ("CPU Generator does not use offset"). Whole prefills discard nothing.
        if current_platform.is_cpu():
            args["enable_chunked_prefill"] = False
    try:
        llm = LLM(**args)
    except Exception as e:  # noqa: BLE001 - a bad keyword, no memory, an unsupported model: one line for pdraft
        traceback.print_exc()
        _send(reply, {"error": f"vllm.LLM(...) failed ({_first_line(e)})"})
        return 2
    _send(reply, {"ready": True, "vllm": vllm.__version__, "load_s": time.perf_counter() - start,
                  "speculative_config": _speculative_config(llm)})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("exit"):
            break
        if "sps" in msg:
            try:
                _send(reply, _sps(llm, SamplingParams, TokensPrompt, msg["sps"]))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                _send(reply, {"error": f"vLLM SPS profile failed ({_first_line(e)})"})
                return 2
            continue
        if "serve" in msg:
            try:
                _send(reply, _serve(llm, SamplingParams, TokensPrompt, msg["serve"]))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                _send(reply, {"error": f"vLLM serve failed ({_first_line(e)})"})
                return 2
            continue
        start = time.perf_counter()
        # top_k -1 is vLLM's own "off" (pdraft's is 0); top_p 1 is off in both.
        params = [SamplingParams(temperature=r["temperature"], top_k=r["top_k"] or -1, top_p=r["top_p"],
                                 max_tokens=r["max_tokens"], seed=r["seed"], stop_token_ids=msg["stop_token_ids"],
                                 detokenize=False)
                  for r in msg["requests"]]
        prompts = [TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in msg["requests"]]
        try:
            outs = llm.generate(prompts, params, use_tqdm=False)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            _send(reply, {"error": f"vLLM generate failed ({_first_line(e)})"})
            return 2
        results = []
        for r, out in zip(msg["requests"], outs):
            if list(out.prompt_token_ids) != r["prompt_ids"]:
                _send(reply, {"error": "vLLM returned the requests out of order"})
                return 2
            comp = out.outputs[0]
            results.append({"index": r["index"], "token_ids": list(comp.token_ids),
                            "finish_reason": comp.finish_reason})
        _send(reply, {"results": results, "seconds": time.perf_counter() - start})
    return 0


def _speculative_config(llm) -> dict | None:
    """The engine's resolved speculative config, every plain field of it (None without speculation)."""
    spec = getattr(llm.llm_engine.vllm_config, "speculative_config", None)
    if spec is None:
        return None
    out = {}
    for name in dir(spec):
        if name.startswith("_"):
            continue
        try:
            value = getattr(spec, name)
        except Exception:  # noqa: BLE001 - a property that needs more than the config
            continue
        if value is None or isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
            out[name] = list(value)
    return out


def _serve(llm, SamplingParams, TokensPrompt, msg: dict) -> dict:
    """The requests of `msg`, at most msg["concurrency"] in flight; results in request order."""
    engine = llm.llm_engine
    tag = f"{time.monotonic_ns()}-"  # request ids unique across serve messages
    pending = list(enumerate(msg["requests"]))[::-1]
    results: dict[int, dict] = {}
    in_flight = 0
    start = time.perf_counter()
    while pending or in_flight:
        while pending and in_flight < msg["concurrency"]:
            i, r = pending.pop()
            params = SamplingParams(temperature=msg["temperature"], top_k=msg.get("top_k") or 0,
                                    top_p=msg.get("top_p", 1.0), max_tokens=r["max_tokens"], seed=r.get("seed"),
                                    stop_token_ids=msg["stop_token_ids"], detokenize=False)
            engine.add_request(f"{tag}{i}", TokensPrompt(prompt_token_ids=r["prompt_ids"]), params)
            in_flight += 1
        for out in engine.step():
            if not out.finished:
                continue
            in_flight -= 1
            comp, m = out.outputs[0], out.outputs[0].spec_decode_metrics
            stats = out.metrics
            results[int(out.request_id.removeprefix(tag))] = {
                "token_ids": list(comp.token_ids), "finish_reason": comp.finish_reason,
                "per_step_accepted": None if m is None else list(m.per_step_accepted),
                "per_step_drafted": None if m is None else list(m.per_step_drafted),
                "first_token_ts": None if stats is None else stats.first_token_ts,
                "last_token_ts": None if stats is None else stats.last_token_ts}
    return {"results": [results[i] for i in range(len(msg["requests"]))], "seconds": time.perf_counter() - start}


def _sps(llm, SamplingParams, TokensPrompt, msg: dict) -> dict:
    """calibrate-threshold's cost table measured in this engine (pdraft.serving.vllm, where the module docstring
    says why this approximates a verify step): `requests` contexts of random ids are prefilled once into the prefix
    cache; then for each B of `points`, min(B, requests) of them, each extended by its share of B fresh random
    ids, are one generate call of max_tokens 1, timed; the median over `repeats` after a warm-up. Every timed
    request must report exactly its context as cached (RequestOutput.num_cached_tokens): anything else would time
    a prefill of the context, and fails here."""
    import random
    import statistics

    import torch  # vLLM's own: where it ran, and which torch measured

    config = llm.llm_engine.vllm_config
    cache, scheduler = config.cache_config, config.scheduler_config
    if not cache.enable_prefix_caching:
        raise RuntimeError("prefix caching is off: the contexts would be prefilled at every step")
    points, requests, vocab = list(msg["points"]), int(msg["requests"]), int(msg["vocab_size"])
    # Prefix-cache hits land on whole blocks (or hash blocks; 128 tokens on the CPU build): the context is the
    # nearest whole number of them, at least one, within max_model_len beside the widest request's new tokens.
    unit = int(getattr(cache, "cache_hit_alignment_tokens", None) or cache.block_size)
    widest = -(-max(points) // min(requests, max(points)))
    room = (config.model_config.max_model_len - widest) // unit * unit
    context = min(max(unit, round(msg["context"] / unit) * unit), room)
    if context < unit:
        raise RuntimeError(f"max_model_len {config.model_config.max_model_len} holds no {unit}-token cache block "
                           f"beside {widest} new tokens")
    if max(points) > scheduler.max_num_batched_tokens or requests > scheduler.max_num_seqs:
        raise RuntimeError(f"{max(points)} tokens over {requests} requests do not fit one scheduler step "
                           f"(max_num_batched_tokens {scheduler.max_num_batched_tokens}, max_num_seqs "
                           f"{scheduler.max_num_seqs})")
    rng = random.Random(int(msg["seed"]))
    contexts = [[rng.randrange(vocab) for _ in range(context)] for _ in range(requests)]
    params = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)

    def run(prompts: list[list[int]]) -> tuple[float, list[int]]:
        start = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return time.perf_counter() - start, [int(o.num_cached_tokens or 0) for o in outs]

    def step(b: int) -> float:
        rows = min(b, requests)
        # fresh ids every call: a repeated extension would be a cache hit of its own from the second call on
        prompts = [contexts[r] + [rng.randrange(vocab) for _ in range(b // rows + (1 if r < b % rows else 0))]
                   for r in range(rows)]
        seconds, cached = run(prompts)
        if cached != [context] * rows:
            raise RuntimeError(f"at B={b} vLLM reports {cached} cached tokens, not the {context}-token contexts: "
                               "the step would time a prefill of them (KV cache too small for the contexts?)")
        return seconds

    run(contexts)  # prefill every context once: its blocks enter the prefix cache
    for b in (1, max(points), 1):  # warm-up
        step(b)
    medians = [statistics.median(step(b) for _ in range(int(msg["repeats"]))) for b in points]
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"seconds": medians, "context": context, "cache_unit": unit, "torch": torch.__version__,
            "device": device, "max_num_batched_tokens": int(scheduler.max_num_batched_tokens)}


if __name__ == "__main__":  # vLLM's engine may spawn processes that re-import this file
    sys.exit(main())
