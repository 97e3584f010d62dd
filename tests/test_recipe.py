"""The recipe format: strict keys with suggestions, types and ranges, file:line in every error, dotted
overrides, resolved copies, and explanations for every field."""

from pathlib import Path

import pytest
import yaml

from pdraft.errors import RecipeError
from pdraft.recipe import RESOLVED_NAME, SECTIONS, Recipe, explain, load_recipe, save_resolved

BAD = """\
name: demo
train:
  stpes: 100
  lr: 3e-4
  batch_size: "eight"
drafter:
  block_size: 64
"""


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def problems_of(path, overrides=None) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    return info.value.problems


def test_every_section_the_issue_names_exists():
    assert set(SECTIONS) == {"target", "data", "drafter", "train", "calibrate", "decode", "bench", "hub", "runtime"}


def test_one_line_per_problem_with_file_line_and_key(tmp_path):
    p = write(tmp_path, BAD)
    probs = problems_of(p)
    assert probs == [
        f"{p}:3: train.stpes: unknown key; did you mean 'train.steps'?",
        f"{p}:5: train.batch_size: expected a valid integer, found 'eight' (str)",
        f"{p}:7: drafter.block_size: expected a value less than or equal to 32, found 64 (int)",
    ]


def test_yaml_exponent_without_dot_is_a_number(tmp_path):
    r = load_recipe(write(tmp_path, "train:\n  lr: 3e-4\n"))
    assert r.train.lr == pytest.approx(3e-4)


def test_unknown_section_suggests_closest(tmp_path):
    probs = problems_of(write(tmp_path, "trian:\n  steps: 3\n"))
    assert probs == [f"{tmp_path / 'r.yaml'}:1: trian: unknown key; did you mean 'train'?"]


def test_section_given_as_scalar(tmp_path):
    probs = problems_of(write(tmp_path, "name: x\ndecode: 5\n"))
    assert probs[0].startswith(f"{tmp_path / 'r.yaml'}:2: decode: expected a mapping")


def test_malformed_yaml_names_the_line(tmp_path):
    probs = problems_of(write(tmp_path, "name: x\ntrain:\n  steps: [1, 2\n"))
    assert len(probs) == 1 and "malformed YAML" in probs[0] and f"{tmp_path / 'r.yaml'}:" in probs[0]


def test_duplicate_keys_are_errors(tmp_path):
    probs = problems_of(write(tmp_path, "train:\n  steps: 1\n  steps: 2\n"))
    assert probs == [f"{tmp_path / 'r.yaml'}:3: train.steps: key appears twice"]


def test_missing_and_top_level_list(tmp_path):
    assert problems_of(tmp_path / "nope.yaml") == [f"{tmp_path / 'nope.yaml'}: recipe file not found"]
    assert "expected a mapping of sections" in problems_of(write(tmp_path, "- 1\n- 2\n"))[0]


def test_cross_field_check(tmp_path):
    probs = problems_of(write(tmp_path, "drafter:\n  num_experts: 2\n  experts_top_k: 4\n"))
    assert "experts_top_k (4) exceeds drafter.num_experts (2)" in probs[0]


def test_overrides_apply_and_are_named_in_errors(tmp_path):
    p = write(tmp_path, "train:\n  steps: 5\n")
    r = load_recipe(p, ["train.steps=7", "train.lr=1e-3", "target.layer_ids=[1, 3]", "decode.gamma=null"])
    assert (r.train.steps, r.train.lr, r.target.layer_ids, r.decode.gamma) == (7, 1e-3, [1, 3], None)
    assert problems_of(p, ["train.steps=-1"]) == [
        "--set train.steps=-1: train.steps: expected a value greater than or equal to 1, found -1 (int)"]
    assert "did you mean 'train.steps'" in problems_of(p, ["train.step=3"])[0]
    assert "expected KEY=VALUE" in problems_of(p, ["train.steps"])[0]


def test_resolved_copy_round_trips(tmp_path):
    r = load_recipe(write(tmp_path, "name: demo\ndrafter:\n  kind: dflash\n"), ["decode.gamma=8"])
    path = save_resolved(r, tmp_path / "artifact", derived={"target.layer_ids": [1, 2]})
    assert path.name == RESOLVED_NAME
    again = load_recipe(path)
    assert again.drafter.kind == "dflash" and again.decode.gamma == 8 and again.target.layer_ids == [1, 2]
    data = yaml.safe_load(path.read_text())
    assert set(data) >= set(SECTIONS)  # defaults written out, not left implicit


def test_every_field_has_a_description():
    rows = explain()
    assert len(rows) > 80
    assert all(desc and "\n" not in desc for _, _, _, desc in rows)
    assert [r[0] for r in explain("train.lr")] == ["train.lr"]
    with pytest.raises(RecipeError, match="did you mean 'train.lr'"):
        explain("train.lrr")


def test_shipped_recipes_are_valid():
    root = Path(__file__).resolve().parents[1] / "recipes"
    recipes = sorted(root.glob("*.yaml"))
    assert recipes, "no recipes shipped"
    for path in recipes:
        assert isinstance(load_recipe(path), Recipe)
