"""Prompt sets: the record forms, malformed lines named by number (or skipped), empty files, Parquet,
builtin sets and datasets ids that cannot load."""

import json
import sys
import types
from pathlib import Path

import pytest

from pdraft.data.prompts import load_prompts, parse_record, read_jsonl
from pdraft.errors import PdraftError


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_record_forms():
    assert parse_record({"turns": ["a", "b"]}).turns == ["a", "b"]
    msgs = parse_record({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "r"}, {"role": "user", "content": "q2"}]})
    assert (msgs.turns, msgs.response) == (["q", "q2"], "r")
    share = parse_record({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "r"}]})
    assert (share.turns, share.response) == (["q"], "r")
    pr = parse_record({"prompt": "p", "completion": "c"})
    assert (pr.prompt, pr.response) == ("p", "c")
    assert parse_record({"text": "t"}).response is None
    with pytest.raises(ValueError, match="no \"turns\""):
        parse_record({"question": "x"})
    with pytest.raises(ValueError, match="non-empty list"):
        parse_record({"turns": []})


def test_jsonl_good_and_blank_lines(tmp_path):
    p = _write(tmp_path / "a.jsonl", [json.dumps({"turns": ["one"]}), "", json.dumps({"turns": ["two"], "response": "r"})])
    ps = read_jsonl(p)
    assert [c.prompt for c in ps] == ["one", "two"] and ps[1].response == "r" and ps.skipped == []
    assert ps[1].origin.endswith("a.jsonl:3")


def test_malformed_line_is_named(tmp_path):
    p = _write(tmp_path / "bad.jsonl", [json.dumps({"turns": ["ok"]}), '{"turns": ["broken"', json.dumps({"nope": 1})])
    with pytest.raises(PdraftError, match=r"bad.jsonl:2: invalid JSON"):
        read_jsonl(p)
    ps = read_jsonl(p, on_error="skip")
    assert [c.prompt for c in ps] == ["ok"] and ps.skipped == [2, 3]


def test_empty_and_all_bad_files(tmp_path):
    with pytest.raises(PdraftError, match="empty prompt set"):
        load_prompts(str(_write(tmp_path / "empty.jsonl", [])))
    with pytest.raises(PdraftError, match="all 1 lines are malformed"):
        load_prompts(str(_write(tmp_path / "bad.jsonl", ["[1, 2]"])), on_error="skip")


def test_shared_deepspec_layout_and_max_samples():
    path = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "mt-bench.jsonl"
    if not path.exists():
        pytest.skip("the shared benchmark prompt sets are not next to this checkout")
    ps = load_prompts(str(path), max_samples=5)
    assert len(ps) == 5 and all(len(c.turns) == 2 for c in ps)


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["p1", "p2"], "response": ["r1", None]}), tmp_path / "d.parquet")
    ps = load_prompts(str(tmp_path / "d.parquet"))
    assert [(c.prompt, c.response) for c in ps] == [("p1", "r1"), ("p2", None)]


def test_missing_file_and_unknown_dataset(tmp_path):
    with pytest.raises(PdraftError, match="not found"):
        load_prompts(str(tmp_path / "missing.jsonl"))
    with pytest.raises(PdraftError, match="cannot load dataset 'pdraft-test-nobody/no-such-set' split 'train'"):
        load_prompts("pdraft-test-nobody/no-such-set")


def test_builtin_sets_interleave(tmp_path, monkeypatch):
    code = _write(tmp_path / "code.jsonl", [json.dumps({"turns": [f"c{i}"]}) for i in range(3)])
    prose = _write(tmp_path / "prose.jsonl", [json.dumps({"turns": [f"p{i}"]}) for i in range(2)])
    fake = types.ModuleType("pdraft.targets.builtin")
    fake.prompt_set_path = lambda name, split="heldout": {"code": code, "prose": prose}[name]
    monkeypatch.setitem(sys.modules, "pdraft.targets.builtin", fake)
    assert [c.prompt for c in load_prompts("builtin:code+prose")] == ["c0", "p0", "c1", "p1", "c2"]
    assert [c.prompt for c in load_prompts("builtin:prose")] == ["p0", "p1"]
    with pytest.raises(PdraftError, match="unknown builtin prompt set builtin:poems"):
        load_prompts("builtin:poems")


def test_builtin_sets_absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "pdraft.targets.builtin", None)  # import fails
    with pytest.raises(PdraftError, match="not part of this build"):
        load_prompts("builtin:code")


def test_builtin_training_split_never_overlaps_the_bench_sets():
    from pdraft.data.prompts import load_prompts

    train = {c.prompt for c in load_prompts("builtin:code-train+prose-train")}
    held = {c.prompt for c in load_prompts("builtin:code+prose")}
    assert len(train) > 1000 and len(held) > 400
    assert not train & held


def test_row_ranges_and_joined_files(tmp_path):
    """`file.jsonl[a:b]` takes records a..b-1 (what a bench's first N leave out), `+` interleaves sources record by
    record, and max_samples cuts the mix, not one source."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"turns": [f"a{i}"]}) + "\n" for i in range(6)))
    b.write_text("".join(json.dumps({"turns": [f"b{i}"]}) + "\n" for i in range(3)))
    assert [c.prompt for c in load_prompts(f"{a}[4:]")] == ["a4", "a5"]
    assert [c.prompt for c in load_prompts(f"{a}[:2]")] == ["a0", "a1"]
    assert [c.prompt for c in load_prompts(f"{a}[1:3]+{b}[2:]")] == ["a1", "b2", "a2"]
    assert [c.prompt for c in load_prompts(f"{a}+{b}", max_samples=3)] == ["a0", "b0", "a1"]
    with pytest.raises(PdraftError, match="not found"):
        load_prompts(f"{tmp_path / 'missing.jsonl'}[2:]")


def test_bench_names_a_row_range_by_its_file():
    from pdraft.bench.sweep import domain_name

    assert domain_name("../shared/datasets/humaneval.jsonl[40:]") == "humaneval[40:]"
    assert domain_name("../shared/datasets/humaneval.jsonl") == "humaneval"
