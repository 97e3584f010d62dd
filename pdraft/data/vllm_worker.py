"""The vLLM side of `data.regenerate_engine: vllm`, run as a script by the interpreter in `data.vllm_python`
(vLLM usually lives in its own venv, with its own torch), so it imports nothing but the standard library and
vLLM: never pdraft. pdraft.data.regenerate_vllm starts it and speaks to it in JSON lines: on stdin an `init`
message (the `vllm.LLM` keyword arguments, and whether requests will be seeded), then one message per chunk of prompts (token ids, already
rendered with pdraft's chat template; per-prompt max tokens, seeds and sampling; the stop ids), then
`exit`; on the reply stream one line per message. vLLM's own logging goes to stderr: the reply stream is a
private copy of stdout taken before vLLM is imported, and stdout itself is pointed at stderr.
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
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def main() -> int:
    reply = _replies()
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
    _send(reply, {"ready": True, "vllm": vllm.__version__, "load_s": time.perf_counter() - start})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("exit"):
            break
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


if __name__ == "__main__":  # vLLM's engine may spawn processes that re-import this file
    sys.exit(main())
