"""What a verification policy is to the decoding engine, and what every policy shares. `VerifyConfig` is a
run's policy with its settings and the files found beside the drafter (the STS calibration, the cost table),
checked on construction against what its registry entry says it reads; `make_policy` turns it into the
`VerifyPolicy` object the engine's round calls, chosen once when the run starts:

    lengths = policy.lengths(proposal, caps)          # before the verify pass
    policy.observe(proposal, lengths, accepted, s)    # after acceptance: what was verified, kept, and its time

A policy may keep state across rounds (observe), but to stay lossless its lengths may depend only on the
caps, on what was drafted up to each position and on earlier rounds' outcomes, never on the current round's
target output (the DSpark paper's Appendix A argues it for Algorithm 1's early stop). `survival` is the prefix
survival of the confidence logits that the confidence-driven policies share; `check_confidence` is the one
refusal of a drafter without the confidence head a policy (or calibration) needs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from pdraft.policies import COST_TABLE, DEFAULT, Knob, PolicySpec, knob_values, policy_spec
from pdraft.policies.cost import SpsTable
from pdraft.errors import PdraftError
from pdraft.models.api import Proposal
from pdraft.models.families import FAMILIES


@dataclass
class VerifyConfig:
    """Verification-length policy of a decode run (its registry entry and class: pdraft.policies)."""

    mode: str = DEFAULT  # a registered policy's name
    # The policy's own settings (pdraft.policies.Knob.setting -> value, e.g. "threshold", "round_overhead_s"): each
    # its policy declares, at the Knob's default where not given, every given one checked against its one range (a
    # run's settings hand over only the knobs its policy reads). `knob(THRESHOLD)` reads one.
    knobs: Mapping[str, float] = field(default_factory=dict)
    sps: SpsTable | None = None  # the profiled steps-per-second table, for the policies that read one
    # Optional STS calibration: per-position temperatures T_k, confidence = sigmoid(logit_k / T_k).
    confidence_temperatures: list[float] | None = None
    # Verify only the real tokens, sum(1 + l_r), in one packed row (pdraft.decode.target_runner.PackedVerifier);
    # False = the padded pass of batch * (1 + max l) tokens, kept as the reference the packed pass is tested
    # against.
    packed: bool = True
    spec: PolicySpec = field(init=False, repr=False, compare=False)  # the registry entry of `mode`, resolved once

    def __post_init__(self):
        self.spec = policy_spec(self.mode)
        self.knobs = knob_values(self.knobs, self.spec.knobs)
        if self.spec.files.get(COST_TABLE) and self.sps is None:
            raise PdraftError(f"{self.spec.title} needs an SPS table (--sps-table SPS_JSON)")

    def knob(self, knob: Knob) -> float:
        """The value of one of the policy's own settings (its PolicySpec declares `knob`)."""
        if knob.setting not in self.knobs:
            raise KeyError(f"verification mode {self.mode!r} does not declare the setting {knob.setting!r}")
        return self.knobs[knob.setting]


class VerifyPolicy:
    """A verification policy: `lengths` before the verify pass, `observe` after acceptance."""

    def __init__(self, config: VerifyConfig):
        self.config = config

    def lengths(self, proposal: Proposal | None, caps: torch.Tensor) -> torch.Tensor:
        """[batch] long: l, the number of drafts each request sends to the target this round; -1 marks a
        finished request. proposal: the round's drafts (None: a round without drafts, which verifies only the
        anchor); caps [batch] long: most drafts each request may verify, -1 = finished. Caps depend on lengths
        only, never on drafted tokens, so capping keeps decoding lossless."""
        if proposal is None:
            return caps.clamp(max=0)
        return self.choose(proposal, caps)

    def choose(self, proposal: Proposal, caps: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def observe(self, proposal: Proposal | None, lengths: torch.Tensor, accepted: torch.Tensor,
                verify_s: float) -> None:
        """After acceptance: lengths [batch] as `lengths` returned them, accepted [batch] long (a), and the
        measured seconds of the verify pass. Policies that learn across rounds keep what they need."""


def make_policy(config: VerifyConfig) -> VerifyPolicy:
    """The policy object of `config`, its class taken from the registry entry of its mode."""
    return config.spec.policy_class()(config)


def check_confidence(drafter_config, purpose: str, subject: str = "this drafter") -> None:
    """`purpose` (e.g. "verification mode 'threshold'") reads a confidence head; None = a drafter without one."""
    if not getattr(drafter_config, "has_confidence", False):
        heads = [spec for spec in FAMILIES if spec.confidence_field]
        raise PdraftError(f"{subject} has no confidence head: {purpose} needs one "
                          f"(a {FAMILIES.titles(lambda spec: spec.confidence_field is not None)} drafter)",
                          hint=" or ".join(f"train a {spec.kind} drafter with drafter.{spec.confidence_field}: true"
                                           for spec in heads) + ", or use full verification")


def survival(confidence_logits: torch.Tensor, temperatures: list[float] | None = None) -> torch.Tensor:
    """confidence logits [R, gamma] -> prefix survival probabilities a_{r,j} = prod_{i<=j} c_{r,i}, with the STS
    temperatures applied per position when given (c = sigmoid(logit_k / T_k))."""
    logits = confidence_logits.float()
    if temperatures is not None:
        t = torch.tensor(temperatures[: logits.shape[1]], dtype=torch.float32)
        if t.numel() < logits.shape[1]:
            raise PdraftError(
                f"confidence calibration has {t.numel()} temperatures but the block drafts {logits.shape[1]}"
            )
        logits = logits / t
    return torch.sigmoid(logits).cumprod(dim=-1)


def admitted_survival(policy: VerifyPolicy, proposal: Proposal, caps: torch.Tensor) -> torch.Tensor:
    """[batch, gamma] prefix survival of the round's drafts on the host, zero past each request's cap (such
    positions are never admitted), for the policies that read the confidence head."""
    if proposal.confidence is None:  # the drafter proposed without a confidence head
        check_confidence(None, f"verification mode {policy.config.mode!r}")
    gamma = proposal.tokens.shape[1]
    a = survival(proposal.confidence[:, :gamma].cpu(), policy.config.confidence_temperatures)  # like caps: host
    within = torch.arange(1, gamma + 1).unsqueeze(0) <= caps.unsqueeze(1)  # [batch, gamma]
    return a * within


__all__ = ["VerifyConfig", "VerifyPolicy", "make_policy", "check_confidence", "survival", "admitted_survival"]
