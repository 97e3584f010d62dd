"""`pdraft decode`: speculative decoding of one or more prompts, streamed to the terminal, followed by the round
statistics of pdraft.metrics. Parses and validates flags, then calls pdraft.decode.session (the calls the
quickstart makes too); `--no-draft` runs the target alone through the same loop; `--json` prints one JSON
object per prompt instead."""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pdraft.cli.common import SetOpt, check_flags, err, one_target_copy, out, recipe_from
from pdraft.errors import PdraftError
from pdraft.policies import NAMES, POLICIES, THRESHOLD, knobs
from pdraft.rich_text import styled

VERIFY_HELP = (" | ".join(NAMES) + ": the verification policy, with its own flags below; one that reads the STS "
               "calibration or the cost table picks them up next to the drafter.")


OLD_FORMS = {THRESHOLD.key: "; alone, the old form of --verify threshold --threshold X"}  # _policy_flags reads them


def with_knob_flags(command):
    """`command` with one option per setting the verification policies declare (pdraft.policies.knobs:
    --threshold, --round-overhead-ms), each a number in its recipe key's unit, None when not given, listed after
    --verify; the command takes them together as `knob_flags` (recipe key -> value). A new policy's knob gets its
    flag here without an edit: typer reads the options from the signature this builds."""
    params = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "knob_flags"]
    at = next(i for i, p in enumerate(params) if p.name == "verify_mode") + 1
    options = [inspect.Parameter(knob.key, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                 annotation=Annotated[float | None, typer.Option(knob.flag, help=_knob_help(knob))])
               for knob in knobs()]

    keys = [knob.key for knob in knobs()]

    @functools.wraps(command)
    def with_flags(**given):
        return command(**{name: value for name, value in given.items() if name not in keys},
                       knob_flags={key: given[key] for key in keys})

    with_flags.__signature__ = inspect.Signature(params[:at] + options + params[at:])
    return with_flags


def _knob_help(knob) -> str:
    readers = " and ".join(spec.name for spec in POLICIES if knob in spec.knobs)
    return f"{knob.description} ({readers}{OLD_FORMS.get(knob.key, '')})"


@with_knob_flags
def decode(
    prompt: Annotated[list[str] | None, typer.Option("--prompt", "-p", help="Prompt text (repeatable).")] = None,
    prompt_file: Annotated[Path | None, typer.Option("--prompt-file", help="One prompt per line, or .jsonl with a \"prompt\" field.")] = None,
    prompt_ids: Annotated[str | None, typer.Option("--prompt-ids", help="Raw token ids, e.g. 12,7,99; ';' separates prompts.")] = None,
    target: Annotated[str | None, typer.Option("--target", help="Target model: local folder, Hub id or builtin:NAME (default: the recipe's).")] = None,
    drafter: Annotated[Path | None, typer.Option("--drafter", help="Drafter checkpoint folder.")] = None,
    gamma: Annotated[int | None, typer.Option("--gamma", help="Draft tokens per round (default: the drafter's largest).")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", help="0 = greedy.")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help="Nucleus mass (1 = off).")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="Top-k (0 = off).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Run seed: prompt i samples from a stream seeded from (seed, i), whatever --batch-size; a JSONL prompt's own \"seed\" field wins (default: decode.seed, else runtime.seed).")] = None,
    max_new_tokens: Annotated[int | None, typer.Option("--max-new-tokens", help="Tokens to generate per prompt.")] = None,
    verify_mode: Annotated[str | None, typer.Option("--verify", help=VERIFY_HELP)] = None,
    sps_table: Annotated[Path | None, typer.Option("--sps-table", help="The cost table (SPS JSON) of the policies that read one (scheduler, estimator), instead of the one next to the drafter.")] = None,
    scheduler: Annotated[Path | None, typer.Option("--scheduler", help="The old form of --verify scheduler --sps-table PATH.")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Prompts decoded together.")] = None,
    tree: Annotated[str | None, typer.Option("--tree", help="Verify a tree per round from the drafter's one pass: a node budget (32, the width chosen) or budget x width (32x4); DFlash, DSpark, DFlash2 (default: decode.tree, null = a chain).")] = None,
    no_draft: Annotated[bool, typer.Option("--no-draft", help="Decode with the target alone (same loop).")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="Plain continuation: skip the chat template.")] = False,
    enable_thinking: Annotated[bool, typer.Option("--enable-thinking", help="Let the chat template enable thinking.")] = False,
    denoise_steps: Annotated[int | None, typer.Option("--denoise-steps", help="Must equal the drafter's trained number.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per prompt on stdout.")] = False,
    metrics: Annotated[Path | None, typer.Option("--metrics", help="Append every round to this metrics stream (JSONL) for `pdraft monitor`.")] = None,
    recipe: Annotated[Path | None, typer.Option("--recipe", help="YAML recipe supplying defaults for these flags.")] = None,
    set_: SetOpt = None,
    knob_flags: Mapping[str, float | None] | None = None,  # --threshold, --round-overhead-ms: with_knob_flags
) -> None:
    """Speculative decoding with a drafter of any family (DFlash, DSpark, DFlash2, EAGLE-3): the target's exact output.

    Example: pdraft decode --recipe recipes/quickstart.yaml --drafter runs/quickstart/dspark/final --prompt "def fib(n):"
    """
    from pdraft.data.templates import eos_ids
    from pdraft.decode import inputs as P
    from pdraft.decode.session import DecodeRun
    from pdraft.decode.settings import DecodeSettings, parse_tree
    from pdraft.streams import request_seeds
    from pdraft.recipe import DecodeSection, DrafterSection
    from pdraft.runtime import leave_group, make_runtime
    from pdraft.decode.backend import check_decodable, cpu_runtime, runtime_line
    from pdraft.targets.loader import load_target

    check_flags(DecodeSection, {"--temperature": ("temperature", temperature), "--top-p": ("top_p", top_p),
                                "--top-k": ("top_k", top_k), "--seed": ("seed", seed), "--gamma": ("gamma", gamma),
                                "--max-new-tokens": ("max_new_tokens", max_new_tokens),
                                **{knob.flag: (knob.key, knob_flags[knob.key]) for knob in knobs()}})
    check_flags(DrafterSection, {"--denoise-steps": ("denoise_steps", denoise_steps)})
    r = recipe_from(recipe, (set_ or []) + ([f"target.id={target}"] if target else []))
    main = one_target_copy(r, "decode")  # a sharded target's other processes decode along, silently
    sources = sum(x is not None for x in (prompt, prompt_file, prompt_ids))
    if sources != 1:
        raise PdraftError("give exactly one of --prompt, --prompt-file or --prompt-ids")
    if not no_draft and drafter is None:
        raise PdraftError("no drafter: pass --drafter PATH, or --no-draft to decode with the target alone")
    mode, sps_table = _policy_flags(verify_mode, knob_flags[THRESHOLD.key], sps_table, scheduler)
    P.check_decode_io(r, None if no_draft else drafter, prompt_file, sps_table, metrics)
    settings = DecodeSettings.from_recipe(
        r, "decode", gamma=None if no_draft else gamma, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
        max_new_tokens=max_new_tokens, verify=mode, knob_flags=knob_flags,
        sps_table=str(sps_table) if sps_table is not None else None, batch_size=batch_size,
        denoise_steps=denoise_steps, tree=parse_tree(tree) if tree is not None and not no_draft else None)
    run = DecodeRun.prepare(settings, None if no_draft else drafter,
                            device=r.runtime.device if r.runtime.device != "auto" else None,
                            warn=lambda m: err.print(styled("[yellow]warning:[/yellow] {}", m)))
    raw = raw or not r.decode.chat_template
    enable_thinking = enable_thinking or r.decode.enable_thinking

    loaded = load_target(r.target, make_runtime(r.runtime), check_config=check_decodable)  # before the weights
    model, tokenizer = loaded.model, loaded.tokenizer
    texts, ids, own = _read_prompts(P, loaded, prompt, prompt_file, prompt_ids, raw, enable_thinking,
                                    quiet=json_out, recipe_chat=r.decode.chat_template)
    seeds = request_seeds(settings.seed, 0, len(ids), own)  # one stream per prompt, the same in any batch
    draft_model = run.load_drafter(model)
    # threads (runtime.threads: auto) and the products' plans measured on this run's own step and verify pass,
    # as bench does: what ran is the stats' first line
    cpu = cpu_runtime(model, loaded.layer_ids, settings, r.runtime.threads, settings.gamma_for(draft_model) + 1,
                      drafters=[draft_model] if draft_model is not None else [])
    stream = not json_out and len(ids) == 1

    def detok(tokens):
        if tokenizer is None:
            return " ".join(map(str, tokens))
        return tokenizer.decode(tokens, skip_special_tokens=True)

    label = "target alone" if no_draft else f"{Path(drafter).name} ({draft_model.config.kind})"
    sink = _metrics_sink(metrics if main else None, label, settings.gamma_for(draft_model), run.verify.mode)
    on_round = _on_round(P.TextStream(detok, lambda text: out.print(text, end="")) if stream else None, sink)
    try:
        results = run.decode(model, draft_model, ids, eos_token_ids=eos_ids(model, tokenizer), seeds=seeds,
                             on_round=on_round, on_batch=sink.next_batch if sink is not None else None)
    finally:
        if sink is not None:
            sink.close()
    if stream:
        out.print()
    ran = runtime_line(cpu) if cpu["threads"]["how"] != "cuda" else ""
    _report(results, ids, texts, detok, json_out, seeds, ran)
    leave_group()


def _read_prompts(P, loaded, prompt, prompt_file, prompt_ids, raw: bool, enable_thinking: bool, *, quiet: bool,
                  recipe_chat: bool):
    """(texts or None, token ids, each prompt's own seed or None) from the one prompt source given, saying how
    the text reached the target unless `quiet` (--json)."""
    if prompt_ids is not None:
        ids = P.parse_prompt_ids(prompt_ids)
        return None, ids, [None] * len(ids)
    texts, own = (list(prompt), [None] * len(prompt)) if prompt else P.read_prompt_file(prompt_file)
    ids = P.encode(loaded.tokenizer, texts, raw=raw, enable_thinking=enable_thinking, context=loaded.max_context)
    if not quiet:
        err.print(_prompt_form(loaded.tokenizer, raw, recipe_chat), highlight=False)
    return texts, ids, own


def _metrics_sink(path: Path | None, label: str, gamma: int, verify: str):
    """The --metrics stream with this run's header row, or None."""
    if path is None:
        return None
    from pdraft.bench.stream import MetricsStream

    sink = MetricsStream(path)
    sink.begin_run(drafter=label, gamma=gamma, verify=verify)
    return sink


def _on_round(printer, sink):
    """The engine's per-round callback: stream the single request's new text (`printer`) and append each
    round to the metrics stream (`sink`); None when neither is wanted."""
    if printer is None and sink is None:
        return None

    def each_round(event):
        if printer is not None:
            printer.add(event.new_tokens[0])
        if sink is not None:
            for record in event.records:
                sink.write_round(record)

    return each_round


def _policy_flags(verify: str | None, threshold: float | None, sps_table: Path | None,
                  scheduler: Path | None) -> tuple[str | None, Path | None]:
    """(policy name or None for the recipe's, cost table) from --verify and the policies' own flags, with the
    old forms that chose a policy by its setting (--threshold alone, --scheduler PATH) read as the new ones,
    saying so."""
    if scheduler is not None:
        if sps_table is not None:
            raise PdraftError("--scheduler PATH is the old form of --sps-table PATH: give one of them")
        if threshold is not None and verify is None:
            raise PdraftError("--threshold and --scheduler are two verification policies: choose one",
                              hint="--verify NAME picks the policy; --threshold and --sps-table are its settings")
        err.print(styled("[yellow]note:[/yellow] --scheduler PATH is the old form of {}--sps-table PATH",
                         "--verify scheduler " if verify is None else ""))
        return verify or "scheduler", scheduler
    if threshold is not None and verify is None:
        err.print("[yellow]note:[/yellow] --threshold without --verify is the old form of "
                  "--verify threshold --threshold X")
        return "threshold", sps_table
    return verify, sps_table


def _prompt_form(tokenizer, raw: bool, recipe_chat: bool) -> str:
    """One line saying how the prompt text reached the target: a continuation prompt and a chat turn give
    different outputs, so decode says which it used and how to get the other."""
    from pdraft.data.templates import has_chat_template

    if raw:
        how = "--raw" if recipe_chat else "decode.chat_template: false"
        return f"prompt form: raw text, continued as written ({how})"
    if not has_chat_template(tokenizer):
        return "prompt form: raw text (the target's tokenizer has no chat template)"
    return "prompt form: a user turn in the target's chat template (decode.chat_template: true; --raw continues the bare text)"


def _report(results, ids, texts, detok, json_out: bool, seeds: list[int], runtime: str = "") -> None:
    from pdraft.metrics import join_batches, summarize

    records = join_batches([(res.records, len(res.output_ids)) for res in results])
    index = 0
    for res in results:
        for b, tokens in enumerate(res.output_ids):
            rounds = [r for r in res.records if r.request == index]
            if json_out:
                row = {
                    "prompt": texts[index] if texts else ids[index], "prompt_ids": ids[index], "output_ids": tokens,
                    "text": detok(tokens), "finish_reason": res.finish_reasons[b],
                    "seed": seeds[index],  # this prompt's stream seed: give it as the prompt's "seed" to redraw it
                    "rounds": [{"drafted": r.gamma, "verified": r.verified, "accepted": r.accepted} for r in rounds],
                    "summary": summarize(rounds).to_dict(),
                }
                sys.stdout.write(json.dumps(row) + "\n")
            elif len(ids) > 1:
                out.rule(f"prompt {index}")
                out.print(detok(tokens))
            index += 1
    if json_out:
        sys.stdout.flush()
    else:
        compiled = sum(res.compile_s for res in results)
        backend = results[0].backend + (f" (compiling took {compiled:.1f} s, not in TPOT)" if compiled else "")
        _print_stats(summarize(records), backend, runtime)


def _fmt(value, pct=False, ms=False):
    if value is None:
        return "-"
    if pct:
        return f"{100 * value:.1f}%"
    return f"{1000 * value:.2f} ms" if ms else f"{value:.2f}"


def _print_stats(s, backend: str = "", runtime: str = "") -> None:
    table = Table(title="round statistics", show_header=False, box=None)
    for name, value in [
        ("backend (decode.compile)", backend or "-"),
        ("runtime", runtime.removeprefix("runtime: ") or "-"),
        ("accepted length tau", _fmt(s.tau)),
        ("token acceptance", _fmt(s.token_acceptance, pct=True)),
        ("block acceptance", _fmt(s.block_acceptance, pct=True)),
        ("verification utilization", _fmt(s.verification_utilization, pct=True)),
        ("TPOT", _fmt(s.tpot_s, ms=True)),
        ("tokens / s", _fmt(s.tokens_per_s)),
        ("total draft / verify / other", " / ".join(_fmt(x, ms=True) for x in (s.draft_s, s.verify_s,
                                                                               s.bookkeeping_s))),
        ("conditional acceptance k=1..8", " ".join(_fmt(c, pct=True) for c in s.conditional_acceptance[:8]) or "-"),
        ("request-rounds, tokens", f"{s.rounds}, {s.generated_tokens}"),
    ]:
        table.add_row(name, value)
    out.print(table)
