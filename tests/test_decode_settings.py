"""DecodeSettings (pdraft.decode.settings): each command's precedence (flags over its recipe section over the
decode section; calibration verifies the full block but honours the verifier and fused-kernel choices), the
seed through run_seed, every numeric value refused when out of range or not finite, gamma's default and range
against the drafter; and the packed verifier chosen at construction: it registers its attention once, and a
plain forward of the model afterwards gives the very same logits as before."""

import math

import pytest
import torch

from doubles import DoubleConfig, RandomDrafter, tiny_target
from pdraft.policies.base import VerifyConfig, check_confidence
from pdraft.decode.settings import DecodeSettings
from pdraft.decode.target_runner import PackedVerifier, PaddedVerifier, make_verifier
from pdraft.errors import PdraftError
from pdraft.models.api import SamplingParams
from pdraft.recipe import load_recipe


def recipe(*overrides):
    return load_recipe(None, list(overrides))


def test_decode_flags_win_over_the_recipe():
    r = recipe("decode.temperature=0.7", "decode.gamma=6", "decode.verify=threshold", "decode.fused_kernels=true",
               "decode.packed_verify=false", "decode.threshold=0.7", "decode.seed=4")
    s = DecodeSettings.from_recipe(r, "decode")
    assert (s.gamma, s.sampling.temperature, s.verify, s.fused_kernels, s.packed_verify, s.seed) == (
        6, 0.7, "threshold", True, False, 4)
    assert math.isclose(s.knobs["threshold"], 0.7)
    s = DecodeSettings.from_recipe(recipe("decode.verify=scheduler", "decode.round_overhead_ms=2"), "decode")
    assert math.isclose(s.knobs["round_overhead_s"], 0.002)
    s = DecodeSettings.from_recipe(r, "decode", gamma=3, temperature=0.0, seed=9, verify="full", top_p=None)
    assert (s.gamma, s.sampling.temperature, s.seed, s.verify, s.sampling.top_p) == (3, 0.0, 9, "full", 1.0)


def test_bench_and_calibrate_read_their_own_sections():
    r = recipe("decode.temperature=0.7", "decode.max_new_tokens=50", "decode.verify=threshold",
               "decode.packed_verify=false", "decode.fused_kernels=true", "decode.seed=4",
               "bench.temperature=0.3", "bench.max_new_tokens=20", "bench.seed=8", "bench.batch_size=3",
               "calibrate.temperature=0.5", "calibrate.gamma=5", "calibrate.max_new_tokens=30")
    b = DecodeSettings.from_recipe(r, "bench")
    assert (b.sampling.temperature, b.max_new_tokens, b.seed, b.batch_size, b.gamma) == (0.3, 20, 8, 3, None)
    assert (b.verify, b.packed_verify, b.fused_kernels) == ("threshold", False, True)  # the decode section's
    c = DecodeSettings.from_recipe(r, "calibrate", batch_size=8)
    assert (c.sampling.temperature, c.gamma, c.max_new_tokens, c.seed, c.batch_size) == (0.5, 5, 30, 4, 8)
    # Every drafted position must be observed, so calibration verifies the full block, with the run's verifier.
    assert c.verify == "full" and c.packed_verify is False and c.fused_kernels is True
    assert c.verify_config() == VerifyConfig(packed=False)


def test_seed_falls_back_to_runtime_seed():
    assert DecodeSettings.from_recipe(recipe("runtime.seed=13"), "decode").seed == 13
    assert DecodeSettings.from_recipe(recipe("runtime.seed=13", "decode.seed=2"), "bench").seed == 2


@pytest.mark.parametrize("field, value, match", [
    ("temperature", float("nan"), "temperature: expected a finite number"),
    ("temperature", float("inf"), "temperature: expected a finite number"),
    ("temperature", -0.1, r"temperature: expected 0 \(greedy\) or a value in \[1e-06, 5\], found -0.1"),
    ("temperature", 1e-300, "1e-300 is below the smallest temperature pdraft samples at, 1e-06"),
    ("top_p", float("nan"), "top_p must be a finite number"),
    ("top_p", 0.0, r"top_p must be in \(0.0, 1.0\]"),
    ("top_k", -1, "top_k must be an integer >= 0"),
])
def test_sampling_values_are_refused(field, value, match):
    with pytest.raises(PdraftError, match=match):
        SamplingParams(**{field: value})
    changed = SamplingParams(temperature=1.0)
    setattr(changed, field, value)  # changed after it was checked: the run checks it again
    with pytest.raises(PdraftError, match=match):
        DecodeSettings(sampling=changed)


@pytest.mark.parametrize("changes, match", [
    ({"max_new_tokens": 0}, "max-new-tokens must be >= 1"),
    ({"max_new_tokens": 2.5}, "max-new-tokens must be an integer"),
    ({"seed": -1}, "--seed must be >= 0"),
    ({"knobs": {"threshold": float("nan")}}, "confidence threshold must be a finite number"),
    ({"knobs": {"threshold": 1.5}}, r"confidence threshold must be in \[0.0, 1.0\]"),
    ({"knobs": {"round_overhead_s": float("inf")}}, "round overhead"),
    ({"batch_size": 0}, "--batch-size must be >= 1"),
    ({"gamma": float("nan")}, "gamma must be an integer"),
    ({"verify": "greedy"}, "unknown verification mode"),
    ({"denoise_steps": 0}, "--denoise-steps must be >= 1"),
])
def test_run_values_are_refused(changes, match):
    with pytest.raises(PdraftError, match=match):
        DecodeSettings(**changes)
    with pytest.raises(PdraftError, match=match):  # a copy is checked again
        DecodeSettings().replace(**changes)


def test_gamma_default_and_range_follow_the_drafter():
    drafter = RandomDrafter(DoubleConfig(64, 32, [0, 1], block_size=8))
    assert DecodeSettings().gamma_for(drafter) == drafter.max_gamma()
    assert DecodeSettings(gamma=3).gamma_for(drafter) == 3
    assert DecodeSettings(gamma=3).gamma_for(None) == 0
    with pytest.raises(PdraftError, match="calibrate.gamma 9 is out of range: this drafter drafts 1..8"):
        DecodeSettings(gamma=9).gamma_for(drafter, name="calibrate.gamma")


def test_a_mode_that_reads_confidence_needs_the_head():
    drafter = RandomDrafter(DoubleConfig(64, 32, [0, 1], block_size=8, has_confidence=False))
    target = tiny_target(64, 32, num_layers=3)
    with pytest.raises(PdraftError, match="this drafter has no confidence head: verification mode 'threshold'"):
        DecodeSettings(verify="threshold").check_drafter(target.config, drafter)
    assert DecodeSettings().check_drafter(target.config, drafter) == drafter.max_gamma()
    with pytest.raises(PdraftError, match="no confidence head: calibrate-threshold needs one"):
        check_confidence(drafter.config, "calibrate-threshold")


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_packed_attention_is_installed_once_and_changes_no_other_forward(kernel):
    model = tiny_target(64, 32, num_layers=3, seed=2)
    model.config._attn_implementation = kernel
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0  # left padding: the mask is built from this 2D mask
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        assert isinstance(make_verifier(model, packed=False), PaddedVerifier)
        assert model.config._attn_implementation == kernel  # the padded verifier registers nothing
        first = PackedVerifier(model)
        name = model.config._attn_implementation
        assert name.startswith("pdraft_packed") and first.attention == name
        assert PackedVerifier(model).attention == name  # a second verifier finds it installed
        after = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_the_recipe_tree_is_the_flag_rule_and_reaches_decode_and_bench_only():
    """`decode.tree` is read by the --tree flag's rule (pdraft.policies.parse_tree: "8" takes the width the flag
    would), the resolved copy records that width; decode and bench take it and a flag wins over it; calibration
    verifies a chain whatever the recipe says (it observes per-position acceptance)."""
    from pdraft.policies import parse_tree
    from pdraft.recipe import dump_resolved

    assert recipe().decode.tree is None and DecodeSettings.from_recipe(recipe(), "decode").tree is None
    for text in ("8", "8x2", "32", " 32X4 ", "1"):
        r = recipe(f"decode.tree={text}")
        assert DecodeSettings.from_recipe(r, "decode").tree == parse_tree(text), text
        assert r.decode.tree == "{}x{}".format(*parse_tree(text))
    r = recipe("decode.tree=8")
    assert "tree: 8x4" in dump_resolved(r)
    assert DecodeSettings.from_recipe(r, "decode", tree=(16, 2)).tree == (16, 2)  # the flag wins
    assert DecodeSettings.from_recipe(r, "bench").tree == (8, 4)
    assert DecodeSettings.from_recipe(r, "bench", tree=(6, 3)).tree == (6, 3)
    assert DecodeSettings.from_recipe(r, "calibrate").tree is None
    assert DecodeSettings.from_recipe(r, "calibrate", batch_size=4).verify == "full"
    assert DecodeSettings.from_recipe(recipe("decode.tree=null"), "decode").tree is None


@pytest.mark.parametrize("value, match", [
    ("big", "decode.tree: 'big': give a node budget (32) or a budget and a width (32x4)"),
    ("0", "decode.tree: nodes must be in [1, 256], got 0"),
    ("257", "decode.tree: nodes must be in [1, 256], got 257"),
    ("3x4", "decode.tree: width must be in [1, 3], got 4"),
    ("8x2x1", "decode.tree: '8x2x1': give a node budget"),
    ("1.5", "decode.tree: expected a node budget (32) or a budget and a width (32x4), got 1.5"),
    ("true", "decode.tree: expected a node budget"),
])
def test_a_malformed_recipe_tree_is_one_line_at_load(value, match):
    from pdraft.errors import RecipeError

    with pytest.raises(RecipeError) as e:
        recipe(f"decode.tree={value}")
    assert match in str(e.value) and "\n" not in str(e.value)


def test_a_recipe_tree_with_a_policy_that_does_not_verify_every_node_is_one_line():
    """As `--tree 8 --verify threshold` is: the registry says which policies verify trees (PolicySpec.trees);
    a --verify full flag over the recipe's policy decodes the tree, and calibration, which verifies a chain, runs."""
    r = recipe("decode.tree=8", "decode.verify=threshold")
    for command in ("decode", "bench"):
        with pytest.raises(PdraftError) as e:
            DecodeSettings.from_recipe(r, command)
        assert "cannot run with --verify threshold (decode.verify)" in e.value.message and "\n" not in e.value.message
    assert DecodeSettings.from_recipe(r, "decode", verify="full").tree == (8, 4)
    assert DecodeSettings.from_recipe(r, "calibrate").tree is None
