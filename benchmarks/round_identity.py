"""Every count a decode run produces, without its timings, as one JSON file: the check that a refactoring of the
decode loop or of how its settings are resolved changed no token. Run it on two commits and compare the files:

    git archive BASE | tar -x -C /tmp/base
    PYTHONPATH=/tmp/base python benchmarks/round_identity.py /tmp/base.json
    PYTHONPATH=. python benchmarks/round_identity.py /tmp/new.json
    cmp /tmp/base.json /tmp/new.json && echo identical
    PYTHONPATH=. python benchmarks/round_identity.py /tmp/off.json off   # a commit with decode.compile: one backend

On a tiny random Qwen3 target (tests/test_data_tinytarget.py) with random DFlash and DSpark drafters it records:
the rounds of `bench_recipe` (what bench.json's `runs[].rounds` hold) greedy, sampled with a fixed seed and a
confidence threshold, and with the padded verifier; the outputs and rounds of `generate` with the scheduler
policy, greedy and sampled, packed and padded, batched; and the calibration rounds `calibrate` collects. Only
library calls whose signatures both sides share are used. A few minutes of CPU at most.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

TIMING = {"decode_s", "tpot_s", "tokens_per_s", "draft_s", "verify_s", "bookkeeping_s", "draft_s_per_round",
          "verify_s_per_round", "speedup", "tpot_repeats_s", "round_s",
          # issue 30's bench fields: timings, and which baseline was the faster, which depends on them
          "baseline", "compile_s", "t_step_s", "draft_per_step", "verify_per_step", "round_per_step",
          "ideal_speedup", "speedup_vs_ideal", "backend",
          # timings of the summary that were missing here (they made two runs of one commit differ)
          "per_user_tokens_per_s", "round_s_per_round", "tpot_p50_s", "tpot_p90_s", "prefill_s"}
ROUND_TIMES = {"draft_s", "verify_s", "round_s"}


def _strip(x):
    """Drop every timing (they differ between any two runs), keep every count."""
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in TIMING}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def _bench_runs(report: dict) -> list:
    fields = report["round_fields"]
    keep = [i for i, name in enumerate(fields) if name not in ROUND_TIMES]
    # transformers' generate() rows (issue 30) are a baseline of their own, not a decode of pdraft's: left out,
    # so that a report compares with one written before they existed.
    return [{**_strip({k: v for k, v in run.items() if k not in ("rounds", "same_as_target")}),
             "rounds": [[row[i] for i in keep] for row in run["rounds"]]}
            for run in report["runs"] if run["kind"] != "generate"]


def _records(result) -> dict:
    return {"output_ids": result.output_ids, "finish_reasons": result.finish_reasons,
            "records": [_strip(r.to_dict()) for r in result.records]}  # (backend, compile_s: not counts)


def main(out_path: str, compile_mode: str | None = None) -> None:
    """`compile_mode` (issue 30's decode.compile, a commit that has it): run every decode on that backend."""
    import pdraft
    from transformers import AutoModelForCausalLM

    from pdraft.bench.session import bench_recipe
    from pdraft.calibrate.pipeline import calibrate
    from pdraft.decode.engine import generate
    try:  # their homes since the policy registry (issue 27) ...
        from pdraft.policies.base import VerifyConfig
        from pdraft.policies.cost import SpsTable
    except ImportError:  # ... and before it, so that the script still runs on the commits before that
        from pdraft.decode.scheduler import SpsTable, VerifyConfig
    from pdraft.models import build_drafter, save_drafter
    from pdraft.models.api import SamplingParams
    from pdraft.recipe import load_recipe
    try:  # its home since issue 43 ...
        from pdraft.targets.loader import load_target
    except ImportError:  # ... and before it (pdraft.target), so that the script still runs on the older commits
        from pdraft.target.loader import load_target
    from pdraft.runtime import make_runtime
    from test_data_tinytarget import make_tiny_target, write_chat_jsonl

    print(f"pdraft from {Path(pdraft.__file__).parent}", file=sys.stderr)
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="round-identity-"))
    folder = make_tiny_target(root / "target", hidden=32, layers=2, norm_scale=4.0)
    data = write_chat_jsonl(root / "prompts.jsonl", 6)
    model = AutoModelForCausalLM.from_pretrained(folder).float().eval()
    drafters = {}
    for kind in ("dflash", "dspark"):
        extra = {"markov_rank": 8} if kind == "dspark" else {}
        d = build_drafter(kind, model.config, seed=0, mask_token_id=0, num_hidden_layers=1, block_size=6, **extra)
        save_drafter(d, root / kind)
        drafters[kind] = root / kind
    base = {"name": "identity", "output_dir": str(root / "run"), "target": {"id": str(folder)},
            "decode": {"max_new_tokens": 8, **({"compile": compile_mode} if compile_mode else {})},
            "calibrate": {"prompts": str(data), "num_prompts": 4, "max_new_tokens": 8, "min_samples": 1},
            "bench": {"gamma": "2,4", "prompt_sets": [str(data)], "num_prompts": 4, "max_new_tokens": 10,
                      "batch_size": 2},
            "runtime": {"threads": 1, "device": "cpu"}}
    recipe_path = root / "recipe.yaml"
    recipe_path.write_text(json.dumps(base))
    out: dict = {}
    target = load_target(load_recipe(recipe_path).target, make_runtime(load_recipe(recipe_path).runtime))
    for name, overrides in {
        "bench greedy": [],
        "bench sampled threshold": ["bench.temperature=0.9", "bench.top_p=0.95", "bench.seed=5",
                                    "decode.verify=threshold", "decode.threshold=0.2"],
        "bench greedy padded": ["decode.packed_verify=false"],
    }.items():
        r = load_recipe(recipe_path, overrides)
        res = bench_recipe(r, list(drafters.values()), target=target, out_dir=root / name.replace(" ", "-"))
        out[name] = _bench_runs(json.loads(res.report_path.read_text()))

    from pdraft.models import load_drafter

    dspark = load_drafter(drafters["dspark"])
    dspark.attach_target(model)
    prompts = [[5, 9, 13, 21, 8], [3, 4], [7, 7, 7, 7, 7, 7, 7, 7, 2], [11, 12, 13]]
    extra = {"compile": compile_mode} if compile_mode else {}
    sps = SpsTable([1, 4, 8, 16], [100.0, 90.0, 60.0, 30.0], 24)
    for packed in (True, False):
        for sampling in (None, SamplingParams(temperature=0.8, top_k=20, top_p=0.9)):
            for mode in ("full", "scheduler"):
                verify = VerifyConfig(packed=packed) if mode == "full" else VerifyConfig(mode="scheduler", sps=sps,
                                                                                         packed=packed)
                res = generate(model, dspark, prompts, gamma=4, sampling=sampling, max_new_tokens=9, seed=3, **extra,
                               verify=verify)
                out[f"generate packed={packed} sampled={sampling is not None} {mode}"] = _records(res)
    alone = generate(model, None, prompts, max_new_tokens=9, sampling=SamplingParams(temperature=1.0), seed=1,
                     **extra)
    out["generate target alone sampled"] = _records(alone)

    r = load_recipe(recipe_path, ["calibrate.temperature=0.7"])
    calibrate(r, drafters["dspark"], out_dir=root / "cal", skip_sps=True, target=target)
    out["calibrate rounds"] = json.loads((root / "cal" / "calibration" / "rounds.json").read_text())
    Path(out_path).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{out_path}: {len(out)} sections", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "round_identity.json", sys.argv[2] if len(sys.argv) > 2 else None)
