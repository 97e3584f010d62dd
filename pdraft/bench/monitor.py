"""`pdraft monitor`'s library: a sliding window over a metrics stream (pdraft.bench.stream), its figures from
pdraft.metrics.summarize, each judged against the seed article's healthy ranges (token acceptance 60-80%,
block acceptance 40-60%, verification utilisation 70-90%, below 60% meaning the scheduler prunes too hard) with
a colour and a one-line hint of the likely cause, rendered as a rich view or a JSON summary, and optionally
exported as Prometheus metrics named after vLLM's `spec_decode_*` family.

The window holds the last N request-rounds (or the last N seconds, by the writer's timestamps) of the current
run only: a new run header (another drafter or gamma, as a bench sweep writes them) closes the previous run,
whose last window is kept in a short list of recent runs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rich.console import Group
from rich.table import Table
from rich.text import Text

from pdraft.metrics import RoundRecord, Summary, summarize
from pdraft.bench.stream import record_from
from pdraft.policies import FULL


@dataclass(frozen=True)
class Health:
    low: float  # healthy range, inclusive
    high: float
    red_below: float  # red under this, yellow between it and `low`
    hint_low: str
    hint_high: str


HEALTH = {
    "token_acceptance": Health(
        0.60, 0.80, 0.50,
        "gamma too large for this drafter, or it was trained on another domain's data",
        "above the range: gamma could be larger (or the text is very repetitive)"),
    "block_acceptance": Health(
        0.40, 0.60, 0.30,
        "gamma too large: whole blocks rarely survive (try bench's recommended gamma)",
        "most blocks survive whole: gamma could be larger"),
    "verification_utilization": Health(
        0.70, 0.90, 0.60,
        "scheduler too aggressive: it prunes too hard (lower the threshold or re-profile the SPS table)",
        "scheduler prunes little: check the threshold / SPS table"),
}
LABELS = {
    "token_acceptance": "token acceptance",
    "block_acceptance": "block acceptance",
    "verification_utilization": "verification utilization",
}


def judge(name: str, value: float | None, summary: Summary | None = None,
          verify: str | None = None) -> tuple[str, str]:
    """(status, hint) of one metric: status is ok / yellow / red / n/a. `verify` is the run's verification mode
    (from its header): under full verification nothing prunes, and utilisation below 100% only comes from the
    token budget capping the last block, so it is not judged against the scheduler's range."""
    health = HEALTH[name]
    if value is None:
        return "n/a", ""
    if name == "verification_utilization" and (value >= 1.0 or verify == FULL):
        return "ok", "full verification (no pruning; below 100% only where the token budget capped a block)"
    if health.low <= value <= health.high:
        return "ok", ""
    if value > health.high:
        return "yellow", health.hint_high
    status = "red" if value < health.red_below else "yellow"
    hint = health.hint_low
    if name == "token_acceptance" and summary is not None:
        hint = _acceptance_cause(summary) or hint
    return status, hint


def _acceptance_cause(summary: Summary) -> str | None:
    """Tell a bad first position (domain, denoise steps) from decay along the block (gamma too large)."""
    cond = [c for c in summary.conditional_acceptance if c is not None]
    if not cond:
        return None
    if cond[0] < HEALTH["token_acceptance"].low:
        return ("position 1 already fails: training data from another domain, or a denoise-step mismatch "
                "between training and decoding")
    return "acceptance decays along the block: gamma too large"


class Window:
    """The current run's header and its last `size` request-rounds (or `seconds` of rounds)."""

    def __init__(self, size: int = 200, seconds: float | None = None, keep_runs: int = 8):
        self.size, self.seconds = size, seconds
        self.header: dict = {}
        self.rounds: deque[tuple[float | None, RoundRecord]] = deque(maxlen=None if seconds else size)
        self.recent: deque[tuple[dict, Summary]] = deque(maxlen=keep_runs)
        self.lines = 0

    def reset(self) -> None:
        self.header, self.lines = {}, 0
        self.rounds.clear()
        self.recent.clear()

    def feed(self, rows: list[dict]) -> list[tuple[dict, RoundRecord]]:
        """Take stream lines; returns the (header, record) pairs fed, for exporters."""
        fed = []
        for row in rows:
            self.lines += 1
            kind = row.get("type")
            if kind == "run":
                if self.rounds:
                    self.recent.append((self.header, summarize(self.records())))
                self.header = row
                self.rounds.clear()
            elif kind == "round":
                try:
                    record = record_from(row)
                except (TypeError, ValueError):
                    continue  # a round line missing fields or with wrong types (StreamFollower already skips those)
                self.rounds.append((row.get("t"), record))
                fed.append((self.header, record))
        self._trim()
        return fed

    def _trim(self) -> None:
        if self.seconds is None or not self.rounds:
            return
        newest = self.rounds[-1][0]
        if newest is None:
            return
        while self.rounds and self.rounds[0][0] is not None and newest - self.rounds[0][0] > self.seconds:
            self.rounds.popleft()

    def records(self) -> list[RoundRecord]:
        return [r for _, r in self.rounds]

    def summary(self) -> Summary:
        return summarize(self.records())

    def describe(self) -> str:
        return f"last {self.seconds:g} s" if self.seconds else f"last {self.size} request-rounds"


# ------------------------------------------------------------------------------------------ output


def snapshot(window: Window, source: str = "") -> dict:
    """The window as a JSON-ready dict: run header, summary, and each health metric's status and hint."""
    s = window.summary()
    health = {}
    for name, h in HEALTH.items():
        value = getattr(s, name)
        status, hint = judge(name, value, s, window.header.get("verify"))
        health[name] = {"value": value, "healthy": [h.low, h.high], "status": status, "hint": hint}
    return {"source": source, "run": window.header, "window": window.describe(), "window_rounds": len(window.rounds),
            "summary": s.to_dict(), "health": health,
            "recent_runs": [{"run": h, "summary": r.to_dict()} for h, r in window.recent]}


STYLE = {"ok": "green", "yellow": "yellow", "red": "bold red", "n/a": "dim"}


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def render(window: Window, source: str = "") -> Group:
    snap = snapshot(window, source)
    s, run = snap["summary"], snap["run"]
    who = f"{run.get('drafter', '?')}, γ={run.get('gamma', '?')}" if run else "waiting for a run header"
    extra = ", ".join(f"{k} {run[k]}" for k in ("domain", "repeat") if k in run)
    title = Text.assemble(("pdraft monitor", "bold"), f"  {source}  ", (who, "cyan"),
                          f" ({extra})" if extra else "", f"  · {snap['window']}: {snap['window_rounds']} in window")
    table = Table(show_header=True, box=None, pad_edge=False)
    for col in ("metric", "value", "healthy", "status"):
        table.add_column(col, no_wrap=True)
    table.add_row("accepted length tau", "-" if s["tau"] is None else f"{s['tau']:.2f}", "", "")
    notes = []
    for name, h in snap["health"].items():
        style = STYLE[h["status"]]
        table.add_row(LABELS[name], Text(_pct(h["value"]), style=style),
                      f"{h['healthy'][0]:.0%}-{h['healthy'][1]:.0%}", Text(h["status"], style=style))
        if h["hint"]:
            notes.append(Text.assemble((f"{LABELS[name]} {_pct(h['value'])} ({h['status']}): ", style), h["hint"]))
    table.add_row("TPOT", "-" if s["tpot_s"] is None else f"{1000 * s['tpot_s']:.2f} ms", "", "")
    table.add_row("tokens / s", "-" if s["tokens_per_s"] is None else f"{s['tokens_per_s']:.1f}", "", "")
    for key, label in (("draft_s", "draft time"), ("verify_s", "verify time"), ("bookkeeping_s", "other time")):
        table.add_row(label, f"{1000 * s[key]:.1f} ms", "", "window total")
    cond = " ".join("-" if c is None else f"{100 * c:.0f}" for c in s["conditional_acceptance"])
    joint = " ".join("-" if c is None else f"{100 * c:.0f}" for c in s["joint_acceptance"])
    notes.append(Text(f"conditional acceptance P(k | 1..k-1) by k, %: {cond or '-'}"))
    notes.append(Text(f"joint acceptance P(a >= k) by k, %: {joint or '-'}"))
    parts = [title, table, *notes]
    if window.recent:
        recent = Table(title="recent runs (their last window)", box=None)
        for col in ("drafter", "γ", "domain", "tau", "token acc", "block acc", "TPOT ms"):
            recent.add_column(col)
        for header, rs in window.recent:
            recent.add_row(str(header.get("drafter", "?")), str(header.get("gamma", "?")),
                           str(header.get("domain", "")), "-" if rs.tau is None else f"{rs.tau:.2f}",
                           _pct(rs.token_acceptance), _pct(rs.block_acceptance),
                           "-" if rs.tpot_s is None else f"{1000 * rs.tpot_s:.2f}")
        parts.append(recent)
    return Group(*parts)


# -------------------------------------------------------------------------------------- Prometheus


class PrometheusExporter:
    """Counters named like vLLM's (`vllm:spec_decode_num_drafts` -> `pdraft:spec_decode_num_drafts`, exposed with
    the `_total` suffix; per-position acceptance with a 0-based `position` label as vLLM does) plus pdraft's
    verified-token counter (vLLM has no scheduler, so its draft tokens are all verified) and gauges of the
    window's rates. vLLM derives acceptance rate = accepted / draft tokens and mean acceptance length =
    1 + accepted / drafts from these counters; with pdraft's scheduler the token acceptance rate divides by
    verified tokens instead. Every series carries a `drafter` label."""

    def __init__(self, port: int, addr: str = "127.0.0.1"):
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

        self.registry = CollectorRegistry()
        p, r = "pdraft:spec_decode_", self.registry
        self.drafts = Counter(p + "num_drafts", "Draft rounds (request-rounds with gamma > 0).", ["drafter"],
                              registry=r)
        self.draft_tokens = Counter(p + "num_draft_tokens", "Tokens drafted (sum of gamma).", ["drafter"], registry=r)
        self.verified = Counter(p + "num_verified_tokens", "Drafts sent to verification (sum of l).", ["drafter"],
                                registry=r)
        self.accepted = Counter(p + "num_accepted_tokens", "Drafts accepted (sum of a).", ["drafter"], registry=r)
        self.per_pos = Counter(p + "num_accepted_tokens_per_pos", "Rounds whose draft at 0-based position was "
                               "accepted.", ["drafter", "position"], registry=r)
        self.generated = Counter("pdraft:generation_tokens", "Tokens committed to outputs.", ["drafter"], registry=r)
        self.gauges = {name: Gauge(p + "window_" + name, help_text, ["drafter"], registry=r) for name, help_text in [
            ("mean_acceptance_length", "Window tau: mean of a + 1."),
            ("token_acceptance_rate", "Window sum a / sum l."),
            ("block_acceptance_rate", "Window share of rounds with a = gamma."),
            ("verification_utilization", "Window sum l / sum gamma."),
            ("tpot_seconds", "Window time per output token."),
        ]}
        self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def observe(self, fed: list[tuple[dict, RoundRecord]]) -> None:
        for header, r in fed:
            label = str(header.get("drafter", "unknown"))
            self.generated.labels(label).inc(r.committed)
            if r.gamma <= 0:
                continue
            self.drafts.labels(label).inc()
            self.draft_tokens.labels(label).inc(r.gamma)
            self.verified.labels(label).inc(r.verified)
            self.accepted.labels(label).inc(r.accepted)
            for k in range(r.accepted):
                self.per_pos.labels(label, str(k)).inc()

    def update(self, window: Window) -> None:
        if not window.header:
            return
        s = window.summary()
        label = str(window.header.get("drafter", "unknown"))
        for name, value in [("mean_acceptance_length", s.tau), ("token_acceptance_rate", s.token_acceptance),
                            ("block_acceptance_rate", s.block_acceptance),
                            ("verification_utilization", s.verification_utilization), ("tpot_seconds", s.tpot_s)]:
            if value is not None:
                self.gauges[name].labels(label).set(value)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
