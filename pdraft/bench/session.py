"""`bench_recipe(...)`: a whole bench run driven by a resolved recipe, as one library call that `pdraft
bench` and the quickstart lifecycle share: load the target, build the contenders (each drafter with its own
calibration and cost table when it has a confidence head, the n-gram baseline, the target alone and
transformers' generate()), decode the
prompt sets over the gamma sweep (at each of bench.temperatures, side by side), and write bench.json, the plots and the resolved recipe. With
`bench.concurrency` set it runs the serving sweep instead (pdraft.bench.serving: concurrency levels x
temperatures x policies, the SLA picks, the Pareto plot)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdraft.errors import PdraftError
from pdraft.io_plan import Input, Output, check_io, input_if_local

REPORT_FILES = ("bench.json", "tau_speedup.png", "conditional_acceptance.png", "token_acceptance.png",
                "pareto.png", "recipe.resolved.yaml")


def report_folder(r, out_dir: str | Path | None = None) -> Path:
    b = r.bench
    return Path(out_dir) if out_dir else (Path(b.output_dir) if b.output_dir else Path(r.output_dir) / "bench")


def check_bench_io(r, drafters, out_dir=None, metrics=None, prompt_sets=None) -> None:
    """Refuse, before anything is loaded, a report folder or metrics stream over what bench reads (each
    drafter folder whole, the prompt sets, the recipe, a local target), a report folder holding another
    artifact, or a name bench writes that is a link (pdraft.io_plan)."""
    folder = report_folder(r, out_dir)
    inputs = [Input("drafter", Path(d)) for d in drafters] + input_if_local("the recipe", r.source)
    inputs += input_if_local("target.id", r.target.id)
    for source in prompt_sets or r.bench.prompt_sets:
        inputs += input_if_local("the prompt set", source)
    outputs = [Output("--out", folder, "folder", artifact="bench report", whole=False)]
    outputs += [Output(f"its {name}", folder / name) for name in REPORT_FILES]
    if metrics:
        outputs.append(Output("--metrics", Path(metrics), "append"))
    check_io("bench", inputs, outputs)


# The bench keys only the serving sweep reads (it runs with bench.concurrency).
SERVING_ONLY = ("policies", "sla_tps")


def serving_settings(r):
    """The serving sweep's settings (pdraft.bench.serving.ServingSettings) when `bench.concurrency` is set, else
    None; temperatures, policies and an SLA without it are refused in one line (only that sweep runs them)."""
    from pdraft.bench.serving import ServingSettings, parse_policies

    b = r.bench
    if not b.concurrency:
        extra = [f"bench.{name}" for name in SERVING_ONLY if getattr(b, name)]
        if extra:
            raise PdraftError(f"{', '.join(extra)} belong to the serving sweep, which runs only with concurrency "
                              "levels", hint="give --concurrency 1,4,16 (or bench.concurrency)")
        return None
    policies = parse_policies(b.policies or [r.decode.verify])
    return ServingSettings(sorted(set(b.concurrency)), list(dict.fromkeys(b.temperatures or [b.temperature])),
                           policies, b.sla_tps)


def with_trees(contenders: list, tree: tuple[int, int], warn) -> list:
    """Each parallel drafter followed by its tree twin (LoopContender.as_tree); a chain drafter (EAGLE-3) keeps
    its chain alone, with a warning. `tree` is checked already (DecodeSettings: its shape, a policy that
    verifies every node)."""
    from pdraft.models.families import FAMILIES

    nodes, width = tree
    out = []
    for c in contenders:
        out.append(c)
        if c.baseline:
            continue
        if c.engine:
            warn(f"{c.label}: no tree ({c.engine} runs chains in this bench)")
            continue
        if FAMILIES.get(c.kind).drafting != "parallel":
            warn(f"{c.label}: no tree (a {FAMILIES.get(c.kind).title} drafter drafts a chain)")
            continue
        out.append(c.as_tree(nodes, width))
    return out


@dataclass
class BenchOutput:
    report: dict
    folder: Path
    report_path: Path
    plots: list[Path]


def bench_recipe(r, drafters: list[str | Path], *, target=None, out_dir: str | Path | None = None,
                 metrics: str | Path | None = None, ngram: bool = True, prompt_sets: list[str] | None = None,
                 warn: Callable[[str], None] = lambda _: None, log: Callable[[str], None] = lambda _: None,
                 write: bool = True, tree: tuple[int, int] | None = None,
                 engine: Callable | None = None) -> BenchOutput:
    """Bench `drafters` under recipe `r` (its `bench`, `decode` and `runtime` sections). `target` is an
    already loaded pdraft Target to reuse; None loads the recipe's. `write=False` (the other processes of a
    sharded target, which bench along in lockstep) writes no file. `tree` = (nodes, width), the `--tree` flag,
    else the recipe's `decode.tree`: every parallel drafter also runs verifying trees (pdraft.decode.tree_round),
    in the row beside its chain. `engine`: the
    contender factory of `bench.engine` (pdraft.serving.engine_factory), handed in by the caller (the serving
    package sits above this one). Its phases: every check before anything loads, the target and the
    contenders (`_contenders`), the threads and the sweep, the report (`_report`)."""
    from pdraft.bench.serving import run_serving
    from pdraft.bench.sweep import BenchSettings, load_domains, parse_gammas, run_bench
    from pdraft.bench.stream import MetricsStream
    from pdraft.data.templates import eos_ids
    from pdraft.decode.backend import check_decodable, cpu_runtime
    from pdraft.decode.settings import DecodeSettings
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import load_target

    check_bench_io(r, drafters, out_dir, metrics, prompt_sets)
    b = r.bench
    if b.engine and engine is None:
        raise PdraftError(f"bench.engine {b.engine} needs the engine's contenders", hint="run it with pdraft bench")
    serving = serving_settings(r)  # checked before anything is loaded
    # The tree too: --tree, else decode.tree, runs beside each drafter's chain; the sweep's settings are the chain's.
    decode = DecodeSettings.from_recipe(r, "bench", tree=tree)
    if decode.tree is not None and serving is not None:
        raise PdraftError("a tree (--tree, decode.tree) runs in the gamma sweep; the serving sweep (--concurrency) "
                          "does not take it yet", hint="drop --concurrency (and give --batch-size for requests "
                          "decoded together), or bench chains with --set decode.tree=null")
    gammas = parse_gammas(b.gamma)
    sampled_gammas = parse_gammas(b.sampled_gamma) if b.sampled_gamma is not None else None
    if target is not None:
        check_decodable(target.config, r.target.id)
    loaded = target or load_target(r.target, make_runtime(r.runtime), check_config=check_decodable)
    eos = eos_ids(loaded.model, loaded.tokenizer)
    pad = getattr(loaded.tokenizer, "pad_token_id", None)
    settings = BenchSettings(gammas=gammas, decode=decode.replace(tree=None),
                             num_prompts=b.num_prompts, repeats=b.repeats, generate_baseline=b.generate_baseline,
                             generate_threads=r.runtime.threads,
                             pad_token_id=pad if pad is not None else (min(eos) if eos else 0),
                             temperatures=list(dict.fromkeys(b.temperatures)) or None, sampled_gammas=sampled_gammas,
                             sampled_num_prompts=b.sampled_num_prompts)
    contenders, refused = _contenders(r, loaded, drafters, settings, decode.tree, serving, ngram=ngram,
                                      engine=engine, warn=warn)
    domains = load_domains(prompt_sets or b.prompt_sets, loaded.tokenizer, num_prompts=settings.num_prompts,
                           chat_template=r.decode.chat_template, enable_thinking=r.decode.enable_thinking,
                           skip_malformed=b.skip_malformed, context=loaded.max_context)
    for d in domains:
        if d.skipped_lines:
            warn(f"{d.source}: skipped {len(d.skipped_lines)} malformed line(s): "
                 f"{', '.join(map(str, d.skipped_lines[:20]))}")
    # the drafters' product plans are re-timed at the chosen threads too (issue 59: they were timed at load)
    loaded_drafters = {id(c.drafter): c.drafter for c in contenders if getattr(c, "drafter", None) is not None}
    cpu = cpu_runtime(loaded.model, loaded.layer_ids, settings.decode, r.runtime.threads, max(gammas) + 1,
                      drafters=list(loaded_drafters.values()))
    stream = MetricsStream(metrics) if metrics and write else None
    try:
        if serving is None:
            result = run_bench(loaded.model, contenders, domains, settings, eos_token_ids=eos, stream=stream,
                               progress=log)
        else:
            result = run_serving(loaded.model, contenders, domains, settings, serving, eos_token_ids=eos,
                                 stream=stream, warn=warn, progress=log)
    finally:
        if stream is not None:
            stream.close()
    return _report(r, result, serving, refused, cpu, out_dir, write)


def _contenders(r, loaded, drafters, settings, tree, serving, *, ngram: bool, engine, warn) -> tuple[list, list]:
    """Every row of the sweep, in the table's order: the float32 baselines first where they apply, each drafter
    (with the files its policy reads) and its tree twin, the n-gram baseline, the engine's rows; and the engine's
    refusals, (label, one line) each. Every gamma of the sweep is checked against them."""
    from pdraft.bench.sweep import (check_gammas, drafter_contender, float32_baseline_refusal, float32_target_contender,
                                    generate_contender, ngram_contender, policy_applies)
    from pdraft.decode.backend import check_decodable
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import load_target

    b = r.bench
    contenders = [drafter_contender(path, loaded.model) for path in drafters]
    for c in contenders:  # each drafter the policy applies to uses the files beside it (calibration, cost table)
        if policy_applies(settings.decode.verify, c):
            c.verify, _ = settings.decode.build_verify(drafter_dir=c.path, warn=warn)
    refused: list[tuple[str, str]] = []
    engine_contenders: list = []
    if b.engine:  # the same drafters in a serving engine, beside pdraft's loop (its factory: pdraft.serving)
        engine_contenders, refused = engine(r, loaded, list(contenders), warn=warn)
        for _, line in refused:
            warn(line)
    if tree is not None:
        contenders = with_trees(contenders, tree, warn)
    if b.ngram_baseline and ngram and serving is None:  # the serving sweep leaves it out (pdraft.bench.serving)
        contenders.append(ngram_contender(loaded.model))
    contenders += engine_contenders
    if b.float32_baseline and serving is None:  # first, so it sits beside the other baselines in the table
        why_not = float32_baseline_refusal(loaded.model)
        if why_not is None:  # loaded again rather than copied: a loaded target holds packed weights of its run
            again = load_target(r.target, make_runtime(r.runtime.model_copy(update={"dtype": "float32"})),
                                check_config=check_decodable)
            contenders.insert(0, float32_target_contender(again.model))
            if b.generate_baseline:  # transformers' generate() on the same copy: its float32 TPOT beside the rest
                contenders.insert(1, generate_contender(again.model, threads=r.runtime.threads, dtype="float32"))
        elif why_not.startswith("bench.float32_baseline"):
            warn(why_not)
    sampled = settings.sampled_gammas
    for g in [settings.gammas] + ([sampled] if sampled and any(t > 0 for t in b.temperatures) else []):
        check_gammas(contenders, g)
    return contenders, refused


def _report(r, result, serving, refused: list[tuple[str, str]], cpu: dict, out_dir, write: bool) -> BenchOutput:
    """bench.json, the plots and the resolved recipe in the report folder (nothing written when `write` is
    False): the engine's refusals first among the refused or skipped, and what ran (`runtime`)."""
    from pdraft.bench.plots import write_pareto, write_plots
    from pdraft.bench.report import build_report, write_report
    from pdraft.bench.serving_report import build_serving_report
    from pdraft.recipe import resolved_dict, save_resolved

    if serving is None:
        result.refused[:0] = [line for _, line in refused]
    else:
        from pdraft.bench.serving import ServingSkip

        result.skipped[:0] = [ServingSkip(label, "every policy", line) for label, line in refused]
    folder = report_folder(r, out_dir)
    if folder.exists() and not folder.is_dir():
        raise PdraftError(f"bench output {folder} is a file, expected a folder")
    build = build_report if serving is None else build_serving_report
    report = build(result, recipe=resolved_dict(r), target=r.target.id)
    report["runtime"] = cpu
    if not write:
        return BenchOutput(report=report, folder=folder, report_path=folder / "bench.json", plots=[])
    path = write_report(report, folder)
    plots = write_plots(report, folder) if serving is None else [p for p in [write_pareto(report, folder)] if p]
    save_resolved(r, folder)
    return BenchOutput(report=report, folder=folder, report_path=path, plots=plots)
