"""Each rule is written once (issue 27), and a second definition fails here: the gamma ceiling (MAX_GAMMA in
pdraft/models/family.py), the drafter families (named only in their own folders, pdraft/models/<kind>/, and by
the backbone config they extend), the verification policies (listed only in pdraft/policies/__init__.py),
the drafter-fits-target rule (pdraft/models/dims.py), DFlash2's served-block rule (its config's, which the
recipe asks) and the decode defaults (the recipe's `decode` section, which DecodeSettings reads). The scanners
read the package's source with `ast` (docstrings are descriptions, not rules, and are skipped); each is also
run on a small source holding a second definition, which it must find."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pdraft.errors import PdraftError
from pdraft.models.family import MAX_GAMMA
from pdraft.models.families import FAMILIES
from pdraft.policies import NAMES as POLICY_NAMES

PACKAGE = Path(__file__).resolve().parents[1] / "pdraft"
CEILING_HOME = "pdraft/models/family.py"


def sources(package: Path = PACKAGE):
    for path in sorted(package.rglob("*.py")):
        yield path.relative_to(package.parent).as_posix(), path.read_text()


def _docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.add(id(body[0].value))
    return out


def _parents(tree) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def ceiling_copies(files) -> list[str]:
    """Places besides the home that define the gamma ceiling again: an assignment to a MAX_*GAMMA* or
    MAX_*BLOCK* name, or the number itself (not as a factor of a product) in a statement about gamma or a block
    size (a range bound, a default, a comparison)."""
    found = []
    for rel, text in files:
        if rel == CEILING_HOME:
            continue
        tree = ast.parse(text)
        parents = _parents(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and re.fullmatch(r"MAX_\w*(GAMMA|BLOCK)\w*", t.id):
                        found.append(f"{rel}:{node.lineno}: {t.id} = ...")
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value == MAX_GAMMA \
                    and not isinstance(parents.get(id(node)), ast.BinOp):
                stmt = node
                while not isinstance(stmt, ast.stmt):
                    stmt = parents[id(stmt)]
                if re.search(r"gamma|block_size", ast.get_source_segment(text, stmt) or "", re.I):
                    found.append(f"{rel}:{node.lineno}: {MAX_GAMMA} in a gamma/block rule")
    return list(dict.fromkeys(f.split(": ")[0] for f in found))  # one entry per line


def kind_names(files, kinds=FAMILIES.kinds) -> list[str]:
    """String constants naming a family outside the families' folders and the backbone config they extend."""
    found = []
    for rel, text in files:
        if rel == "pdraft/models/dflash/config.py" or any(rel.startswith(f"pdraft/models/{k}/") for k in kinds):
            continue
        tree = ast.parse(text)
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in docs and node.value in kinds:
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def policy_lists(files, names=POLICY_NAMES) -> list[str]:
    """Lists, tuples, sets or Literal[...] holding two or more policy names outside the policy registry."""
    found = []
    for rel, text in files:
        if rel == "pdraft/policies/__init__.py":
            continue
        for node in ast.walk(ast.parse(text)):
            elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else None
            if isinstance(node, ast.Subscript):
                inner = node.slice
                elts = inner.elts if isinstance(inner, ast.Tuple) else [inner]
            named = [e.value for e in elts or [] if isinstance(e, ast.Constant) and e.value in names]
            if len(set(named)) >= 2:
                found.append(f"{rel}:{node.lineno}")
    return list(dict.fromkeys(found))  # a Literal's tuple is seen once


def fit_rules(files) -> list[str]:
    """Modules that refuse a drafter for another target (the one rule: pdraft/models/dims.py)."""
    return sorted({rel for rel, text in files
                   if re.search(r"(does not fit the target|built for another target)", text)
                   and not rel.startswith("tests/")})


# ---- the package as it stands --------------------------------------------------------------------------------
def test_the_gamma_ceiling_is_written_once():
    assert ceiling_copies(sources()) == []


def test_families_are_named_only_in_their_folders():
    assert kind_names(sources()) == []


def test_policies_are_listed_only_in_their_registry():
    assert policy_lists(sources()) == []


def test_the_fits_target_rule_is_written_once():
    assert fit_rules(sources()) == ["pdraft/models/dims.py"]


def test_recipe_choices_come_from_the_registries():
    from typing import get_args

    from pdraft.recipe import DecodeSection, DrafterSection

    assert get_args(DrafterSection.model_fields["kind"].annotation) == FAMILIES.kinds
    assert get_args(DecodeSection.model_fields["verify"].annotation) == POLICY_NAMES
    for family in FAMILIES:  # each family's keys are the recipe's, with their ranges
        for section, fields in (("drafter", family.drafter_fields), ("train", family.train_fields)):
            from pdraft.recipe import SECTIONS
            assert set(fields) <= set(SECTIONS[section].model_fields), (family.kind, section)


def test_decode_defaults_are_the_recipes():
    """DecodeSettings takes every default it shares with the recipe's decode section from that section: equal
    values, and no literal of its own in its source."""
    import dataclasses

    from pdraft.decode.settings import DecodeSettings
    from pdraft.recipe import DecodeSection

    shared = {"max_new_tokens": "max_new_tokens", "verify": "verify",
              "packed_verify": "packed_verify", "batch_size": "batch_size"}
    settings, section = DecodeSettings(), DecodeSection()
    for ours, theirs in shared.items():
        assert getattr(settings, ours) == getattr(section, theirs), ours
    assert settings.knobs == {"threshold": section.threshold, "round_overhead_s": section.round_overhead_ms / 1000}
    text = (PACKAGE / "decode" / "settings.py").read_text()
    cls = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef) and n.name == "DecodeSettings")
    literals = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Constant)
                and n.target.id in (*shared, "threshold", "round_overhead_s")]
    assert literals == [], f"DecodeSettings writes its own default for {literals}"
    assert {f.name for f in dataclasses.fields(DecodeSettings)} >= set(shared)


def test_dflash2_rules_are_the_configs():
    """The recipe refuses a DFlash2 block the engines cannot serve with the reason DFlash2Config gives."""
    from pdraft.models.dflash2.config import DFlash2Config
    from pdraft.recipe import load_recipe

    base = dict(hidden_size=32, vocab_size=97, num_target_layers=4, target_layer_ids=[0, 2], mask_token_id=96,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48)
    for recipe_keys, config_keys in ((["drafter.denoise_steps=2"], dict(denoise_steps=2)),
                                     (["drafter.num_experts=4"], dict(num_experts=4)),
                                     (["drafter.block_size=2", "drafter.conv_kernel_size=3"],
                                      dict(block_size=2, conv_kernel_size=3))):
        with pytest.raises(PdraftError) as from_config:
            DFlash2Config(**base, **config_keys)
        with pytest.raises(PdraftError) as from_recipe:
            load_recipe(None, ["drafter.kind=dflash2", *recipe_keys])
        reason = from_config.value.message.removeprefix("invalid dflash2 drafter config: ")
        assert reason in from_recipe.value.message, (reason, from_recipe.value.message)


def test_a_drafter_setting_has_one_range():
    """The recipe key and the config.json field of each drafter setting refuse the same value just past its one
    Limit (issue 33: selector_top_k was capped at 1,024 by the recipe but 4,096 by the config schema, block_size at
    32 by one and 64 by the other), and the config's refusal names the field."""
    from pdraft.models import schema
    from pdraft.models.dflash.config import LIMITS, RECIPE_KEYS
    from pdraft.models.dflash2.config import LIMITS as DFLASH2_LIMITS
    from pdraft.models.eagle3.config import LIMITS as EAGLE3_LIMITS
    from pdraft.recipe import load_recipe

    recipe_key = {field: key for key, field in RECIPE_KEYS.items()}
    settings = [(name, limit, "dspark") for name, limit in LIMITS.items()]
    settings += [(name, limit, "dflash2") for name, limit in DFLASH2_LIMITS.items()]
    settings += [(name, limit, "eagle3") for name, limit in EAGLE3_LIMITS.items()]
    assert {"block_size", "selector_top_k", "ttt_steps"} <= {name for name, _, _ in settings}
    for name, limit, kind in settings:
        value = int(limit.high) + 1
        place = ("" if name in schema.DRAFTER else "pdraft." if name in schema.PDRAFT else "dflash_config.")
        assert name in {"": schema.DRAFTER, "pdraft.": schema.PDRAFT}.get(place, schema.OBJECTS.get(place, {}))
        data = {"vocab_size": 1 << 22, **({name: value} if not place else {place.rstrip("."): {name: value}})}
        with pytest.raises(PdraftError, match=re.escape(f"{place}{name}")):
            schema.check_drafter_config(data)
        with pytest.raises(PdraftError):
            load_recipe(None, [f"drafter.kind={kind}", f"drafter.{recipe_key.get(name, name)}={value}"])


def test_a_config_built_in_python_has_the_same_ranges_and_saves_what_loads(tmp_path):
    """Each family's config refuses, on construction, the value just past each of its settings' Limits (the
    one range the recipe and the config.json schema read, test above) naming the field, takes the bound itself
    where the config's other rules allow it, and holds no Limit the config class does not check (issue 43:
    denoise_steps was checked only >= 1 against Limit(1, 16), selector_top_k up to the vocabulary against a Limit
    of 1,024). A config changed after construction is refused by save_drafter, as load_config would refuse it."""
    import dataclasses

    from pdraft.models.build import build_drafter
    from pdraft.models.checkpoint import save_drafter
    from test_models_support import tiny_target_config

    target_config = tiny_target_config()
    for family in FAMILIES:
        cls = family.config
        base = build_drafter(family.kind, target_config, seed=0,
                             **({"mask_token_id": 0, "num_hidden_layers": 1} if family.kind != "eagle3" else {})).config
        assert set(cls.limits) <= {f.name for f in dataclasses.fields(cls)}, family.kind
        for name, limit in cls.limits.items():
            above = limit.high + 1
            with pytest.raises(PdraftError, match=re.escape(name)):
                cls.from_dict({**base.to_dict(), name: above})
        assert cls.from_dict(base.to_dict()).to_dict() == base.to_dict()  # the round trip, one base for all
    drafter = build_drafter("dspark", target_config, seed=0, mask_token_id=0, num_hidden_layers=1)
    drafter.config.denoise_steps = 17  # past its Limit after construction
    with pytest.raises(PdraftError, match="denoise_steps"):
        save_drafter(drafter, tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_a_config_built_in_python_and_the_schema_agree_on_the_backbone():
    """Every family's config takes, for each backbone field config.json holds at its top level (depth, width,
    MLP width, heads, block, mask token), the very Limit the config.json schema reads, and so refuses on
    construction the values the schema refuses at load, naming the field (issue 43: Eagle3Config(hidden_size=4)
    was built and saved, then refused by check_drafter_config with "expected a value in 8..65536")."""
    import dataclasses

    from pdraft.models import schema
    from pdraft.models.build import build_drafter
    from test_models_support import tiny_target_config

    target_config = tiny_target_config()
    for family in FAMILIES:
        cls = family.config
        base = build_drafter(family.kind, target_config, seed=0,
                             **({"mask_token_id": 0, "num_hidden_layers": 1} if family.kind != "eagle3" else {})
                             ).config.to_dict()
        top = [name for name in schema.TOP if name in {f.name for f in dataclasses.fields(cls)}]
        assert {"num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads"} <= set(top), family.kind
        for name in top:
            assert name in cls.limits, f"{family.kind}: {name} has no Limit, the schema's {schema.DRAFTER[name]}"
            assert cls.limits[name].schema_entry() == schema.DRAFTER[name], (family.kind, name)
            _, low, high, off = schema.DRAFTER[name]
            for value in (low - 1, high + 1):
                assert value != off
                with pytest.raises(PdraftError, match=re.escape(f"{name} is {value}")):
                    schema.check_drafter_config({name: value})
                with pytest.raises(PdraftError, match=re.escape(name)):
                    cls.from_dict({**base, name: value})


# ---- each scanner finds a second definition -----------------------------------------------------------------
def test_the_scanners_find_second_definitions():
    copy = [("pdraft/decode/settings.py", f"MAX_GAMMA = {MAX_GAMMA}\n"),
            ("pdraft/recipe.py", f"gamma: int = F(None, 'x', ge=1, le={MAX_GAMMA})\n"),
            ("pdraft/lifecycle.py", f"if d.block_size < {MAX_GAMMA}:\n    pass\n"),
            ("pdraft/bench/stream.py", f"LIMIT = 32 * MAX_GAMMA  # a factor, not the ceiling\n")]
    assert ceiling_copies(copy) == ["pdraft/decode/settings.py:1", "pdraft/recipe.py:1", "pdraft/lifecycle.py:1"]
    kinds = [("pdraft/train/loop.py", '"""A docstring may say dspark."""\nif cfg.kind == "dspark":\n    pass\n'),
             ("pdraft/models/dspark/family.py", 'KIND = "dspark"\n')]
    assert kind_names(kinds) == ["pdraft/train/loop.py:2: 'dspark'"]
    lists = [("pdraft/decode/settings.py", 'VERIFY_MODES = ("full", "threshold", "scheduler")\n'),
             ("pdraft/recipe.py", 'verify: Literal["full", "threshold"] = "full"\n'),
             ("pdraft/policies/__init__.py", 'NAMES = ("full", "threshold")\n')]
    assert policy_lists(lists) == ["pdraft/decode/settings.py:1", "pdraft/recipe.py:1"]
    fits = [("pdraft/models/dims.py", "bad('drafter does not fit the target: x')\n"),
            ("pdraft/decode/settings.py", "raise PdraftError('drafter was built for another target: y')\n")]
    assert fit_rules(fits) == ["pdraft/decode/settings.py", "pdraft/models/dims.py"]


def test_a_policy_setting_has_one_range():
    """Each verification policy's own setting (pdraft.policies.Knob: the threshold, the round overhead) has one
    range: the recipe key, the `pdraft decode` flag, DecodeSettings and VerifyConfig refuse the value just past
    it and take the bound itself; and no module outside the registry writes the check again (issue 43: the
    threshold range and the round-overhead check were written three times)."""
    from pdraft.cli.common import check_flags
    from pdraft.decode.settings import DecodeSettings
    from pdraft.policies import knobs
    from pdraft.policies.base import VerifyConfig
    from pdraft.recipe import DecodeSection, load_recipe

    assert {knob.key for knob in knobs()} == {"threshold", "round_overhead_ms"}
    for knob in knobs():
        assert DecodeSection.model_fields[knob.key].default == knob.default
        for value, ok in ((knob.high, True), (knob.low, True), (knob.high * 1.5 + 1, False), (knob.low - 1, False)):
            setting = value / knob.per
            attempts = [lambda: load_recipe(None, [f"decode.{knob.key}={value}"]),
                        lambda: check_flags(DecodeSection, {knob.flag: (knob.key, value)}),
                        lambda: DecodeSettings(knobs={knob.setting: setting}),
                        lambda: VerifyConfig(knobs={knob.setting: setting})]
            for attempt in attempts:
                if ok:
                    attempt()
                else:
                    with pytest.raises(PdraftError):
                        attempt()
    for rel, text in sources():
        if rel != "pdraft/policies/__init__.py":
            for knob in knobs():
                assert f'"{knob.what}"' not in text, f"{rel} checks {knob.what} again"
