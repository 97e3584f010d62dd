"""Issue 39 in CI, after tests/engines/vllm_check.sh has trained, exported and proved its z-lab DFlash and its
EAGLE-3 (their folders are in WORK/<kind>/plan.json): with pdraft's interpreter,

1. `pdraft check-serving DRAFTER --engine vllm` on both drafters: vLLM serves a fresh export of each as pdraft
   decodes it, round for round (exit 0, the engine's tau beside pdraft's);
2. the same with `--export BROKEN` on broken copies of their exports, one per cause (tests/test_serving_check.py
   BREAKS: layer offset, mask token, block size, layout flag, dtype, quantization, vocabulary mapping, weights):
   each must exit 1 naming its cause;
3. the bench through vLLM (the issue's done-when command, shrunk to one gamma and a few tokens for CI's time):
   `pdraft bench recipes/quickstart.yaml --drafter DFLASH --drafter EAGLE3 --drafter DSPARK --engine vllm
   --concurrency 1,4`, DSPARK being an untrained DSpark (which vLLM's CPU build refuses: one line says so); its
   bench.json must hold vLLM's runs beside pdraft's, with the engine's name, version and speculative config.

    python tests/engines/serving_check.py [--work out/vllm-check]

Exits 1 with the reasons on any failure."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
RECIPE = ROOT / "recipes" / "quickstart.yaml"


def pdraft(*args: str) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "pdraft"), *args]
    print("+", " ".join(cmd), flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True)
    print(res.stdout[-4000:], flush=True)
    if res.returncode not in (0, 1):
        print(res.stderr[-4000:], flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(ROOT / "out" / "vllm-check"))
    ap.add_argument("--gamma", default="6", help="At most the EAGLE-3's 7 exported steps.")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    drafters = {kind: json.loads((work / kind / "plan.json").read_text())["drafter"] for kind in ("dflash", "eagle3")}
    failures: list[str] = []

    for kind, folder in drafters.items():  # 1. the correct exports
        res = pdraft("check-serving", folder, "--engine", "vllm", "--num-prompts", "1", "--max-new-tokens", "24")
        if res.returncode != 0 or "OK:" not in res.stdout:
            failures.append(f"check-serving {kind}: exit {res.returncode}, expected 0")

    from pdraft.hub.export import export  # 2. one broken export per cause
    from test_serving_check import BREAKS

    broken = work / "broken"
    shutil.rmtree(broken, ignore_errors=True)
    for (kind, name), (brk, cause) in sorted(BREAKS.items()):
        folder = broken / f"{kind}-{name}"
        export(drafters[kind], "vllm", folder)
        brk(folder)
        res = pdraft("check-serving", drafters[kind], "--engine", "vllm", "--export", str(folder))
        if res.returncode != 1 or f"cause {cause}" not in res.stdout:
            failures.append(f"check-serving {kind} broken by {name}: exit {res.returncode}, expected 1 naming {cause}")
    print(f"serving-check: {len(BREAKS)} broken exports, {sum('broken by' in f for f in failures)} not caught")

    dspark = work / "dspark-untrained"  # 3. the bench through vLLM, with a family its CPU build refuses
    _untrained_dspark(dspark)
    out = work / "engine-bench"
    shutil.rmtree(out, ignore_errors=True)
    res = pdraft("bench", str(RECIPE), "--drafter", drafters["dflash"], "--drafter", drafters["eagle3"],
                 "--drafter", str(dspark), "--engine", "vllm", "--concurrency", "1,4", "--gamma", args.gamma,
                 "--num-prompts", "1", "--max-new-tokens", "24", "--out", str(out), "--no-ngram")
    if res.returncode != 0:
        failures.append(f"bench --engine vllm: exit {res.returncode}\n{res.stderr[-3000:]}")
    else:
        failures += _check_bench(json.loads((out / "bench.json").read_text()))
    for line in failures:
        print("FAIL: " + line)
    print(f"serving-check: {'FAILED' if failures else 'OK'}")
    return 1 if failures else 0


def _untrained_dspark(folder: Path) -> None:
    from transformers import AutoConfig

    from pdraft.models import build_drafter, save_drafter
    from pdraft.recipe import load_recipe
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import inspect_target

    r = load_recipe(RECIPE)
    target = inspect_target(r.target, make_runtime(r.runtime), weights=False)
    shutil.rmtree(folder, ignore_errors=True)
    d = build_drafter("dspark", AutoConfig.from_pretrained(target.path), seed=0, mask_token_id=0, num_hidden_layers=1,
                      block_size=8, markov_rank=8, target_layer_ids=[0, 1, 2])
    save_drafter(d, folder)


def _check_bench(report: dict) -> list[str]:
    """vLLM's runs beside pdraft's: its baseline and both served drafters at every level, figures filled, the
    engine's config recorded, and one line for the refused DSpark."""
    problems = []
    runs = [r for r in report["runs"] if r.get("engine") == "vllm"]
    ours = [r for r in report["runs"] if not r.get("engine")]
    levels = report["settings"]["concurrency"]
    for label in ("vLLM target alone",):
        if sorted(r["concurrency"] for r in runs if r["drafter"] == label) != levels:
            problems.append(f"bench: no {label} run at every level")
    drafted = [r for r in runs if r["gamma"] > 0]
    if len({r["drafter"] for r in drafted}) < 2:
        problems.append(f"bench: vLLM ran {sorted({r['drafter'] for r in drafted})}, expected the DFlash and the EAGLE-3")
    for r in drafted:
        s = r["summary"]
        if s["tau"] is None or s["tpot_p50_s"] is None or s["tokens_per_s"] is None or r["speedup"] is None:
            problems.append(f"bench: {r['drafter']} C={r['concurrency']} lacks a figure: {s}")
        info = r.get("engine_info") or {}
        if info.get("name") != "vllm" or not info.get("version") or not (info.get("speculative_config") or {}).get("method"):
            problems.append(f"bench: {r['drafter']} lacks the engine's name, version or speculative config")
        if r["baseline"] != "vLLM target alone":
            problems.append(f"bench: {r['drafter']}'s speedup counts against {r['baseline']}, not vLLM's own baseline")
    if not ours or not any(r["gamma"] > 0 for r in ours):
        problems.append("bench: pdraft's own runs are missing")
    if not any("dspark" in x["drafter"] and "vLLM" in x["reason"] for x in report.get("skipped", [])):
        problems.append(f"bench: no line for the DSpark vLLM's CPU build refuses: {report.get('skipped')}")
    return problems


if __name__ == "__main__":
    os.environ.setdefault("VLLM_VENV", str(ROOT / ".venv-vllm"))
    sys.exit(main())
