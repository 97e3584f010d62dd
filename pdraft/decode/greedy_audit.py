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
              reference: Sequence[Sequence[int]]) -> list[Divergence]:
        """One Divergence per request whose `outputs` differ from `reference` (empty when all are identical)."""
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
            bound = TOLERANCE * error
            found.append(Divergence(request, p, ours, ref, ours_gap, ref_gap, error,
                                    ours_gap <= bound and ref_gap <= bound))
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
