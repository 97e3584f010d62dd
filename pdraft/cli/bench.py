"""`pdraft bench [RECIPE] --gamma 10..20`: sweep gamma over prompt sets for each drafter given, the n-gram
baseline and the target alone, then print one table per domain, write bench.json (every figure and the
per-round counts behind it), the plots and the resolved recipe, and recommend a gamma. A drafter whose block
is shorter than some gammas of the sweep runs the others; the rest are marked "beyond block size". Parses and
validates flags, then calls pdraft.bench.sweep / report / plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdraft.cli.common import JsonOpt, RecipeArg, SetOpt, err, one_target_copy, out, print_json, recipe_from
from pdraft.rich_text import styled


def bench(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    gamma: Annotated[str | None, typer.Option("--gamma", help="Draft lengths: a range 10..20, a list 4,8,16 or one value (default: bench.gamma).")] = None,
    drafter: Annotated[list[Path] | None, typer.Option("--drafter", help="Drafter checkpoint folder (repeatable: DFlash, DSpark, a pulled checkpoint).")] = None,
    prompt_set: Annotated[list[str] | None, typer.Option("--prompt-set", help="builtin:code, builtin:prose, a DeepSpec-layout JSONL file or a datasets id (repeatable; replaces bench.prompt_sets).")] = None,
    target: Annotated[str | None, typer.Option("--target", help="Target model: local folder, Hub id or builtin:NAME (default: the recipe's).")] = None,
    num_prompts: Annotated[int | None, typer.Option("--num-prompts", help="Prompts per set.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option("--max-new-tokens", help="Tokens generated per prompt.")] = None,
    temperature: Annotated[str | None, typer.Option("--temperature", help="0 = greedy; > 0 samples (top-k 0 and top-p 1 by default, so it really samples). A list 0,1 runs each, side by side (the gamma sweep's T>0 runs take bench.sampled_gamma; with --concurrency, the serving sweep's).")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="Top-k when sampling (0 = off; 1 would be greedy).")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help="Nucleus mass when sampling (1 = off).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of every sampling draw (default: decode.seed, else runtime.seed).")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Prompts decoded together.")] = None,
    repeats: Annotated[int | None, typer.Option("--repeats", help="Timed repeats per run; the median-TPOT repeat is reported.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Report folder (default: bench.output_dir, else OUTPUT_DIR/bench).")] = None,
    metrics: Annotated[Path | None, typer.Option("--metrics", help="Append every round to this metrics stream (watch it with pdraft monitor).")] = None,
    skip_malformed: Annotated[bool, typer.Option("--skip-malformed", help="Skip malformed JSONL lines (reported by number) instead of stopping.")] = False,
    concurrency: Annotated[str | None, typer.Option("--concurrency", help="Requests in flight, e.g. 1,4,16,32: runs the serving sweep (continuous batching) instead of the gamma sweep (bench.concurrency).")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Verification policies side by side in the serving sweep, e.g. full,threshold,scheduler (registered names; bench.policies).")] = None,
    sla_tps: Annotated[float | None, typer.Option("--sla-tps", help="Per-user tokens/s floor: per contender, the best total throughput at or above it, and the line on the Pareto plot (bench.sla_tps).")] = None,
    engine: Annotated[str | None, typer.Option("--engine", help="Also run every contender in a serving engine (vllm): each drafter exported to its format, the engine started in its own interpreter (VLLM_VENV), the same requests with and without speculation, its own figures beside pdraft's (bench.engine).")] = None,
    no_ngram: Annotated[bool, typer.Option("--no-ngram", help="Leave out the n-gram prompt-lookup baseline.")] = False,
    tree: Annotated[str | None, typer.Option("--tree", help="Also verify trees: a node budget (32, the width chosen) or budget x width (32x4); each parallel drafter's tree row sits beside its chain (default: decode.tree).")] = None,
    profile: Annotated[bool, typer.Option("--profile", help="Also print the round account: draft, verify, accept, cache commit and host bookkeeping per drafting round (always in bench.json).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Benchmark drafters against the target alone and the n-gram baseline over a gamma sweep.

    Gammas beyond a drafter's block size are skipped for that drafter and marked "beyond block size".

    Example: pdraft bench recipes/quickstart.yaml --gamma 10..20 --drafter runs/quickstart/dflash/final --drafter runs/quickstart/dspark/final
    """
    from pdraft.bench.report import print_report
    from pdraft.bench.serving import parse_levels, parse_policies, parse_temperatures
    from pdraft.bench.serving_report import print_serving_report
    from pdraft.bench.session import bench_recipe
    from pdraft.runtime import leave_group

    from pdraft.decode.settings import parse_tree

    temps = parse_temperatures(temperature) if temperature is not None else None
    tree_shape = parse_tree(tree) if tree is not None else None
    flags = {"bench.gamma": gamma, "bench.num_prompts": num_prompts, "bench.max_new_tokens": max_new_tokens,
             "bench.temperature": temps[0] if temps and len(temps) == 1 else None,
             "bench.temperatures": temps if temps and len(temps) > 1 else None,
             "bench.concurrency": parse_levels(concurrency) if concurrency is not None else None,
             "bench.policies": parse_policies(policy.split(",")) if policy is not None else None,  # ' ': refused
             "bench.sla_tps": sla_tps, "bench.top_k": top_k, "bench.top_p": top_p, "bench.seed": seed,
             "bench.batch_size": batch_size, "bench.repeats": repeats, "target.id": target, "bench.engine": engine}
    overrides = [f"{k}={'[' + ','.join(map(str, v)) + ']' if isinstance(v, list) else v}" for k, v in flags.items()
                 if v is not None]
    if skip_malformed:
        overrides.append("bench.skip_malformed=true")
    r = recipe_from(recipe, (set_ or []) + overrides)
    factory = None
    if r.bench.engine:  # checked before the target loads
        from pdraft.serving import engine_factory

        factory = engine_factory(r.bench.engine)
    main = one_target_copy(r, "bench")  # a sharded target's other processes run along, silently
    res = bench_recipe(r, list(drafter or []), out_dir=out_dir, metrics=metrics, ngram=not no_ngram,
                       prompt_sets=list(prompt_set) if prompt_set else None,
                       warn=lambda m: err.print(styled("[yellow]warning:[/yellow] {}", m)),
                       log=lambda msg: err.print(styled("[dim]bench {}[/]", msg)), write=main, tree=tree_shape,
                       engine=factory)
    leave_group()
    if json_out:
        print_json(res.report)
        return
    if res.report.get("sweep") == "serving":
        print_serving_report(res.report, out)
    else:
        print_report(res.report, out, profile=profile)
    out.print(f"report: {res.report_path}")
    for p in res.plots:
        out.print(f"plot: {p}")
