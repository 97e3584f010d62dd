"""The single definition of every speculative-decoding metric in DESIGN.md, computed from per-round counts.
decode, bench, monitor and the model card all call `summarize`; nothing else computes these numbers.

One RoundRecord is one request in one decoding round: gamma tokens drafted, l of them verified (l = gamma
without a scheduler), a accepted (0 <= a <= l), plus the target's own token. Definitions:
  tau (accepted length)        mean over rounds of a + 1: over the rounds that drafted (gamma > 0). The first
                               token of a request comes from the target alone (as from an engine's prefill):
                               that step counts towards tokens and time but is not a drafting round. Target-
                               only decoding has no drafting round; its tau is 1.
  token acceptance rate        sum a / sum l
  block acceptance rate        share of rounds with a = gamma (rounds that drafted, gamma > 0)
  verification utilization     sum l / sum gamma  (= sum l / (gamma * rounds) at a fixed gamma)
  conditional acceptance at k  P(a >= k | a >= k-1 and l >= k): only rounds where position k was verified
                               and positions 1..k-1 were accepted
  joint acceptance at k        P(a >= k) over rounds that drafted at least k tokens
  TPOT                         decode wall time / generated tokens, per request, averaged over requests; a
                               request's wall time is the sum of the rounds it took part in (a batched round's
                               time is shared by its requests)
  TPOT p50 / p90               the nearest-rank percentiles of the per-request TPOTs (the smallest TPOT
                               with at least 50% / 90% of requests at or below it)
  per-user tokens/s            mean over requests of generated tokens / the request's wall time (as TPOT's);
                               what one user of a serving engine sees (1 / TPOT when all requests match)
  total tokens/s               generated tokens / decode wall time (each round once): what the machine serves
  speedup                      TPOT(target alone) / TPOT(speculative), same prompts, same run
  draft / verify time per round  total draft (verify) time / distinct rounds (a batched round counts once)
Rates whose denominator is empty are None (e.g. token acceptance of target-only decoding, where sum l = 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass
class RoundRecord:
    request: int  # index of the request in its batch
    round: int  # round number, shared by every request of a batched round
    gamma: int  # tokens drafted (0 for target-only decoding)
    verified: int  # l: drafts sent to the target
    accepted: int  # a: drafts kept
    committed: int  # tokens appended to the output this round (a + 1, less after EOS or the token budget)
    draft_s: float = 0.0  # drafter time of the whole batched round (propose + extend_context)
    verify_s: float = 0.0  # target verify pass of the whole batched round
    round_s: float = 0.0  # wall time of the whole batched round (draft + verify + bookkeeping)
    # Raw confidence LOGITS of the gamma drafted positions (DSpark drafters only; None otherwise). Kept so that
    # calibrate-threshold can fit STS and replay threshold rules from the very rounds decode ran.
    confidence: list[float] | None = None
    prefill_s: float = 0.0  # continuous batching: the round's prefills of requests taking a slot (not in round_s;
    # their first tokens, which come from these prefills, are not in `committed` either)
    # Tree verification: drafted nodes per depth 1..gamma of this request's tree (the chain: [1] * gamma); None
    # for a chain. `verified` is then the deepest node it may keep (gamma within its cap), `accepted` the path's.
    tree: list[int] | None = None
    # Last, so that the positional rows of an older bench.json (ROUND_FIELDS) still read:
    accept_s: float = 0.0  # the acceptance test of the whole batched round (and the policy's observe)
    commit_s: float = 0.0  # the target's cache commit of the accepted drafts (verifier.commit / commit_tree)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Summary:
    rounds: int  # request-rounds tau is over: those that drafted (all of them for target-only decoding)
    requests: int
    generated_tokens: int
    tau: float | None
    token_acceptance: float | None
    block_acceptance: float | None
    verification_utilization: float | None
    conditional_acceptance: list[float | None] = field(default_factory=list)  # index k-1 holds position k
    joint_acceptance: list[float | None] = field(default_factory=list)
    decode_s: float = 0.0
    tpot_s: float | None = None
    tokens_per_s: float | None = None
    draft_s: float = 0.0
    verify_s: float = 0.0
    bookkeeping_s: float = 0.0
    batched_rounds: int = 0  # distinct rounds (a batched round counts once; `rounds` counts request-rounds)
    # Per drafting round (a batched round counts once; a target-only step, the first token of a speculative
    # request, is left out as tau leaves it out; a run that never drafts: every round).
    draft_s_per_round: float | None = None
    verify_s_per_round: float | None = None
    round_s_per_round: float | None = None  # the whole round (draft, verify, bookkeeping), the same rounds
    # The rest of the round, the same rounds: the acceptance test, the target's cache commit, and the host's
    # bookkeeping (the round less draft, verify, accept and commit: the outputs, stop checks, lengths, records)
    accept_s_per_round: float | None = None
    commit_s_per_round: float | None = None
    host_s_per_round: float | None = None
    tpot_p50_s: float | None = None  # nearest-rank percentiles of the per-request TPOTs
    tpot_p90_s: float | None = None
    per_user_tokens_per_s: float | None = None  # mean over requests of tokens / wall time
    prefill_s: float = 0.0  # continuous batching: the refills' prefills, outside decode_s (each round once)

    def to_dict(self) -> dict:
        return asdict(self)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def drafting_rounds(records: Sequence[RoundRecord]) -> list[RoundRecord]:
    """One record per batched round (they share its timings) of the rounds that drafted: a target-only step (the
    first token of a speculative request) is left out, as tau leaves it out; a run that never drafts keeps all."""
    per_round = list({r.round: r for r in records}.values())
    drafting = {r.round for r in records if r.gamma > 0}
    return [r for r in per_round if r.round in drafting] or per_round


def summarize(records: Sequence[RoundRecord]) -> Summary:
    requests = len({r.request for r in records})
    tokens = sum(r.committed for r in records)
    max_gamma = max((r.gamma for r in records), default=0)
    conditional, joint = [], []
    for k in range(1, max_gamma + 1):
        reached = [r for r in records if r.verified >= k and r.accepted >= k - 1]
        conditional.append(_ratio(sum(r.accepted >= k for r in reached), len(reached)))
        drafted = [r for r in records if r.gamma >= k]
        joint.append(_ratio(sum(r.accepted >= k for r in drafted), len(drafted)))
    # tau is over drafting rounds; a target-only step (every step of target-only decoding, and the first step
    # of a speculative request, which the target takes alone as an engine's prefill does) has a + 1 = 1.
    rounds = [r for r in records if r.gamma > 0] or list(records)
    # Batched rounds share their timings: count each round once.
    per_round = list({r.round: r for r in records}.values())
    tpots = request_tpots(records)
    decode_s = sum(r.round_s for r in per_round)
    draft_s = sum(r.draft_s for r in per_round)
    verify_s = sum(r.verify_s for r in per_round)
    timed = drafting_rounds(records)
    return Summary(
        rounds=len(rounds),
        requests=requests,
        generated_tokens=tokens,
        tau=_ratio(sum(r.accepted + 1 for r in rounds), len(rounds)),
        token_acceptance=_ratio(sum(r.accepted for r in records), sum(r.verified for r in records)),
        block_acceptance=_ratio(sum(r.gamma > 0 and r.accepted == r.gamma for r in records),
                                sum(r.gamma > 0 for r in records)),
        verification_utilization=_ratio(sum(r.verified for r in records), sum(r.gamma for r in records)),
        conditional_acceptance=conditional,
        joint_acceptance=joint,
        decode_s=decode_s,
        tpot_s=_mean_tpot(records),
        tokens_per_s=_ratio(tokens, decode_s),
        draft_s=draft_s,
        verify_s=verify_s,
        bookkeeping_s=decode_s - draft_s - verify_s,
        batched_rounds=len(per_round),
        draft_s_per_round=_ratio(sum(r.draft_s for r in timed), len(timed)),
        verify_s_per_round=_ratio(sum(r.verify_s for r in timed), len(timed)),
        round_s_per_round=_ratio(sum(r.round_s for r in timed), len(timed)),
        accept_s_per_round=_ratio(sum(r.accept_s for r in timed), len(timed)),
        commit_s_per_round=_ratio(sum(r.commit_s for r in timed), len(timed)),
        host_s_per_round=_ratio(sum(r.round_s - r.draft_s - r.verify_s - r.accept_s - r.commit_s for r in timed),
                                len(timed)),
        tpot_p50_s=percentile(tpots, 50),
        tpot_p90_s=percentile(tpots, 90),
        per_user_tokens_per_s=sum(1 / t for t in tpots) / len(tpots) if tpots and all(tpots) else None,
        prefill_s=sum(r.prefill_s for r in per_round),
    )


def summarize_engine(records: Sequence[RoundRecord], request_times: Sequence[tuple[float, int]],
                     wall_s: float) -> Summary:
    """A serving engine's run, whose rounds carry counts but no timings (pdraft.serving): every count as
    summarize gives it; TPOT per request from the engine's own clock, (last token time - first token time) /
    (tokens - 1), given as `request_times` [(seconds, tokens after the first)] (its prefill and first token left
    out, as everywhere); total tokens/s over `wall_s`, the wall time of the whole set of requests (the engine
    interleaves prefills with decoding, so they are inside it); no per-round draft or verify time (None)."""
    s = summarize(records)
    tpots = [t / n for t, n in request_times if n > 0]
    s.decode_s = wall_s
    s.draft_s = s.verify_s = s.bookkeeping_s = 0.0
    s.draft_s_per_round = s.verify_s_per_round = s.round_s_per_round = None
    s.accept_s_per_round = s.commit_s_per_round = s.host_s_per_round = None
    s.tpot_s = sum(tpots) / len(tpots) if tpots else None
    s.tpot_p50_s, s.tpot_p90_s = percentile(tpots, 50), percentile(tpots, 90)
    s.per_user_tokens_per_s = sum(1 / t for t in tpots) / len(tpots) if tpots and all(tpots) else None
    s.tokens_per_s = _ratio(s.generated_tokens, wall_s)
    s.prefill_s = 0.0
    return s


def join_batches(batches: Sequence[tuple[Sequence[RoundRecord], int]]) -> list[RoundRecord]:
    """The records of batches decoded one after another, each given with its number of requests, renumbered in
    place so that requests and rounds stay unique across batches (summarize counts a round's time once per
    round number)."""
    out: list[RoundRecord] = []
    round_offset = request_offset = 0
    for records, requests in batches:
        for r in records:
            r.round += round_offset
            r.request += request_offset
        round_offset = max((r.round for r in records), default=round_offset - 1) + 1
        request_offset += requests
        out.extend(records)
    return out


def request_tpots(records: Sequence[RoundRecord]) -> list[float]:
    """Per request (in order of first appearance), the sum of the rounds it took part in / its tokens."""
    round_s = {r.round: r.round_s for r in records}
    per_request: dict[int, list[float]] = {}
    for r in records:
        acc = per_request.setdefault(r.request, [0.0, 0.0])
        acc[0] += round_s[r.round]
        acc[1] += r.committed
    return [t / n for t, n in per_request.values() if n]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least q% of the values at or below it (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100), at least the first
    return ordered[int(rank) - 1]


def _mean_tpot(records: Sequence[RoundRecord]) -> float | None:
    tpots = request_tpots(records)
    return sum(tpots) / len(tpots) if tpots else None


def speedup(target_only: Summary, speculative: Summary) -> float | None:
    """TPOT(target alone) / TPOT(speculative); both from the same prompts in the same run."""
    if target_only.tpot_s is None or not speculative.tpot_s:
        return None
    return target_only.tpot_s / speculative.tpot_s


def speedup_range(baseline_tpots: Sequence[float | None], tpots: Sequence[float | None]) -> tuple[float, float] | None:
    """The lowest and highest speedup over a sweep's repeats, repeat i of the run against repeat i of its
    baseline (the two ran in the same pass round the domain, so a stretch of load falls on both); None with fewer
    than two timed pairs. The spread a single speedup figure hides on a shared machine."""
    pairs = [b / t for b, t in zip(baseline_tpots, tpots) if b is not None and t]
    return (min(pairs), max(pairs)) if len(pairs) >= 2 else None
