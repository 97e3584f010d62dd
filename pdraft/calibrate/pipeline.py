"""`calibrate(recipe, drafter_dir, ...)`: the whole calibrate-threshold run as one library call. Collect
full-verification rounds on held-out prompts, split them by prompt, fit STS on one part, measure ECE / AUC /
Brier before and after on the other, replay the static-threshold sweep, profile the SPS cost table, and
write everything next to the drafter (or to `out_dir`):

    confidence_sts.json      STS temperatures, SGLang layout + pdraft metrics  (pdraft.calibrate.sts)
    sps_table.json           SPS(B) cost table, SGLang layout + device metadata (pdraft.calibrate.sps),
                             measured by pdraft's verifier or in a serving engine (calibrate.sps_engine)
    calibration/             reliability.png, threshold_sweep.png, sps.png, rounds.json (the raw data),
                             report.json, recipe.resolved.yaml

The figures and the resolved recipe go to a sub-folder so that a drafter's own recipe.resolved.yaml (its
training recipe) is never overwritten. Calibration prompts are the *last* `num_prompts` of the prompt set:
training cuts a set from its head (data.max_samples), so when both use the same source the tail is the part
least likely to have been trained on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pdraft.calibrate import sps as S
from pdraft.calibrate import sts as T
from pdraft.calibrate.collect import RoundData, collect
from pdraft.calibrate.report import plot_reliability, plot_sps, plot_sweep
from pdraft.calibrate.threshold_sweep import recommend, sweep
from pdraft.calibration_files import (CALIBRATION_NAME, SPS_NAME, device_mismatch, device_name, find_sps_table,
                                      read_calibration)
from pdraft.policies.cost import SPS_FILE
from pdraft.readback import load
from pdraft.policies.base import check_confidence
from pdraft.decode.settings import DecodeSettings
from pdraft.errors import PdraftError
from pdraft.io_plan import Input, Output, check_io, input_if_local
from pdraft import ledger
from pdraft.paths import make_dir

# Requests decoded together while collecting; acceptance does not depend on it (the quickstart's calibration gave
# the same rounds and ECE at 8 and 32, and collected in 19 s against 24 on the AVX2-only class: issue 56).
COLLECT_BATCH = 32
FIGURES = "calibration"
FIGURE_FILES = ("reliability.png", "threshold_sweep.png", "sps.png", "rounds.json", "report.json",
                "recipe.resolved.yaml")
DRAFTER_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "recipe.resolved.yaml")


def check_calibrate_io(recipe, drafter_dir: Path, out: Path, skip_sps: bool) -> None:
    """Refuse, before anything is loaded, a calibration output over what calibrate-threshold reads: the
    drafter's weights, config and recipe (its sidecars go beside them, never over them), the prompts, the
    recipe, a local target, and with --skip-sps the cost table it keeps; or a name it writes that is a link
    (pdraft.io_plan)."""
    inputs = [Input("the drafter's " + name, drafter_dir / name) for name in DRAFTER_FILES
              if (drafter_dir / name).exists()]
    inputs += input_if_local("the recipe", recipe.source) + input_if_local("target.id", recipe.target.id)
    inputs += input_if_local("calibrate.prompts", recipe.calibrate.prompts)
    if skip_sps:
        inputs += input_if_local("the cost table it keeps", out / SPS_NAME)
    outputs = [Output("--out", out, "folder", whole=False), Output("its " + CALIBRATION_NAME, out / CALIBRATION_NAME),
               Output("its figures folder", out / FIGURES, "folder", whole=False)]
    outputs += [Output(f"its {FIGURES}/{name}", out / FIGURES / name) for name in FIGURE_FILES]
    if not skip_sps:
        outputs.append(Output("its " + SPS_NAME, out / SPS_NAME))
    check_io("calibrate-threshold", inputs, outputs)


def check_drafter(drafter_dir: str | Path) -> None:
    """Fail fast, before loading any model, on a drafter that cannot be calibrated."""
    from pdraft.models import load_config

    cfg = load_config(drafter_dir)
    check_confidence(cfg, "calibrate-threshold", subject=f"drafter {drafter_dir} ({cfg.kind})")


def calibrate(recipe, drafter_dir: str | Path, *, held_out: float | None = None, out_dir: str | Path | None = None,
              skip_sps: bool = False, log: Callable[[str], None] = lambda _: None, target=None,
              sps_profiler: Callable | None = None) -> dict:
    """`target`: an already loaded pdraft.targets.loader target (the quickstart passes its own); None loads
    recipe.target. `sps_profiler`: the engine's (pdraft.serving.sps_profiler(calibrate.sps_engine)), which
    measures the cost table instead of pdraft's verifier; the caller resolves it, as the bench's caller resolves
    its engine, and it is required exactly when calibrate.sps_engine names an engine."""
    from pdraft.data.prompts import load_prompts
    from pdraft.data.templates import eos_ids
    from pdraft.decode import inputs as P
    from pdraft.recipe import save_resolved
    from pdraft.runtime import make_runtime
    from pdraft.decode.backend import check_decodable
    from pdraft.targets.loader import load_target

    # check every input and output before anything loads
    sec = recipe.calibrate
    held_out, drafter_dir, out, kept_path, kept = _checked(recipe, drafter_dir, held_out, out_dir, skip_sps)
    if bool(sec.sps_engine) != (sps_profiler is not None):
        raise PdraftError(f"calibrate.sps_engine is {sec.sps_engine}, but {'no' if sps_profiler is None else 'an'} "
                          "SPS profiler was passed: resolve it with pdraft.serving.sps_profiler(calibrate.sps_engine)")
    if sec.sps_engine and skip_sps:
        raise PdraftError(f"--engine {sec.sps_engine} measures the cost table, --skip-sps keeps the one there: "
                          "give one of them")
    figures = out / FIGURES  # created only once the fit succeeded: a failed run leaves no folder behind

    # the target and the drafter
    runtime = make_runtime(recipe.runtime)
    if target is not None:
        check_decodable(target.config, recipe.target.id)
    target = target or load_target(recipe.target, runtime, check_config=check_decodable)
    model = target.model
    drafter = P.load_attached_drafter(drafter_dir, model)  # on the target's device, in its dtype
    settings = DecodeSettings.from_recipe(recipe, "calibrate", batch_size=COLLECT_BATCH)
    gamma = settings.gamma_for(drafter, name="calibrate.gamma")
    settings = settings.replace(gamma=gamma)

    # collect: decode the held-out prompts with full verification, every drafted position an observation
    records = load_prompts(sec.prompts)
    texts = [r.prompt for r in records][-sec.num_prompts:]
    if not texts:
        raise PdraftError(f"calibration prompt set {sec.prompts!r} is empty")
    ids = P.encode(target.tokenizer, texts, raw=not recipe.decode.chat_template,
                   enable_thinking=recipe.decode.enable_thinking, context=target.max_context)
    log(f"collecting: {len(ids)} prompts x {settings.max_new_tokens} tokens, gamma {gamma}, full verification, "
        f"temperature {settings.sampling.temperature}")
    seed = settings.seed  # the sampling streams' seed, recorded in calibration.json
    data = collect(model, drafter, ids, settings, eos_token_ids=eos_ids(model, target.tokenizer),
                   on_batch=lambda done, total: log(f"  decoded {done}/{total} prompts"))
    # fit STS on one part, measure ECE on the other
    fit_part, eval_part = data.split(held_out, seed=runtime.seed)
    ece_on = "held-out" if held_out > 0 else "fit (no held-out part: --held-out 0)"
    log(f"fitting STS on {len(fit_part)} rounds; measuring on {len(eval_part)} {ece_on} rounds")
    fit = T.fit_sts(fit_part, bins=sec.bins, binning=sec.binning, min_samples=sec.min_samples)
    before = T.evaluate(eval_part, None, sec.bins, sec.binning)
    after = T.evaluate(eval_part, fit.temperatures, sec.bins, sec.binning)
    make_dir(figures, "calibration figures folder")

    # the cost table: profiled now, or the one --skip-sps keeps
    table, sps_path = (_cost_table(recipe, target, ids, settings.compile, out, figures, log, sps_profiler)
                       if not skip_sps
                       else (kept, kept_path))
    if skip_sps and kept is not None:
        mismatch = device_mismatch(sps_path, S.SpsTable.from_dict(table).device, next(model.parameters()).device)
        if mismatch:
            fit.warnings.append(mismatch)
    sps_table = S.SpsTable.from_dict(table) if table is not None else None

    # the threshold sweep, the calibration file, the figures and the report
    rows = sweep(eval_part, fit.temperatures, sps=sps_table)
    threshold, rule = recommend(rows)
    dataset = f"{sec.prompts} (last {len(ids)} prompts, {sec.max_new_tokens} new tokens, temperature {sec.temperature})"
    calibration = T.calibration_dict(fit, dataset=dataset, fit_rows=len(fit_part), before=before, after=after, extra={
        "gamma": gamma, "seed": seed, "binning": sec.binning, "bins": sec.bins, "min_samples": sec.min_samples,
        "held_out_fraction": held_out, "ece_on": ece_on, "fit_rounds": len(fit_part),
        "eval_rounds": len(eval_part), "target": target.id, "drafter": str(drafter_dir),
        "pooled_before": T.pooled(eval_part, None, sec.bins, sec.binning),
        "pooled_after": T.pooled(eval_part, fit.temperatures, sec.bins, sec.binning),
        "grid": f"2^(i/16), i = -64..64 ({len(T.GRID)} temperatures)"})
    cal_path = T.save_calibration(calibration, out / CALIBRATION_NAME)
    result = {
        "calibration": read_calibration(cal_path).model_dump(exclude_unset=True),
        "sweep": {"rows": [r.to_dict() for r in rows], "recommended": threshold, "rule": rule, "on": ece_on,
                  "temperatures": "calibrated"},
        "sps": table,
        "files": {"calibration": str(cal_path), "sps_table": str(sps_path) if sps_path else None},
        "warnings": list(fit.warnings),
    }
    meta = result["calibration"]["pdraft"]
    plot_reliability(meta["per_position_before"], meta["per_position_after"], figures / "reliability.png",
                     title=f"{drafter_dir.name}: cumulative survival, {ece_on} rounds")
    plot_sweep(result["sweep"]["rows"], figures / "threshold_sweep.png", threshold,
               title=f"{drafter_dir.name}: static threshold sweep ({ece_on} rounds)")
    ledger.write_text(figures / "rounds.json", json.dumps(data.to_dict()) + "\n")
    save_resolved(recipe, figures, {"calibrate.gamma": gamma, "calibrate.held_out_fraction": held_out})
    result["files"].update({name: str(figures / name) for name in
                            ("reliability.png", "threshold_sweep.png", "rounds.json", "recipe.resolved.yaml")})
    if table is not None and not skip_sps:
        result["files"]["sps.png"] = str(figures / "sps.png")
    ledger.write_text(figures / "report.json", json.dumps(result, indent=2, default=str) + "\n")
    result["files"]["report.json"] = str(figures / "report.json")
    return result


def _checked(recipe, drafter_dir, held_out, out_dir, skip_sps: bool):
    """(held-out fraction, drafter folder, output folder, the kept cost table's path and dict or None): every
    input and output checked before anything loads, the table --skip-sps keeps read by its one schema."""
    held_out = recipe.calibrate.held_out_fraction if held_out is None else float(held_out)
    if not 0.0 <= held_out < 1.0:
        raise PdraftError(f"--held-out must be in [0, 1), got {held_out}")
    drafter_dir = Path(drafter_dir)
    check_drafter(drafter_dir)
    out = Path(out_dir) if out_dir is not None else drafter_dir
    if out.exists() and not out.is_dir():
        raise PdraftError(f"--out {out} is a file; expected a folder")
    check_calibrate_io(recipe, drafter_dir, out, skip_sps)
    kept_path = find_sps_table(out) if skip_sps else None
    kept = load(kept_path, SPS_FILE, inside="drafter folder").model_dump(exclude_unset=True) if kept_path else None
    if kept is not None:
        S.SpsTable.from_dict(kept, f"SPS table {kept_path}")  # before anything is decoded
    return held_out, drafter_dir, out, kept_path, kept


def _cost_table(recipe, target, ids, compile_mode: str, out: Path, figures: Path, log,
                sps_profiler: Callable | None) -> tuple[dict, Path]:
    """Profile SPS(B) on the target over a KV cache as long as a calibration request's mean context, with pdraft's
    verifier or in the engine of `sps_profiler`, write sps_table.json and its plot; (the table's dict, its
    path)."""
    sec = recipe.calibrate
    context = int(sum(map(len, ids)) / len(ids)) + sec.max_new_tokens // 2
    where = f"in {sec.sps_engine}" if sps_profiler is not None else "with pdraft's verifier"
    log(f"profiling SPS(B) {where} for B = 1..{sec.sps_max_batch_tokens} over a {context}-token KV cache, "
        f"{sec.sps_repeats} repeats")
    if sps_profiler is None:
        table = S.profile(target.model, sec.sps_max_batch_tokens, repeats=sec.sps_repeats, context=context,
                          target=target.id, requests=sec.sps_requests, compile=compile_mode)
    else:
        table = _engine_table(recipe, target, context, sps_profiler)
    path = S.save_sps_table(table, out / SPS_NAME)
    plot_sps(table, figures / "sps.png")
    return table, path


def _engine_table(recipe, target, context: int, sps_profiler: Callable) -> dict:
    """The cost table measured by a serving engine (pdraft.serving.api.Engine.sps_profiler) at the same B, context
    and requests pdraft's own profile uses, in the same layout; its metadata is what the engine says it measured."""
    sec = recipe.calibrate
    points = S.profile_points(sec.sps_max_batch_tokens)
    context = S.fit_context(context, sec.sps_max_batch_tokens, sec.sps_requests, target.max_context)
    seconds, meta = sps_profiler(recipe, target, points, context=context, requests=sec.sps_requests,
                                 repeats=sec.sps_repeats)
    if len(seconds) != len(points) or not all(s > 0 for s in seconds):
        raise PdraftError(f"the {sec.sps_engine} SPS profiler returned {len(seconds)} step times for {len(points)} "
                          "batch sizes, or a time that is not > 0")
    meta = dict(meta)
    gpu = meta.pop("device", None)  # the engine's accelerator by name, None on the CPU pdraft names here
    return S.cost_table(seconds, points, sec.sps_max_batch_tokens, device=gpu or device_name("cpu"),
                        device_type="cuda" if gpu else "cpu",
                        meta={"target": target.id, "requests": int(sec.sps_requests), "repeats": int(sec.sps_repeats),
                              **meta})


def headline(result: dict) -> str:
    """The acceptance figure of the issue, in one line: overall ECE after STS on the held-out part."""
    meta = result["calibration"].get("pdraft") or {}  # a calibration pdraft did not write has none
    if not meta.get("overall_before") or not meta.get("overall_after"):
        return "the calibration file records no ECE measurements (not written by calibrate-threshold)"
    b, a = meta["overall_before"], meta["overall_after"]

    def pct(v):
        return "n/a" if not isinstance(v, (int, float)) else f"{100 * v:.2f}%"
    pb, pa = meta.get("pooled_before") or {}, meta.get("pooled_after") or {}
    auc = "n/a" if not isinstance(pa.get("auc"), (int, float)) else f"{pa['auc']:.3f}"
    return (f"{meta.get('ece_on')} ECE of the cumulative survival: {pct(pb.get('ece'))} before STS -> "
            f"{pct(pa.get('ece'))} after ({str(meta.get('binning')).replace('_', '-')} bins x {meta.get('bins')} over all "
            f"{pa.get('samples')} verified (round, position) samples; AUC {auc}; a perfectly calibrated predictor "
            f"would show {pct(pa.get('ece_floor'))} on these samples); per-position mean {pct(b.get('ece'))} -> "
            f"{pct(a.get('ece'))} (floor {pct(a.get('ece_floor'))})")


__all__ = ["calibrate", "check_drafter", "headline", "RoundData"]
