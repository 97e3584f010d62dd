"""The verification policies: how many of each round's drafts every request sends to the target. A policy maps
the round's proposal (tokens, probabilities, confidences) and the caps (what each request may still verify) to
verify lengths, and may keep state across rounds: after acceptance it observes what the round verified, what
was accepted and how long the verify pass took (pdraft.policies.base.VerifyPolicy is the protocol).

Each policy is one module of this folder and one `PolicySpec` in POLICIES below: that line is the whole
registration, and everything else asks these entries: the recipe's `decode.verify` choices, the recipe keys of the
settings a policy reads (its `Knob`s, with their ranges and defaults), the `pdraft decode` flags of those settings,
the settings objects that carry their values (DecodeSettings.knobs, VerifyConfig.knobs: `knob_values` checks them),
the checks of a run's settings, the CLI's help, whether a drafter needs a confidence head for it, and which files
beside a drafter it reads (pdraft.calibration_files finds them). A policy's Knob is declared here, beside its entry,
not in its module: the registry is torch-free like the family registry, so that the recipe and the CLI read it
without importing torch, while a policy's module imports torch; each entry names its class ("module:Class") and
pdraft.lazy imports it when a run starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from pdraft.errors import PdraftError, check_number
from pdraft.lazy import load

CALIBRATION, COST_TABLE = "calibration", "cost table"  # the files beside a drafter a policy may read


@dataclass(frozen=True)
class Knob:
    """A setting of its own a policy reads, declared once: the recipe key `decode.<key>` and its range in the
    recipe's unit, the `pdraft decode` flag `--<key with dashes>`, and the run setting it becomes (the entry
    `<setting>` of DecodeSettings.knobs and VerifyConfig.knobs, the recipe value divided by `per`, the recipe's
    units per setting unit: 1000 milliseconds to a second). The recipe's field, the flag and `knob_values` all read
    it, so its range is written here only (tests/test_one_rule.py)."""

    key: str  # decode.<key> in a recipe, --<key with dashes> on `pdraft decode`
    setting: str  # the DecodeSettings / VerifyConfig field it becomes
    what: str  # its name in a refusal: "confidence threshold"
    default: float
    low: float
    high: float
    description: str
    per: float = 1.0

    def recipe_field(self) -> tuple[Any, Any]:
        """(annotation, pydantic FieldInfo) of the recipe key, as the families' recipe fields are declared."""
        return float, Field(self.default, description=self.description, ge=self.low, le=self.high)

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def from_recipe(self, section) -> float:
        """The setting's value from a recipe `decode` section."""
        return self.from_flag(getattr(section, self.key))

    def from_flag(self, value: float) -> float:
        """The setting's value from a value in the recipe's unit (a recipe key's, a flag's)."""
        return value / self.per

    @property
    def default_setting(self) -> float:
        return self.default / self.per

    def check(self, value) -> None:
        check_number(self.what, value, low=self.low / self.per, high=self.high / self.per)


THRESHOLD = Knob("threshold", "threshold", "confidence threshold", 0.5, 0.0, 1.0,
                 "Confidence threshold when verify = threshold.")
ROUND_OVERHEAD = Knob("round_overhead_ms", "round_overhead_s", "round overhead (seconds)", 0.0, 0.0, 1e6,
                      "Per-round time outside verification (drafting, bookkeeping) the scheduler and the estimator "
                      "add to their cost (0: the estimator measures it).", per=1000)


@dataclass(frozen=True)
class PolicySpec:
    name: str  # `decode.verify` / `--verify`
    title: str  # for messages: "the prefix scheduler"
    summary: str  # for the recipe's description of `decode.verify`
    policy: str  # "module:Class" of its pdraft.policies.base.VerifyPolicy
    needs_confidence: bool = False  # reads the proposal's confidence logits: a drafter must have the head
    files: Mapping[str, bool] = field(default_factory=dict)  # CALIBRATION / COST_TABLE beside the drafter -> required
    knobs: tuple[Knob, ...] = ()  # the settings of its own it reads besides the verifier (a Knob may be shared)
    trees: bool = False  # verifies a tree (decode.tree): every node, which a policy that shortens a chain cannot

    def policy_class(self) -> type:
        return load(self.policy)


POLICIES = (
    PolicySpec("full", "full verification", "whole block", "pdraft.policies.full:FullPolicy", trees=True),
    PolicySpec("threshold", "the static threshold", "static confidence threshold",
               "pdraft.policies.threshold:ThresholdPolicy", needs_confidence=True,
               files={CALIBRATION: False}, knobs=(THRESHOLD,)),
    PolicySpec("scheduler", "the prefix scheduler", "the hardware-aware scheduler",
               "pdraft.policies.scheduler:SchedulerPolicy", needs_confidence=True,
               files={CALIBRATION: False, COST_TABLE: True}, knobs=(ROUND_OVERHEAD,)),
    PolicySpec("estimator", "the online acceptance estimator", "online acceptance estimator, every family",
               "pdraft.policies.estimator:EstimatorPolicy", files={COST_TABLE: False}, knobs=(ROUND_OVERHEAD,)),
)
NAMES = tuple(spec.name for spec in POLICIES)
FULL = POLICIES[0].name  # every draft verified: what calibration observes and drafters without a confidence head use
DEFAULT = FULL  # what a run verifies when nothing says otherwise


def knobs() -> tuple[Knob, ...]:
    """Every registered policy's knobs, each once, in registration order (the recipe's `decode` keys)."""
    seen: dict[str, Knob] = {}
    for spec in POLICIES:
        for knob in spec.knobs:
            if seen.setdefault(knob.key, knob) is not knob:
                raise ValueError(f"two policies declare different knobs named decode.{knob.key}")
    return tuple(seen.values())


def knob_values(given: Mapping[str, float], defaults: tuple[Knob, ...]) -> dict[str, float]:
    """A settings object's knob values (setting -> value): every knob in `given` checked against its one range,
    and each of `defaults` not given at its default. DecodeSettings and VerifyConfig take theirs from here, so a
    knob is range-checked in this one place whichever object it reaches; a setting no policy declares is refused,
    as an unknown keyword argument would be."""
    declared = {knob.setting: knob for knob in knobs()}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise TypeError(f"no verification policy reads a setting named {', '.join(map(repr, unknown))} "
                        f"(the policies' settings: {', '.join(declared)})")
    for setting, value in given.items():
        declared[setting].check(value)
    return {**{knob.setting: knob.default_setting for knob in defaults}, **given}


# ------------------------------------------------------------------------------------------------ trees
# The tree a round drafts from a parallel drafter's one pass and verifies in one target pass (pdraft.models.tree,
# pdraft.decode.tree_round): a verification setting like a knob, but a shape, not a number, so it has its own
# rule, written here once for the recipe key `decode.tree` and the `--tree` flags of decode and bench.

MAX_TREE_NODES = 256  # drafted nodes per tree; the verify pass grows with them
TREE_FORMS = "give a node budget (32) or a budget and a width (32x4)"


def default_tree_width(nodes: int) -> int:
    """The width a budget of `nodes` gets when none is given: 4 (SGLang's DFlash tree PR and DDTree use budgets of
    16-64 nodes with a few children per node), fewer for a budget under 8."""
    return max(1, min(4, nodes // 2))


def parse_tree(text: str, *, name: str = "--tree") -> tuple[int, int]:
    """(nodes, width) from `32` (a 32-node budget, the width chosen) or `32x4` (32 nodes, 4 children per node at
    most); `name` is the flag or recipe key that gave it, for the refusal."""
    parts = str(text).strip().lower().split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise PdraftError(f"{name} {text!r}: {TREE_FORMS}") from None
    if len(values) not in (1, 2):
        raise PdraftError(f"{name} {text!r}: {TREE_FORMS}")
    nodes = values[0]
    check_number(f"{name} nodes", nodes, low=1, high=MAX_TREE_NODES, integer=True)
    return check_tree((nodes, values[1] if len(values) == 2 else default_tree_width(nodes)), name=name)


def check_tree(tree, *, name: str = "tree") -> tuple[int, int]:
    """(nodes, width): a node budget 1..MAX_TREE_NODES and a width 1..nodes."""
    if isinstance(tree, (str, bytes)) or len(tree) != 2:
        raise PdraftError(f"a tree is (nodes, width), got {tree!r}")
    nodes, width = tree
    check_number(f"{name} nodes", nodes, low=1, high=MAX_TREE_NODES, integer=True)
    check_number(f"{name} width", width, low=1, high=nodes, integer=True)
    return int(nodes), int(width)


def policy_spec(name: str) -> PolicySpec:
    for spec in POLICIES:
        if spec.name == name:
            return spec
    raise PdraftError(f"unknown verification mode {name!r}: use {', '.join(NAMES[:-1])} or {NAMES[-1]}")


__all__ = ["Knob", "PolicySpec", "POLICIES", "NAMES", "FULL", "DEFAULT", "CALIBRATION", "COST_TABLE", "THRESHOLD",
           "ROUND_OVERHEAD", "MAX_TREE_NODES", "knobs", "knob_values", "default_tree_width", "parse_tree", "check_tree",
           "policy_spec"]
