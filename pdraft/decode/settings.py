"""The settings of a decode run, resolved once: `DecodeSettings.from_recipe(recipe, command, **flags)` reads the recipe
section a command decodes with (decode, bench or calibrate), lets the command's flags win, takes the seed from
`run_seed`, checks every value, and the one object goes down to `generate` (pdraft.decode.engine) from
`pdraft decode`, bench, calibrate-threshold and the quickstart alike. Every range of a decode run is checked here: gamma
(1..MAX_GAMMA, at most what the drafter drafts, default the drafter's largest), sampling (temperature, top-k,
top-p), the seed, the token budget, the verification policy (a registered one: pdraft.policies; `verify_config`
builds its `VerifyConfig` from what its entry reads), the fused kernels, the denoise steps, the batch size, the tree
(its shape rule is the registry's: pdraft.policies.parse_tree) and `compile` (static caches and compiled passes,
pdraft.decode.backend); and the checks that a drafter fits the run: it was built for this target (the one rule,
pdraft.models.dims.check_fits_target), it has the confidence head its verification policy needs, it is decoded with
the denoise steps it learned. A number that is not finite (nan, inf) is refused like one out of range. The defaults
are the recipe's `decode` section's (a Python caller that passes nothing decodes as a recipe that leaves the keys
out), the gamma ceiling is pdraft.models.family's, and the verification policies' own settings (threshold, round
overhead) are their registry's knobs (pdraft.policies.Knob: recipe key, range, default), carried in one mapping,
`knobs`, that a new policy's knob joins without an edit here. Only the files that sit next to a drafter (its STS
calibration and cost table) are found later, per drafter, by `build_verify` (pdraft.calibration_files).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pdraft.calibration_files import policy_files
from pdraft.errors import PdraftError, check_number
from pdraft.models.api import SamplingParams
from pdraft.models.sampling import is_greedy
from pdraft.models.dims import check_fits_target
from pdraft.models.family import MAX_GAMMA
from pdraft.models.families import FAMILIES
from pdraft.policies import (CALIBRATION, COST_TABLE, FULL, POLICIES, Knob, PolicySpec, check_tree, knob_values, knobs,
                             parse_tree, policy_spec)
from pdraft.policies.base import VerifyConfig, check_confidence
from pdraft.policies.cost import SpsTable
from pdraft.recipe import DecodeSection
from pdraft.streams import run_seed

COMMANDS = ("decode", "bench", "calibrate")
COMPILE_MODES = ("auto", "on", "off")  # pdraft.decode.backend says what each runs
DRAFT_SAMPLE_METHODS = ("probabilistic", "greedy")  # vLLM's names (vllm/config/speculative.py DraftSampleMethod)


def _default(key: str):
    """The recipe's default of `decode.<key>`: the one definition of a decode run's defaults."""
    return DecodeSection.model_fields[key].default


# ------------------------------------------------------------------------------------------- checks


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


# ----------------------------------------------------------------------------------------- settings


def _refuse_settings_of_other_policies(spec: PolicySpec, knob_flags: dict) -> None:
    """A flag given for a setting that only other policies read (`--threshold 0.5 --verify estimator`) is refused in
    one line naming both, never dropped: the registry (pdraft.policies) says which policy reads which setting."""
    for knob in knobs():
        value = knob_flags.get(knob.key)
        readers = [p.name for p in POLICIES if knob in p.knobs]
        if value is not None and knob not in spec.knobs:
            raise PdraftError(f"{knob.flag} {value:g} is a setting of the {' / '.join(readers)} policy, "
                              f"but this run verifies with {spec.name} ({spec.title}), which does not read it",
                              hint=f"drop {knob.flag}, or verify with {readers[0]}")


def _refuse_settings_the_policy_drops(recipe, spec: PolicySpec, *, verify_flag: bool, sps_flag: bool,
                                      sps_table) -> None:
    """A decode run's settings that its policy cannot use, refused in one line, never dropped (issue 60): a cost
    table (--sps-table, decode.sps_table) for a policy that reads none, and a recipe's own policy setting
    (decode.threshold, decode.round_overhead_ms, written in the recipe with another value than the default) that
    the recipe's own decode.verify does not read. A recipe key is refused only when the recipe also chose the policy: a --verify flag choosing
    another policy for one run leaves the recipe's setting for the runs it was written for."""
    if sps_table is not None and COST_TABLE not in spec.files and (sps_flag or not verify_flag):
        readers = " / ".join(p.name for p in POLICIES if COST_TABLE in p.files)
        given = "--sps-table" if sps_flag else "decode.sps_table"
        raise PdraftError(f"{given} {sps_table} is the cost table of the {readers} policy, but this run verifies "
                          f"with {spec.name} ({spec.title}), which reads none",
                          hint=f"drop {given}, or verify with {readers.split(' / ')[0]}")
    if verify_flag:
        return
    written = recipe.decode.written(knob.key for knob in knobs())
    for knob in knobs():
        if knob.key in written and knob not in spec.knobs:
            readers = [p.name for p in POLICIES if knob in p.knobs]
            raise PdraftError(f"decode.{knob.key} {getattr(recipe.decode, knob.key):g} is a setting of the "
                              f"{' / '.join(readers)} policy, but the recipe verifies with {spec.name} "
                              f"({spec.title}), which does not read it",
                              hint=f"drop decode.{knob.key}, or set decode.verify: {readers[0]}")


@dataclass(frozen=True)
class DecodeSettings:
    """Everything that decides what a decode run outputs and how it verifies, checked on construction."""

    gamma: int | None = None  # draft tokens per round; None = the drafter's largest
    sampling: SamplingParams = field(default_factory=SamplingParams)  # temperature 0 = greedy
    # How drafts are drawn when sampling: "probabilistic" from the drafter's distribution, "greedy" its argmax
    # tested as a one-hot distribution (pdraft.decode.acceptance takes both exactly; vLLM's draft_sample_method).
    draft_sample_method: str = _default("draft_sample_method")
    max_new_tokens: int = _default("max_new_tokens")
    seed: int = 0  # request i samples from a stream seeded from (seed, i) (pdraft.streams)
    verify: str = _default("verify")  # a registered verification policy (pdraft.policies)
    # The verification policies' own settings (pdraft.policies.Knob.setting -> value: "threshold", "round_overhead_s",
    # each with its recipe key and range): every registered knob, at its default where not given; `knob(K)` reads one.
    knobs: Mapping[str, float] = field(default_factory=dict)
    sps_table: str | None = None  # cost table of the policies that read one; None = the one next to the drafter
    packed_verify: bool = _default("packed_verify")  # the packed verifier (sum of 1 + l tokens), not the padded
    # The fused Triton sequential-head kernel for DSpark drafts (CUDA only); None = leave the drafter's switch.
    fused_kernels: bool | None = None
    denoise_steps: int | None = None  # if given, must equal the drafter's trained number
    batch_size: int = _default("batch_size")  # requests decoded together by a command (generate: all it gets)
    compile: str = _default("compile")  # auto | on | off: static caches and compiled passes (pdraft.decode.backend)
    # Tree verification (pdraft.models.tree, pdraft.decode.tree_accept): (node budget, width) of the tree each
    # round drafts from one parallel pass and verifies in one target pass; None = a chain of gamma drafts.
    tree: tuple[int, int] | None = None
    policy: PolicySpec = field(init=False, repr=False, compare=False)  # the registry entry of `verify`, resolved once

    def __post_init__(self):
        object.__setattr__(self, "sampling", check_sampling(self.sampling))
        if self.gamma is not None:  # its range is the drafter's: gamma_for
            check_number("gamma", self.gamma, integer=True)
        check_number("max-new-tokens", self.max_new_tokens, low=1, integer=True)
        check_number("--seed", self.seed, low=0, integer=True)
        object.__setattr__(self, "policy", policy_spec(self.verify))
        object.__setattr__(self, "knobs", knob_values(self.knobs, knobs()))
        if self.denoise_steps is not None:
            check_number("--denoise-steps", self.denoise_steps, low=1, integer=True)
        check_number("--batch-size", self.batch_size, low=1, integer=True)
        if self.compile not in COMPILE_MODES:
            raise PdraftError(f"unknown decode.compile {self.compile!r}: use auto, on or off")
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise PdraftError(f"unknown decode.draft_sample_method {self.draft_sample_method!r}: use "
                              f"{' or '.join(DRAFT_SAMPLE_METHODS)}")
        if self.tree is not None and self.draft_sample_method == "greedy" and not is_greedy(self.sampling):
            raise PdraftError("decode.draft_sample_method greedy draws each round's drafts as the drafter's argmax: "
                              "a sampled tree (--tree at temperature > 0) draws its children from the drafter's "
                              "distribution, so it would not read it",
                              hint="drop the tree (decode.tree: null), or decode.draft_sample_method: probabilistic")
        if self.tree is not None:
            object.__setattr__(self, "tree", check_tree(self.tree))
            if not self.policy.trees:  # the registry says which policies verify a tree (pdraft.policies)
                raise PdraftError(f"tree verification (--tree, decode.tree) verifies every node of the tree: it "
                                  f"cannot run with --verify {self.verify} (decode.verify)",
                                  hint=f"verify with {' or '.join(p.name for p in POLICIES if p.trees)}, or decode "
                                       "a chain (no --tree, decode.tree: null)")

    @classmethod
    def from_recipe(cls, recipe, command: str = "decode", **flags) -> DecodeSettings:
        """The settings `command` (decode | bench | calibrate) decodes with: its recipe section over the decode
        section, then every flag that is not None. Bench and calibration take sampling and the token budget
        from their own sections; calibration always verifies the full block of a chain (every drafted position
        must be an observation, so `decode.verify` and `decode.tree` do not reach it) and bench sweeps gamma
        itself; the verifier, the fused kernels, `compile` and the cost model come from the decode section for
        every command, and so does the tree for decode and bench (`decode.tree` through parse_tree, the `--tree`
        flag's rule; bench runs it beside each drafter's chain: pdraft.bench.session). `temperature`, `top_k`
        and `top_p` flags build the sampling; `seed` goes through run_seed (flag, then the section's seed, then decode.seed, then
        runtime.seed); `knob_flags` maps a policy setting's recipe key (pdraft.policies.Knob.key) to its flag's
        value in the recipe's unit, None where the flag was not given."""
        if command not in COMMANDS:
            raise ValueError(f"unknown command {command!r}")
        d = recipe.decode
        values = dict(gamma=d.gamma, temperature=d.temperature, top_k=d.top_k, top_p=d.top_p,
                      draft_sample_method=d.draft_sample_method,
                      max_new_tokens=d.max_new_tokens, verify=d.verify, sps_table=d.sps_table,
                      packed_verify=d.packed_verify, fused_kernels=d.fused_kernels, batch_size=d.batch_size,
                      compile=d.compile, knobs={knob.setting: knob.from_recipe(d) for knob in knobs()},
                      tree=parse_tree(d.tree, name="decode.tree") if d.tree is not None else None)
        if command == "bench":
            b = recipe.bench
            values.update(gamma=None, temperature=b.temperature, top_k=b.top_k, top_p=b.top_p,
                          max_new_tokens=b.max_new_tokens, batch_size=b.batch_size)
        elif command == "calibrate":
            c = recipe.calibrate
            values.update(gamma=c.gamma, temperature=c.temperature, top_k=0, top_p=1.0,
                          max_new_tokens=c.max_new_tokens, verify=FULL, tree=None)
        seed = run_seed(recipe, flags.pop("seed", None), section="bench" if command == "bench" else "decode")
        knob_flags = {key: value for key, value in flags.pop("knob_flags", {}).items() if value is not None}
        values.update({k: v for k, v in flags.items() if v is not None})
        by_key = {knob.key: knob for knob in knobs()}
        values["knobs"].update({by_key[key].setting: by_key[key].from_flag(value) for key, value in knob_flags.items()})
        _refuse_settings_of_other_policies(policy_spec(values["verify"]), knob_flags)
        if command == "decode":
            for flag, key, off in (("--top-k", "top_k", 0), ("--top-p", "top_p", 1.0)):
                if values["temperature"] == 0 and flags.get(key) is not None and flags[key] != off:
                    raise PdraftError(f"{flag} {flags[key]:g} is a sampling setting, but this run is greedy "
                                      f"(temperature 0), which does not read it",
                                      hint=f"drop {flag}, or sample with --temperature > 0")
            _refuse_settings_the_policy_drops(recipe, policy_spec(values["verify"]),
                                              verify_flag=flags.get("verify") is not None,
                                              sps_flag=flags.get("sps_table") is not None, sps_table=values["sps_table"])
        sampling = SamplingParams(temperature=values.pop("temperature"), top_k=values.pop("top_k"),
                                  top_p=values.pop("top_p"))
        return cls(sampling=sampling, seed=seed, **values)

    def replace(self, **changes) -> DecodeSettings:
        """A copy with `changes`, checked again."""
        return dataclasses.replace(self, **changes)

    def knob(self, knob: Knob) -> float:
        """The value of a verification policy's own setting (pdraft.policies.Knob), read by its policy."""
        return self.knobs[knob.setting]

    def gamma_for(self, drafter, *, name: str = "gamma") -> int:
        """The gamma this run drafts with `drafter` (0 for the target alone): the setting, else the drafter's
        largest, within what the drafter drafts. `name` is the setting's name in the error."""
        if drafter is None:
            return 0
        gamma = self.gamma if self.gamma is not None else int(drafter.max_gamma())
        return check_gamma(gamma, drafter.max_gamma(), name=name)

    def build_verify(self, *, drafter_dir: str | Path | None = None, device=None,
                     warn: Callable[[str], None] | None = None) -> tuple[VerifyConfig, dict]:
        """(VerifyConfig, provenance) of this run for the drafter in `drafter_dir`: the files its policy reads
        found beside the drafter (pdraft.calibration_files.policy_files; `sps_table` wins over the one found),
        so a calibrated drafter is used calibrated without extra flags. Provenance names the files used."""
        temps, sps, used = policy_files(self.policy, drafter_dir, sps_table=self.sps_table,
                                        device=device, warn=warn)
        return self.verify_config(temps, sps), used

    def verify_config(self, temperatures: list[float] | None = None, sps: SpsTable | None = None) -> VerifyConfig:
        """This run's verification policy with the drafter's calibration and cost table (build_verify finds
        them): each setting and file only where the policy's registry entry says it reads it."""
        spec = self.policy
        return VerifyConfig(mode=self.verify, sps=sps if COST_TABLE in spec.files else None,
                            confidence_temperatures=temperatures if CALIBRATION in spec.files else None,
                            packed=self.packed_verify, knobs={knob.setting: self.knob(knob) for knob in spec.knobs})

    def check_drafter(self, target_config, drafter, verify: VerifyConfig | None = None) -> int:
        """Every way `drafter` can be wrong for this run, as one PdraftError; returns gamma_for(drafter)."""
        if drafter is None:
            return 0
        check_fits_target(drafter.config, target_config)
        gamma = self.gamma_for(drafter)
        trained = int(getattr(drafter.config, "denoise_steps", 1))
        if self.denoise_steps is not None and int(self.denoise_steps) != trained:
            raise PdraftError(
                f"this drafter was trained with {trained} denoise step(s) and must be decoded with {trained}: with "
                f"{self.denoise_steps} it refines blocks it never learned to refine, and acceptance collapses"
            )
        if self.tree is not None and FAMILIES.of(drafter.config).drafting != "parallel":
            raise PdraftError(f"tree verification drafts from one parallel pass: {FAMILIES.of(drafter.config).title} "
                              "drafts a chain", hint="use a DFlash, DSpark or DFlash2 drafter, or decode a chain "
                                                              "(no --tree, decode.tree: null)")
        policy = verify.spec if verify is not None else self.policy
        if policy.needs_confidence:
            check_confidence(drafter.config, f"verification mode {policy.name!r}")
        return gamma
