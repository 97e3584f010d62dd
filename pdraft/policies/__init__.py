"""The verification policies: how many of each round's drafts every request sends to the target. A policy maps
the round's proposal (tokens, probabilities, confidences) and the caps (what each request may still verify) to
verify lengths, and may keep state across rounds: after acceptance it observes what the round verified, what
was accepted and how long the verify pass took (pdraft.policies.base.VerifyPolicy is the protocol).

Each policy is one module of this folder and one `PolicySpec` in POLICIES below. Everything else asks these
entries: the recipe's `decode.verify` choices, the checks of a run's settings, the CLI's help, whether a drafter
needs a confidence head for it, and which files beside a drafter it reads (pdraft.decode.policy finds them).
Torch-free like the family registry, so that the recipe reads it without importing torch; each entry names
its class ("module:Class") and pdraft.lazy imports it when a run starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pdraft.errors import PdraftError
from pdraft.lazy import load

CALIBRATION, COST_TABLE = "calibration", "cost table"  # the files beside a drafter a policy may read


@dataclass(frozen=True)
class PolicySpec:
    name: str  # `decode.verify` / `--verify`
    title: str  # for messages: "the prefix scheduler"
    summary: str  # for the recipe's description of `decode.verify`
    policy: str  # "module:Class" of its pdraft.policies.base.VerifyPolicy
    needs_confidence: bool = False  # reads the proposal's confidence logits: a drafter must have the head
    files: Mapping[str, bool] = field(default_factory=dict)  # CALIBRATION / COST_TABLE beside the drafter -> required
    settings: tuple[str, ...] = ()  # the run settings it reads besides the verifier ("threshold", "round_overhead_s")

    def policy_class(self) -> type:
        return load(self.policy)


POLICIES = (
    PolicySpec("full", "full verification", "whole block", "pdraft.policies.full:FullPolicy"),
    PolicySpec("threshold", "the static threshold", "static confidence threshold",
               "pdraft.policies.threshold:ThresholdPolicy", needs_confidence=True,
               files={CALIBRATION: False}, settings=("threshold",)),
    PolicySpec("scheduler", "the prefix scheduler", "the hardware-aware scheduler",
               "pdraft.policies.scheduler:SchedulerPolicy", needs_confidence=True,
               files={CALIBRATION: False, COST_TABLE: True}, settings=("round_overhead_s",)),
    PolicySpec("estimator", "the online acceptance estimator", "online acceptance estimator, every family",
               "pdraft.policies.estimator:EstimatorPolicy", files={COST_TABLE: False}, settings=("round_overhead_s",)),
)
NAMES = tuple(spec.name for spec in POLICIES)
FULL = POLICIES[0].name  # every draft verified: what calibration observes and drafters without a confidence head use
DEFAULT = FULL  # what a run verifies when nothing says otherwise


def policy_spec(name: str) -> PolicySpec:
    for spec in POLICIES:
        if spec.name == name:
            return spec
    raise PdraftError(f"unknown verification mode {name!r}: use {', '.join(NAMES[:-1])} or {NAMES[-1]}")


__all__ = ["PolicySpec", "POLICIES", "NAMES", "FULL", "DEFAULT", "CALIBRATION", "COST_TABLE", "policy_spec"]
