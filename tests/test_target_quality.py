"""The embedded target's quality checks: the loop detector behind `pdraft target eval`'s loop share, its
measurement on the test target, and the sweep script that chose between builds."""

from __future__ import annotations

import json

import pytest

from pdraft.targets.builtin.quality import has_loop, loop_share


def _seq(unit, times, prefix=(100, 101, 102), suffix=(103, 104)):
    return list(prefix) + list(unit) * times + list(suffix)


@pytest.mark.parametrize("unit, times, loops", [
    ((1, 2, 3, 4), 3, True),        # the same 4-gram three times in a row
    ((1, 2, 3, 4), 2, False),       # twice is not a loop
    ((7,), 12, True),               # one token twelve times
    ((7,), 11, False),
    ((1, 2), 6, True),              # period 2 over 12 tokens
    ((1, 2), 5, False),
    (tuple(range(10, 20)), 3, True),   # a 10-token line three times
    (tuple(range(10, 20)), 2, False),
    (tuple(range(10, 31)), 3, True),   # period 21, the longest that fits 64 tokens three times
])
def test_has_loop_finds_a_unit_repeated_three_times(unit, times, loops):
    assert has_loop(_seq(unit, times)) is loops


def test_has_loop_ignores_repeats_that_are_not_consecutive():
    # The same 4-gram three times, but with other tokens between: real code repeats names like this.
    ids = [1, 2, 3, 4, 50, 1, 2, 3, 4, 51, 52, 1, 2, 3, 4]
    assert not has_loop(ids)
    assert not has_loop(list(range(64)))
    assert not has_loop([])


def test_prompts_are_encoded_as_decode_encodes_them(builtin_test_target):
    from transformers import AutoTokenizer

    from pdraft.data.templates import encode_prompt
    from pdraft.targets.builtin.quality import encode

    tok = AutoTokenizer.from_pretrained(str(builtin_test_target))
    for chat in (False, True):
        for text in ("def f(x):", 'def g(a):\n    """Doc."""'):
            assert encode(tok, text, chat) == encode_prompt(tok, text, chat_template=chat)
    assert encode(tok, "def f(x):", True) != encode(tok, "def f(x):", False)


def test_loop_share_on_the_test_target(builtin_test_target):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(builtin_test_target))
    model = AutoModelForCausalLM.from_pretrained(str(builtin_test_target))
    for chat in (False, True):
        m = loop_share(model, tok, ["def f(x):", "def g(a, b):"], chat_template=chat, max_new_tokens=16)
        assert m["prompts"] == 2
        assert 0.0 <= m["loops"] <= 1.0
        assert 0 <= m["mean_tokens"] <= 16
        assert isinstance(m["first"], str)


@pytest.mark.slow
def test_target_sweep_dumps_the_builder_streams_and_runs_a_configuration(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import torch

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "target_sweep.py"
    subprocess.run([sys.executable, str(script), "dump", "--vocab", "512", "--out", str(tmp_path)], check=True,
                   capture_output=True)
    data = torch.load(tmp_path / "data512.pt")
    assert len(data["raw"]) == len(data["chat"]) == 101 and int(data["code_0.3"].max()) < 512
    # The chat streams differ from the raw-heavy ones only by wrapping: same documents, more special tokens.
    assert len(data["code_0.5"]) > len(data["code_0.3"])
    out = subprocess.run([sys.executable, str(script), "run", "smoke", "--data", str(tmp_path), "--device", "cpu",
                          "--out", str(tmp_path / "res")], check=True, capture_output=True, text=True).stdout
    res = json.loads((tmp_path / "res" / "smoke.json").read_text())
    assert res["name"] == "smoke" and 0 <= res["code_top1"] <= 1 and 0 <= res["loop_raw"] <= 1
    assert '"code_top1"' in out
