"""How often vLLM's greedy responses differ from transformers' on the embedded target, and why: the figures
docs/SCALING.md quotes. Regenerates the first N prompts of recipes/quickstart.yaml's training set with both
engines (pdraft.data.regenerate_vllm and pdraft.data.regenerate; the same rendered prompts, stop ids and caps),
then, for every prompt whose responses part, the logit gap in transformers' own forward pass between its token
and vLLM's at the first differing position (a gap near 0 is a float near-tie, which either engine may break
either way). Both engines resume from OUT, so a second run only reanalyses.

    python benchmarks/vllm_regenerate.py --prompts 512 --vllm-python /work/main/.venv-vllm/bin/python

Wall times include vLLM's engine start (about a minute on 2 CPU cores) and are taken on whatever else the
machine runs; they are printed, not claimed."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from pdraft.data.prompts import load_prompts
from pdraft.data.regenerate import RegenerateSettings, regenerate
from pdraft.data.regenerate_vllm import regenerate_vllm
from pdraft.engines.vllm_driver import VllmSettings
from pdraft.data.templates import encode_prompt
from pdraft.recipe import load_recipe
from pdraft.runtime import make_runtime
from pdraft.targets.loader import inspect_target, load_target

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--vllm-python", required=True, help="The python of the venv vLLM is installed in.")
    ap.add_argument("--out", default=str(ROOT / "out" / "vllm-regenerate"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    r = load_recipe(ROOT / "recipes" / "quickstart.yaml", [
        f"runtime.threads={args.threads}", f"data.vllm_python={args.vllm_python}",
        "data.vllm_args={enforce_eager: true, max_model_len: 1024, gpu_memory_utilization: 0.15}"])
    rt = make_runtime(r.runtime)
    records = list(load_prompts(r.data.source, r.data.split, args.prompts))
    settings = RegenerateSettings(max_new_tokens=r.data.regenerate_max_new_tokens, batch_size=r.data.regenerate_batch_size,
                                  chat_template=r.data.chat_template)
    info = inspect_target(r.target, rt)
    t = time.perf_counter()
    by_vllm = regenerate_vllm(info, records, out / "vllm.jsonl", settings, VllmSettings.from_recipe(r, info))
    vllm_s = time.perf_counter() - t
    target = load_target(r.target, rt)
    t = time.perf_counter()
    by_hf = regenerate(target, records, out / "transformers.jsonl", settings)
    hf_s = time.perf_counter() - t
    rows = []
    for i, (a, b) in enumerate(zip(by_vllm, by_hf)):
        if a.response_ids == b.response_ids:
            continue
        k = next((j for j, (x, y) in enumerate(zip(a.response_ids, b.response_ids)) if x != y),
                 min(len(a.response_ids), len(b.response_ids)))
        ids = encode_prompt(target.tokenizer, records[i].prompt, settings.chat_template) + b.response_ids[:k]
        with torch.no_grad():
            logits = target.model(input_ids=torch.tensor([ids])).logits[0, -1].double()
        top2 = logits.topk(2)
        row = {"prompt": i, "first_diff_at": k, "transformers_token": b.response_ids[k] if k < len(b.response_ids) else None,
               "vllm_token": a.response_ids[k] if k < len(a.response_ids) else None,
               "top2_gap": float(top2.values[0] - top2.values[1])}
        if row["vllm_token"] is not None and row["transformers_token"] is not None:
            row["gap_between_the_two"] = float(logits[row["transformers_token"]] - logits[row["vllm_token"]])
        rows.append(row)
    same = len(records) - len(rows)
    print(json.dumps({"prompts": len(records), "identical": same, "differ": len(rows),
                      "differing_share": len(rows) / len(records), "max_new_tokens": settings.max_new_tokens,
                      "vllm_wall_s_with_engine_start": round(vllm_s, 1), "transformers_wall_s": round(hf_s, 1),
                      "differences": rows}, indent=1))


if __name__ == "__main__":
    main()
