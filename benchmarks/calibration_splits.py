"""How much the held-out ECE after STS depends on which prompts were held out.

calibrate-threshold fits STS on one random part of the calibration prompts and measures on the rest, so its
headline after-ECE is one draw. This script refits on the rounds calibrate-threshold saved
(`calibration/rounds.json` next to the drafter) for several split seeds and prints, per seed and as median and
maximum, the held-out ECE before and after (pooled over all verified (round, position) samples, and the
per-position mean), each beside its floor: the ECE a perfectly calibrated predictor would show on the same
samples (pdraft.calibrate.scores.ece_floor). No model is loaded; it takes seconds.

    python benchmarks/calibration_splits.py runs/quickstart/dspark/final/calibration/rounds.json [--seeds 8]
        [--held-out 0.3] [--bins 15] [--binning equal_mass] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdraft.calibrate import sts as T  # noqa: E402
from pdraft.calibrate.collect import RoundData  # noqa: E402


def one_split(data: RoundData, seed: int, held_out: float, bins: int, binning: str, min_samples: int) -> dict:
    fit_part, eval_part = data.split(held_out, seed=seed)
    fit = T.fit_sts(fit_part, bins=bins, binning=binning, min_samples=min_samples)
    row = {"seed": seed, "fit_rounds": len(fit_part), "eval_rounds": len(eval_part), "temperatures": fit.temperatures}
    for name, temps in (("before", None), ("after", fit.temperatures)):
        pooled = T.pooled(eval_part, temps, bins, binning)
        mean = T.overall(T.evaluate(eval_part, temps, bins, binning))
        row[name] = {"pooled_ece": pooled["ece"], "pooled_floor": pooled["ece_floor"], "pooled_auc": pooled["auc"],
                     "per_position_ece": mean["ece"], "per_position_floor": mean["ece_floor"]}
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", type=Path, help="calibration/rounds.json written by pdraft calibrate-threshold")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--held-out", type=float, default=0.3)
    ap.add_argument("--bins", type=int, default=15)
    ap.add_argument("--binning", choices=["equal_mass", "equal_width"], default="equal_mass")
    ap.add_argument("--min-samples", type=int, default=50)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not args.rounds.is_file():
        print(f"{args.rounds} does not exist: run pdraft calibrate-threshold first", file=sys.stderr)
        return 2
    data = RoundData.from_dict(json.loads(args.rounds.read_text()))
    rows = [one_split(data, s, args.held_out, args.bins, args.binning, args.min_samples) for s in range(args.seeds)]

    def pct(v):
        return f"{100 * v:5.2f}%"
    print(f"{args.rounds}: {len(data)} rounds, gamma {data.gamma}, {len(set(data.prompt.tolist()))} prompts; "
          f"held out {args.held_out:.0%} of the prompts; {args.binning.replace('_', '-')} bins x {args.bins}")
    print("seed  pooled before -> after (floor)     per-position mean before -> after (floor)")
    for r in rows:
        b, a = r["before"], r["after"]
        print(f"{r['seed']:>4}  {pct(b['pooled_ece'])} -> {pct(a['pooled_ece'])} ({pct(a['pooled_floor'])})"
              f"      {pct(b['per_position_ece'])} -> {pct(a['per_position_ece'])} ({pct(a['per_position_floor'])})")
    summary = {}
    for key in ("pooled_ece", "per_position_ece"):
        after = [r["after"][key] for r in rows]
        summary[key] = {"median": statistics.median(after), "max": max(after), "min": min(after)}
        print(f"after STS, {key.replace('_', ' ')}: median {pct(summary[key]['median'])}, "
              f"range {pct(summary[key]['min'])} .. {pct(summary[key]['max'])}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": str(args.rounds), "splits": rows, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
