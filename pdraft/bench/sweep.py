"""The bench sweep behind `pdraft bench --gamma 10..20`: for every prompt set (domain), decode its prompts with the
target alone, with transformers' own `generate()` (pdraft.bench.hf_generate: the loop users already run, a
second target-alone baseline) and then with every contender (each drafter given, plus the n-gram prompt-lookup
baseline; with `--engine`, a serving engine's runs of the same) at every gamma it can draft (gammas beyond a
drafter's block size are skipped for that drafter and reported as "beyond block size"; a drafter that can draft
none of the sweep is an error), each through its own `run` (pdraft.bench.contenders: the sweep never asks what
a contender is), and keep each run's per-round counts. Every figure comes from pdraft.metrics over those
counts; speedup is metrics.speedup against the FASTER of the baseline runs (gamma 0) of the same domain and
the same engine in the same sweep (each run names it in `baseline`), so no speedup is measured against a slow
loop, and an engine's speculation counts against that engine without it. Each run also records the backend it ran on (pdraft.decode.backend) and the
seconds spent compiling, which are kept out of its timings (compiled code serves every later request of the
process). With `repeats` > 1 each run is timed that many times, the repeats going round the domain's runs in
turn, and the repeat with the median TPOT is kept whole (its rounds and its summary), so the reported figures
can always be recomputed from the reported rounds. Acceptance does not vary between repeats: the seed fixes
every random draw.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pdraft.bench.contenders import (TARGET_LABEL, Contender, Decoded, GenerateContender, LoopContender, Workload,
                                     count_reasons)
from pdraft.metrics import RoundRecord, Summary, speedup, speedup_range
from pdraft.policies import FULL, policy_spec
from pdraft.policies.base import VerifyConfig
from pdraft.decode.greedy_audit import Divergence, GreedyAuditor
from pdraft.decode.settings import DecodeSettings, check_gamma
from pdraft.models.api import SamplingParams
from pdraft.models.family import MAX_GAMMA
from pdraft.errors import PdraftError

NGRAM_LABEL = "n-gram (prompt lookup)"


def parse_gammas(text: str) -> list[int]:
    """'10..20' (inclusive range), '4,8,16' (list) or '8' (one value) -> sorted distinct gammas in 1..MAX_GAMMA.
    A range's ends are checked before it is expanded, so '1..999999999999' is refused at once."""
    spec = str(text).strip()
    shown = spec if len(spec) <= 40 else spec[:37] + "..."  # a 5000-digit value stays one readable line
    try:
        if ".." in spec:
            lo_text, hi_text = spec.split("..", 1)
            lo, hi = int(lo_text), int(hi_text)
            if lo > hi:
                raise PdraftError(f"gamma range {shown!r} runs backwards", hint=f"write {hi}..{lo}")
            check_gamma(lo)
            check_gamma(hi)
            values = list(range(lo, hi + 1))
        else:
            values = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise PdraftError(f"cannot read gamma {shown!r}: use a range like 10..20, a list like 4,8,16 or one value") \
            from None
    if not values:
        raise PdraftError(f"gamma {shown!r} names no value")
    for g in values:
        check_gamma(g)
    return sorted(set(values))


@dataclass
class Domain:
    name: str  # short label: "code", "humaneval", a datasets id
    source: str  # as given: builtin:code, a file path, a datasets id
    prompts: list[list[int]]  # token ids, through the chat template
    texts: list[str]
    skipped_lines: list[int] = field(default_factory=list)


@dataclass
class BenchSettings:
    gammas: list[int]
    # Every decode of the sweep: sampling, token budget, seed (prompt i of a set samples from a stream seeded
    # from (seed, i), whatever the batch size), batch size, verifier. Its gamma is unused: the sweep sets it.
    decode: DecodeSettings = field(default_factory=DecodeSettings)
    num_prompts: int = 16
    repeats: int = 1
    verify: VerifyConfig | None = None  # for drafters the policy applies to and no policy of their own
    generate_baseline: bool = True  # also time transformers' generate() as a target-alone baseline
    generate_threads: int | str | None = None  # runtime.threads: "auto" times generate()'s own threads
    pad_token_id: int = 0  # left padding of generate()'s batches
    # The sweep at each temperature in turn, side by side in one report (None: decode.sampling's alone); the
    # first is the primary one (the plots, the draft-cost fit). top_k / top_p are decode.sampling's at each.
    temperatures: list[float] | None = None
    sampled_gammas: list[int] | None = None  # the gammas at temperatures above 0 (None: gammas): a cheaper T=1
    sampled_num_prompts: int | None = None  # prompts per domain at temperatures above 0 (None: num_prompts)

    def temperature_list(self) -> list[float]:
        return list(self.temperatures) if self.temperatures else [float(self.decode.sampling.temperature)]

    def at(self, temperature: float) -> BenchSettings:
        """This sweep at one temperature: its sampling and, above 0, the sampled gammas."""
        base = self.decode.sampling
        sampling = SamplingParams(temperature=temperature, top_k=base.top_k, top_p=base.top_p)
        sampled = temperature > 0
        gammas = self.sampled_gammas if sampled and self.sampled_gammas else self.gammas
        n = min(self.num_prompts, self.sampled_num_prompts or self.num_prompts) if sampled else self.num_prompts
        return replace(self, gammas=list(gammas), decode=self.decode.replace(sampling=sampling),
                       temperatures=[temperature], num_prompts=n)

    def verify_for(self, contender: Contender) -> VerifyConfig:
        """A contender the sweep's verification policy applies to (every drafter, or only those with a confidence
        head when the policy reads one: its registry entry says) verifies by its own policy (its files) or this
        sweep's; the others verify the full block, with the sweep's verifier."""
        chosen = contender.verify or self.verify
        mode = chosen.mode if chosen is not None else self.decode.verify
        if not policy_applies(mode, contender) or contender.refusal(mode):  # before building it: the target alone has no cost table to read
            return self.decode.replace(verify=FULL).verify_config()
        return chosen or self.decode.verify_config()


def policy_applies(mode: str, contender: Contender) -> bool:
    """Whether verification policy `mode` can run with `contender` (a baseline drafts nothing)."""
    return not contender.baseline and (contender.has_confidence or not policy_spec(mode).needs_confidence)


@dataclass
class RunResult:
    domain: str
    drafter: str
    kind: str
    gamma: int  # 0 for a baseline (drafts nothing)
    summary: Summary
    records: list[RoundRecord]  # the kept (median-TPOT) repeat, rounds and requests numbered across batches
    tpot_repeats_s: list[float | None]
    kept_repeat: int
    verify: str = FULL
    speedup: float | None = None
    speedup_range: tuple[float, float] | None = None  # over the repeats, each against its baseline's same repeat
    finish_reasons: dict[str, int] = field(default_factory=dict)
    baseline: str | None = None  # the target-alone run the speedup is measured against (the faster one)
    backend: str = ""  # reference eager / static eager / static compiled (pdraft.decode.backend); "" = generate()
    compile_s: float = 0.0  # compilation during this run, kept out of its timings
    outputs: list[list[int]] | None = field(default=None, repr=False)  # the kept repeat's outputs
    same_as_target: bool | None = None  # greedy: its outputs equal the first baseline's (pdraft's target alone)
    divergences: list[Divergence] | None = None  # greedy, where they differ: each request's first differing token,
    # re-scored against the float64 target (pdraft.decode.greedy_audit: a near-tie of the run's dtype, or a loss)
    engine: str = ""  # "" = this process; else the serving engine (its speedups count against its own baseline)
    engine_info: dict | None = None  # the engine's name, version and speculative config
    temperature: float = 0.0  # the sampling temperature this run decoded at
    dtype: str = ""  # "" = the run's dtype; else its own copy of the target's (float32_target_contender)


@dataclass
class BenchResult:
    settings: BenchSettings
    domains: list[Domain]
    contenders: list[Contender]
    runs: list[RunResult]
    refused: list[str] = field(default_factory=list)  # one line per contender that could not run at all


# ---------------------------------------------------------------------------------------- contenders


def target_contender(target_model=None) -> LoopContender:
    return LoopContender(TARGET_LABEL, "target", lambda prompts: None, target_model=target_model)


def float32_target_contender(float32_model) -> LoopContender:
    """pdraft's target alone on the target loaded again in float32 (bench.float32_baseline): a speedup reference
    for a CPU run in a reduced dtype, where a one-row float32 product can be the faster one (generate() on the same
    copy is the other: generate_contender(dtype="float32")). Its greedy outputs are not compared with the run's
    (another dtype rounds otherwise)."""
    return LoopContender(f"{TARGET_LABEL} (float32)", "target", lambda prompts: None, target_model=float32_model,
                         dtype="float32")


def float32_baseline_refusal(target_model) -> str | None:
    """Why a float32 copy of the target is not timed beside the run (one line), or None where it is: only for a
    CPU target in a reduced dtype whose copy fits in half the memory free now, in one process."""
    import os

    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "a sharded target (one copy per process is not what it would time)"
    param = next(target_model.parameters())
    if param.device.type != "cpu" or param.dtype == torch.float32:
        return "the target runs in float32 or not on a CPU"
    need = sum(p.numel() for p in target_model.parameters()) * 4
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        free = None
    if free is not None and need > free // 2:
        return (f"bench.float32_baseline: a float32 copy of the target needs {need / 2**30:.1f} GiB, more than half "
                f"the {free / 2**30:.1f} GiB free: left out, so speedups count against the {str(param.dtype)[6:]} "
                f"target alone only")
    return None


def generate_contender(target_model=None, label: str | None = None, threads: int | str | None = None,
                       dtype: str = "") -> GenerateContender:
    from pdraft.bench.hf_generate import GENERATE_LABEL

    label = label or (f"{GENERATE_LABEL} ({dtype})" if dtype else GENERATE_LABEL)
    return GenerateContender(label, target_model=target_model, threads=threads, dtype=dtype)


def ngram_contender(target_model) -> LoopContender:
    from pdraft.decode.ngram import NgramDrafter

    return LoopContender(NGRAM_LABEL, "ngram", lambda prompts: NgramDrafter(target_model.config, prompts),
                         max_gamma=MAX_GAMMA, target_model=target_model)


def drafter_contender(path: str | Path, target_model) -> Contender:
    """A drafter checkpoint folder, loaded once and attached to the target; labelled by folder name and kind."""
    from pdraft.decode.inputs import load_attached_drafter

    path = Path(path)
    if not path.exists():
        raise PdraftError(f"drafter {str(path)!r} not found", hint="give a drafter checkpoint folder")
    drafter = load_attached_drafter(path, target_model)
    kind = str(getattr(drafter.config, "kind", "drafter"))
    return LoopContender(f"{drafter_name(path)} ({kind})", kind, lambda prompts: drafter, drafter.max_gamma(),
                         str(path), bool(getattr(drafter.config, "has_confidence", False)),
                         target_model=target_model, drafter=drafter)


def drafter_name(path: str | Path) -> str:
    """The folder name, with its parent when the name is a training run's generic checkpoint name
    (runs/code/dspark/final -> dspark/final), so two runs' checkpoints stay apart in one table."""
    path = Path(path).resolve()
    generic = path.name in ("final", "latest", "best") or re.fullmatch(r"(step|checkpoint)[-_]?\d+", path.name)
    return f"{path.parent.name}/{path.name}" if generic and path.parent.name else path.name


def drafted_gammas(contender: Contender, gammas: Sequence[int]) -> list[int]:
    """The gammas of the sweep this contender can draft (all of them for a baseline)."""
    return [g for g in gammas if contender.max_gamma is None or g <= contender.max_gamma]


def skipped_gammas(contender: Contender, gammas: Sequence[int]) -> list[int]:
    """The gammas of the sweep beyond this contender's block size: reported as such, never decoded."""
    return [g for g in gammas if contender.max_gamma is not None and g > contender.max_gamma]


def check_gammas(contenders: Sequence[Contender], gammas: Sequence[int]) -> None:
    """A drafter that can draft only part of the sweep runs that part (the rest is reported as beyond its block
    size); one that can draft none of it is an error, as are two contenders with one label."""
    for c in contenders:
        if not drafted_gammas(c, gammas):
            raise PdraftError(f"gamma {min(gammas)} is beyond what drafter {c.label} can draft "
                              f"(at most {c.max_gamma} tokens)",
                              hint=f"sweep gammas up to {c.max_gamma}, or drop this drafter")
    labels = [c.label for c in contenders]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise PdraftError(f"two drafters share the label {dupes[0]!r} (folder name and kind)",
                          hint="give the checkpoints distinct folder names")


# ------------------------------------------------------------------------------------------- domains


def domain_name(source: str) -> str:
    from pdraft.data.prompts import ROW_RANGE

    rows = ROW_RANGE.match(source)  # a file's row range
    if rows and not Path(source).exists():
        return f"{domain_name(rows['path'])}[{rows['start']}:{rows['stop']}]"
    if source.startswith("builtin:"):
        return source[len("builtin:"):]
    if re.search(r"\.(jsonl|json|parquet)$", source, re.IGNORECASE) or Path(source).exists():
        return Path(source).stem
    return source


def load_domains(sources: Sequence[str], tokenizer, *, num_prompts: int, chat_template: bool = True,
                 enable_thinking: bool = False, skip_malformed: bool = False,
                 split: str = "train", context: int | None = None) -> list[Domain]:
    """Read every prompt set (pdraft.data.prompts.load_prompts) and encode its first turns as decode does."""
    from pdraft.data.prompts import load_prompts
    from pdraft.decode.inputs import encode

    if not sources:
        raise PdraftError("no prompt set to benchmark", hint="give --prompt-set or set bench.prompt_sets")
    domains: list[Domain] = []
    names: set[str] = set()
    for source in sources:
        prompts = load_prompts(source, split=split, max_samples=num_prompts,
                               on_error="skip" if skip_malformed else "stop")
        texts = [c.prompt for c in prompts]
        name = domain_name(source)
        if name in names:
            name = f"{name}#{len(domains)}"
        names.add(name)
        ids = encode(tokenizer, texts, raw=not chat_template, enable_thinking=enable_thinking, context=context)
        domains.append(Domain(name, source, ids, texts, list(prompts.skipped)))
    return domains


# -------------------------------------------------------------------------------------------- sweep


def median_repeat(tpots: Sequence[float | None]) -> int:
    """The index of the repeat whose TPOT is the (lower) median, repeats without one sorting last: the repeat a
    run keeps whole, so that its summary matches its rounds (the gamma sweep's and the serving sweep's rule)."""
    order = sorted(range(len(tpots)), key=lambda i: (tpots[i] is None, tpots[i] or 0.0))
    return order[(len(order) - 1) // 2]


def fastest_baseline(runs: Sequence) -> object | None:
    """Of the baseline runs among `runs` (gamma 0: they drafted nothing) that have a TPOT, the fastest: what every
    speedup of the same domain (or concurrency level) and engine counts against. None when none was timed."""
    timed = [r for r in runs if r.gamma == 0 and r.summary.tpot_s]
    return min(timed, key=lambda r: r.summary.tpot_s) if timed else None


def compare_runs(runs: Sequence) -> dict[str, list]:
    """`runs` of one domain (or level), grouped by the engine that ran them: speedups count within a group."""
    groups: dict[str, list] = {}
    for run in runs:
        groups.setdefault(run.engine, []).append(run)
    return groups


def run_bench(target_model, contenders: Sequence[Contender], domains: Sequence[Domain], settings: BenchSettings,
              *, eos_token_ids: Sequence[int] = (), stream=None,
              progress: Callable[[str], None] | None = None) -> BenchResult:
    """Decode every domain with the target alone and with generate() first (the speedup references), then
    every contender at every gamma it can draft (gammas beyond a drafter's block size are left out here and
    reported by pdraft.bench.report as such); the whole sweep once per temperature (settings.temperatures), each
    with its own target-alone references, so a T=1 speedup counts against sampling with the target alone. With
    repeats > 1 the repeats go round the whole domain (repeat 1 of every run, then repeat 2, ...), so that a
    stretch of load on a shared machine falls on every run's repeats alike instead of on one run. `stream` (a
    pdraft.bench.stream.MetricsStream) receives every round as it happens."""
    temperatures = settings.temperature_list()
    for t in temperatures:
        check_gammas(contenders, settings.at(t).gammas)
    if settings.repeats < 1 or settings.num_prompts < 1:
        raise PdraftError("repeats and number of prompts must both be >= 1")
    _plan_batches(target_model, contenders, domains, settings, temperatures)
    runs: list[RunResult] = []
    auditor = GreedyAuditor(target_model)  # its float64 copy of the target is made only if greedy outputs differ
    try:  # a serving engine starts once for the whole sweep and stops at its end, whatever happens
        ready, refused = prepare_all(contenders, sorted({g for t in temperatures for g in settings.at(t).gammas}),
                                     progress)
        for t in temperatures:
            say = progress if progress is None or len(temperatures) == 1 else (lambda m, t=t: progress(f"T={t:g} {m}"))
            for run in _sweep(target_model, ready, domains, settings.at(t), eos_token_ids, stream, say, auditor):
                run.temperature = t
                runs.append(run)
    finally:
        for c in contenders:
            c.close()
    return BenchResult(settings, list(domains), list(contenders), runs, [why for _, why in refused])


def _plan_batches(target_model, contenders, domains, settings: BenchSettings, temperatures) -> None:
    """The gamma sweep's static batches planned like the serving sweep's levels (pdraft.bench.memory_plan):
    min(batch size, prompts per set) rows at the sweep's largest gamma, refused in one line before anything runs."""
    from pdraft.bench.memory_plan import check_bench_batches

    prompts = [p for d in domains for p in d.prompts[: settings.num_prompts]]
    if not prompts:
        return
    rows = min(settings.decode.batch_size, max(len(d.prompts[: settings.num_prompts]) for d in domains))
    gamma = max((g for t in temperatures for c in contenders for g in drafted_gammas(c, settings.at(t).gammas)),
                default=0)
    check_bench_batches(target_model, [rows], prompts, settings, gamma, name="bench.batch_size")


def _sweep(target_model, contenders, domains, settings: BenchSettings, eos_token_ids, stream, progress,
           auditor: GreedyAuditor) -> list[RunResult]:
    """run_bench at the one temperature of `settings`, on the first settings.num_prompts prompts of each domain."""
    plain = [target_contender(target_model)]
    plain += [generate_contender(target_model, threads=settings.generate_threads)] if settings.generate_baseline else []
    runs: list[RunResult] = []
    for domain in domains:
        n = settings.num_prompts
        domain = replace(domain, prompts=domain.prompts[:n], texts=domain.texts[:n])
        runs.extend(_bench_domain(domain, plain + list(contenders), settings, eos_token_ids, stream, progress,
                                  auditor))
    return runs


def prepare_all(contenders: Sequence[Contender], gammas: Sequence[int],
                progress: Callable[[str], None] | None = None) -> tuple[list[Contender], list[tuple]]:
    """Every contender made ready for the gammas it drafts of the sweep (a serving engine starts here, before
    anything is timed): (the ready ones, (contender, one line) for each that cannot run at all)."""
    ready, refused = [], []
    for c in contenders:
        if progress and c.engine:
            progress(f"starting {c.engine} for {c.label}")
        why = c.prepare(drafted_gammas(c, gammas))
        if why:
            refused.append((c, why))
            if progress:
                progress(why)
        else:
            ready.append(c)
    return ready, refused


def _bench_domain(domain: Domain, contenders: Sequence[Contender], settings: BenchSettings, eos_token_ids, stream,
                  progress, auditor: GreedyAuditor | None = None) -> list[RunResult]:
    """Every contender at every gamma it drafts over one domain, repeats round the domain's runs; speedups within
    each engine's runs. Greedy: every run's outputs against the first baseline's (pdraft's target alone), each
    difference audited (rounding or loss) where an auditor is given."""
    plan = [(c, g) for c in contenders for g in ([0] if c.baseline else drafted_gammas(c, settings.gammas))]
    repeats: list[list[Decoded]] = [[] for _ in plan]
    for repeat in range(settings.repeats):
        for (contender, gamma), done in zip(plan, repeats):
            if progress:
                progress(f"{domain.name}: {contender.label}" + (f", gamma {gamma}" if gamma else "")
                         + (f" (repeat {repeat + 1}/{settings.repeats})" if settings.repeats > 1 else ""))
            done.append(_decode_once(contender, domain, gamma, settings, eos_token_ids, stream, repeat))
    here = [_kept(domain, contender, gamma, settings.verify_for(contender).mode, done)
            for (contender, gamma), done in zip(plan, repeats)]
    for group in compare_runs(here).values():
        baselines = [r for r in group if r.gamma == 0]
        greedy = float(settings.decode.sampling.temperature) == 0  # lossless means the same tokens
        for run in group if baselines else ():
            if run is baselines[0] or not greedy or run.dtype:  # another dtype's copy rounds otherwise
                continue
            run.same_as_target = run.outputs == baselines[0].outputs
            if greedy and not run.same_as_target and auditor is not None:
                run.divergences = auditor.audit(domain.prompts, run.outputs, baselines[0].outputs)
        fastest = fastest_baseline(group) or (baselines[0] if baselines else None)
        for run in group if fastest is not None else ():
            run.speedup = speedup(fastest.summary, run.summary)
            run.speedup_range = speedup_range(fastest.tpot_repeats_s, run.tpot_repeats_s)
            run.baseline = fastest.drafter
    return here


def _decode_once(contender: Contender, domain: Domain, gamma: int, settings: BenchSettings, eos_token_ids,
                 stream, repeat: int) -> Decoded:
    """One timed repeat of one run."""
    verify = settings.verify_for(contender)
    if stream is not None:
        stream.begin_run(drafter=contender.label, gamma=gamma, domain=domain.name, repeat=repeat,
                         kind=contender.kind, verify=verify.mode)
    work = Workload([list(p) for p in domain.prompts], settings.decode, gamma, verify,
                    eos_token_ids=eos_token_ids, pad_token_id=settings.pad_token_id)
    return contender.run(work, stream)


def _kept(domain: Domain, contender: Contender, gamma: int, verify: str, repeats: list[Decoded]) -> RunResult:
    """The run of `repeats`: the repeat whose TPOT is the (lower) median is kept whole, so its summary matches
    its rounds."""
    tpots = [r.summary.tpot_s for r in repeats]
    kept = median_repeat(tpots)
    d = repeats[kept]
    return RunResult(domain.name, contender.label, contender.kind, gamma, d.summary, d.records, tpots, kept,
                     verify, finish_reasons=count_reasons(d.finish_reasons), backend=d.backend,
                     compile_s=sum(r.compile_s for r in repeats), outputs=d.outputs, engine=contender.engine,
                     engine_info=d.engine_info, dtype=getattr(contender, "dtype", ""))
