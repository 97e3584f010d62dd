"""Walks of two hostile-input classes of issue 45 over the registries and tables their rules read, so that a new
field, knob, output or recipe key is covered without a new case. Class 4, contradictions refused in one line
naming both sides: every field a checkpoint layout reads from several places (Layout.stated_twice) stated twice
with different values; every policy knob given to every policy that does not read it; every output of every
command's I/O plan aimed at each other output and at each input. Class 10, the quickstart's plan: every key of the
sections whose settings the plan builds (decode, calibrate, bench) given a value its schema or its stage refuses,
and every kind named twice, refused before the first stage with nothing written. No model is trained or loaded."""

from __future__ import annotations

import ast
import io
import json
import types
import typing
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from pdraft.errors import PdraftError

ROOT = Path(__file__).resolve().parents[1]


def one_line(e: pytest.ExceptionInfo) -> str:
    text = e.value.one_line() if isinstance(e.value, PdraftError) else str(e.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


# ---- class 4 (a): every field a layout may state twice --------------------------------------------------------
def _written_configs():
    """(layout, typed config, config.json) for every layout and every family that saves in it, written by the
    layout from a tiny drafter of that family."""
    from test_models_support import MASK, tiny_target_config

    from pdraft.models.build import build_drafter
    from pdraft.models.families import FAMILIES

    target = tiny_target_config()
    out: dict[tuple[str, str], tuple] = {}
    for spec in FAMILIES:
        kw = {} if spec.drafting != "parallel" else dict(mask_token_id=MASK, block_size=4, num_hidden_layers=2)
        for variant in ({}, {"qk_norm": True, "draft_vocab_size": target.vocab_size}):
            try:
                cfg = build_drafter(spec.kind, target, **kw, **variant).config
            except TypeError:
                continue
            for layout in spec.layouts:
                try:
                    out.setdefault((layout.name, spec.kind), (layout, cfg, layout.to_json(cfg)))
                except PdraftError:  # a layout that cannot hold this variant (DeepSpec's EAGLE-3: q/k norms)
                    continue
    assert {name for name, _ in out} == {layout.name for layout in FAMILIES.layouts}, "a layout no tiny drafter writes"
    return list(out.values())


WRITTEN = _written_configs()


def _places_of(data: dict, layout) -> dict[str, set[str]]:
    """Field name -> the objects ("" = the top level, "dflash_config.", ...) that state it in a written config.json
    or in the layout's schema."""
    found: dict[str, set[str]] = {}
    for key, value in data.items():
        found.setdefault(key, set()).add("")
        if isinstance(value, dict):
            for inner in value:
                found.setdefault(inner, set()).add(key + ".")
    for prefix, fields in layout.schema.items():
        for name in fields:
            found.setdefault(name, set()).add(prefix)
    return found


# Names two objects hold with two meanings, so no contradiction: pdraft's own class name beside the backbone's.
NOT_ONE_FIELD = {"model_type": "pdraft.model_type names pdraft's config class, the top-level one the backbone's"}


@pytest.mark.parametrize("layout,cfg,data", WRITTEN, ids=[f"{w[0].name}-{w[1].kind}" for w in WRITTEN])
def test_every_field_a_layout_states_in_two_objects_is_declared(layout, cfg, data):
    """A field name that a layout writes or checks in two objects is in its table of places (or named above):
    the table is what the reader reads through stated_once and what the walk below states twice."""
    declared = {path for places in layout.stated_twice().values() for path, _ in places}
    for name, objects in _places_of(data, layout).items():
        if len(objects) > 1 and name not in NOT_ONE_FIELD:
            paths = {prefix + name for prefix in objects}
            assert paths <= declared, f"{layout.name}: {name} in {sorted(objects)} is not in Layout.stated_twice"


def _other(value):
    """A valid-looking value unlike `value`, also after the vLLM numbering's shift by one (lists: each + 2)."""
    if isinstance(value, bool):
        raise AssertionError("no boolean is stated twice")
    if isinstance(value, int):
        return value - 1 if value > 2 else value + 1
    if isinstance(value, float):
        return value / 2
    return [int(i) + 2 for i in value]


def _set(data: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value


STATED = [(layout, cfg, data, name, a, b) for layout, cfg, data in WRITTEN
          for name, places in layout.stated_twice().items() if hasattr(cfg, name)
          for i, a in enumerate(places) for b in places[i + 1:]]


def test_every_declared_field_of_every_layout_is_walked():
    walked = {(s[0].name, s[3]) for s in STATED}
    for layout, _, _ in WRITTEN:
        assert {(layout.name, name) for name in layout.stated_twice()} <= walked


@pytest.mark.parametrize("layout,cfg,data,name,a,b", STATED,
                         ids=[f"{s[0].name}-{s[1].kind}-{s[4][0]}-{s[5][0]}" for s in STATED])
def test_every_field_stated_twice_differently_is_refused_naming_both(tmp_path, layout, cfg, data, name, a, b):
    from pdraft.models.checkpoint import load_config

    value = getattr(cfg, name)
    damaged = json.loads(json.dumps(data))
    for path, _ in layout.stated_twice()[name]:
        _set(damaged, path, None)  # only the pair states it
    _set(damaged, a[0], value)
    _set(damaged, b[0], _other(value))
    (tmp_path / "config.json").write_text(json.dumps(damaged))
    with pytest.raises(PdraftError) as e:
        load_config(tmp_path)
    text = one_line(e)
    assert f"{name} is " in text and a[1] in text and b[1] in text, text
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert getattr(load_config(tmp_path), name) == value  # as written, it reads back


# ---- class 4 (b): every knob given to a policy that does not read it ------------------------------------------
def _knob_with_wrong_policy():
    from pdraft.policies import POLICIES, knobs

    return [(spec, knob) for spec in POLICIES for knob in knobs() if knob not in spec.knobs]


@pytest.mark.parametrize("command", ["decode", "bench", "calibrate"])
@pytest.mark.parametrize("spec,knob", _knob_with_wrong_policy(),
                         ids=[f"{s.name}-{k.key}" for s, k in _knob_with_wrong_policy()])
def test_every_knob_given_to_a_policy_that_does_not_read_it_is_refused(command, spec, knob):
    from pdraft.decode.settings import DecodeSettings
    from pdraft.recipe import load_recipe

    recipe = load_recipe()
    with pytest.raises(PdraftError) as e:
        DecodeSettings.from_recipe(recipe, command, verify=spec.name, knob_flags={knob.key: knob.default})
    text = one_line(e)
    assert knob.flag in text and f"verifies with {spec.name}" in text, text


@pytest.mark.parametrize("spec,knob", _knob_with_wrong_policy(),
                         ids=[f"{s.name}-{k.key}" for s, k in _knob_with_wrong_policy()])
def test_every_recipe_knob_its_own_recipe_policy_does_not_read_is_refused_by_decode(spec, knob):
    """The recipe's own decode section contradicting itself (decode.verify: estimator with decode.threshold
    written; issue 60: it exited 0 ignoring the threshold) is refused by decode; a --verify flag that picks
    another policy for one run, and the commands that choose their policies otherwise, take the recipe as is."""
    from pdraft.decode.settings import DecodeSettings
    from pdraft.recipe import load_recipe

    value = knob.high if knob.high < 1e5 else knob.default + 1  # another value than the default
    written = load_recipe(overrides=[f"decode.verify={spec.name}", f"decode.{knob.key}={value}"])
    with pytest.raises(PdraftError) as e:
        DecodeSettings.from_recipe(written, "decode")
    text = one_line(e)
    assert f"decode.{knob.key}" in text and f"verifies with {spec.name}" in text, text
    reader = next(p for p in POLICIES_() if knob in p.knobs)
    assert DecodeSettings.from_recipe(written, "decode", verify=reader.name).knob(knob) == pytest.approx(
        value / knob.per)
    for command in ("bench", "calibrate"):
        DecodeSettings.from_recipe(written, command)
    DecodeSettings.from_recipe(load_recipe(overrides=[f"decode.verify={spec.name}"]), "decode")  # nothing written
    at_default = load_recipe(overrides=[f"decode.verify={spec.name}", f"decode.{knob.key}={knob.default}"])
    DecodeSettings.from_recipe(at_default, "decode")  # the default written out, as a resolved copy does


def POLICIES_():
    from pdraft.policies import POLICIES

    return POLICIES


@pytest.mark.parametrize("flag", [True, False], ids=["--sps-table", "decode.sps_table"])
def test_a_cost_table_given_to_every_policy_that_reads_none_is_refused_by_decode(flag, tmp_path):
    from pdraft.decode.settings import DecodeSettings
    from pdraft.policies import COST_TABLE
    from pdraft.recipe import load_recipe

    table = str(tmp_path / "sps_table.json")
    for spec in POLICIES_():
        overrides = [f"decode.verify={spec.name}"] + ([] if flag else [f"decode.sps_table={table}"])
        given = {"sps_table": table} if flag else {}
        if COST_TABLE in spec.files:
            assert DecodeSettings.from_recipe(load_recipe(overrides=overrides), "decode", **given).sps_table == table
            continue
        with pytest.raises(PdraftError) as e:
            DecodeSettings.from_recipe(load_recipe(overrides=overrides), "decode", **given)
        text = one_line(e)
        assert ("--sps-table" if flag else "decode.sps_table") in text and f"verifies with {spec.name}" in text, text


@pytest.mark.parametrize("key,value", [("regenerate_top_k", 5), ("regenerate_top_p", 0.9),
                                       ("regenerate_greedy_share", 0.5)])
def test_every_sampling_key_of_a_greedy_regeneration_is_refused(key, value):
    """data.regenerate_top_k / top_p / greedy_share written while data.regenerate_temperature is 0 would be
    dropped (issue 60): one line naming both keys; with a sampled regeneration the same key is taken."""
    from pdraft.errors import RecipeError
    from pdraft.recipe import load_recipe

    with pytest.raises(RecipeError) as e:
        load_recipe(overrides=[f"data.{key}={value}"])
    assert f"data.{key}" in str(e.value) and "regenerate_temperature is 0" in str(e.value), str(e.value)
    assert getattr(load_recipe(overrides=[f"data.{key}={value}", "data.regenerate_temperature=1"]).data, key) == value


@pytest.mark.parametrize("flag,key,value", [("--top-k", "top_k", 5), ("--top-p", "top_p", 0.9)])
def test_every_sampling_flag_of_a_greedy_decode_is_refused(flag, key, value):
    from pdraft.decode.settings import DecodeSettings
    from pdraft.recipe import load_recipe

    with pytest.raises(PdraftError) as e:
        DecodeSettings.from_recipe(load_recipe(), "decode", **{key: value})
    assert flag in one_line(e) and "greedy" in one_line(e), one_line(e)
    got = DecodeSettings.from_recipe(load_recipe(), "decode", temperature=1.0, **{key: value})
    assert getattr(got.sampling, key) == value
    DecodeSettings.from_recipe(load_recipe(), "bench", **{key: value})  # a bench's temperatures may sample


def test_every_knob_given_to_its_own_policy_is_taken():
    from pdraft.decode.settings import DecodeSettings
    from pdraft.policies import POLICIES
    from pdraft.recipe import load_recipe

    for spec in POLICIES:
        for knob in spec.knobs:
            value = (knob.low + knob.high) / 2 / knob.per if knob.high < 1e5 else knob.low / knob.per + 0.25
            got = DecodeSettings.from_recipe(load_recipe(), "decode", verify=spec.name,
                                             knob_flags={knob.key: value * knob.per})
            assert got.knob(knob) == pytest.approx(value)


# ---- class 4 (c): every output of every command's plan aimed at another output or an input --------------------
class Planned(Exception):
    """Raised by the recording check_io: the plan is caught before the command goes on."""


def _module_calling_check_io() -> set[str]:
    """Every pdraft module that calls check_io: each must have its plan in PLANS below."""
    found = set()
    for path in (ROOT / "pdraft").rglob("*.py"):
        if path.name == "io_plan.py":
            continue
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "check_io" for n in ast.walk(tree)):
            found.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def _world(tmp: Path):
    """A recipe naming a local file for every input a plan may name, and the files a command finds in place."""
    from pdraft.recipe import load_recipe

    for name in ("prompts.jsonl", "bench.jsonl", "cal.jsonl", "sps.json", "data.jsonl"):
        (tmp / name).write_text("{}\n")
    for folder in ("target", "init", "drafter", "cache", "run/step_000010", "report", "cal", "source"):
        (tmp / folder).mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "recipe.resolved.yaml"):
        (tmp / "drafter" / name).write_text("{}")
    (tmp / "cache" / "manifest.json").write_text("{}")
    (tmp / "cache" / "shard-00000.safetensors").write_text("x")
    (tmp / "source" / "config.json").write_text("{}")
    recipe = tmp / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp / 'out'}\ntarget: {{id: {tmp / 'target'}}}\n"
                      f"data: {{source: {tmp / 'data.jsonl'}, cache_dir: {tmp / 'cache'}, regenerate: true}}\n"
                      f"drafter: {{init_from: {tmp / 'init'}}}\ncalibrate: {{prompts: {tmp / 'cal.jsonl'}}}\n"
                      f"decode: {{sps_table: {tmp / 'sps.json'}}}\nbench: {{prompt_sets: [{tmp / 'bench.jsonl'}]}}\n")
    return load_recipe(recipe)


def _plans(tmp: Path, monkeypatch) -> dict[str, tuple[str, list, list]]:
    """module -> (command, inputs, outputs) of the plan the command builds, recorded from its check_io call."""
    from importlib import import_module

    bench, export_hidden, calibrate, decode, export, pull, train = (import_module(f"pdraft.{name}") for name in (
        "bench.session", "cache.export_hidden", "calibrate.pipeline", "decode.inputs", "hub.export", "hub.pull",
        "train.loop"))

    r = _world(tmp)
    calls = {  # module -> the command's own up-front check, with every output it may write named
        export_hidden: lambda: export_hidden.check_export_io(r),
        calibrate: lambda: calibrate.check_calibrate_io(r, tmp / "drafter", tmp / "cal", skip_sps=False),
        decode: lambda: decode.check_decode_io(r, tmp / "drafter", tmp / "prompts.jsonl", tmp / "sps.json",
                                               tmp / "metrics.jsonl"),
        train: lambda: train.check_train_io(r, tmp / "run"),
        bench: lambda: bench.check_bench_io(r, [tmp / "drafter"], tmp / "report", tmp / "metrics.jsonl"),
        export: lambda: export.export(tmp / "drafter", "vllm", tmp / "exported"),
        pull: lambda: pull.pull(str(tmp / "source"), out=tmp / "pulled"),
    }
    plans = {}
    for module, call in calls.items():
        def record(command, inputs, outputs, module=module):
            plans[module.__name__] = (command, list(inputs), list(outputs))
            raise Planned
        monkeypatch.setattr(module, "check_io", record)
        with pytest.raises(Planned):
            call()
    return plans


def test_every_output_aimed_at_another_output_or_an_input_is_refused(tmp_path, monkeypatch):
    from pdraft.io_plan import check_io

    plans = _plans(tmp_path, monkeypatch)
    assert set(plans) == _module_calling_check_io(), "a command's I/O plan is not walked here"
    walked = 0
    for command, inputs, outputs in plans.values():
        check_io(command, inputs, outputs)  # the plan as the command makes it is fine
        for i, out in enumerate(outputs):
            aims = [(other.what, other.path) for other in outputs if other is not out]
            aims += [(inp.what, inp.path) for inp in inputs] if out.whole else []
            for what, path in aims:
                aimed = outputs[:i] + [replace(out, path=path)] + outputs[i + 1:]
                with pytest.raises(PdraftError) as e:
                    check_io(command, inputs, aimed)
                text = one_line(e)
                sharing = [w for w, p in aims if p == path]  # the world names one file for --sps-table and the recipe's
                assert out.what in text and any(w in text for w in sharing), (command, out.what, what, text)
                walked += 1
    assert walked > 100


# ---- class 10: the quickstart's plan, refused before the first stage ---------------------------------------------
def _quickstart(tmp: Path, overrides: list[str], kinds=None) -> tuple[PdraftError, str]:
    """The quickstart's refusal and what it printed, checking that no stage started and nothing was written."""
    from pdraft import lifecycle

    console = Console(file=io.StringIO(), width=200)
    before = sorted(tmp.rglob("*"))
    with pytest.raises(PdraftError) as e:
        lifecycle.run(None, [f"output_dir={tmp / 'run'}", *overrides], console=console,
                      **({"kinds": kinds} if kinds is not None else {}))
    printed = console.file.getvalue()
    assert "[1/" not in printed and sorted(tmp.rglob("*")) == before, printed
    return e, one_line(e)


@pytest.mark.parametrize("kind", __import__("pdraft.lifecycle", fromlist=["KINDS"]).KINDS)
def test_every_kind_named_twice_or_beside_a_blank_is_refused_before_any_stage(tmp_path, kind):
    _, text = _quickstart(tmp_path, [], kinds=(kind, kind))
    assert f"--kinds names {kind} more than once" in text
    _, text = _quickstart(tmp_path, [], kinds=(kind, "no-such-kind"))
    assert "no-such-kind" in text


# Keys of the plan's sections whose refusal the schema cannot derive, each with the bad value the stage refuses.
STAGE_VALUES = {
    "bench.gamma": "x",  # read as text by the schema; the sweep parses it
    "bench.sampled_gamma": "0",
    "bench.engine": "vllm",  # the quickstart benches in pdraft's loop only
    "calibrate.sps_engine": "vllm",  # and profiles the cost table with pdraft's verifier
    "bench.prompt_sets": [],
    "bench.concurrency": [1, 4],  # the quickstart runs the gamma sweep
    "bench.policies": ["full"],  # the serving sweep's, which the quickstart does not run
    "decode.tree": "32x99",  # a width over the node budget: refused where the recipe is read (parse_tree)
}
# A value of each key only the serving sweep reads (pdraft.bench.session.SERVING_ONLY) that it would take.
SERVING_VALUES = {"policies": ["full"], "sla_tps": 10.0}
# Keys whose bad value no stage can know before it runs: paths and datasets ids, read at their stage.
READ_AT_THEIR_STAGE = {"calibrate.prompts", "decode.sps_table", "bench.output_dir"}


def _bad_value(annotation, metadata):
    """A value the schema refuses, from its type and constraints; None where it declares none."""
    import annotated_types as at

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _bad_value(args[0], list(args[1:]) + list(metadata))
    if origin in (typing.Union, types.UnionType):
        plain = [a for a in args if a is not type(None)]
        return _bad_value(plain[0], metadata) if len(plain) == 1 else None
    if origin is typing.Literal:
        return "no-such-choice"
    if origin is list:
        inner = _bad_value(args[0], []) if args else None
        return None if inner is None else [inner]
    for m in metadata:
        inner = getattr(m, "metadata", None)
        if inner:  # a pydantic FieldInfo inside Annotated
            found = _bad_value(annotation, inner)
            if found is not None:
                return found
        if isinstance(m, (at.Le, at.Lt)):
            bound = m.le if isinstance(m, at.Le) else m.lt
            return bound + 1 if annotation is int else bound * 2 + 1
        if isinstance(m, (at.Ge, at.Gt)):
            bound = m.ge if isinstance(m, at.Ge) else m.gt
            return bound - 1
        if getattr(m, "pattern", None):
            return "NOT A NAME!"
    if annotation is bool:
        return "sometimes"
    return None


def _plan_keys():
    from pdraft.recipe import SECTIONS

    out = []
    for section in ("decode", "calibrate", "bench"):
        for name, info in SECTIONS[section].model_fields.items():
            key = f"{section}.{name}"
            value = STAGE_VALUES.get(key, _bad_value(info.annotation, info.metadata))
            out.append((key, value))
    return out


def test_every_key_of_the_plans_sections_is_walked():
    unwalked = [key for key, value in _plan_keys() if value is None and key not in READ_AT_THEIR_STAGE]
    assert not unwalked, f"give these a bad value in STAGE_VALUES or name them in READ_AT_THEIR_STAGE: {unwalked}"


@pytest.mark.parametrize("key,value", [kv for kv in _plan_keys() if kv[1] is not None], ids=lambda v: str(v)[:30])
def test_every_stage_setting_with_a_bad_value_is_refused_before_any_stage(tmp_path, key, value):
    _, text = _quickstart(tmp_path, [f"{key}={json.dumps(value)}"])
    assert key in text, text


def test_every_key_only_the_serving_sweep_reads_is_refused_before_any_stage(tmp_path):
    from pdraft.bench.session import SERVING_ONLY

    assert set(SERVING_VALUES) == set(SERVING_ONLY)
    for name in SERVING_ONLY:
        _, text = _quickstart(tmp_path, [f"bench.{name}={json.dumps(SERVING_VALUES[name])}"])
        assert f"bench.{name} belong to the serving sweep" in text, text
