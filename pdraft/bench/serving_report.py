"""The serving sweep's report (pdraft.bench.serving): bench.json in the bench schema (`pdraft.bench/1`, so the
model card and pull read it as any bench report), each run carrying its concurrency, temperature and policy
and the per-round counts behind its figures; the requests rule, the stream seeds, the skipped policies with
their one-line reasons and the SLA picks; and the rich tables that print it (one per temperature, then the
SLA picks), drawn from the report dict, so what is printed is what is saved.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from pdraft.bench.contenders import ENGINE_NOTE
from pdraft.bench.report import DEFINITIONS, SCHEMA, machine_info, sampling_note
from pdraft.bench.serving import REQUESTS_RULE, ServingResult, sla_picks
from pdraft.bench.stream import ROUND_FIELDS

SERVING_DEFINITIONS = {
    **DEFINITIONS,
    "concurrency": "requests in flight: pdraft's runs batch continuously (a finished request's slot is refilled "
                   "at once by prefilling the next prompt into its row, timed apart as prefill_s); transformers "
                   "generate() runs static padded batches of C one after another",
    "requests": REQUESTS_RULE,
    "per_user_tokens_per_s": "mean over requests of generated tokens / the request's decode time (the rounds it "
                             "took part in; prefills left out, as in TPOT)",
    "tokens_per_s": "total tokens/s: generated tokens / decode wall time (each round once)",
    "tpot_p50_s, tpot_p90_s": "nearest-rank percentiles of the per-request TPOTs",
    "speedup": "TPOT(baseline) / TPOT(run) at the same concurrency and temperature; baseline = the faster of "
               "pdraft's target alone and transformers generate() there (named in `baseline`)",
    "prefill_s": "continuous batching: seconds spent prefilling requests as they took a slot; left out of decode_s, "
                 "TPOT and tokens/s with the first token each prefill gives, as generate()'s prefill and first token "
                 "are (its share of the wall time is in the table)",
    "throughput_gain": "total tokens/s(run) / total tokens/s(baseline), same level and temperature",
    "same_as_target": "greedy runs: outputs token-identical to pdraft's target alone at this level",
    "divergences": "greedy runs that differ: each request's first differing token, re-scored against the float64 "
                   "target (rounding: both choices within the run's own logit error of its maximum; else a loss)",
    "sla": "per contender and temperature: the (gamma, policy, concurrency) with the highest total tokens/s whose "
           "per-user tokens/s >= sla_tps",
}
FOOTER = ("per-user = mean of a request's tokens / its decode time · total = tokens / decode wall time · TPOT "
          "p50/p90 over requests · speedup = TPOT(faster baseline) / TPOT · gain = total / baseline total · "
          "tau, token acc = Σa/Σl, verif util = Σl/Σγ · prefill = share of the wall time spent prefilling "
          "requests that took a slot (left out of TPOT and tokens/s with the first token each gives) · = target: "
          "greedy outputs identical to the target alone (near-tie: differing only where the run's dtype rounds a "
          "near-tie apart, pdraft.decode.greedy_audit; NO: a loss)")


def _near_tie_or_no(row: dict) -> str:
    divergences = row.get("divergences")
    return "near-tie" if divergences and all(d["rounding"] for d in divergences) else "NO"


def build_serving_report(result: ServingResult, *, recipe: dict | None = None, machine: dict | None = None,
                         target: str | None = None) -> dict:
    s, sv = result.settings, result.serving
    d = s.decode
    pooled = "+".join(dom.name for dom in result.domains)
    runs = [{
        "domain": pooled, "drafter": r.drafter, "kind": r.kind, "gamma": r.gamma, "verify": r.verify,
        "concurrency": r.concurrency, "temperature": r.temperature, "requests": r.requests,
        "summary": r.summary.to_dict(), "speedup": r.speedup, "throughput_gain": r.throughput_gain,
        "baseline": r.baseline, "backend": r.backend, "compile_s": r.compile_s, "refills": r.refills,
        "same_as_target": r.same_as_target,
        **({"divergences": [d.to_dict() for d in r.divergences]} if r.divergences else {}),
        "tpot_repeats_s": r.tpot_repeats_s, "prefills_timed": r.prefills_timed,
        **({"engine": r.engine, "engine_info": r.engine_info} if r.engine else {}),
        "rounds": [[getattr(rec, name) for name in ROUND_FIELDS] for rec in r.records],
    } for r in result.runs]
    return {
        "schema": SCHEMA,
        "sweep": "serving",
        "target": target,
        "definitions": SERVING_DEFINITIONS,
        "round_fields": list(ROUND_FIELDS),
        "settings": {
            "gammas": s.gammas, "concurrency": sv.concurrency, "temperatures": sv.temperatures,
            "policies": sv.policies, "sla_tps": sv.sla_tps, "num_prompts": s.num_prompts,
            "max_new_tokens": d.max_new_tokens, "top_k": d.sampling.top_k, "top_p": d.sampling.top_p,
            "sampling": [sampling_note(d.sampling.__class__(temperature=t, top_k=d.sampling.top_k,
                                                            top_p=d.sampling.top_p)) for t in sv.temperatures],
            "seed": d.seed, "requests_rule": REQUESTS_RULE, "repeats": s.repeats,
        },
        "stream_seeds": result.seeds,  # request i of every level draws from stream_seeds[i], at every temperature
        "domains": [{"name": dom.name, "source": dom.source, "prompts": len(dom.prompts),
                     "skipped_lines": dom.skipped_lines} for dom in result.domains],
        "drafters": [{"label": c.label, "kind": c.kind, "path": c.path, "max_gamma": c.max_gamma}
                     for c in result.contenders],
        "runs": runs,
        "skipped": [{"drafter": x.drafter, "verify": x.verify, "reason": x.reason} for x in result.skipped],
        "sla": sla_picks(runs, sv.sla_tps),
        "recipe": recipe,
        "machine": machine if machine is not None else machine_info(),
    }


def _num(v, digits=1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _ms(v) -> str:
    return "-" if v is None else f"{1000 * v:.2f}"


def print_serving_report(report: dict, console: Console) -> None:
    st = report["settings"]
    for temperature, note in zip(st["temperatures"], st["sampling"]):
        console.print(_level_table(report, temperature, note))
    if report.get("sla"):
        console.print(_sla_table(report))


def _level_table(report: dict, temperature: float, note: str) -> Table:
    st = report["settings"]
    rows = [r for r in report["runs"] if r["temperature"] == temperature]
    backends = sorted({r["backend"] for r in rows if r.get("backend")})
    kept = ("one timed run each" if st["repeats"] == 1
            else f"{st['repeats']} timed repeats each, the (lower) median-TPOT one kept")
    notes = [FOOTER, f"requests: {st['requests_rule']}; {st['max_new_tokens']} new tokens each; {kept}",
             "concurrency: pdraft's runs batch continuously (a freed slot is refilled by prefilling the next prompt "
             "into its row while the other rows wait; that prefill and its first token are left out of the decode "
             "figures and shown as `prefill`); generate() runs static padded batches of C (its prefill and first "
             "token left out likewise)",
             f"backend: {', '.join(backends) or '-'}; sampling: {note}"]
    engines = sorted({r["engine"] for r in rows if r.get("engine")})
    if engines:
        notes.append(ENGINE_NOTE.format(engines=", ".join(engines)))
    notes += [f"{x['drafter']}: {x['verify']} skipped: {x['reason']}" for x in report.get("skipped", [])]
    table = Table(title=f"serving sweep, T={temperature:g} ({', '.join(d['name'] for d in report['domains'])} "
                        f"pooled: {sum(d['prompts'] for d in report['domains'])} prompts)",
                  caption="\n".join(notes), caption_justify="left")
    columns = ("contender", "γ", "policy", "C", "reqs", "per-user tok/s", "total tok/s", "TPOT p50 ms",
               "TPOT p90 ms", "tau", "token acc", "verif util", "prefill", "speedup", "gain", "= target")
    for name in columns:
        table.add_column(name, justify="left" if name in ("contender", "policy") else "right")
    for level in st["concurrency"]:
        for r in (x for x in rows if x["concurrency"] == level):
            s = r["summary"]
            same = r.get("same_as_target")
            table.add_row(r["drafter"], str(r["gamma"]) if r["gamma"] else "-", r["verify"] if r["gamma"] else "-",
                          str(level), str(r["requests"]), _num(s.get("per_user_tokens_per_s")),
                          _num(s.get("tokens_per_s")), _ms(s.get("tpot_p50_s")), _ms(s.get("tpot_p90_s")),
                          _num(s["tau"], 2), _pct(s["token_acceptance"]), _pct(s["verification_utilization"]),
                          _pct(s["prefill_s"] / (s["decode_s"] + s["prefill_s"]) if s.get("decode_s")
                               and r.get("prefills_timed") else None),
                          _num(r["speedup"], 2) + "x", _num(r.get("throughput_gain"), 2) + "x",
                          "-" if same is None else "yes" if same else _near_tie_or_no(r))
        table.add_section()
    return table


def _sla_table(report: dict) -> Table:
    floor = report["settings"]["sla_tps"]
    table = Table(title=f"SLA: per-user >= {floor:g} tokens/s, the highest total tokens/s",
                  caption="per contender and temperature, over every (gamma, policy, concurrency) measured",
                  caption_justify="left")
    for name in ("contender", "T", "γ", "policy", "C", "total tok/s", "per-user tok/s"):
        table.add_column(name, justify="left" if name in ("contender", "policy") else "right")
    for rec in report["sla"]:
        p = rec["pick"]
        if p is None:
            table.add_row(rec["drafter"], f"{rec['temperature']:g}", "none meets the SLA", "-", "-", "-", "-")
            continue
        table.add_row(rec["drafter"], f"{rec['temperature']:g}", str(p["gamma"]) if p["gamma"] else "-",
                      p["verify"] if p["gamma"] else "-", str(p["concurrency"]), _num(p["total_tokens_per_s"]),
                      _num(p["per_user_tokens_per_s"]))
    return table
