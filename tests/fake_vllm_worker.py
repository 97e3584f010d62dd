"""A test double of pdraft/engines/vllm_worker.py: the same JSON-lines protocol, no vLLM. Run as a script in its
place (tests/test_worker_replies.py points regenerate_vllm.WORKER here); the `fake` key of the init message's
`llm` arguments (data.vllm_args) picks how it misbehaves:

good: answers as the worker does (token ids 10, 11, 12 per prompt, within the request's max_tokens);
banner: prints a banner line before its ready reply; load-hang: never answers the init;
hang: loads, then never answers a chunk; bad-id / negative-id / huge-id: an id at the vocabulary size, -1, or
2**64; missing: drops the last answer; twice: answers one prompt twice; extra: answers a prompt not asked;
too-long: more tokens than max_tokens; flood: a reply line of 64 MiB without a line end; deep: a reply nested
40 levels; wrong-type: token_ids as text; exit: exits with code 3 before answering; error: its own error
line holding rich markup and control characters; orphan: starts a grandchild that keeps the reply pipe
open (its pid written to $FAKE_VLLM_ORPHAN_PID), then never answers the init.

Before it reads anything it sends the worker's `started` line, unless $FAKE_VLLM_START says otherwise:
hang (never starts), silent (says nothing, then exits 0 at once: an interpreter that runs nothing)."""

import json
import os
import sys
import time


def send(message: dict | str) -> None:
    sys.stdout.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
    sys.stdout.flush()


def main() -> int:
    start = os.environ.get("FAKE_VLLM_START")
    if start == "hang":
        time.sleep(3600)
    if start == "silent":
        return 0
    send({"started": True, "python": sys.version.split()[0]})
    init = json.loads(sys.stdin.readline())
    mode = init["llm"].get("fake", "good")
    vocab = int(init["llm"].get("fake_vocab", 0))
    sys.stderr.write(f"fake vLLM worker, mode {mode}\n")
    if mode == "load-hang":
        time.sleep(3600)
    if mode == "orphan":
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], stdout=sys.stdout)
        with open(os.environ["FAKE_VLLM_ORPHAN_PID"], "w") as f:
            f.write(str(child.pid))
        time.sleep(3600)
    if mode == "exit":
        return 3
    if mode == "banner":
        send("INFO 12-02 vLLM engine starting (a banner on stdout)")
    if mode == "error":
        send({"error": "[bold red]boom[/] \x1b[31m and [link=file:///etc/passwd]x[/link]"})
        return 2
    send({"ready": True, "vllm": "0.0-fake", "load_s": 0.0})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("exit"):
            return 0
        if mode == "hang":
            time.sleep(3600)
        if mode == "flood":
            block = b"7" * (1 << 20)
            for _ in range(64):
                os.write(1, block)
            time.sleep(3600)
        if mode == "deep":
            send("[" * 40 + "]" * 40)
            continue
        results = []
        for r in msg["requests"]:
            ids = [10, 11, 12][: r["max_tokens"]]
            if mode == "bad-id":
                ids = [1, vocab]
            elif mode == "negative-id":
                ids = [-1]
            elif mode == "huge-id":
                ids = [2**64]
            elif mode == "too-long":
                ids = [1] * (r["max_tokens"] + 1)
            results.append({"index": r["index"], "token_ids": ids, "finish_reason": "length"})
        if mode == "missing":
            results = results[:-1]
        elif mode == "twice":
            results.append(results[0])
        elif mode == "extra":
            results.append({**results[0], "index": 10**6})
        elif mode == "wrong-type":
            results[0]["token_ids"] = "1 2 3"
        send({"results": results, "seconds": 0.0})
    return 0


if __name__ == "__main__":
    sys.exit(main())
