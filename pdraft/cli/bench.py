"""`pdraft bench [RECIPE] --gamma 10..20`: sweep gamma over prompt sets for each drafter given, the n-gram
baseline and the target alone, then print one table per domain, write bench.json (every figure and the
per-round counts behind it), the plots and the resolved recipe, and recommend a gamma. Parses and validates
flags, then calls pdraft.bench.run / report / plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdraft.cli.common import JsonOpt, RecipeArg, SetOpt, err, out, print_json, recipe_from
from pdraft.errors import PdraftError


def _pick(flag, value):
    return value if flag is None else flag


def bench(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    gamma: Annotated[str | None, typer.Option("--gamma", help="Draft lengths: a range 10..20, a list 4,8,16 or one value (default: bench.gamma).")] = None,
    drafter: Annotated[list[Path] | None, typer.Option("--drafter", help="Drafter checkpoint folder (repeatable: DFlash, DSpark, a pulled checkpoint).")] = None,
    prompt_set: Annotated[list[str] | None, typer.Option("--prompt-set", help="builtin:code, builtin:prose, a DeepSpec-layout JSONL file or a datasets id (repeatable; replaces bench.prompt_sets).")] = None,
    target: Annotated[str | None, typer.Option("--target", help="Target model: local folder, Hub id or builtin:NAME (default: the recipe's).")] = None,
    num_prompts: Annotated[int | None, typer.Option("--num-prompts", help="Prompts per set.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option("--max-new-tokens", help="Tokens generated per prompt.")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", help="0 = greedy; > 0 samples (top-k 0 and top-p 1 by default, so it really samples).")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="Top-k when sampling (0 = off; 1 would be greedy).")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help="Nucleus mass when sampling (1 = off).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of every sampling draw (default: decode.seed, else runtime.seed).")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Prompts decoded together.")] = None,
    repeats: Annotated[int | None, typer.Option("--repeats", help="Timed repeats per run; the median-TPOT repeat is reported.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Report folder (default: bench.output_dir, else OUTPUT_DIR/bench).")] = None,
    metrics: Annotated[Path | None, typer.Option("--metrics", help="Append every round to this metrics stream (watch it with pdraft monitor).")] = None,
    skip_malformed: Annotated[bool, typer.Option("--skip-malformed", help="Skip malformed JSONL lines (reported by number) instead of stopping.")] = False,
    no_ngram: Annotated[bool, typer.Option("--no-ngram", help="Leave out the n-gram prompt-lookup baseline.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Benchmark drafters against the target alone and the n-gram baseline over a gamma sweep.

    Example: pdraft bench recipes/quickstart.yaml --gamma 4..16 --drafter runs/quickstart/dflash/final --drafter runs/quickstart/dspark/final
    """
    from pdraft.bench.plots import write_plots
    from pdraft.bench.report import build_report, print_report, write_report
    from pdraft.bench.run import (BenchSettings, check_gammas, drafter_contender, load_domains, ngram_contender,
                                  parse_gammas, run_bench)
    from pdraft.bench.stream import MetricsStream
    from pdraft.decode.policy import build_verify
    from pdraft.decode.prompts import eos_ids
    from pdraft.models.api import SamplingParams
    from pdraft.models.sampling import check_params
    from pdraft.recipe import resolved_dict, save_resolved
    from pdraft.runtime import make_runtime
    from pdraft.target.loader import load_target

    r = recipe_from(recipe, (set_ or []) + ([f"target.id={target}"] if target else []))
    b = r.bench
    gammas = parse_gammas(_pick(gamma, b.gamma))
    sampling = SamplingParams(temperature=_pick(temperature, b.temperature), top_k=_pick(top_k, b.top_k),
                              top_p=_pick(top_p, b.top_p))
    check_params(sampling)
    settings = BenchSettings(
        gammas=gammas, num_prompts=_pick(num_prompts, b.num_prompts),
        max_new_tokens=_pick(max_new_tokens, b.max_new_tokens), sampling=sampling,
        seed=_pick(seed, next(v for v in (b.seed, r.decode.seed, r.runtime.seed) if v is not None)),
        batch_size=_pick(batch_size, b.batch_size), repeats=_pick(repeats, b.repeats),
    )
    for name in ("num_prompts", "max_new_tokens", "batch_size", "repeats"):
        if getattr(settings, name) < 1:
            raise PdraftError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(settings, name)}")

    loaded = load_target(r.target, make_runtime(r.runtime))
    contenders = [drafter_contender(path, loaded.model) for path in drafter or []]
    for c in contenders:  # each drafter with a confidence head uses its own calibration and cost table
        if c.has_confidence:
            c.verify, _ = build_verify(r.decode.verify, threshold=r.decode.threshold, sps_path=r.decode.sps_table,
                                       drafter_dir=c.path, warn=lambda m: err.print(f"[yellow]warning:[/yellow] {m}"))
    if b.ngram_baseline and not no_ngram:
        contenders.append(ngram_contender(loaded.model.config))
    check_gammas(contenders, gammas)
    domains = load_domains(prompt_set or b.prompt_sets, loaded.tokenizer, num_prompts=settings.num_prompts,
                           chat_template=r.decode.chat_template, enable_thinking=r.decode.enable_thinking,
                           skip_malformed=skip_malformed or b.skip_malformed)
    for d in domains:
        if d.skipped_lines:
            err.print(f"[yellow]{d.source}: skipped {len(d.skipped_lines)} malformed line(s): "
                      f"{', '.join(map(str, d.skipped_lines[:20]))}[/]")

    stream = MetricsStream(metrics) if metrics else None
    try:
        result = run_bench(loaded.model, contenders, domains, settings, eos_token_ids=eos_ids(loaded.model,
                           loaded.tokenizer), stream=stream, progress=lambda msg: err.print(f"[dim]bench {msg}[/]"))
    finally:
        if stream is not None:
            stream.close()

    folder = out_dir or (Path(b.output_dir) if b.output_dir else Path(r.output_dir) / "bench")
    report = build_report(result, recipe=resolved_dict(r), target=r.target.id)
    path = write_report(report, folder)
    plots = write_plots(report, folder)
    save_resolved(r, folder)
    if json_out:
        print_json(report)
        return
    print_report(report, out)
    out.print(f"report: {path}")
    for p in plots:
        out.print(f"plot: {p}")
