"""The model card (README.md) that `push` uploads: what the drafter is (kind, size in parameters, block size and
convention, target layers), what it was trained for and on (target model and revision, data, steps, from
recipe.resolved.yaml), what was measured (the bench JSON report's tau per domain and gamma, speedup and machine;
the calibration's ECE before and after), and exact commands for pdraft, vLLM and SGLang. Every figure is read
from a file in the drafter folder; a section whose file is absent says so instead of inventing a number. The
YAML header uses the Hub's model-card metadata keys (library_name, base_model, tags)."""

from __future__ import annotations

from pathlib import Path

import yaml

from pdraft.bench_file import BENCH_REPORT, BenchReport
from pdraft.calibration_files import read_calibration
from pdraft.errors import PdraftError
from pdraft.hub.export import (CALIBRATION_GLOBS, SPS_GLOBS, TARGET_PLACEHOLDER, find_one, plan, recipe_target,
                               resolved_of, serve_command)
from pdraft.hub.files import check_repo_id
from pdraft.models.checkpoint import load_drafter
from pdraft.models.families import FAMILIES
from pdraft.paths import RESOLVED_NAME
from pdraft.readback import load

BENCH_GLOBS = ("bench.json", "bench_report.json", "*bench*.json")


def _fmt(x, digits: int = 2) -> str:
    if isinstance(x, bool) or x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def bench_rows(report: BenchReport) -> list[dict]:
    """The drafters' measured runs of a bench report (the baselines, gamma 0, are references, not rows), at its
    first temperature when it ran several (the card's table has no temperature column)."""
    first = report.runs[0].temperature if report.runs else None
    return [{"drafter": r.drafter, "domain": r.domain, "gamma": r.gamma, "tau": r.summary.tau,
             "token_acceptance": r.summary.token_acceptance, "speedup": r.speedup}
            for r in report.runs if r.gamma > 0 and r.temperature == first]


def _machine(report: BenchReport) -> str:
    m = report.machine
    if m:
        return ", ".join(f"{k}: {v}" for k, v in m.items() if not isinstance(v, (dict, list)))
    return "not recorded in the report"


def _bench_section(folder: Path, bench: tuple[Path, bytes] | None = None) -> list[str]:
    path = bench[0] if bench else find_one(folder, BENCH_GLOBS)
    if path is None:
        return ["No bench report was pushed with the drafter (run `pdraft bench` and push again with "
                "--bench-report OUT/bench.json)."]
    # The bench report's one schema (pdraft.bench.report), on the bytes push sends when it sends them.
    report = load(path, BENCH_REPORT, inside="drafter folder" if bench is None else None,
                  blob=bench[1] if bench else None)
    rows = bench_rows(report)
    if not rows:
        return [f"`{path.name}` holds no measured drafter runs."]
    lines = [f"From `{path.name}` (definitions: tau = mean accepted drafts + 1 per round; speedup = target-alone "
             f"TPOT / speculative TPOT in the same run). Machine: {_machine(report)}.", "",
             "| drafter | domain | gamma | tau | token acceptance | speedup |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['drafter']} | {r['domain']} | {_fmt(r['gamma'])} "
                     f"| {_fmt(r['tau'])} | {_fmt(r['token_acceptance'])} | {_fmt(r['speedup'])} |")
    return lines


def _calibration_section(folder: Path) -> list[str]:
    path = find_one(folder, CALIBRATION_GLOBS)
    if path is None:
        return ["No calibration file was in the drafter folder (run `pdraft calibrate-threshold`)."]
    cal = read_calibration(path).model_dump(exclude_unset=True)  # the schema decode reads it with
    lines = [f"From `{path.name}` (Sequential Temperature Scaling; dataset: {cal.get('dataset', '—') or '—'}, "
             f"samples: {cal.get('num_samples', '—')})."]
    scalars = {k: v for k, v in cal.items() if "ece" in k.lower() and isinstance(v, (int, float))}
    for k, v in sorted(scalars.items()):
        lines.append(f"- {k}: {_fmt(float(v), 4)}")
    before, after = cal.get("ece_before"), cal.get("ece_after")
    if isinstance(before, list) and isinstance(after, list) and before and after:
        lines += ["", "| position | ECE before | ECE after | temperature |", "| --- | --- | --- | --- |"]
        temps = cal.get("temperatures") or []
        for k in range(max(len(before), len(after))):
            b = before[k] if k < len(before) else None
            a = after[k] if k < len(after) else None
            t = temps[k] if k < len(temps) else None
            lines.append(f"| {k + 1} | {_fmt(b, 4)} | {_fmt(a, 4)} | {_fmt(t, 3)} |")
    elif not scalars:
        lines.append("The file records no ECE figures.")
    return lines


def _engine_lines(cfg, repo_id: str, target: str, fmt: str, folder: Path) -> list[str]:
    try:
        p = plan(cfg, fmt)
    except PdraftError as err:
        return [f"Not loadable as trained: {err.message}"]
    local = f"drafter-{fmt}"
    sts = f"{local}/sglang_sts.json" if fmt == "sglang" and p.method == "DSPARK" and cfg.has_confidence and \
        find_one(folder, CALIBRATION_GLOBS) else None
    sps = f"{local}/sglang_sps_table.json" if fmt == "sglang" and p.method == "DSPARK" and \
        find_one(folder, SPS_GLOBS) else None
    return ["```bash", f"pdraft pull {repo_id} --out drafter",
            f"pdraft export drafter --format {fmt} --out {local}", serve_command(p, local, target, sts, sps, confidence=cfg.has_confidence), "```"]


def build_card(folder: str | Path, repo_id: str, drafter=None, bench: tuple[Path, bytes] | None = None) -> str:
    """README.md text for the drafter in `folder`, to be pushed to `repo_id` (`drafter`: the folder's drafter
    when the caller has already loaded it; `bench`: a bench report pushed from its own folder, path and bytes)."""
    folder = Path(folder)
    if drafter is None:
        drafter = load_drafter(folder)
    cfg = drafter.config
    params = sum(t.numel() for t in drafter.state_dict().values())
    resolved = resolved_of(folder)  # the recipe's own schema: a `data` that is a list is one line
    recipe = resolved[1] if resolved else {}
    tgt = recipe.get("target") or {}
    data, train = recipe.get("data") or {}, recipe.get("train") or {}
    target = recipe_target(recipe)
    family = FAMILIES.of(cfg)
    kind = family.title
    meta = {"library_name": "pdraft", "tags": ["speculative-decoding", kind.lower(), "pdraft"]}
    if target != TARGET_PLACEHOLDER:
        try:
            meta["base_model"] = check_repo_id(target)
        except PdraftError:
            pass
    moe = (f", mixture of experts ({cfg.num_experts} experts, top-{cfg.num_experts_per_tok})"
           if getattr(cfg, "is_moe", False) else "")
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", "",
             f"# {repo_id.split('/')[-1]}", "",
             f"A {kind} {family.drafting} drafter for speculative decoding, trained and pushed with pdraft.", "",
             "## Drafter", "",
             f"- Target model: `{tgt.get('id', 'not recorded')}`, "
             f"revision: `{tgt.get('revision') or 'default branch'}`",
             f"- Kind: {kind}{cfg.card_heads()}",
             f"- Size: {params:,} parameters ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}{moe}); the "
             f"embedding and LM head are the target's and are not stored",
             *cfg.card_lines(), "",
             "## Training", ""]
    if recipe:
        lines += [f"- Data: `{data.get('source', '—')}`" + (f" (at most {data['max_samples']} samples)"
                                                           if data.get("max_samples") else "")
                  + (", responses regenerated by the target" if data.get("regenerate") else ""),
                  f"- Steps: {train.get('steps', '—')}, batch size {train.get('batch_size', '—')} × "
                  f"{train.get('grad_accum', 1)} accumulation, peak lr {train.get('lr', '—')}",
                  f"- The full resolved recipe is `{RESOLVED_NAME}` in this repository."]
    else:
        lines.append(f"No `{RESOLVED_NAME}` was in the drafter folder; training settings are not recorded.")
    lines += ["", "## Measured acceptance and speed", "", *_bench_section(folder, bench), "",
              "## Confidence calibration", "", *_calibration_section(folder), "",
              "## Run it", "", "pdraft (decode or bench against the target):", "", "```bash",
              f"pdraft pull {repo_id} --out drafter",
              f"pdraft decode --target {tgt.get('id', TARGET_PLACEHOLDER)} --drafter drafter --prompt 'Hello'",
              "```", "", "vLLM:", "", *_engine_lines(cfg, repo_id, target, "vllm", folder), "",
              "SGLang:", "", *_engine_lines(cfg, repo_id, target, "sglang", folder), ""]
    if target == TARGET_PLACEHOLDER:
        lines.append(f"Replace `{TARGET_PLACEHOLDER}` with the target this drafter was trained for.")
    return "\n".join(lines) + "\n"
