"""The model card (README.md) that `push` uploads: what the drafter is (kind, size in parameters, block size and
convention, target layers), what it was trained for and on (target model and revision, data, steps, from
recipe.resolved.yaml), what was measured (the bench JSON report's tau per domain and gamma, speedup and machine;
the calibration's ECE before and after), and exact commands for pdraft, vLLM and SGLang. Every figure is read
from a file in the drafter folder; a section whose file is absent says so instead of inventing a number. The
YAML header uses the Hub's model-card metadata keys (library_name, base_model, tags)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from pdraft.errors import PdraftError
from pdraft.hub.export import (CALIBRATION_GLOBS, SPS_GLOBS, TARGET_PLACEHOLDER, find_one, plan, recipe_target,
                               serve_command)
from pdraft.hub.files import check_repo_id
from pdraft.models.checkpoint import load_drafter
from pdraft.models.families import FAMILIES
from pdraft.paths import RESOLVED_NAME, read_regular
from pdraft.typed_yaml import load_yaml_text

BENCH_GLOBS = ("bench.json", "bench_report.json", "*bench*.json")
_BENCH_KEYS = ("drafter", "domain", "prompt_set", "gamma", "tau", "token_acceptance", "speedup")


def _fmt(x, digits: int = 2) -> str:
    if isinstance(x, bool) or x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def bench_rows(report) -> list[dict]:
    """Every result entry of a bench JSON report: any object carrying `tau` and `gamma` (the report's layout may
    nest them per drafter and domain; the parents' `drafter`/`domain` keys are inherited)."""
    rows: list[dict] = []

    def walk(node, inherited: dict) -> None:
        if isinstance(node, dict):
            here = dict(inherited)
            for key in ("drafter", "domain", "prompt_set"):
                if isinstance(node.get(key), str):
                    here[key] = node[key]
            if "tau" in node and "gamma" in node and not isinstance(node["tau"], (dict, list)):
                rows.append({**here, **{k: node[k] for k in _BENCH_KEYS if k in node}})
                return
            for value in node.values():
                walk(value, here)
        elif isinstance(node, list):
            for value in node:
                walk(value, inherited)

    walk(report, {})
    return rows


def _machine(report) -> str:
    m = report.get("machine") if isinstance(report, dict) else None
    if isinstance(m, dict):
        return ", ".join(f"{k}: {v}" for k, v in m.items() if not isinstance(v, (dict, list)))
    return str(m) if m else "not recorded in the report"


def _bench_section(folder: Path, bench: tuple[Path, bytes] | None = None) -> list[str]:
    path = bench[0] if bench else find_one(folder, BENCH_GLOBS)
    if path is None:
        return ["No bench report was pushed with the drafter (run `pdraft bench` and push again with "
                "--bench-report OUT/bench.json)."]
    try:
        report = json.loads(bench[1] if bench else read_regular(folder, path.name, what="drafter folder"))
    except PdraftError:
        raise
    except Exception as err:
        raise PdraftError(f"cannot parse the bench report {path}: {err}") from None
    rows = bench_rows(report)
    if not rows:
        return [f"`{path.name}` holds no per-gamma results (objects with `tau` and `gamma`)."]
    lines = [f"From `{path.name}` (definitions: tau = mean accepted drafts + 1 per round; speedup = target-alone "
             f"TPOT / speculative TPOT in the same run). Machine: {_machine(report)}.", "",
             "| drafter | domain | gamma | tau | token acceptance | speedup |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        domain = r.get("domain", r.get("prompt_set", "—"))
        lines.append(f"| {r.get('drafter', '—')} | {domain} | {_fmt(r.get('gamma'))} "
                     f"| {_fmt(r.get('tau'))} | {_fmt(r.get('token_acceptance'))} | {_fmt(r.get('speedup'))} |")
    return lines


def _calibration_section(folder: Path) -> list[str]:
    path = find_one(folder, CALIBRATION_GLOBS)
    if path is None:
        return ["No calibration file was in the drafter folder (run `pdraft calibrate-threshold`)."]
    try:
        cal = json.loads(read_regular(folder, path.name, what="drafter folder"))
    except PdraftError:
        raise
    except Exception as err:
        raise PdraftError(f"cannot parse the calibration file {path}: {err}") from None
    if not isinstance(cal, dict):
        raise PdraftError(f"the calibration file {path} must hold a JSON object")
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


def _recipe(folder: Path) -> dict:
    path = folder / RESOLVED_NAME
    if not path.is_file():
        return {}
    data = load_yaml_text(read_regular(folder, RESOLVED_NAME, what="drafter folder"), str(path))  # bounded
    if data is not None and not isinstance(data, dict):  # a recipe that is not a mapping is not a recipe
        raise PdraftError(f"{path} must hold a YAML mapping (a resolved recipe), found {type(data).__name__}")
    return data or {}


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
    recipe = _recipe(folder)
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
