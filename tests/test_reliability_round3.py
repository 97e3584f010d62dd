"""Reliability, third hostile round (issue 45), the classes a command refuses in one line: EAGLE-3 vocabulary maps
from a file that are out of range, negative, many-to-one, of the wrong length or dtype, or whose t2d disagrees
with d2t (class 3: decode, bench, export and pull each refuse, the map checked as the weights load); a positive
temperature below the floor at every path that takes one (class 5: every temperature key of the recipe, decode's
and bench's flags). Contract in reliability_support.check. The walks beside: every recipe key holding a
temperature refuses the underflow and accepts the floor, and the map rule is run on each damage directly."""

import re
from pathlib import Path

import pytest
import torch

import reliability_support
from reliability_support import Case, check, param
from test_reliability_eagle3 import eagle3

w = reliability_support.w  # the shared world, a module fixture

VOCAB = 0  # filled from the world's target: the tiny target's vocabulary


def set_weight(name, change):
    """Replace weight `name` of the saved drafter by change(tensor, vocab)."""
    def damage(folder):
        import json

        from safetensors.torch import load_file, save_file

        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        tensors = load_file(str(folder / "model.safetensors"))
        tensors[name] = change(tensors[name].clone(), vocab)
        save_file(tensors, str(folder / "model.safetensors"))
    return damage


def _out_of_range(d2t, vocab):
    d2t[-1] = vocab - (len(d2t) - 1)  # the last draft id onto target id `vocab`
    return d2t


def _negative(d2t, vocab):
    d2t[0] = -1
    return d2t


def _many_to_one(d2t, vocab):
    d2t[1] = d2t[0] - 1  # draft ids 0 and 1 onto one target id
    return d2t


def _t2d_extra(t2d, vocab):
    t2d[-1] = True  # marks a target id d2t does not map to
    return t2d


MAPS = [  # (name, what the user has, weight, change, expected error)
    ("d2t-out-of-range", "a d2t mapping a draft id past the target's vocabulary", "d2t", _out_of_range,
     r"d2t maps draft id 39 to target id \d+, outside the target's vocabulary \[0, \d+\)"),
    ("d2t-negative", "a d2t mapping draft id 0 to target id -1", "d2t", _negative,
     r"d2t maps draft id 0 to target id -1, outside"),
    ("d2t-many-to-one", "a d2t mapping two draft ids onto one target id", "d2t", _many_to_one,
     r"d2t maps draft ids 0 and 1 both to target id 0; the map must be one-to-one"),
    ("d2t-float", "a d2t of floats (1.5)", "d2t", lambda d, v: d.double() + 0.5,
     r"d2t has dtype float64, expected an integer dtype"),
    ("d2t-short", "a d2t one entry short", "d2t", lambda d, v: d[:-1],
     r"weight 'd2t' has shape \(39,\), the config implies \(40,\)"),
    ("t2d-disagrees", "a t2d marking a target id d2t does not map to", "t2d", _t2d_extra,
     r"t2d marks target id \d+, which d2t does not map to"),
    ("t2d-float", "a t2d of floats", "t2d", lambda t, v: t.float() * 0.5,
     r"t2d has dtype float32, expected bool"),
]


def damaged(weight, change):
    return lambda w, t: eagle3(w, t, set_weight(weight, change))


CASES = []
for name, what, weight, change, expect in MAPS:
    CASES += [
        Case("decode", f"eagle3-{name}", f"an EAGLE-3 with {what}",
             lambda w, t, d=damaged(weight, change): ["decode", "--recipe", str(w.recipe), "--drafter", str(d(w, t)),
                                                      "--prompt", "def f"], expect),
        Case("export", f"eagle3-{name}", f"an EAGLE-3 with {what}, exported for vLLM",
             lambda w, t, d=damaged(weight, change): ["export", str(d(w, t)), "--format", "vllm", "--out",
                                                      str(t / "out")], expect),
    ]
CASES += [
    Case("bench", "eagle3-d2t-many-to-one", "an EAGLE-3 whose d2t maps two draft ids onto one target id",
         lambda w, t: ["bench", str(w.recipe), "--drafter", str(damaged("d2t", _many_to_one)(w, t)), "--out",
                       str(t / "bench")], r"the map must be one-to-one"),
    Case("pull", "eagle3-d2t-out-of-range", "a published EAGLE-3 whose d2t leaves the target's vocabulary",
         lambda w, t: ["pull", str(damaged("d2t", _out_of_range)(w, t)), "--out", str(t / "copy")],
         r"outside the target's vocabulary"),
]

# ---- class 5: a positive temperature that underflows, at every path that takes one ----------------------------
UNDERFLOW = r"1e-300 is below the smallest temperature pdraft samples at, 1e-06 .*use 0 for greedy"
TEMPERATURE_KEYS = ["decode.temperature", "bench.temperature", "calibrate.temperature", "data.regenerate_temperature"]
CASES += [Case("recipe check", f"underflow-{key}", f"--set {key}=1e-300", lambda w, t, k=key: [
    "recipe", "check", str(w.recipe), "--set", f"{k}=1e-300"], rf"{key.replace('.', '[.]')}: {UNDERFLOW}")
    for key in TEMPERATURE_KEYS]
CASES += [
    Case("recipe check", "underflow-bench.temperatures", "--set bench.temperatures=[0,1e-300]",
         lambda w, t: ["recipe", "check", str(w.recipe), "--set", "bench.temperatures=[0, 1e-300]"],
         rf"bench\.temperatures\.1: {UNDERFLOW}"),
    Case("decode", "temperature-underflow", "--temperature 1e-300 (decode drew token 0)",
         lambda w, t: ["decode", "--recipe", str(w.recipe), "--drafter", str(w.dspark), "--prompt", "def f",
                       "--temperature", "1e-300"], UNDERFLOW),
    Case("bench", "temperature-underflow", "--temperature 1e-300 (generate()'s baseline crashed)",
         lambda w, t: ["bench", str(w.recipe), "--drafter", str(w.dspark), "--out", str(t / "b"),
                       "--temperature", "1e-300"], UNDERFLOW),
    Case("bench", "temperatures-underflow", "--temperature 0,1e-300 --concurrency 1 (the serving sweep)",
         lambda w, t: ["bench", str(w.recipe), "--drafter", str(w.dspark), "--out", str(t / "b"),
                       "--temperature", "0,1e-300", "--concurrency", "1"], UNDERFLOW),
]


# ---- the walks --------------------------------------------------------------------------------------------------
def _temperature_keys():
    """Every recipe key that holds a temperature, found by walking the schema (not listed by hand)."""
    from pdraft.recipe import Recipe

    keys = []
    for section, info in Recipe.model_fields.items():
        model = info.annotation
        for name in getattr(model, "model_fields", {}):
            if "temperature" in name:
                keys.append(f"{section}.{name}")
    return keys


def test_every_temperature_key_takes_the_one_rule():
    from pdraft.errors import PdraftError
    from pdraft.recipe import load_recipe
    from pdraft.temperature import MIN_TEMPERATURE

    keys = _temperature_keys()
    assert set(TEMPERATURE_KEYS) | {"bench.temperatures"} == set(keys), keys  # the cases above cover every key
    recipe = reliability_support.world().recipe
    for key in keys:
        listed = key.endswith("temperatures")
        fmt = (lambda v: f"[{v}]") if listed else str
        for bad in (1e-300, 5e-7, -1, 6):
            with pytest.raises(PdraftError, match=key.replace(".", "[.]")):
                load_recipe(recipe, [f"{key}={fmt(bad)}"])
        for good in (0, MIN_TEMPERATURE, 1, 5):
            load_recipe(recipe, [f"{key}={fmt(good)}"])


def test_sampling_params_take_the_one_rule():
    from pdraft.errors import PdraftError
    from pdraft.models.api import SamplingParams
    from pdraft.temperature import MIN_TEMPERATURE

    for bad in (1e-300, MIN_TEMPERATURE / 2):
        with pytest.raises(PdraftError, match="below the smallest temperature"):
            SamplingParams(temperature=bad)
    SamplingParams(temperature=MIN_TEMPERATURE)


@pytest.mark.parametrize("name", [m[0] for m in MAPS if m[0] != "d2t-short"])
def test_the_map_rule_refuses_each_damage_and_passes_a_good_map(name):
    from pdraft.errors import PdraftError
    from pdraft.models.vocab import check_vocab_map

    vocab, n = 100, 40
    ids = torch.arange(0, 2 * n, 2)  # every other target id
    d2t, t2d = ids - torch.arange(n), torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True)
    check_vocab_map(d2t, t2d, vocab, n, "good")  # the negative proof
    _, _, weight, change, expect = next(m for m in MAPS if m[0] == name)
    if weight == "d2t":
        d2t = change(d2t.clone(), vocab)
    else:
        t2d = change(t2d.clone(), vocab)
    expect = expect.replace("draft id 39", f"draft id {n - 1}")
    with pytest.raises(PdraftError, match=expect):
        check_vocab_map(d2t, t2d, vocab, n, "m")


# ---- class 4: contradictions refused in one line naming both sides ---------------------------------------------
def zlab_two_layer_lists(w, t):
    """The world's DFlash drafter saved in z-lab's layout, then given a top-level target_layer_ids that differs
    from its dflash_config's."""
    import json

    from pdraft.models import load_drafter, save_drafter

    folder = save_drafter(load_drafter(w.dflash), t / "zlab", layout="zlab")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["target_layer_ids"] = [i + 1 for i in cfg["dflash_config"]["target_layer_ids"]]
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def eagle3_layer_ids(**places):
    def damage(folder):
        import json

        cfg = json.loads((folder / "config.json").read_text())
        for key, value in places.items():
            if key == "eagle":
                cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = value
            elif key == "top":
                cfg["eagle_aux_hidden_state_layer_ids"] = value
            else:
                cfg["pdraft"]["target_layer_ids"] = value
        (folder / "config.json").write_text(json.dumps(cfg))
    return damage


def _metrics_on_report(w, t):
    out = t / "bench"
    return ["bench", str(w.recipe), "--drafter", str(w.dspark), "--out", str(out), "--metrics", str(out / "bench.json")]


CASES += [
    Case("decode", "zlab-layer-ids-twice", "a z-lab config.json whose top-level target_layer_ids differ from "
         "dflash_config's", lambda w, t: ["decode", "--recipe", str(w.recipe), "--drafter", str(zlab_two_layer_lists(w, t)),
                                          "--prompt", "def f"],
         r"target_layer_ids is \[\d+(, \d+)*\] at the top level but \[\d+(, \d+)*\] in dflash_config; a drafter has one"),
    Case("pull", "zlab-layer-ids-twice", "a z-lab drafter whose config states its layer ids twice, differently",
         lambda w, t: ["pull", str(zlab_two_layer_lists(w, t)), "--out", str(t / "copy")],
         r"target_layer_ids is .* at the top level but .* in dflash_config"),
    Case("decode", "eagle3-layer-ids-twice", "an EAGLE-3 whose pdraft object and eagle_config name other layers",
         lambda w, t: ["decode", "--recipe", str(w.recipe), "--drafter",
                       str(eagle3(w, t, eagle3_layer_ids(eagle=[1, 2]))), "--prompt", "def f"],
         r"target_layer_ids is \[0, 1, 2\] in pdraft\.target_layer_ids but \[1, 2\] in eagle_config"),
    Case("export", "eagle3-layer-ids-vllm-place", "an EAGLE-3 whose top-level (vLLM) ids disagree with eagle_config's",
         lambda w, t: ["export", str(eagle3(w, t, eagle3_layer_ids(top=[2, 3]))), "--format", "sglang",
                       "--out", str(t / "o")],
         r"in the top-level eagle_aux_hidden_state_layer_ids \(vLLM's numbering, each minus 1\)"),
    Case("decode", "threshold-with-estimator", "--threshold 0.5 --verify estimator (the threshold was dropped)",
         lambda w, t: ["decode", "--recipe", str(w.recipe), "--drafter", str(w.dspark), "--prompt", "def f",
                       "--verify", "estimator", "--threshold", "0.5"],
         r"--threshold 0\.5 is a setting of the threshold policy, but this run verifies with estimator"),
    Case("bench", "policy-blank", "--policy ' ' (fell back to the recipe's policy)",
         lambda w, t: ["bench", str(w.recipe), "--drafter", str(w.dspark), "--out", str(t / "b"), "--concurrency", "1",
                       "--policy", " "], r"--policy names no policy"),
    Case("bench", "metrics-on-report", "--metrics OUT/bench.json (the report overwrote the stream)",
         _metrics_on_report, r"its bench\.json .*bench\.json and --metrics .*bench\.json are the same file"),
]


# ---- class 6: every field of every read-back round typed; labels printed as they are ---------------------------
def stream_with(rows: list[dict], header: dict | None = None) -> str:
    import json

    head = header or {"type": "run", "drafter": "d", "gamma": 4, "verify": "full", "t": 0.0}
    return "".join(json.dumps(r) + "\n" for r in [head, *rows])


GOOD_ROUND = {"type": "round", "request": 0, "round": 0, "gamma": 4, "verified": 4, "accepted": 2, "committed": 3,
              "draft_s": 0.001, "verify_s": 0.002, "round_s": 0.004, "confidence": [0.5, 0.1, -0.2, 0.3],
              "prefill_s": 0.0, "t": 1.0}


def _bad_values(kind: str) -> list:
    """Values no field of that declared type may hold, as JSON can carry them."""
    common = ["text", None, True, [], {}]
    if kind == "int":
        return [*common, -1, 1.5, 2**64, 1e12]
    if kind == "float":  # null is not here: seconds a writer did not time (test_null_seconds_are_not_measured)
        return ["text", True, [], {}, -0.5, float("inf"), "1.0"]
    return ["text", True, [1, "x"], [None], [float("nan")], {}]  # the confidence list (null is allowed)


def _round_field_damages():
    from pdraft.bench.stream import _FIELD_TYPES

    return [(name, kind, bad) for name, kind in _FIELD_TYPES.items() for bad in _bad_values(kind)]


@pytest.mark.parametrize("name,kind,bad", _round_field_damages(),
                         ids=[f"{n}={b!r}"[:40] for n, _, b in _round_field_damages()])
def test_every_round_field_is_typed_as_read_back(tmp_path, name, kind, bad):
    """monitor --once on a stream whose only round has one field damaged: one line naming the field, never a
    traceback (test_the_undamaged_round_renders is the negative proof)."""
    from reliability_support import run_cli

    path = tmp_path / "m.jsonl"
    path.write_text(stream_with([{**GOOD_ROUND, name: bad}]))
    res = run_cli(["monitor", str(path), "--once", "--json"])
    assert "Traceback" not in res.err and res.code == 2, res.err[-2000:]
    assert f"round field '{name}'" in res.error_lines[-1], res.err


@pytest.mark.parametrize("name", ["prefill_s", "draft_s", "verify_s", "round_s"])
def test_null_seconds_are_not_measured(tmp_path, name):
    """A null optional timing field is data (a writer that did not time it), read as an absent one: the monitor
    renders the stream and counts the round (issue 60), where it once refused the line."""
    import json

    from pdraft.bench.stream import record_from
    from reliability_support import run_cli

    assert getattr(record_from({**GOOD_ROUND, name: None}), name) == 0.0
    path = tmp_path / "m.jsonl"
    path.write_text(stream_with([{**GOOD_ROUND, name: None}]))
    res = run_cli(["monitor", str(path), "--once", "--json"])
    assert res.code == 0 and json.loads(res.out)["summary"]["rounds"] == 1, res.err[-2000:]


def test_the_undamaged_round_renders(tmp_path):
    """The negative proof of the walk above: the same stream with every field intact."""
    from reliability_support import run_cli

    path = tmp_path / "m.jsonl"
    path.write_text(stream_with([GOOD_ROUND]))
    res = run_cli(["monitor", str(path), "--once", "--json"])
    import json

    assert res.code == 0 and json.loads(res.out)["summary"]["rounds"] == 1, res.err[-2000:]


MARKUP = "[bold red]x[/] [/] [link=file:///etc/passwd]y[/link] \\[z]"


@pytest.mark.parametrize("json_out", [False, True])
def test_a_run_label_holding_markup_prints_as_written(tmp_path, json_out):
    """A header whose drafter, verify and domain hold rich markup (and an unbalanced closing tag, which crashed
    the monitor), in the current run and in the recent runs' table."""
    from reliability_support import run_cli

    header = {"type": "run", "drafter": MARKUP, "gamma": 4, "verify": MARKUP, "domain": MARKUP, "repeat": MARKUP}
    path = tmp_path / "m.jsonl"
    path.write_text(stream_with([GOOD_ROUND], header) + stream_with([GOOD_ROUND], header))
    res = run_cli(["monitor", str(path), "--once", *(["--json"] if json_out else [])])
    assert res.code == 0 and "Traceback" not in res.err, res.err[-2000:]
    if not json_out:
        assert "[bold red]x[/]" in res.out.replace("\n", ""), res.out


def test_styled_escapes_every_value():
    from pdraft.rich_text import styled

    assert styled("[bold]{}[/bold] {}", MARKUP, "[/]").plain == f"{MARKUP} [/]"


# ---- class 11: monitor --once returns after one read, whatever a writer does meanwhile --------------------------
@pytest.mark.parametrize("writer", ["append", "truncate-and-rewrite", "replace-by-rename"])
def test_monitor_once_returns_after_one_read(tmp_path, writer):
    import os
    import threading

    from pdraft.bench.stream import StreamFollower

    path = tmp_path / "m.jsonl"
    body = stream_with([GOOD_ROUND] * 2000)
    path.write_text(body)
    start = path.stat().st_size
    stop = threading.Event()

    def write():
        n = 0
        while not stop.is_set():
            n += 1
            if writer == "append":
                with open(path, "a") as f:
                    f.write(stream_with([GOOD_ROUND] * 50))
            elif writer == "truncate-and-rewrite":
                with open(path, "w") as f:
                    f.write(body[: len(body) // 3])
            else:
                (tmp_path / f"new{n % 2}").write_text(body)
                os.replace(tmp_path / f"new{n % 2}", path)

    follower = StreamFollower(path, chunk=4096, until=start)  # many small reads, the writer between each
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        polls = 0
        while True:
            polls += 1
            follower.poll()
            if not follower.more:
                break
            assert polls <= start // 4096 + 2, "monitor --once kept reading"
        assert follower.offset <= start and follower.good_rounds <= 2000
    finally:
        stop.set()
        thread.join()


# ---- class 8: every string choice as the docs spell it, bare in YAML ---------------------------------------------
def _string_choices():
    """(section, key, choice) for every field of the recipe whose values are string choices, walked from the
    schema: the families' keys included."""
    from typing import Literal, get_args, get_origin

    from pdraft.recipe import Recipe

    out = []
    for section, info in Recipe.model_fields.items():
        model = info.annotation
        for key, field_info in getattr(model, "model_fields", {}).items():
            if get_origin(field_info.annotation) is Literal:
                out += [(section, key, c) for c in get_args(field_info.annotation) if isinstance(c, str)]
    return out


def test_every_string_choice_reads_bare_from_yaml():
    import yaml

    from pdraft.recipe import Recipe

    choices = _string_choices()
    assert ("decode", "compile", "off") in choices and ("decode", "compile", "on") in choices
    booleans = 0
    for section, key, choice in choices:
        value = yaml.safe_load(f"{key}: {choice}")[key]  # what YAML makes of the bare word
        booleans += isinstance(value, bool)
        model = Recipe.model_fields[section].annotation
        assert getattr(model.model_validate({key: value}), key) == choice, (section, key, choice)
    assert booleans >= 2  # on and off: the walk did meet the words YAML turns into booleans


def test_compile_off_in_a_recipe_file_and_a_boolean_elsewhere_is_still_refused(tmp_path):
    from pdraft.errors import PdraftError
    from pdraft.recipe import load_recipe

    recipe = reliability_support.world().recipe
    path = tmp_path / "r.yaml"
    path.write_text(recipe.read_text() + "")
    text = recipe.read_text().replace("decode:\n", "decode:\n  compile: off\n", 1)
    path.write_text(text)
    assert load_recipe(path).decode.compile == "off"
    assert load_recipe(path, ["decode.compile=on"]).decode.compile == "on"
    with pytest.raises(PdraftError, match="decode.verify"):  # no choice of verify is a YAML boolean
        load_recipe(path, ["decode.verify=yes"])


# ---- class 7: a target no decode path can run, refused from its config before its weights load ------------------
def sliding_target(w, t, **fields):
    """A copy of the world's target whose config.json turns on a sliding window (Qwen3's use_sliding_window), and
    whose weights are cut in half: a command that read them would fail on that, so the sliding-window line proves
    the refusal came first."""
    import json
    import shutil

    folder = Path(shutil.copytree(w.target, t / "sliding-target"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(fields or {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0})
    cfg.pop("layer_types", None)
    (folder / "config.json").write_text(json.dumps(cfg))
    weights = folder / "model.safetensors"
    header = 8 + int.from_bytes(weights.read_bytes()[:8], "little")
    with open(weights, "r+b") as f:
        f.truncate(header + (weights.stat().st_size - header) // 2)
    return folder


SLIDING = r"uses sliding-window attention \(sliding_window 8\); pdraft's decode paths \(static and reference\) verify"
CASES += [
    Case("decode", "sliding-window-target", "a sliding-window target (use_sliding_window true), weights cut",
         lambda w, t: ["decode", "--recipe", str(w.recipe), "--drafter", str(w.dspark), "--prompt", "def f",
                       "--set", f"target.id={sliding_target(w, t)}"], SLIDING),
    Case("decode", "sliding-window-target-no-draft", "a sliding-window target decoded alone (--no-draft)",
         lambda w, t: ["decode", "--recipe", str(w.recipe), "--no-draft", "--prompt", "def f",
                       "--set", f"target.id={sliding_target(w, t)}"], SLIDING),
    Case("bench", "sliding-window-target", "a sliding-window target benchmarked",
         lambda w, t: ["bench", str(w.recipe), "--drafter", str(w.dspark), "--out", str(t / "b"),
                       "--target", str(sliding_target(w, t))], SLIDING),
    Case("calibrate-threshold", "sliding-window-target", "a drafter calibrated on a sliding-window target",
         lambda w, t: ["calibrate-threshold", str(w.recipe), "--drafter", str(w.dspark), "--out", str(t / "cal"),
                       "--set", f"target.id={sliding_target(w, t)}"], SLIDING),
]


# check-serving (issue 39): its inputs are refused before any engine starts.
CASES += [
    Case("check-serving", "no-recipe", "a drafter folder without the recipe it was trained with, and no --recipe",
         lambda w, t: ["check-serving", str(t), "--engine", "vllm"], r"has no recipe\.resolved\.yaml"),
    Case("check-serving", "unknown-engine", "--engine sglang (no such engine module here)",
         lambda w, t: ["check-serving", str(w.dspark), "--engine", "sglang", "--recipe", str(w.recipe)],
         r"unknown serving engine 'sglang'"),
]


@pytest.mark.parametrize("fields,expect", [
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8}, "sliding-window attention"),
    ({"model_type": "mistral", "sliding_window": 4096}, "sliding-window attention"),
    ({"model_type": "qwen3", "layer_types": ["full_attention", "sliding_attention"]}, r"other than full attention \(sliding_attention\)"),
    ({"model_type": "llama", "layer_types": ["chunked_attention"]}, r"\(chunked_attention\)"),
])
def test_every_windowed_config_is_refused_by_both_paths(fields, expect):
    """The one rule (windowed_attention) refuses each way a config can say its attention is windowed, for the
    decode commands (check_decodable) and for the static path's own choice; a full-attention config passes."""
    from types import SimpleNamespace

    from pdraft.decode.backend import check_decodable
    from pdraft.decode.static_target import windowed_attention
    from pdraft.errors import PdraftError

    cfg = SimpleNamespace(**fields)
    assert re.search(expect, windowed_attention(cfg))
    with pytest.raises(PdraftError, match=expect):
        check_decodable(cfg, "t")
    check_decodable(SimpleNamespace(model_type="qwen3", layer_types=["full_attention"] * 2, sliding_window=None), "t")
    check_decodable(SimpleNamespace(model_type="mistral", sliding_window=None), "t")


# ---- class 10: the quickstart validates its whole plan before the first stage --------------------------------------
def quickstart(*extra, recipe=None):
    return lambda w, t: ["quickstart", str(recipe(w, t) if recipe else w.recipe), *extra]


CASES += [
    Case("quickstart", "kinds-comma", "--kinds ',' (crashed at the decode stage)", quickstart("--kinds", ","),
         r"--kinds names no drafter kind"),
    Case("quickstart", "kinds-twice", "--kinds dspark,dspark (refused only after training)",
         quickstart("--kinds", "dspark,dflash,dspark"), r"--kinds names dspark more than once"),
    Case("quickstart", "bench-concurrency", "bench.concurrency in the quickstart's recipe (printed a serving report "
         "with the gamma-sweep printer)", quickstart("--set", "bench.concurrency=[1, 4]"),
         r"bench\.concurrency \[1, 4\]: the quickstart runs the gamma sweep"),
    Case("quickstart", "bench-policies", "bench.policies without concurrency (refused only at the bench stage)",
         quickstart("--set", "bench.policies=[full]"), r"bench\.policies belong to the serving sweep"),
]


# ---- class 9: memory planned before it is spent -------------------------------------------------------------------
def test_level_bytes_by_hand():
    from types import SimpleNamespace

    from pdraft.bench.memory_plan import level_bytes

    cfg = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          hidden_size=32, vocab_size=100)
    got = level_bytes(cfg, 2, rows=3, capacity=10, gamma=4, generate_baseline=True)
    layer = 2 * 3 * 2 * 10 * 8 * 2  # keys and values x rows x kv heads x capacity x head dim x bytes
    assert got == {"target KV cache": 2 * layer, "verify logits": 2 * 3 * 5 * 100 * 4,
                   "draft distributions": 2 * 3 * 4 * 100 * 4, "drafter context": layer,
                   "generate() padded batch": 3 * 10 * 10 * 4}


def test_a_level_the_machine_cannot_hold_is_refused_before_any_level_runs(w, tmp_path, monkeypatch):
    """With 64 MB available, --concurrency 1,4096: refused in one line with both figures and the largest level that
    fits, before the first level (C=1, which fits) runs, and nothing written; with the machine's own figure the
    planner stays out of the way of the levels the other serving tests run (the negative proof is theirs)."""
    import time

    from pdraft.bench import memory_plan, serving
    from reliability_support import run_cli

    monkeypatch.setattr(memory_plan, "available_bytes", lambda device: 64 << 20)
    # The world's bench has one prompt, so the sweep would run 4096 as 1 (serving.clamp_levels, tested in
    # test_reliability_round4.py); this test is the planner's, so the levels reach it as given.
    monkeypatch.setattr(serving, "clamp_levels", lambda levels, prompts, warn: list(levels))
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    res = run_cli(["bench", str(w.recipe), "--drafter", str(w.dspark), "--out", str(tmp_path / "b"),
                   "--concurrency", "1,4096", "--no-ngram"])
    assert res.code == 2 and "Traceback" not in res.err, res.err[-3000:]
    line = res.error_lines[-1]
    assert re.search(r"bench\.concurrency 4096: the level would hold about [\d.]+ [MG]B \(target KV cache .*\), more "
                     r"than 80% of the 67\.1 MB available on cpu; the largest level that fits is \d+", line), line
    assert "C=1" not in res.err and not (tmp_path / "b" / "bench.json").exists()
    assert time.perf_counter() - t0 < 120


def test_the_gamma_sweeps_batches_are_planned_too(w, tmp_path, monkeypatch):
    """Issue 60: every batch a bench forms is planned, not only the serving sweep's levels: the gamma sweep's
    static batch (--batch-size 64) under a machine with 64 KB free is refused naming bench.batch_size."""
    from pdraft.bench import memory_plan
    from reliability_support import run_cli

    monkeypatch.setattr(memory_plan, "available_bytes", lambda device: 64 << 10)
    monkeypatch.chdir(tmp_path)
    res = run_cli(["bench", str(w.recipe), "--drafter", str(w.dspark), "--out", str(tmp_path / "b"),
                   "--batch-size", "64", "--num-prompts", "64", "--no-ngram"])
    assert res.code == 2 and "Traceback" not in res.err, res.err[-3000:]
    assert re.search(r"bench\.batch_size \d+: the level would hold about .* available on cpu", res.error_lines[-1]), \
        res.error_lines[-1]
    assert not (tmp_path / "b" / "bench.json").exists()


def test_available_memory_is_what_the_process_may_take(tmp_path):
    """The planner's figure is the smallest of the host's, the cgroup's room (v2 and v1 layouts, reclaimable file
    cache not counted as held, "max" and v1's huge value as no limit) and the rlimits' room (a memory-limited
    job: issue 60's sweep was sized from the host's figure alone)."""
    import subprocess
    import sys

    from pdraft.bench.memory_plan import NO_LIMIT, cgroup_room

    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text(f"{3 << 30}\n")
    (v2 / "memory.current").write_text(f"{2 << 30}\n")
    (v2 / "memory.stat").write_text(f"anon 1\ninactive_file {1 << 30}\n")
    assert cgroup_room(str(v2)) == 2 << 30
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_room(str(v2)) is None
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{NO_LIMIT * 8}\n")
    (v1 / "memory.usage_in_bytes").write_text("5\n")
    assert cgroup_room(str(tmp_path / "v1")) is None
    (v1 / "memory.limit_in_bytes").write_text(f"{1 << 30}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{(1 << 30) + 5}\n")
    assert cgroup_room(str(tmp_path / "v1")) == 0
    probe = ("import resource, torch\n"
             "from pdraft.bench.memory_plan import available_bytes, rlimit_room\n"
             "data = [int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmData:')][0]\n"
             "resource.setrlimit(resource.RLIMIT_DATA, (data + (300 << 20), resource.getrlimit(resource.RLIMIT_DATA)[1]))\n"
             "print(rlimit_room(), available_bytes(torch.device('cpu')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    room, available = map(int, out.stdout.split())
    assert 250 << 20 < room <= 300 << 20 and available <= room, out.stdout


# CASES is complete here: the generator counts test_case[...] of CASES (reliability_support.case_nodes).
@param(CASES)
def test_case(case, w, tmp_path, monkeypatch):
    check(case, w, tmp_path, monkeypatch)
