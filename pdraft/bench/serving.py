"""The serving sweep behind `pdraft bench --concurrency 1,4,16,32 --temperature 0,1 --policy full,scheduler`:
what a serving engineer decides with. Every contender (each drafter given at every gamma of the sweep it can
draft, under every verification policy of the sweep that applies to it) and both target-alone baselines
decode the same requests at every concurrency level and temperature, and every figure comes from
pdraft.metrics.summarize over the runs' rounds.

Requests. A level of concurrency C decodes max(2 C, P) requests, P being the prompts of every prompt set
pooled (set after set): request i is prompt i mod P with its own stream seed request_seed(seed, i), so
copies of a prompt are independent samples and the same request draws the same numbers at every level.
pdraft's runs (the target alone and every drafter) batch continuously (pdraft.decode.engine, `concurrency`):
C requests in flight, a finished one's slot refilled at once by prefilling the next prompt into its row. Every
decode figure leaves prefills out with the first token each gives (the project's TPOT definition), here as for
transformers' generate(), which cannot refill a row: it runs static padded batches of C requests one after
another, an honest baseline only for what it is, and named so. The refills' time is reported beside
(`prefill_s` and its share of the wall time), since in a serving engine the rows wait for it.

Speedups count against the faster target-alone baseline at the same level and temperature: `speedup` is
TPOT(baseline) / TPOT(run) (metrics.speedup) and `throughput_gain` total tokens/s(run) / total tokens/s
(baseline). A policy that cannot run with a contender (no confidence head, no cost table beside the drafter,
or any other one-line refusal of its files) is skipped with that line, never an error in the middle of the
sweep. The n-gram baseline is left out of this sweep: its lookup is built over one call's prompts by row.
With `repeats` > 1 every run of a level is timed that many times, the repeats going round the level's runs in
turn, and the repeat with the (lower) median TPOT is kept whole, as in the gamma sweep.

`sla_picks`: per contender and temperature, the configuration (gamma, policy, concurrency) with the highest
total tokens/s whose per-user tokens/s stays at or above the SLA floor (None when none does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pdraft.bench.contenders import TARGET_LABEL, Contender, Workload
from pdraft.bench.sweep import (BenchSettings, Domain, compare_runs, drafted_gammas, fastest_baseline,
                                generate_contender, median_repeat, policy_applies, prepare_all, target_contender)
from pdraft.decode.greedy_audit import GreedyAuditor
from pdraft.errors import PdraftError
from pdraft.metrics import Summary, speedup
from pdraft.models.api import SamplingParams
from pdraft.policies import FULL, policy_spec
from pdraft.streams import request_seeds
from pdraft.temperature import temperature_problem
from pdraft.bench.memory_plan import check_bench_batches

GENERATE_LABEL = "generate(), static C"  # transformers generate(): static padded batches of C requests
REQUESTS_RULE = "max(2 C, P) requests per level: the P pooled prompts in turn, request i seeded request_seed(seed, i)"


def parse_levels(text: str) -> list[int]:
    """'1,4,16,32' -> [1, 4, 16, 32] (sorted, distinct, each 1..4096)."""
    try:
        values = sorted({int(v) for v in str(text).split(",") if v.strip()})
    except ValueError:
        raise PdraftError(f"cannot read concurrency {text!r}: give a list like 1,4,16,32") from None
    if not values or not all(1 <= v <= 4096 for v in values):
        raise PdraftError(f"concurrency {text!r}: give levels between 1 and 4096, like 1,4,16,32")
    return values


def parse_temperatures(text: str) -> list[float]:
    """'0,1' -> [0.0, 1.0] (in the order given, distinct, each a temperature pdraft.temperature accepts)."""
    try:
        values = list(dict.fromkeys(float(v) for v in str(text).split(",") if v.strip()))
    except ValueError:
        raise PdraftError(f"cannot read temperature {text!r}: give one value or a list like 0,1") from None
    if not values:
        raise PdraftError(f"temperature {text!r}: give one value or a list like 0,1")
    for v in values:  # the one temperature rule (pdraft.temperature): 0, or within its floor and ceiling
        if (problem := temperature_problem(v)) is not None:
            raise PdraftError(f"--temperature {text}: {problem}")
    return values


def parse_policies(names: Sequence[str]) -> list[str]:
    """Registered policy names, checked against the registry (its own one-line error for an unknown one)."""
    out = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    for name in out:
        policy_spec(name)
    if not out:
        raise PdraftError("--policy names no policy: give registered names like full,scheduler")
    return out


@dataclass
class ServingSettings:
    concurrency: list[int]
    temperatures: list[float]
    policies: list[str]
    sla_tps: float | None = None


@dataclass
class ServingRun:
    drafter: str
    kind: str  # the contender's kind: "target" | "generate" | the drafter's kind
    gamma: int  # 0 for the baselines
    verify: str
    concurrency: int
    temperature: float
    requests: int
    summary: Summary
    records: list = field(repr=False, default_factory=list)
    backend: str = ""
    compile_s: float = 0.0
    refills: int = 0  # slots taken by a request after another left them (0 for generate())
    speedup: float | None = None
    throughput_gain: float | None = None
    baseline: str | None = None
    same_as_target: bool | None = None  # greedy runs: outputs equal pdraft's target alone at this level
    divergences: list | None = None  # where they differ: pdraft.decode.greedy_audit's Divergence per request
    outputs: list[list[int]] | None = field(default=None, repr=False)
    tpot_repeats_s: list[float | None] = field(default_factory=list)  # every repeat's TPOT; this is the median one
    engine: str = ""  # "" = this process; else the serving engine (compared with its own baseline)
    engine_info: dict | None = None
    prefills_timed: bool = False  # the refills' prefills were timed apart (pdraft's continuous batching)


@dataclass
class ServingSkip:
    drafter: str
    verify: str
    reason: str  # one line


@dataclass
class ServingResult:
    settings: BenchSettings
    serving: ServingSettings
    domains: list[Domain]
    contenders: list[Contender]
    runs: list[ServingRun]
    skipped: list[ServingSkip]
    seeds: list[int]  # the stream seed of every request index of the largest level


def pooled_prompts(domains: Sequence[Domain]) -> list[list[int]]:
    return [list(p) for d in domains for p in d.prompts]


def clamp_levels(levels: Sequence[int], prompts: int, warn: Callable[[str], None]) -> list[int]:
    """The levels the sweep runs: a level above the P pooled prompts is run as P, with one warning line, and
    the levels that then repeat are dropped. Above P a level only adds copies of the same prompts (REQUESTS_RULE:
    2 C requests), so its time grew with C while it measured no request the sweep does not already have
    (issue 60: `--concurrency 512` over 24 prompts decoded 1,024 requests per contender)."""
    over = [c for c in levels if c > prompts]
    if over:
        warn(f"bench.concurrency {', '.join(map(str, over))}: above the {prompts} prompts this sweep has, run as "
             f"{prompts} (every prompt in flight at once; more would only repeat them)")
    return sorted({min(c, prompts) for c in levels})


def requests_for(prompts: Sequence[Sequence[int]], concurrency: int) -> list[list[int]]:
    """The requests of one level (REQUESTS_RULE)."""
    n = max(2 * concurrency, len(prompts))
    return [list(prompts[i % len(prompts)]) for i in range(n)]


def policy_plan(contenders: Sequence[Contender], settings: BenchSettings, policies: Sequence[str], *,
                warn: Callable[[str], None] = lambda _: None) -> tuple[dict, list[ServingSkip]]:
    """{(contender label, policy): VerifyConfig} for every policy that can run with each drafter, and one skip
    line for each that cannot (the registry's reason, or the refusal of the files it needs)."""
    plan, skipped = {}, []
    for c in (c for c in contenders if not c.baseline):  # a baseline verifies nothing
        for name in policies:
            spec = policy_spec(name)
            if c.refusal(name):
                skipped.append(ServingSkip(c.label, name, c.refusal(name)))
                continue
            if not policy_applies(name, c):
                skipped.append(ServingSkip(c.label, name, f"{spec.title} needs a confidence head; {c.kind} has none"))
                continue
            try:
                plan[(c.label, name)], _ = settings.decode.replace(verify=name).build_verify(drafter_dir=c.path,
                                                                                             warn=warn)
            except PdraftError as e:
                skipped.append(ServingSkip(c.label, name, str(e).splitlines()[0]))
    return plan, skipped


def run_serving(target_model, contenders: Sequence[Contender], domains: Sequence[Domain], settings: BenchSettings,
                serving: ServingSettings, *, eos_token_ids: Sequence[int] = (), stream=None,
                warn: Callable[[str], None] = lambda _: None,
                progress: Callable[[str], None] | None = None) -> ServingResult:
    prompts = pooled_prompts(domains)
    if not prompts:
        raise PdraftError("no prompt to benchmark")
    serving = replace(serving, concurrency=clamp_levels(serving.concurrency, len(prompts), warn))
    plan, skipped = policy_plan(contenders, settings, serving.policies, warn=warn)
    gamma = max((g for c in contenders for g in drafted_gammas(c, settings.gammas)), default=0)
    check_bench_batches(target_model, serving.concurrency, prompts, settings, gamma)  # every level, before the first
    plain = [target_contender(target_model)]
    plain += [generate_contender(target_model, GENERATE_LABEL, settings.generate_threads)] \
        if settings.generate_baseline else []
    runs: list[ServingRun] = []
    auditor = GreedyAuditor(target_model)  # its float64 copy of the target is made only if greedy outputs differ
    try:
        ready, refused = prepare_all(contenders, settings.gammas, progress)
        skipped += [ServingSkip(c.label, "every policy", why) for c, why in refused]
        for temperature in serving.temperatures:
            runs += _serving_temperature(target_model, temperature, plain, ready, plan, prompts, settings, serving,
                                         eos_token_ids, stream, progress, auditor)
    finally:
        for c in contenders:
            c.close()
    largest = len(requests_for(prompts, max(serving.concurrency)))
    return ServingResult(settings, serving, list(domains), list(contenders), runs, skipped,
                         request_seeds(settings.decode.seed, 0, largest))


def _serving_temperature(target_model, temperature, plain, contenders, plan, prompts, settings, serving,
                         eos_token_ids, stream, progress, auditor: GreedyAuditor) -> list[ServingRun]:
    """Every run of one temperature: each level, the baselines then every (contender, gamma, policy)."""
    runs: list[ServingRun] = []
    base = settings.decode.sampling
    sampling = SamplingParams(temperature=temperature, top_k=base.top_k, top_p=base.top_p)
    decode = settings.decode.replace(sampling=sampling)
    for level in serving.concurrency:
        requests = requests_for(prompts, level)
        jobs = [(c, 0, FULL, None) for c in plain + [c for c in contenders if c.baseline]]
        jobs += [(c, g, name, plan[(c.label, name)]) for c in contenders if not c.baseline
                 for g in drafted_gammas(c, settings.gammas) for name in serving.policies
                 if (c.label, name) in plan]
        timed: list[list[ServingRun]] = [[] for _ in jobs]
        for repeat in range(settings.repeats):  # round the level's runs, so a stretch of load hits them alike
            for job, done in zip(jobs, timed):
                done.append(_run_job(job, requests, decode, level, settings, eos_token_ids, stream, progress,
                                     repeat))
        here = [_median(done) for done in timed]
        for group in compare_runs(here).values():
            _compare(group, greedy=temperature == 0)
            reference = next((r for r in group if r.gamma == 0), None)
            for r in group if temperature == 0 else ():
                if r.same_as_target is False:  # rounding or a loss: pdraft.decode.greedy_audit
                    r.divergences = auditor.audit(requests, r.outputs, reference.outputs)
        runs.extend(here)
    return runs


def _run_job(job, requests, decode, level, settings, eos_token_ids, stream, progress, repeat: int) -> ServingRun:
    """One timed run of one (contender, gamma, policy) at one level and temperature."""
    contender, gamma, name, verify = job
    if progress:
        progress(f"T={decode.sampling.temperature:g} C={level}: {contender.label}"
                 + (f", gamma {gamma}, {name}" if gamma else "") + f" ({len(requests)} requests)"
                 + (f" (repeat {repeat + 1}/{settings.repeats})" if settings.repeats > 1 else ""))
    if stream is not None:
        stream.begin_run(drafter=contender.label, gamma=gamma, domain="serving", repeat=repeat, kind=contender.kind,
                         verify=name)
    work = Workload(requests, decode, gamma, verify or decode.verify_config(), concurrency=level,
                    eos_token_ids=eos_token_ids, pad_token_id=settings.pad_token_id)
    d = contender.run(work, stream)
    return ServingRun(contender.label, contender.kind, gamma, name, level, decode.sampling.temperature,
                      len(requests), d.summary, d.records, d.backend, d.compile_s, d.refills, outputs=d.outputs,
                      engine=contender.engine, engine_info=d.engine_info, prefills_timed=d.prefills_timed)


def _median(repeats: list[ServingRun]) -> ServingRun:
    """The repeat with the (lower) median TPOT, kept whole (its rounds are its figures), as the gamma sweep
    keeps; the other repeats' TPOTs and compile time are recorded on it."""
    tpots = [r.summary.tpot_s for r in repeats]
    kept = repeats[median_repeat(tpots)]
    kept.tpot_repeats_s = tpots
    kept.compile_s = sum(r.compile_s for r in repeats)
    return kept


def _compare(runs: list[ServingRun], *, greedy: bool) -> None:
    """Speedup and throughput gain of every run of one (level, temperature) and engine against the faster
    baseline; greedy outputs against the first baseline's (pdraft's target alone; an engine without speculation)."""
    fastest = fastest_baseline(runs)
    if fastest is None:
        return
    target = next((r for r in runs if r.gamma == 0), None)
    for r in runs:
        r.baseline = fastest.drafter
        r.speedup = speedup(fastest.summary, r.summary)
        if r.summary.tokens_per_s and fastest.summary.tokens_per_s:
            r.throughput_gain = r.summary.tokens_per_s / fastest.summary.tokens_per_s
        if greedy and target is not None and r is not target:
            r.same_as_target = r.outputs == target.outputs


def sla_picks(runs: Sequence[dict], floor: float | None) -> list[dict]:
    """Per (contender, temperature): the run with the highest total tokens/s whose per-user tokens/s >= floor."""
    if floor is None:
        return []
    groups: dict[tuple[str, float], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["drafter"], r["temperature"]), []).append(r)
    out = []
    for (drafter, temperature), rows in groups.items():
        ok = [r for r in rows if (r["summary"]["per_user_tokens_per_s"] or 0.0) >= floor
              and r["summary"]["tokens_per_s"] is not None]
        best = max(ok, key=lambda r: r["summary"]["tokens_per_s"], default=None)
        out.append({"drafter": drafter, "temperature": temperature, "sla_tps": floor,
                    "pick": None if best is None else {
                        "gamma": best["gamma"], "verify": best["verify"], "concurrency": best["concurrency"],
                        "total_tokens_per_s": best["summary"]["tokens_per_s"],
                        "per_user_tokens_per_s": best["summary"]["per_user_tokens_per_s"]}})
    return out
