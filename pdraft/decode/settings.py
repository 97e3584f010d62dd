"""The settings of a decode run, resolved once: `DecodeSettings.from_recipe(recipe, command, **flags)` reads the
recipe section a command decodes with (decode, bench or calibrate), lets the command's flags win, takes the seed
from `run_seed`, checks every value, and the one object goes down to `generate` (pdraft.decode.engine) from
`pdraft decode`, bench, calibrate-threshold and the quickstart alike. Every range and every default of a decode
run is written here and nowhere else: gamma (1..MAX_GAMMA, at most what the drafter drafts, default the
drafter's largest), sampling (temperature, top-k, top-p), the seed, the token budget, the verification policy
(`VerifyConfig`: mode, threshold, cost table, packed or padded verifier, round overhead), the fused kernels,
the denoise steps, the batch size and `compile` (static caches and compiled passes, pdraft.decode.backend); and the checks that a drafter fits the run: it was built for this target,
it has the confidence head its verification mode needs, it is decoded with the denoise steps it learned. A
number that is not finite (nan, inf) is refused like one out of range. Only the files that sit next to a
drafter (its STS calibration and cost table) are found later, per drafter, by pdraft.decode.policy.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pdraft.streams import run_seed
from pdraft.errors import PdraftError
from pdraft.models.api import SamplingParams
from pdraft.target.capture import check_layer_ids

if TYPE_CHECKING:
    from pdraft.decode.scheduler import SpsTable

MAX_GAMMA = 32  # the recipe's gamma and block_size ceiling, and the widest bench sweep
VerifyMode = Literal["full", "threshold", "scheduler"]
VERIFY_MODES = ("full", "threshold", "scheduler")
COMMANDS = ("decode", "bench", "calibrate")
COMPILE_MODES = ("auto", "on", "off")  # pdraft.decode.backend says what each runs


# ------------------------------------------------------------------------------------------- checks


def check_number(name: str, value, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, integer: bool = False) -> None:
    """One clean line for a value that is not a finite number in its range (nan compares false to everything,
    so it would slip through a plain `<` check)."""
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise PdraftError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        raise PdraftError(f"{name} must be a finite number, got {value}")
    below = low is not None and (value <= low if low_open else value < low)
    if below or (high is not None and value > high):
        if high is None:
            rule = f"{'>' if low_open else '>='} {low}"
        elif low is None:
            rule = f"<= {high}"
        else:
            rule = f"in {'(' if low_open else '['}{low}, {high}]"
        raise PdraftError(f"{name} must be {rule}, got {value}")


def check_gamma(gamma: int, max_gamma: int | None = None, *, name: str = "gamma") -> int:
    """gamma in 1..max_gamma (the drafter's block) or, without a drafter, 1..MAX_GAMMA."""
    if isinstance(gamma, bool) or not isinstance(gamma, int):
        raise PdraftError(f"{name} must be an integer, got {gamma!r}")
    limit = MAX_GAMMA if max_gamma is None else int(max_gamma)
    if not 1 <= gamma <= limit:
        shown = str(gamma) if len(str(gamma)) <= 20 else f"{str(gamma)[:17]}..."  # a 5000-digit value stays short
        where = (f"this drafter drafts 1..{limit}" if max_gamma is not None
                 else f"draft lengths go from 1 to {limit}")
        raise PdraftError(f"{name} {shown} is out of range: {where}")
    return gamma


def check_sampling(sampling: SamplingParams | None) -> SamplingParams:
    """None means greedy. Temperature >= 0 (0 = greedy), top-k >= 0 (0 = off), top-p in (0, 1] (1 = off): the
    ranges SamplingParams checks on construction (the models take it without a run), checked again here in
    case a copy was changed since."""
    sampling = sampling if sampling is not None else SamplingParams()
    sampling.check()
    return sampling


def check_verify_mode(mode: str) -> None:
    if mode not in VERIFY_MODES:
        raise PdraftError(f"unknown verification mode {mode!r}: use full, threshold or scheduler")


def check_confidence(drafter_config, purpose: str, subject: str = "this drafter") -> None:
    """`purpose` (e.g. "verification mode 'threshold'") reads a confidence head; None = a drafter without one."""
    if not getattr(drafter_config, "has_confidence", False):
        raise PdraftError(f"{subject} has no confidence head: {purpose} needs one (a DSpark drafter)",
                          hint="train a dspark drafter with drafter.confidence_head: true, or use full verification")


def check_drafter_fits(target_config, drafter_config) -> None:
    """The drafter was built for this target: same vocabulary, hidden size, depth and feature layers."""
    cfg, dcfg = target_config, drafter_config
    if int(dcfg.vocab_size) != int(cfg.vocab_size):
        raise PdraftError(f"drafter was built for another target: vocabulary {dcfg.vocab_size} vs the target's "
                          f"{cfg.vocab_size}")
    hidden = int(getattr(dcfg, "target_hidden_size", None) or dcfg.hidden_size)
    if hidden != int(cfg.hidden_size):
        raise PdraftError(f"drafter was built for another target: hidden size {hidden} vs the target's "
                          f"{cfg.hidden_size}")
    layers = getattr(dcfg, "num_target_layers", None)
    if layers is not None and int(layers) != int(cfg.num_hidden_layers):
        raise PdraftError(f"drafter was built for another target: {layers} target layers vs the target's "
                          f"{cfg.num_hidden_layers}")
    try:
        check_layer_ids(dcfg.target_layer_ids, int(cfg.num_hidden_layers))
    except PdraftError as e:
        raise PdraftError(f"drafter was built for another target: {e.message}") from None


# ----------------------------------------------------------------------------------- verify policy


@dataclass
class VerifyConfig:
    """Verification-length policy of a decode run (pdraft.decode.scheduler applies it)."""

    mode: VerifyMode = "full"
    threshold: float = 0.0  # `threshold` mode: minimum cumulative survival probability, in [0, 1]
    sps: SpsTable | None = None  # `scheduler` mode: the profiled steps-per-second table
    # Optional STS calibration: per-position temperatures T_k, confidence = sigmoid(logit_k / T_k).
    confidence_temperatures: list[float] | None = None
    # Verify only the real tokens, sum(1 + l_r), in one packed row (pdraft.decode.target_runner.PackedVerifier);
    # False = the padded pass of batch * (1 + max l) tokens, kept as the reference the packed pass is tested
    # against.
    packed: bool = True
    # Seconds per round outside the verify step (drafting, context update): part of each round's cost that
    # shortening verification cannot save. 0 = the SPS table alone (the paper's Theta).
    round_overhead_s: float = 0.0
    early_stop: bool = field(default=True, repr=False)  # False ONLY for the negative-control test

    def __post_init__(self):
        check_verify_mode(self.mode)
        if self.mode == "threshold":
            check_number("confidence threshold", self.threshold, low=0.0, high=1.0)
        if self.mode == "scheduler" and self.sps is None:
            raise PdraftError("the prefix scheduler needs an SPS table (--scheduler SPS_JSON)")
        check_number("round overhead (seconds)", self.round_overhead_s, low=0.0)


# ----------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class DecodeSettings:
    """Everything that decides what a decode run outputs and how it verifies, checked on construction."""

    gamma: int | None = None  # draft tokens per round; None = the drafter's largest
    sampling: SamplingParams = field(default_factory=SamplingParams)  # temperature 0 = greedy
    max_new_tokens: int = 128
    seed: int = 0  # request i samples from a stream seeded from (seed, i) (pdraft.streams)
    verify: VerifyMode = "full"  # full | threshold | scheduler
    threshold: float = 0.5  # `threshold` mode: minimum cumulative survival probability
    sps_table: str | None = None  # `scheduler` mode: cost table; None = the one next to the drafter
    packed_verify: bool = True  # the packed verifier (sum of 1 + l tokens) rather than the padded one
    round_overhead_s: float = 0.0  # per-round seconds outside verification, for the scheduler's cost
    # The fused Triton sequential-head kernel for DSpark drafts (CUDA only); None = leave the drafter's switch.
    fused_kernels: bool | None = None
    denoise_steps: int | None = None  # if given, must equal the drafter's trained number
    batch_size: int = 1  # requests decoded together by a command (generate decodes what it is given)
    compile: str = "auto"  # auto | on | off: static caches and compiled passes (pdraft.decode.backend)

    def __post_init__(self):
        object.__setattr__(self, "sampling", check_sampling(self.sampling))
        if self.gamma is not None:  # its range is the drafter's: gamma_for
            check_number("gamma", self.gamma, integer=True)
        check_number("max-new-tokens", self.max_new_tokens, low=1, integer=True)
        check_number("--seed", self.seed, low=0, integer=True)
        check_verify_mode(self.verify)
        check_number("confidence threshold", self.threshold, low=0.0, high=1.0)
        check_number("round overhead (seconds)", self.round_overhead_s, low=0.0)
        if self.denoise_steps is not None:
            check_number("--denoise-steps", self.denoise_steps, low=1, integer=True)
        check_number("--batch-size", self.batch_size, low=1, integer=True)
        if self.compile not in COMPILE_MODES:
            raise PdraftError(f"unknown decode.compile {self.compile!r}: use auto, on or off")

    @classmethod
    def from_recipe(cls, recipe, command: str = "decode", **flags) -> DecodeSettings:
        """The settings `command` (decode | bench | calibrate) decodes with: its recipe section over the decode
        section, then every flag that is not None. Bench and calibration take sampling and the token budget
        from their own sections; calibration always verifies the full block (every drafted position must be
        an observation) and bench sweeps gamma itself; the verifier, the fused kernels, `compile` and the cost
        model come from the decode section for every command. `temperature`, `top_k` and `top_p` flags build the
        sampling; `seed` goes through run_seed (flag, then the section's seed, then decode.seed, then
        runtime.seed)."""
        if command not in COMMANDS:
            raise ValueError(f"unknown command {command!r}")
        d = recipe.decode
        values = dict(gamma=d.gamma, temperature=d.temperature, top_k=d.top_k, top_p=d.top_p,
                      max_new_tokens=d.max_new_tokens, verify=d.verify, threshold=d.threshold,
                      sps_table=d.sps_table, packed_verify=d.packed_verify,
                      round_overhead_s=d.round_overhead_ms / 1000, fused_kernels=d.fused_kernels,
                      batch_size=d.batch_size, compile=d.compile)
        if command == "bench":
            b = recipe.bench
            values.update(gamma=None, temperature=b.temperature, top_k=b.top_k, top_p=b.top_p,
                          max_new_tokens=b.max_new_tokens, batch_size=b.batch_size)
        elif command == "calibrate":
            c = recipe.calibrate
            values.update(gamma=c.gamma, temperature=c.temperature, top_k=0, top_p=1.0,
                          max_new_tokens=c.max_new_tokens, verify="full")
        seed = run_seed(recipe, flags.pop("seed", None), section="bench" if command == "bench" else "decode")
        values.update({k: v for k, v in flags.items() if v is not None})
        sampling = SamplingParams(temperature=values.pop("temperature"), top_k=values.pop("top_k"),
                                  top_p=values.pop("top_p"))
        return cls(sampling=sampling, seed=seed, **values)

    def replace(self, **changes) -> DecodeSettings:
        """A copy with `changes`, checked again."""
        return dataclasses.replace(self, **changes)

    def gamma_for(self, drafter, *, name: str = "gamma") -> int:
        """The gamma this run drafts with `drafter` (0 for the target alone): the setting, else the drafter's
        largest, within what the drafter drafts. `name` is the setting's name in the error."""
        if drafter is None:
            return 0
        gamma = self.gamma if self.gamma is not None else int(drafter.max_gamma())
        return check_gamma(gamma, drafter.max_gamma(), name=name)

    def verify_config(self, temperatures: list[float] | None = None, sps: SpsTable | None = None) -> VerifyConfig:
        """This run's verification policy with the drafter's calibration and cost table (policy.build_verify
        finds them)."""
        return VerifyConfig(mode=self.verify, threshold=self.threshold if self.verify == "threshold" else 0.0,
                            sps=sps if self.verify == "scheduler" else None,
                            confidence_temperatures=temperatures if self.verify != "full" else None,
                            packed=self.packed_verify,
                            round_overhead_s=self.round_overhead_s if self.verify == "scheduler" else 0.0)

    def check_drafter(self, target_config, drafter, verify: VerifyConfig | None = None) -> int:
        """Every way `drafter` can be wrong for this run, as one PdraftError; returns gamma_for(drafter)."""
        if drafter is None:
            return 0
        check_drafter_fits(target_config, drafter.config)
        gamma = self.gamma_for(drafter)
        trained = int(getattr(drafter.config, "denoise_steps", 1))
        if self.denoise_steps is not None and int(self.denoise_steps) != trained:
            raise PdraftError(
                f"this drafter was trained with {trained} denoise step(s) and must be decoded with {trained}: with "
                f"{self.denoise_steps} it refines blocks it never learned to refine, and acceptance collapses"
            )
        mode = verify.mode if verify is not None else self.verify
        if mode != "full":
            check_confidence(drafter.config, f"verification mode {mode!r}")
        return gamma
