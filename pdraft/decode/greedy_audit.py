"""Where greedy speculative output and the target alone differ, tell a rounding difference from a loss.

Greedy speculative decoding emits, at every position, the argmax of the target's logits as the verify pass that
accepted the token computed them. In exact arithmetic that is the target-alone token. In bf16 (or fp16, or fp32 to a
far smaller degree) a verify pass over gamma+1 tokens, a one-token step and transformers' `generate()` reach the same
logits through different kernel shapes (GEMM blocking, reduction order), so at a near-tie the argmax can flip; from
there on the two outputs are different, equally greedy continuations of the same target. This is the serving
engines' convention: vLLM's "Lossless guarantees of Speculative Decoding" (docs/features/spec_decode.md, added in
vllm-project/vllm#7962) promises losslessness "up to the precision limits of hardware numerics" and names batch size
and floating-point variation as reasons outputs may differ; its greedy equality tests run where the numerics allow.

`audit` decides, for each differing request, at its first differing token p, with the target itself:
- the reference: the target's logits at p on the shared prefix (the prompt and the tokens both outputs agree on),
  recomputed in float64 on a copy of the target;
- the run's own rounding there: the largest difference over the vocabulary between the same logits computed in the
  run's dtype (one forward of that prefix) and the float64 ones.
A divergence is *rounding* when both tokens' float64 logits lie within twice that error of the float64 maximum (each
of the two paths may have erred by up to that much, so either could have been its argmax); otherwise it is a *loss*:
one side emitted a token the target does not choose at any precision the run reached. A loss is what a broken
verifier produces (tests/test_greedy_audit.py's negative control); in float32 runs the allowed error is about 1e-6,
so only exact ties pass there.

A serving engine is another run with numerics of its own: its batched verify and its one-token steps move the
top-2 gap by up to what its Engine declares (`near_tie_gap`, pdraft.serving.api: measured, never guessed), so an
engine's divergence is audited with that gap as a floor on the bound (`audit(..., gap_floor=)`), against pdraft's
float64 target, or, where the engine's own run reports its top log-probabilities at the divergence (llama.cpp's
target alone: `audit_scores`), against those. One rule (`near_tie`) decides in every case.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

TOLERANCE = 2.0  # allowed float64 gap, in units of the run's own logit error at the divergence (one per path)


@dataclass(frozen=True)
class Divergence:
    """The first token where one request's two outputs differ, re-scored against the float64 target."""

    request: int
    position: int  # index into the outputs (0 = the first new token)
    ours: int | None  # the audited run's token there (None: its output ended first)
    reference: int | None  # the reference run's token (None: its output ended first)
    ours_gap: float | None  # float64 logit max minus the logit of `ours` (0: it is the float64 argmax)
    reference_gap: float | None
    rounding_error: float | None  # max |run-dtype logits - float64 logits| at the position
    rounding: bool  # both gaps within TOLERANCE x rounding_error: a near-tie, not a loss
    why: str = ""  # why it could not be audited, where it could not

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One line: the position, both tokens, their distance from the maximum logit, and the verdict."""
        def gap(x):
            return "?" if x is None else f"{x:.4f}"
        bound = "" if self.rounding_error is None else f" (bound {TOLERANCE * self.rounding_error:.4f})"
        verdict = "a near-tie" if self.rounding else f"not a near-tie{bound}" + (f": {self.why}" if self.why else "")
        return (f"token {self.position}: {self.ours} against {self.reference}, logit gaps to the maximum "
                f"{gap(self.ours_gap)} and {gap(self.reference_gap)}: {verdict}")


def near_tie(ours_gap: float | None, reference_gap: float | None, bound: float) -> bool:
    """The rule: both tokens within `bound` of the maximum logit (an unknown gap is never a tie)."""
    return ours_gap is not None and reference_gap is not None and ours_gap <= bound and reference_gap <= bound


def audit_scores(request: int, position: int, ours: int | None, reference: int | None,
                 top: Sequence[tuple[int, float]], bound: float) -> Divergence:
    """A divergence audited against the reference run's own top scores at `position` ((token, logit or
    log-probability), its most likely tokens; one softmax, so differences of log-probabilities are differences
    of logits): `bound` is the gap allowed (an engine's near_tie_gap). A token missing from `top` is farther from
    the maximum than any listed one: not a tie unless the last listed is already beyond the bound."""
    if ours is None or reference is None or not top:
        why = "one output ends where the other goes on (a stop, not a token choice)" if top else \
            "the reference run reported no scores there"
        return Divergence(request, position, ours, reference, None, None, None, False, why)
    scores = dict(top)
    best = max(scores.values())
    gap = lambda t: best - scores[t] if t in scores else None  # noqa: E731
    ours_gap, ref_gap = gap(ours), gap(reference)
    return Divergence(request, position, ours, reference, ours_gap, ref_gap, bound / TOLERANCE,
                      near_tie(ours_gap, ref_gap, bound))


def first_divergences(outputs: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]
                      ) -> list[tuple[int, int]]:
    """(request, position) of the first differing token of every request whose output differs."""
    out = []
    for i, (a, b) in enumerate(zip(outputs, reference)):
        if list(a) != list(b):
            p = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append((i, p))
    return out


class GreedyAuditor:
    """Re-scores divergences against `model` (the target as the run decoded with it, any dtype) and its float64
    copy, made on first use and kept for the auditor's life (one bench makes one)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._exact: torch.nn.Module | None = None
        self._failed: str = ""

    def _reference_model(self) -> torch.nn.Module | None:
        if self._exact is None and not self._failed:
            try:
                self._exact = _float64_copy(self.model)
            except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
                self._failed = f"no float64 copy of the target: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        return self._exact

    @torch.no_grad()
    def audit(self, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
              reference: Sequence[Sequence[int]], *, gap_floor: float = 0.0) -> list[Divergence]:
        """One Divergence per request whose `outputs` differ from `reference` (empty when all are identical).
        `gap_floor`: the least bound, where the outputs came from a run with other numerics than `self.model`'s
        (a serving engine's near_tie_gap)."""
        found = []
        for request, p in first_divergences(outputs, reference):
            a, b = outputs[request], reference[request]
            ours = a[p] if p < len(a) else None
            ref = b[p] if p < len(b) else None
            exact = self._reference_model() if ours is not None and ref is not None else None
            if exact is None:
                why = self._failed or "one output ends where the other goes on (a stop, not a token choice)"
                found.append(Divergence(request, p, ours, ref, None, None, None, False, why))
                continue
            ids = torch.tensor([list(prompts[request]) + list(a[:p])], device=_device(self.model))  # [1, prefix]
            run = self.model(input_ids=ids).logits[0, -1].double()  # [vocab]
            exact_logits = exact(input_ids=ids).logits[0, -1]  # [vocab], float64
            error = float((run - exact_logits).abs().max())
            top = float(exact_logits.max())
            ours_gap, ref_gap = top - float(exact_logits[ours]), top - float(exact_logits[ref])
            found.append(Divergence(request, p, ours, ref, ours_gap, ref_gap, error,
                                    near_tie(ours_gap, ref_gap, max(TOLERANCE * error, gap_floor))))
        return found


def _float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 twin of a transformers causal LM: a fresh model of its class and config, its weights loaded from
    the state dict (not a deepcopy: the decode path hangs packed oneDNN weights and caches off the loaded model)."""
    with torch.device(_device(model)):
        exact = type(model)(copy.deepcopy(model.config)).to(torch.float64)
    exact.load_state_dict({k: v.detach().to(torch.float64) for k, v in model.state_dict().items()})
    return exact.eval()


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def verdict(divergences: Sequence[Divergence]) -> str:
    """"identical", "rounding" (every divergence a near-tie) or "loss"."""
    if not divergences:
        return "identical"
    return "rounding" if all(d.rounding for d in divergences) else "loss"
