"""`pdraft check-serving DRAFTER --engine vllm [--export DIR]` (and `pdraft export --check`): is the drafter
served as it was trained? The failure this answers is the silent one: an engine loads an export, serves it,
and accepts almost nothing, with no error (a layer offset, a mask token, a block size, a dtype the engine
inherits from the target).

Two checks, in this order:

1. **The export against the engine's loader.** DIR (default: a fresh export of DRAFTER) is compared, field by
   field and tensor by tensor, with the export pdraft writes for DRAFTER (pdraft.hub.export, whose every field
   cites the engine file that reads it: pdraft/hub/ENGINES.md); so is the serve setting
   (`num_speculative_tokens` against the block size) and the target the engine loads (its chat template, its
   shape, a quantization the drafter would inherit). Each difference is named by its cause (CAUSES).
2. **The replay.** The engine serves DIR (greedy, N prompts of the recipe's bench sets through the chat
   template), pdraft's loop decodes the same prompts with DRAFTER at the same gamma, and the outputs and the
   accepted count of every drafting round are compared (compare_rounds: the rule of the engine check,
   tests/engines/vllm_dflash_check.py, which calls it).

A finding in step 1 fails the check at once, before any engine starts (the difference is certain; `replay=True`
serves it anyway, to see what the engine makes of it); an export that matches and a replay that differs is
an engine-side difference (its loader reading a correct export differently), said so; agreement prints the
engine's tau beside pdraft's. Every engine runs through the bench contenders (pdraft.bench.contenders,
pdraft.serving), so the replay is one workload run by two contenders. What is the engine's own (the export format
it serves, the speculative config it prints and is asked for, its replay contender and the interpreter that runs
it, the loader files a cause cites) comes from its Engine (pdraft.serving.api), asked of the registry by name:
nothing here names an engine.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pdraft.errors import PdraftError
from pdraft.hub.export import export
from pdraft.serving import get_engine
from pdraft.serving.api import Engine

REPLAY_DTYPE = "float32"  # pdraft's loop and the engine alike, whatever runtime.dtype resolves to
# cause -> what it is; where an engine reads it is that engine's (Engine.cause_notes, cause_texts)
CAUSES = {
    "layer-ids": "target layer ids or their offset convention",
    "mask-token": "mask token id",
    "block-size": "block size against num_speculative_tokens (dflash serves block_size - 1, dspark block_size; "
                  "more drafts than the trained block draft garbage)",
    "layout": "anchor / layout flags (architecture, method, block convention, sample_from_anchor: which slot "
              "predicts which token)",
    "dtype": "dtype or quantization (a drafter without its own quantization config inherits the target's)",
    "vocab": "vocabulary mapping (vocab size, draft vocabulary, d2t / t2d)",
    "chat-template": "chat template or shape of the target the engine serves (the prompts the drafter sees)",
    "weights": "weights (a tensor missing, reshaped or changed)",
    "config": "another config field the engine reads",
}
_KEY_CAUSES = (("layer_ids", "layer-ids"), ("aux_hidden_state", "layer-ids"), ("mask_token", "mask-token"),
               ("block_size", "block-size"), ("quantization", "dtype"), ("dtype", "dtype"),
               ("vocab", "vocab"), ("d2t", "vocab"), ("t2d", "vocab"), ("architectures", "layout"),
               ("anchor", "layout"), ("block_convention", "layout"), ("model_type", "layout"),
               ("layout", "layout"))


@dataclass
class Finding:
    cause: str  # a key of CAUSES
    detail: str  # one line: what differs

    def line(self) -> str:
        return f"{self.cause}: {self.detail}"


@dataclass
class ServingReport:
    drafter: str
    export: str
    engine: str
    speculative_config: dict
    findings: list[Finding] = field(default_factory=list)
    replayed: bool = False
    problems: list[str] = field(default_factory=list)  # replay differences, one line each
    near_ties: list[str] = field(default_factory=list)  # divergences the audit calls near-ties: reported, not failed
    stats: dict = field(default_factory=dict)  # tau in each, rounds compared
    engine_info: dict | None = None

    @property
    def ok(self) -> bool:
        return not self.findings and not self.problems

    def causes(self) -> list[str]:
        return list(dict.fromkeys(f.cause for f in self.findings))

    def to_dict(self) -> dict:
        return {"ok": self.ok, "drafter": self.drafter, "export": self.export, "engine": self.engine,
                "speculative_config": self.speculative_config, "causes": self.causes(),
                "findings": [{"cause": f.cause, "detail": f.detail} for f in self.findings],
                "replayed": self.replayed, "problems": self.problems, "near_ties": self.near_ties,
                "stats": self.stats,
                "engine_info": self.engine_info}


def cause_texts(engine: str) -> dict[str, str]:
    """CAUSES, each followed by where `engine`'s loader reads it when its module says (Engine.cause_notes)."""
    notes = get_engine(engine).cause_notes
    return {cause: f"{text} ({notes[cause]})" if cause in notes else text for cause, text in CAUSES.items()}


def cause_of(key: str) -> str:
    """The cause a differing config key (dotted) or tensor name points at."""
    low = key.lower()
    return next((cause for needle, cause in _KEY_CAUSES if needle in low), "config")


def _flat(data, prefix: str = "") -> dict:
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


def _show(value) -> str:
    text = json.dumps(value) if value is not None else "absent"
    return text if len(text) <= 80 else text[:77] + "..."


def compare_exports(expected: Path, given: Path) -> list[Finding]:
    """Every difference between the export pdraft writes (`expected`) and `given`: config.json field by field,
    then model.safetensors tensor by tensor (name, shape, dtype, values)."""
    from safetensors import safe_open

    findings: list[Finding] = []
    try:
        want = _flat(json.loads((expected / "config.json").read_text()))
        got = _flat(json.loads((given / "config.json").read_text()))
    except (OSError, ValueError) as e:
        raise PdraftError(f"cannot read {given / 'config.json'}: {e}") from None
    for key in sorted(set(want) | set(got)):
        if want.get(key) != got.get(key):
            findings.append(Finding(cause_of(key), f"config {key} is {_show(got.get(key))} in the export, "
                                                   f"{_show(want.get(key))} as trained"))
    weights = given / "model.safetensors"
    if not weights.is_file():
        return findings + [Finding("weights", f"{weights} is missing")]
    with safe_open(expected / "model.safetensors", "pt") as a, safe_open(weights, "pt") as b:
        names_a, names_b = set(a.keys()), set(b.keys())
        for name in sorted(names_a ^ names_b):
            where = "missing from the export" if name in names_a else "in the export only"
            findings.append(Finding("vocab" if cause_of(name) == "vocab" else "weights", f"tensor {name} {where}"))
        for name in sorted(names_a & names_b):
            x, y = a.get_tensor(name), b.get_tensor(name)
            if x.dtype != y.dtype:
                findings.append(Finding("dtype", f"tensor {name} is {str(y.dtype).removeprefix('torch.')} in the "
                                                 f"export, {str(x.dtype).removeprefix('torch.')} as trained"))
            elif x.shape != y.shape:
                findings.append(Finding(cause_of(name) if cause_of(name) == "vocab" else "weights",
                                        f"tensor {name} has shape {list(y.shape)}, {list(x.shape)} as trained"))
            elif not bool((x == y).all()):
                findings.append(Finding(cause_of(name) if cause_of(name) == "vocab" else "weights",
                                        f"tensor {name} holds other values than the trained one"))
    return findings


def serve_findings(spec: dict, num_speculative: int | None, *, parallel: bool) -> list[Finding]:
    """The serve setting against the block the drafter was trained with (`parallel`: the drafter drafts its block
    in one pass, so a shorter block drafts other tokens than training did; a chain only stops earlier)."""
    if num_speculative is None or num_speculative == spec["num_speculative_tokens"]:
        return []
    trained = spec["num_speculative_tokens"]
    if num_speculative > trained:
        return [Finding("block-size", f"num_speculative_tokens {num_speculative} exceeds the {trained} drafts the "
                                      f"trained block holds (method {spec['method']})")]
    if parallel:
        return [Finding("block-size", f"num_speculative_tokens {num_speculative} runs a shorter block than the "
                                      f"{trained} drafts it was trained with (method {spec['method']})")]
    return []


def _chat_template(folder: Path) -> str | None:
    for name in ("chat_template.jinja",):
        if (folder / name).is_file():
            return (folder / name).read_text()
    try:
        return json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return None


def target_findings(served: Path, trained: Path) -> list[Finding]:
    """The target the engine loads against the one the drafter was trained on: shape, vocabulary, chat template,
    and a quantization the drafter would inherit."""
    findings = []
    try:
        a = json.loads((trained / "config.json").read_text())
        b = json.loads((served / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise PdraftError(f"cannot read the target's config.json: {e}") from None
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if a.get(key) != b.get(key):
            findings.append(Finding("vocab" if key == "vocab_size" else "chat-template",
                                    f"served target has {key} {b.get(key)}, the drafter's target {a.get(key)}"))
    if b.get("quantization_config") and not a.get("quantization_config"):
        method = b["quantization_config"].get("quant_method", "?")
        findings.append(Finding("dtype", f"the served target is quantized ({method}) and the drafter has no "
                                         f"quantization config of its own: the engine would load it quantized"))
    if Path(served).resolve() != Path(trained).resolve() and _chat_template(served) != _chat_template(trained):
        findings.append(Finding("chat-template", "the served target's chat template differs from the one the "
                                                 "drafter was trained with"))
    return findings


def compare_rounds(ours: list[dict], theirs: list[dict], *, budget_end_undrafted: bool = False,
                   stop_draft_unaccepted: bool = False, audited: dict | None = None) -> tuple[list[str], dict]:
    """pdraft's decode against an engine's, per request: rows {"output_ids", "finish_reason", "accepted": [a of
    every drafting round], "drafted": [its draft length]}. Outputs must be equal token for token, and every
    round's accepted count equal, except the final round of a request that stopped on max tokens (pdraft caps that
    draft at the remaining budget; an engine drafts in full and trims after, so it may count more).
    `budget_end_undrafted`: the engine takes a request's last budgeted token in a step that drafts nothing
    (Engine.budget_end_undrafted), so such a request may show one round fewer than pdraft's.
    `stop_draft_unaccepted`: the engine takes a drafted stop token as its step's own token, not as an accepted draft
    (Engine.stop_draft_unaccepted), so the round of a request that ended on a stop token among pdraft's accepted
    drafts counts the drafts before it (stop_round). `audited`: request ->
    its greedy_audit Divergence (the engine's output against pdraft's); a near-tie there ends that prompt's
    comparison at the divergence (its rounds that verified only earlier tokens are still compared) and is listed
    in stats["near_ties"]; any other divergence is a problem. (problems, stats with tau in each and the rounds
    compared)."""
    problems: list[str] = []
    ties: list[str] = []
    compared = same = pd_acc = pd_rounds = en_acc = en_rounds = 0
    if len(ours) != len(theirs):
        problems.append(f"request counts differ: pdraft {len(ours)}, engine {len(theirs)}")
    for i, (p, s) in enumerate(zip(ours, theirs)):
        a, b = list(p["accepted"]), list(s["accepted"])
        if s["output_ids"] != p["output_ids"]:
            d = (audited or {}).get(i)
            if d is None or not d.rounding:
                k = next((k for k, (x, y) in enumerate(zip(s["output_ids"], p["output_ids"])) if x != y),
                         min(len(s["output_ids"]), len(p["output_ids"])))
                where = d.line() if d is not None else f"token {k}"
                problems.append(f"prompt {i}: the engine's output differs from pdraft's at {where}")
                continue  # different text: rounds cannot be compared
            ties.append(f"prompt {i}: the engine's output parts from pdraft's at {d.line()}; compared up to there")
            n = _rounds_before(p.get("drafted", []), a, d.position)
            a, b = a[:n], b[:n]
        elif budget_end_undrafted and p["finish_reason"] == "length" and len(b) == len(a) - 1:
            a = a[:-1]  # pdraft's capped last round is the engine's undrafted last step
        elif stop_draft_unaccepted and p["finish_reason"] == "eos":
            a = stop_round(p)
        pd_acc, pd_rounds, en_acc, en_rounds = pd_acc + sum(a), pd_rounds + len(a), en_acc + sum(b), en_rounds + len(b)
        if len(a) != len(b):
            problems.append(f"prompt {i}: pdraft drafted {len(a)} rounds, the engine verified {len(b)} steps")
        n = max(min(len(a), len(b)) - (1 if p["finish_reason"] == "length" and s["output_ids"] == p["output_ids"]
                                        else 0), 0)
        bad = [k for k in range(n) if a[k] != b[k]]
        compared, same = compared + n, same + n - len(bad)
        if bad:
            k = bad[0]
            problems.append(f"prompt {i}: {len(bad)} of {n} rounds differ; first at drafting round {k + 1}: pdraft "
                            f"accepted {a[k]}, the engine {b[k]} (pdraft {a[:n]} vs engine {b[:n]})")
    tau = lambda acc, rounds: 1 + acc / rounds if rounds else None  # noqa: E731
    return problems, {"prompts": len(ours), "rounds_compared": compared, "rounds_equal": same,
                      "tau_pdraft": tau(pd_acc, pd_rounds), "pdraft_rounds": pd_rounds,
                      "tau_engine": tau(en_acc, en_rounds), "engine_rounds": en_rounds, "near_ties": ties}


def stop_round(row: dict) -> list[int]:
    """The accepted counts of a request that ended on a stop token, its last round counted as an engine that never
    accepts a drafted stop token but at its draft's last position counts it (llama.cpp: common/sampling.cpp:704,
    common_sampler_sample_and_accept_n stops at a drafted end-of-generation token unless it is the last draft and
    takes it as the step's own token). pdraft counts every draft its target agrees with, the stop token and the drafts
    past it included (they never reach the output). The last round committed c tokens, the stop token last (the
    first token comes from the prefill, each earlier round committed a + 1); where the stop token was one of its
    accepted drafts (c <= a), the engine's count is the c - 1 drafts before it, or c where it was the last verified
    draft. Rows without per-round draft lengths are left as they are."""
    a, verified = list(row["accepted"]), list(row.get("verified") or row.get("drafted") or [])
    if not a or len(verified) != len(a):
        return a
    c = len(row["output_ids"]) - 1 - sum(x + 1 for x in a[:-1])
    if 1 <= c <= a[-1]:
        a[-1] = c - 1 if c < verified[-1] else c
    return a


def _rounds_before(drafted: list[int], accepted: list[int], position: int) -> int:
    """How many leading drafting rounds verified only output positions before `position`: round j starts at
    1 + sum of the earlier rounds' a + 1 (the first token comes from the prefill) and verifies its drafted
    positions and the bonus after them. Without the draft lengths, none."""
    start, n = 1, 0
    for g, a in zip(drafted, accepted):
        if start + g >= position:
            break
        start, n = start + a + 1, n + 1
    return n


def rows_of(decoded) -> list[dict]:
    """compare_rounds' rows from a contender's Decoded (pdraft.bench.contenders)."""
    rows = [{"output_ids": list(o), "finish_reason": reason, "accepted": [], "drafted": [], "verified": []}
            for o, reason in zip(decoded.outputs, decoded.finish_reasons)]
    for r in decoded.records:
        if r.gamma > 0:
            rows[r.request]["accepted"].append(r.accepted)
            rows[r.request]["drafted"].append(r.gamma)
            rows[r.request]["verified"].append(r.verified)
    return rows


def check_serving(drafter_dir: str | Path, *, engine: str = "vllm", export_dir: str | Path | None = None,
                  recipe=None, num_prompts: int = 2, max_new_tokens: int = 32, num_speculative: int | None = None,
                  served_target: str | Path | None = None, replay: bool | None = None,
                  log=lambda _: None) -> ServingReport:
    """The checks of the module docstring. `recipe` gives the target and the prompts (default: the drafter's
    recipe.resolved.yaml); `served_target` the folder the engine loads (default: the recipe's target);
    `replay` None replays only when the export check finds nothing, True always, False never."""
    served_by = get_engine(engine)  # an unknown name: its one line
    drafter_dir = Path(drafter_dir)
    recipe = recipe or _drafter_recipe(drafter_dir)
    target = _target_info(recipe)
    served = Path(served_target or target.path).resolve()
    scratch = Path(tempfile.mkdtemp(prefix="pdraft-check-serving-"))
    try:
        report = _check(drafter_dir, served_by, export_dir, recipe, target, served, num_prompts, max_new_tokens,
                        num_speculative, replay, scratch, log)
    except BaseException:
        # Kept: an engine's one-line error points at its log in here (issue 60: it pointed at a deleted file).
        # Only a scratch folder nothing was written to yet goes (a refusal before the export).
        if any(scratch.iterdir()):
            log(f"kept {scratch} (the export and the engine's logs)")
        else:
            scratch.rmdir()
        raise
    if report.problems:  # the engine's logs stay for the reader
        report.problems.append(f"the engine's logs: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def _check(drafter_dir, engine: Engine, export_dir, recipe, target, served, num_prompts, max_new_tokens,
           num_speculative, replay, scratch, log) -> ServingReport:
    fresh = export(drafter_dir, engine.export_format, scratch / "expected", target=str(served))
    spec = engine.speculative_config(fresh.command)
    given = Path(export_dir) if export_dir else fresh.path
    report = ServingReport(str(drafter_dir), str(given), engine.name, dict(spec))
    if export_dir:
        report.findings += compare_exports(fresh.path, given)
    report.findings += serve_findings(spec, num_speculative, parallel=_drafts_in_parallel(drafter_dir))
    report.findings += target_findings(served, Path(target.path))
    gamma = num_speculative or int(spec["num_speculative_tokens"])
    report.speculative_config = engine.served_config(spec, given, gamma)
    for f in report.findings:
        log(f"export check: {f.line()}")
    if replay is False or (replay is None and report.findings):
        return report
    _replay(report, engine, drafter_dir, given, spec, gamma, recipe, served, num_prompts, max_new_tokens, scratch,
            log)
    return report


def _replay(report, engine: Engine, drafter_dir, export_dir, spec, gamma, recipe, served, num_prompts, max_new_tokens,
            scratch, log) -> None:
    """Serve the export in the engine and decode with the drafter in pdraft's loop: one greedy workload, two
    contenders (pdraft.bench.contenders)."""
    from pdraft.bench.contenders import Workload
    from pdraft.bench.sweep import drafter_contender, load_domains
    from pdraft.data.templates import eos_ids
    from pdraft.decode.greedy_audit import GreedyAuditor
    from pdraft.decode.settings import DecodeSettings
    from pdraft.models.api import SamplingParams
    from pdraft.policies import FULL
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import load_target

    # float32 on both sides (llm_args' default): the replay proves the format round for round, and a bf16 run
    # (runtime.dtype auto on a CPU with bf16 units) would part from the engine by rounding, not by a broken export.
    loaded = load_target(recipe.target, make_runtime(recipe.runtime.model_copy(update={"dtype": REPLAY_DTYPE})))
    ours = drafter_contender(drafter_dir, loaded.model)
    if gamma > (ours.max_gamma or 0):
        report.problems.append(f"pdraft's loop drafts at most {ours.max_gamma} tokens with this drafter; the engine "
                               f"is asked for {gamma}")
        return
    domains = load_domains(recipe.bench.prompt_sets, loaded.tokenizer, num_prompts=num_prompts,
                           chat_template=recipe.decode.chat_template, enable_thinking=recipe.decode.enable_thinking,
                           context=loaded.max_context)
    prompts = [list(p) for d in domains for p in d.prompts]
    settings = DecodeSettings.from_recipe(recipe, "decode").replace(  # a chain, as the engine runs it
        gamma=gamma, verify=FULL, tree=None, sampling=SamplingParams(), max_new_tokens=max_new_tokens,
        batch_size=len(prompts))
    eos = sorted(set(eos_ids(loaded.model, loaded.tokenizer)))
    work = Workload(prompts, settings, gamma, settings.verify_config(), eos_token_ids=eos)
    log(f"pdraft: {len(prompts)} prompts, gamma {gamma}, greedy, {max_new_tokens} new tokens")
    mine = ours.run(work)
    longest = max(len(p) for p in prompts) + max_new_tokens + gamma + 8
    theirs = engine.replay_contender(recipe, served, ours, Path(export_dir), spec, gamma,
                                     vocab_size=loaded.vocab_size, dtype=REPLAY_DTYPE, context=longest,
                                     scratch=scratch)
    log(f"{report.engine}: starting with {json.dumps(report.speculative_config)}")
    refused = theirs.prepare([gamma])
    if refused:
        report.problems.append(refused)
        report.replayed = True
        return
    try:
        served_rows = theirs.run(Workload(prompts, settings, gamma, work.verify, concurrency=len(prompts),
                                          eos_token_ids=eos))
    finally:
        theirs.close()
    report.replayed = True
    report.engine_info = served_rows.engine_info
    # where the engine's greedy text parts from pdraft's: audited against pdraft's float64 target, the engine's
    # own numerics allowed for (Engine.near_tie_gap; pdraft.decode.greedy_audit)
    audited = {d.request: d for d in GreedyAuditor(loaded.model).audit(
        prompts, served_rows.outputs, mine.outputs, gap_floor=engine.near_tie_gap)}
    report.problems, report.stats = compare_rounds(rows_of(mine), rows_of(served_rows),
                                                   budget_end_undrafted=engine.budget_end_undrafted,
                                                   stop_draft_unaccepted=engine.stop_draft_unaccepted, audited=audited)
    report.near_ties = report.stats.pop("near_ties")
    info = served_rows.engine_info or {}
    report.problems += list(info.get("problems", []))  # the engine's own checks
    report.near_ties += list(info.get("near_ties", []))


def _drafts_in_parallel(folder: Path) -> bool:
    from pdraft.models import load_drafter
    from pdraft.models.families import FAMILIES

    return FAMILIES.of(load_drafter(folder).config).drafting == "parallel"


def _drafter_recipe(folder: Path):
    from pdraft.paths import RESOLVED_NAME
    from pdraft.recipe import load_recipe

    if not (folder / RESOLVED_NAME).is_file():
        raise PdraftError(f"{folder} has no {RESOLVED_NAME} to take the target and prompts from",
                          hint="give --recipe with the recipe the drafter was trained with")
    return load_recipe(folder / RESOLVED_NAME)


def _target_info(recipe):
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import inspect_target

    return inspect_target(recipe.target, make_runtime(recipe.runtime), weights=False)
