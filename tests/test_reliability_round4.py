"""Reliability, fourth hostile round (issue 60), the residue: an EAGLE-3 folder whose top-level
`target_layer_ids` contradicts the layers its engine keys name (decode, export and pull each refuse, in the one
loader), an export whose layer ids do not fit the target it names, the serving sweep's levels above the requests it
has, check-serving's scratch folder kept on failure, and stale `.tmp-*` folders of a killed target build. Contract
in reliability_support.check; the walks beside run each rule over its class of inputs."""

import json
import re
from pathlib import Path

import pytest

import reliability_support
from reliability_support import Case, check, param
from test_reliability_eagle3 import eagle3

w = reliability_support.w  # the shared world, a module fixture


# ---- class 1: EAGLE-3 layer ids stated in DeepSpec's key beside the engines' ----------------------------------------
def top_level_ids(ids, *, drop_pdraft: bool = False):
    """Give the saved EAGLE-3 config a top-level target_layer_ids (DeepSpec's key); drop_pdraft removes pdraft's
    own copy, so eagle_config (what SGLang reads) is the one engine place left."""
    def damage(folder):
        cfg = json.loads((folder / "config.json").read_text())
        cfg["target_layer_ids"] = ids
        if drop_pdraft:
            cfg["pdraft"].pop("target_layer_ids")
        (folder / "config.json").write_text(json.dumps(cfg))
    return damage


LAYERS_TWICE = r"target_layer_ids is \[0, 1, 2\] in (pdraft|eagle_config)\S* .*but \[1, 2, 3\] in the top-level target_layer_ids"
CASES = [
    Case("decode", "eagle3-top-level-target-layer-ids", "an EAGLE-3 whose top-level target_layer_ids (DeepSpec's "
         "key) name other layers than eagle_config", lambda w, t: [
             "decode", "--recipe", str(w.recipe), "--drafter", str(eagle3(w, t, top_level_ids([1, 2, 3]))),
             "--prompt", "def f"], LAYERS_TWICE),
    Case("export", "eagle3-top-level-target-layer-ids", "the same folder exported for vLLM (wrote both lists)",
         lambda w, t: ["export", str(eagle3(w, t, top_level_ids([1, 2, 3], drop_pdraft=True))), "--format", "vllm",
                       "--out", str(t / "o")], LAYERS_TWICE),
    Case("pull", "eagle3-top-level-target-layer-ids", "a published EAGLE-3 stating its layers twice, differently",
         lambda w, t: ["pull", str(eagle3(w, t, top_level_ids([1, 2, 3], drop_pdraft=True))), "--out",
                       str(t / "copy")], LAYERS_TWICE),
]


def test_a_top_level_target_layer_ids_alone_names_no_layers(tmp_path):
    """DeepSpec's key in an EAGLE-3-layout folder is checked, never read alone: no engine of that layout reads it,
    so the folder still names no layers (the refusal it had), and one that agrees with eagle_config loads."""
    from test_models_support import tiny_target_config

    from pdraft.errors import PdraftError
    from pdraft.models.build import build_drafter
    from pdraft.models.checkpoint import load_config
    from pdraft.models.eagle3.format import eagle3_config_to_json

    data = eagle3_config_to_json(build_drafter("eagle3", tiny_target_config(), seed=0).config)
    ids = list(data["pdraft"]["target_layer_ids"])
    data["target_layer_ids"] = ids
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert load_config(tmp_path).target_layer_ids == ids
    del data["pdraft"]["target_layer_ids"], data["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(PdraftError, match="does not name the target layers it reads"):
        load_config(tmp_path)


# ---- class 2: export holds the drafter's feature layers against the target it names --------------------------------
DEEP = 12  # the depth the drafters below record; the target export is given has TARGET_DEPTH layers
TARGET_DEPTH = 4


def _saved(spec, tmp_path, ids):
    """A drafter of family `spec` built for a DEEP-layer target with feature layers `ids`, saved."""
    from test_models_support import MASK, tiny_target_config

    from pdraft.models import save_drafter
    from pdraft.models.build import build_drafter

    kw = {} if spec.drafting != "parallel" else dict(mask_token_id=MASK, block_size=4, num_hidden_layers=2)
    drafter = build_drafter(spec.kind, tiny_target_config(num_hidden_layers=DEEP), seed=0, target_layer_ids=ids, **kw)
    return save_drafter(drafter, tmp_path / spec.kind)


def _restate(node, ids):
    """Every place a config.json names feature layers, set to `ids` (pdraft's numbering: the places save writes)."""
    for key, value in node.items():
        if key in ("target_layer_ids", "eagle_aux_hidden_state_layer_ids"):
            node[key] = list(ids)
        elif isinstance(value, dict):
            _restate(value, ids)


def _exportable():
    from pdraft.models.families import FAMILIES

    return list(FAMILIES)  # every family has a vLLM plan


L = TARGET_DEPTH
# (name, ids the drafter is built with for a DEEP-layer target or None, ids written into its config.json, error)
BAD_IDS = [
    ("at-or-above-depth", [0, 1, L], None, rf"target layer id {L} is out of range: the target has {L} decoder layers"),
    ("far-above-depth", [0, 1, DEEP - 2], None, rf"target layer id {DEEP - 2} is out of range"),
    ("the-target's-last", [0, 1, L - 1], None, r"last"),
    ("below-the-embedding", [0, 1, 2], [-2, 0, 1], r"id -2 is out of range"),
    ("repeated", [0, 1, 2], [0, 1, 1], r"repeat"),
    ("unsorted", [0, 1, 2], [0, 2, 1], r"not in increasing order"),
]


@pytest.mark.parametrize("name,built,written,expect", BAD_IDS, ids=[b[0] for b in BAD_IDS])
def test_export_refuses_feature_layers_the_target_does_not_have(tmp_path, name, built, written, expect):
    """For every family and every kind of bad layer list, `export --target FOLDER` refuses in one line and writes
    nothing; the same drafter exports for a target deep enough (a DEEP-layer one) where the ids are legal."""
    from test_models_support import tiny_target_config

    from pdraft.errors import PdraftError
    from pdraft.hub.export import export

    shallow, deep = tmp_path / "shallow", tmp_path / "deep"
    tiny_target_config(num_hidden_layers=TARGET_DEPTH).save_pretrained(shallow)
    tiny_target_config(num_hidden_layers=DEEP).save_pretrained(deep)
    for spec in _exportable():
        folder = _saved(spec, tmp_path, built)
        if written is None:  # legal for the depth it records: exports for that target
            export(folder, "vllm", tmp_path / f"{spec.kind}-ok", target=str(deep))
        else:
            cfg = json.loads((folder / "config.json").read_text())
            _restate(cfg, written)
            (folder / "config.json").write_text(json.dumps(cfg))
        out = tmp_path / f"{spec.kind}-out"
        with pytest.raises(PdraftError) as e:
            export(folder, "vllm", out, target=str(shallow))
        text = e.value.one_line()
        assert "\n" not in text and re.search(expect, text), f"{spec.kind}: {text}"
        assert not out.exists(), f"{spec.kind}: {sorted(out.iterdir())}"


CASES += [
    Case("export", "layer-ids-beyond-the-target", "a DSpark drafter recording a 12-layer target, exported with "
         "--target a 4-layer one (wrote the export)", lambda w, t: [
             "export", str(_saved(_spec("dspark"), t, [0, 1, 9])), "--format", "vllm", "--out", str(t / "o"),
             "--target", str(w.target)], r"cannot export for the target .*: target layer id 9 is out of range"),
]


def _spec(kind):
    from pdraft.models.families import FAMILIES

    return next(spec for spec in FAMILIES if spec.kind == kind)


# ---- class 3: the serving sweep's levels, bounded by the requests it has ---------------------------------------------
LEVELS = [  # (what --concurrency is given, levels parsed or None = refused, then run over 24 prompts, warned levels)
    ("0", None, None, None),
    ("-4", None, None, None),
    ("1.5", None, None, None),
    ("4097", None, None, None),
    ("100000", None, None, None),
    (",", None, None, None),
    ("4,4,1", [1, 4], [1, 4], None),
    ("1,512", [1, 512], [1, 24], "512"),
    ("24,30,512", [24, 30, 512], [24], "30, 512"),
    ("16,32", [16, 32], [16, 24], "32"),
]


@pytest.mark.parametrize("given,parsed,run,warned", LEVELS, ids=[g[0] for g in LEVELS])
def test_every_level_is_refused_or_run_within_the_prompts(given, parsed, run, warned):
    """Every kind of level walks the one path a sweep's levels take: zero, negative, non-integer, past the
    parser's bound and empty are refused in one line by the flag's parser and by the recipe's schema; a level
    above the 24 pooled prompts runs as 24 with one warning naming it, repeats dropped after clamping."""
    from pdraft.bench.serving import clamp_levels, parse_levels
    from pdraft.errors import PdraftError
    from pdraft.recipe import load_recipe

    if parsed is None:
        with pytest.raises(PdraftError) as e:
            parse_levels(given)
        assert "\n" not in e.value.one_line() and "concurrency" in e.value.one_line()
        with pytest.raises(PdraftError):  # the recipe key: its schema, one line (reliability_support's cases)
            load_recipe(overrides=[f"bench.concurrency=[{given}]"])
        return
    assert parse_levels(given) == parsed
    warnings: list[str] = []
    assert clamp_levels(parsed, 24, warnings.append) == run
    assert len(warnings) == (warned is not None)
    if warned:
        assert warnings[0].startswith(f"bench.concurrency {warned}: above the 24 prompts"), warnings


def test_a_level_above_the_prompts_runs_as_all_of_them(w, tmp_path, monkeypatch):
    """The world's bench has one prompt: --concurrency 1,3,512 runs one level (C=1, two requests), says so in one
    warning line, and its report lists the levels it ran (before: 1,024 requests at C=512)."""
    from reliability_support import run_cli

    monkeypatch.chdir(tmp_path)
    res = run_cli(["bench", str(w.recipe), "--drafter", str(w.dspark), "--out", str(tmp_path / "b"),
                   "--concurrency", "1,3,512"])
    assert res.code == 0, res.err[-3000:]
    assert [line for line in res.err.splitlines() if "above the 1 prompts" in line] == \
        ["warning: bench.concurrency 3, 512: above the 1 prompts this sweep has, run as 1 (every prompt in flight "
         "at once; more would only repeat them)"], res.err[-3000:]
    report = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert report["settings"]["concurrency"] == [1]
    assert {r["concurrency"] for r in report["runs"]} == {1} and {r["requests"] for r in report["runs"]} == {2}


# ---- class 4: check-serving keeps its scratch folder when it fails --------------------------------------------------
def _engine_log_error(scratch):
    from pdraft.errors import PdraftError

    (scratch / "engine.log").write_text("the engine's last words\n")
    raise PdraftError("the engine stopped before it answered", hint=f"see {scratch / 'engine.log'}")


def _interrupted(scratch):
    (scratch / "expected").mkdir()
    raise KeyboardInterrupt


def _refused_before_writing(scratch):
    from pdraft.errors import PdraftError

    raise PdraftError("the drafter is refused before anything is written")


def _problems(scratch):
    from pdraft.serving.check import ServingReport

    (scratch / "engine.log").write_text("round 3 differs\n")
    report = ServingReport("d", "e", "fake", {})
    report.problems.append("round 3: pdraft accepted 2, the engine 1")
    return report


def _clean(scratch):
    from pdraft.serving.check import ServingReport

    (scratch / "engine.log").write_text("all rounds equal\n")
    return ServingReport("d", "e", "fake", {})


OUTCOMES = [  # (name, what _check does with the scratch folder, raises, the folder stays)
    ("one-line-error-with-a-log", _engine_log_error, "PdraftError", True),
    ("interrupted", _interrupted, "KeyboardInterrupt", True),
    ("refused-before-writing", _refused_before_writing, "PdraftError", False),
    ("problems-found", _problems, None, True),
    ("clean", _clean, None, False),
]


@pytest.mark.parametrize("name,outcome,raises,kept", OUTCOMES, ids=[o[0] for o in OUTCOMES])
def test_check_serving_keeps_its_scratch_folder_unless_it_passed(tmp_path, monkeypatch, name, outcome, raises, kept):
    """Every way check-serving's work can end: the scratch folder (export, engine logs) is deleted only when the
    check passed or nothing was written to it; otherwise it stays, so the hint or problem naming a file in it
    names a file that exists (issue 60: it was deleted on any exception)."""
    from types import SimpleNamespace

    from pdraft.serving import check

    seen, logged = [], []

    def fake_check(*args):
        seen.append(args[-2])
        return outcome(args[-2])

    monkeypatch.setattr(check, "_drafter_recipe", lambda folder: None)
    monkeypatch.setattr(check, "_target_info", lambda recipe: SimpleNamespace(path=str(tmp_path)))
    monkeypatch.setattr(check, "_check", fake_check)
    monkeypatch.setattr(check.tempfile, "mkdtemp", lambda prefix: str((tmp_path / prefix).mkdir() or tmp_path / prefix))
    if raises:
        with pytest.raises(BaseException) as e:
            check.check_serving(tmp_path / "drafter", log=logged.append)
        assert type(e.value).__name__ == raises
        hint = getattr(e.value, "hint", None) or ""
        if "see " in hint:
            assert Path(hint.removeprefix("see ")).is_file(), hint
    else:
        report = check.check_serving(tmp_path / "drafter", log=logged.append)
        if kept:
            assert report.problems[-1] == f"the engine's logs: {seen[0]}"
    assert seen[0].exists() == kept, (name, sorted(tmp_path.rglob("*")))
    assert (f"kept {seen[0]} (the export and the engine's logs)" in logged) == (kept and raises is not None)


# ---- class 5: a killed target build's temporary folders are swept at the next build ---------------------------------
def test_the_next_build_removes_what_a_killed_build_left_and_nothing_else(tmp_path):
    """A killed first use leaves `.tmp-<name>-XXXXXXXX` (mkdtemp) and `.trash-<name>-<hex>` (a discarded copy)
    beside the cache entry; the next build, under the same lock, removes each such folder older than the lock and
    keeps everything else: another target's, a newer one, a link (never followed), a plain file, the resumable
    `.build-<name>` checkpoint folder."""
    import os
    import time

    from pdraft.targets import builtin

    folder = builtin.target_dir("tiny-stdlib", tmp_path)
    root = folder.parent
    root.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("a user's file\n")
    removed = [".tmp-tiny-stdlib-a1b2c3d4", ".tmp-tiny-stdlib-zz_09xyq", ".trash-tiny-stdlib-0123abcd"]
    kept = [".tmp-tiny-stdlib-seed1-a1b2c3d4", ".tmp-other-a1b2c3d4", ".tmp-tiny-stdlib-future01",
            ".build-tiny-stdlib", ".tmp-tiny-stdlib-linked00", ".tmp-tiny-stdlib-afile000"]
    for name in removed + kept[:4]:
        (root / name / "sub").mkdir(parents=True)
        (root / name / "sub" / "model.safetensors").write_bytes(b"half")
    future = time.time() + 3600
    os.utime(root / ".tmp-tiny-stdlib-future01", (future, future))  # made after the lock was taken
    (root / ".tmp-tiny-stdlib-linked00").symlink_to(outside, target_is_directory=True)
    (root / ".tmp-tiny-stdlib-afile000").write_text("not a folder\n")

    assert builtin.resolve("tiny-stdlib", cache_dir=tmp_path, progress=False) == folder
    left = {p.name for p in root.iterdir()}
    assert not left & set(removed), sorted(left)
    assert set(kept) <= left, sorted(left)
    assert (outside / "keep.txt").read_text() == "a user's file\n"
    assert builtin.verify(folder) is None


# CASES is complete here: the generator counts test_case[...] of CASES (reliability_support.case_nodes).
@param(CASES)
def test_case(case, w, tmp_path, monkeypatch):
    check(case, w, tmp_path, monkeypatch)
