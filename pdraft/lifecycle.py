"""The whole lifecycle in one call, as `pdraft quickstart` runs it: build (or reuse) the target, export its
hidden states, train a drafter of every registered family (DFlash, DSpark, DFlash2, EAGLE-3; pdraft.models.families)
on the same cache with the same steps, calibrate every drafter that has a confidence head, bench them against
the target alone and the n-gram baseline, greedy and at temperature 1 side by side (`bench_overrides`), and decode a held-out prompt with streaming output, checking that the
speculative output equals the target's own greedy output.

Every stage is the same library call its own command makes, and every stage resumes: the export continues
at its first missing shard, training continues from `latest`, calibration is reused when its file exists.
So an interrupted quickstart rerun picks up where it stopped. A summary (stage times, artifact paths and the
headline figures) is written to OUTPUT_DIR/quickstart.json.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from pdraft.errors import PdraftError
from pdraft.models.families import FAMILIES
from pdraft.paths import atomic_write_text
from pdraft.rich_text import console as rich_console, styled

KINDS = FAMILIES.kinds


def kind_overrides(recipe, kind: str) -> list[str]:
    """The recipe overrides that make `kind` comparable with the others: the family's own (FamilySpec.
    quickstart; DFlash2's block holds the anchor, so it gets one more slot where the recipe's block is DeepSpec's
    and drafts up to the same gamma as the others)."""
    return [f"drafter.kind={kind}", *FAMILIES.get(kind).quickstart(recipe.drafter)]


class Stages:
    """Numbered stage headers with their wall times."""

    def __init__(self, console: Console, names):
        self.console, self.names, self.seconds = console, list(names), {}

    @contextmanager
    def stage(self, name: str):
        i = self.names.index(name) + 1
        self.console.rule(styled("[bold]\\[{}/{}] {}", i, len(self.names), name))
        start = time.perf_counter()
        yield
        self.seconds[name] = round(time.perf_counter() - start, 1)
        self.console.print(styled("[dim]{}: {} s[/]", name, f"{self.seconds[name]:.1f}"))


def sample_prompt(recipe, tokenizer) -> tuple[str, list[int]]:
    """The first prompt of the first bench prompt set (held out from training), encoded as decode does."""
    from pdraft.data.prompts import load_prompts
    from pdraft.data.templates import encode_prompt

    source = recipe.bench.prompt_sets[0]
    text = load_prompts(source, max_samples=1)[0].prompt
    return text, encode_prompt(tokenizer, text, recipe.decode.chat_template, recipe.decode.enable_thinking)


def bench_overrides(recipe) -> list[str]:
    """The quickstart benches greedy (T=0) and sampled (T=1) decoding side by side, unless the recipe names its
    own bench temperatures: T=1 is where most traffic runs and where the papers measure drafters, and greedy is
    where the output can be checked token for token. The T=1 sweep runs only the middle gamma of bench.gamma (γ8
    of the shipped 4,8,16) on the first half of the prompts (6 of 12), unless bench.sampled_gamma /
    bench.sampled_num_prompts say otherwise: a sampled run drafts two to three times the rounds per token of a
    greedy one on the quickstart's drafters, and the whole sweep again would cost about three more minutes of the
    quickstart's fifteen."""
    from pdraft.bench.sweep import parse_gammas

    b = recipe.bench
    if b.temperatures or b.concurrency:
        return []
    out = [f"bench.temperatures=[{b.temperature:g},1]"] if b.temperature == 0 else []
    if out and b.sampled_gamma is None:
        gammas = parse_gammas(b.gamma)
        out.append(f"bench.sampled_gamma={gammas[len(gammas) // 2]}")
    if out and b.sampled_num_prompts is None:
        out.append(f"bench.sampled_num_prompts={max(1, b.num_prompts // 2)}")
    return out


def check_plan(recipe_path: str | Path, overrides: list[str], kinds) -> tuple:
    """(the recipe, each kind's recipe), after refusing in one line anything a later stage would refuse: no kind,
    a kind twice or unknown, a recipe the serving sweep or an engine would read (the quickstart runs and prints the
    gamma sweep in pdraft's loop), each stage's decode settings (bench, calibration, the final greedy decode) built
    once here, and the bench stage's gammas and prompt sets."""
    from pdraft.bench.session import serving_settings
    from pdraft.bench.sweep import parse_gammas
    from pdraft.decode.settings import DecodeSettings
    from pdraft.recipe import load_recipe

    kinds = tuple(kinds)
    if not kinds:
        raise PdraftError("--kinds names no drafter kind", hint=f"give some of {', '.join(KINDS)}")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise PdraftError(f"unknown drafter kind(s) {unknown}: use any of {', '.join(KINDS)}")
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    if twice:
        raise PdraftError(f"--kinds names {', '.join(twice)} more than once; each kind is trained once",
                          hint=f"give each kind once, e.g. {','.join(dict.fromkeys(kinds))}")
    r = load_recipe(recipe_path, overrides)
    recipes = {k: load_recipe(recipe_path, overrides + kind_overrides(r, k)) for k in kinds}
    for k, rk in recipes.items():
        if rk.bench.concurrency:
            raise PdraftError(f"bench.concurrency {rk.bench.concurrency}: the quickstart runs the gamma sweep; the "
                              f"serving sweep runs with `pdraft bench --concurrency` on the drafters it trains",
                              hint="remove bench.concurrency from the quickstart's recipe")
        serving_settings(rk)  # the serving sweep's keys without it: refused here, not after training
        DecodeSettings.from_recipe(rk, "decode", temperature=0.0)
        if FAMILIES.get(k).has_confidence(rk.drafter):
            DecodeSettings.from_recipe(rk, "calibrate")
    b = r.bench  # what the bench stage (pdraft.bench.session.bench_recipe) reads before it times anything
    for key in ("gamma", "sampled_gamma"):  # text the schema takes as it is; the sweep parses it
        if getattr(b, key) is not None:
            try:
                parse_gammas(getattr(b, key))
            except PdraftError as e:
                raise PdraftError(f"bench.{key}: {e.message}", hint=e.hint) from None
    if b.engine:
        raise PdraftError(f"bench.engine {b.engine}: the quickstart benches in pdraft's loop; an engine runs with "
                          f"`pdraft bench` on the drafters it trains",
                          hint="remove bench.engine from the quickstart's recipe")
    if r.calibrate.sps_engine:
        raise PdraftError(f"calibrate.sps_engine {r.calibrate.sps_engine}: the quickstart profiles the cost table "
                          "with pdraft's verifier; an engine measures it with `pdraft calibrate-threshold --engine`",
                          hint="remove calibrate.sps_engine from the quickstart's recipe")
    if not b.prompt_sets:  # the bench stage's prompts, and the decode stage's first one
        raise PdraftError("bench.prompt_sets is empty: no prompt set to benchmark or decode",
                          hint="set bench.prompt_sets")
    rb = load_recipe(recipe_path, overrides + bench_overrides(r))  # the bench stage's recipe (bench_overrides)
    serving_settings(rb)
    DecodeSettings.from_recipe(rb, "bench")
    return r, recipes


def run(recipe_path: str | Path, overrides: list[str] | None = None, *, console: Console | None = None,
        kinds=KINDS, fresh: bool = False, log: Callable[[str], None] | None = None) -> dict:
    from pdraft.bench.report import print_report
    from pdraft.bench.session import bench_recipe
    from pdraft.cache.export_hidden import cache_folder, export_hidden
    from pdraft.calibrate.pipeline import calibrate, headline
    from pdraft.calibration_files import find_calibration, read_calibration
    from pdraft.decode.session import target_alone_loop
    from pdraft.hub.pull import drafter_folder
    from pdraft.recipe import load_recipe
    from pdraft.runtime import cpu_class, make_runtime
    from pdraft.decode.backend import check_decodable
    from pdraft.targets.loader import load_target
    from pdraft.train.loop import run_dir_of, train, training_source
    from pdraft.train.progress import train_bar, validation_line

    console = console or rich_console()
    overrides = list(overrides or [])
    r, recipes = check_plan(recipe_path, overrides, kinds)  # the whole plan, before the first stage runs
    # Every drafter with a confidence head is calibrated; the first of them is the one decoded at the end.
    calibrated = [k for k in kinds if FAMILIES.get(k).has_confidence(recipes[k].drafter)]
    names = ["target", "export-hidden"] + [f"train {k}" for k in kinds]
    names += [f"calibrate {k}" for k in calibrated] + ["bench", "decode"]
    st = Stages(console, names)
    t0 = time.perf_counter()
    summary: dict = {"recipe": str(Path(recipe_path).resolve()), "output_dir": str(Path(r.output_dir).resolve()),
                     "machine": f"{platform.processor() or platform.machine()}", "cpu_class": cpu_class(),
                     "stages": st.seconds}

    with st.stage("target"):
        rt = make_runtime(r.runtime)
        target = load_target(r.target, rt, check_config=check_decodable)  # the quickstart decodes with it
        params = sum(p.numel() for p in target.model.parameters())
        console.print(f"{target.id}: {target.num_layers} layers, hidden {target.hidden_size}, vocab "
                      f"{target.vocab_size}, {params / 1e6:.1f}M parameters; drafter reads layers {target.layer_ids}"
                      f" on {rt.describe()}")
        summary["target"] = {"id": target.id, "path": str(target.path), "parameters": params}

    with st.stage("export-hidden"):
        report = export_hidden(r, target, fresh=fresh, console=console, loop_for=target_alone_loop)
        summary["cache"] = {"folder": str(cache_folder(r)), **report.summary()}
        source = training_source(r, target, loop_for=target_alone_loop)

    finals: dict[str, Path] = {}
    for kind in kinds:
        with st.stage(f"train {kind}"):
            rk = recipes[kind]
            with train_bar(console, kind, rk.train.steps) as progress:
                rep = train(rk, target, source, run_dir=run_dir_of(rk), fresh=fresh, progress=progress,
                            init_from=drafter_folder(rk.drafter.init_from) if rk.drafter.init_from else None)
            finals[kind] = rep.final_dir
            val = rep.validation
            if val:
                console.print(validation_line(kind, val))
            summary[f"train_{kind}"] = {"drafter": str(rep.final_dir), "steps": rep.steps,
                                        "resumed_from": rep.resumed_from, "validation": val}

    for i, kind in enumerate(calibrated):
        with st.stage(f"calibrate {kind}"):
            existing = find_calibration(finals[kind])
            if existing is not None and not fresh:
                cal = read_calibration(existing).model_dump(exclude_unset=True)
                console.print(f"reusing {existing}")
                entry = {"file": str(existing), "reused": True, "headline": headline({"calibration": cal})}
            else:
                result = calibrate(recipes[kind], finals[kind], log=lambda m: console.print(m), target=target)
                console.print(headline(result))
                entry = {"file": str(find_calibration(finals[kind])), "headline": headline(result)}
            summary[f"calibration_{kind}" if i else "calibration"] = entry

    with st.stage("bench"):
        rb = load_recipe(recipe_path, overrides + bench_overrides(r))
        res = bench_recipe(rb, [finals[k] for k in kinds], target=target,
                           warn=lambda m: console.print(styled("[yellow]warning:[/yellow] {}", m)),
                           log=lambda m: console.print(styled("[dim]bench {}[/]", m)))
        print_report(res.report, console)
        summary["bench"] = {"report": str(res.report_path), "plots": [str(p) for p in res.plots],
                            "headline": _bench_headline(res.report)}

    with st.stage("decode"):
        kind = calibrated[0] if calibrated else kinds[0]
        summary["decode"] = _decode_stage(r, target, kind, finals[kind], console)

    summary["total_seconds"] = round(time.perf_counter() - t0, 1)
    path = Path(r.output_dir) / "quickstart.json"
    atomic_write_text(path, json.dumps(summary, indent=2, default=str) + "\n")
    console.rule(styled("[bold]done"))
    console.print(f"{summary['total_seconds'] / 60:.1f} min in all; summary: {path}")
    return summary


def _decode_stage(r, target, kind: str, final: Path, console: Console) -> dict:
    """The quickstart's last stage: one held-out prompt decoded by `kind`'s drafter, streamed, and checked token
    for token against the target alone. The recipe's decode settings, greedy: the output must then be the
    target's own greedy output. The same calls as `pdraft decode` (pdraft.decode.session)."""
    from pdraft.data.templates import eos_ids
    from pdraft.decode.inputs import TextStream
    from pdraft.decode.session import DecodeRun
    from pdraft.decode.settings import DecodeSettings

    text, ids = sample_prompt(r, target.tokenizer)
    settings = DecodeSettings.from_recipe(r, "decode", temperature=0.0)
    session = DecodeRun.prepare(settings, final, warn=lambda m: console.print(styled("[yellow]warning:[/yellow] {}", m)))
    drafter = session.load_drafter(target.model)
    eos = eos_ids(target.model, target.tokenizer)
    form = "in the chat template" if r.decode.chat_template else "raw text"  # decode.chat_template decides
    console.print(styled("[bold]prompt[/bold] ({}, held out, {}):\n{}", r.bench.prompt_sets[0], form, text))
    console.print(styled("[bold]{} speculative output:[/bold]", kind))
    printer = TextStream(lambda tokens: target.tokenizer.decode(tokens, skip_special_tokens=True),
                         lambda text: console.print(text, end=""))

    def on_round(event):
        printer.add(event.new_tokens[0])

    spec = session.decode(target.model, drafter, [ids], eos_token_ids=eos, on_round=on_round)[0]
    console.print()
    alone = session.decode(target.model, None, [ids], eos_token_ids=eos)[0]
    same = spec.output_ids[0] == alone.output_ids[0]
    s = spec.summary()
    console.print(styled("identical to the target's own greedy output: [bold]{}[/bold]; tau {}, token acceptance "
                         "{}%", "yes" if same else "NO", f"{s.tau:.2f}", f"{100 * (s.token_acceptance or 0):.1f}"))
    if not same:
        raise PdraftError("speculative output differs from the target's greedy output: this is a bug, please "
                          "report it with the quickstart.json next to the outputs")
    return {"drafter": kind, "prompt": text, "output": target.tokenizer.decode(spec.output_ids[0]),
            "identical_to_target_greedy": same, "tau": s.tau}


def _bench_headline(report: dict) -> dict:
    """tau, token acceptance and speedup per drafter and gamma for each domain, from the report's summaries; the
    runs at a temperature above 0 under "<gamma> T=<t>" (e.g. "8 T=1") beside the greedy ones."""
    out: dict = {}
    for run in report.get("runs", []):
        if run["gamma"] == 0:  # the baselines draft nothing
            continue
        t = run.get("temperature", 0.0)
        dom = out.setdefault(run["domain"], {})
        dom.setdefault(run["drafter"], {})[str(run["gamma"]) + (f" T={t:g}" if t else "")] = {
            "tau": run["summary"]["tau"], "token_acceptance": run["summary"].get("token_acceptance"),
            "speedup": run.get("speedup")}
    return out
