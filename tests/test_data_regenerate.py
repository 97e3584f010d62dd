"""Regeneration by the target: greedy output equals plain generation, sampling is seeded, and an interrupted
run resumes to the same file."""

import json

import pytest
import torch

from pdraft.data.prompts import Conversation
from pdraft.decode.session import target_alone_loop as own_loop
from pdraft.data.regenerate import RegenerateSettings, _generate, read_done, regenerate
from pdraft.data.templates import encode_prompt
from pdraft.errors import PdraftError
from pdraft.recipe import TargetSection
from pdraft.target.loader import load_target
from test_data_tinytarget import make_tiny_target


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_target(TargetSection(id=str(make_tiny_target(tmp_path_factory.mktemp("regen") / "t"))))


RECORDS = [Conversation([f"Write a function number {i}" + " please" * (i % 3)]) for i in range(7)]


def _rows(path):
    return sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["index"])


def test_greedy_matches_single_prompt_generation(target, tmp_path):
    settings = RegenerateSettings(max_new_tokens=5, batch_size=3)
    out = regenerate(target, RECORDS, tmp_path / "r.jsonl", settings)
    ids = torch.tensor([encode_prompt(target.tokenizer, RECORDS[0].prompt)])
    direct = target.model.generate(input_ids=ids, max_new_tokens=5, do_sample=False)[0, ids.shape[1]:].tolist()
    stops = {target.tokenizer.eos_token_id}
    cut = next((k + 1 for k, t in enumerate(direct) if t in stops), len(direct))
    assert out[0].response_ids == direct[:cut]
    assert out[0].response == target.tokenizer.decode(direct[:cut], skip_special_tokens=True)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_own_loop_gives_generates_tokens(target, temperature):
    """The batches pdraft's own loop regenerates are generate()'s, greedy and sampled from the same streams, over
    prompts of different lengths (left padding on one side, per-row lengths on the other) and early stops."""
    loop = own_loop(target)
    assert loop is not None  # the tiny Qwen3 target on a CPU, one process: export-hidden regenerates with it
    prompts = [encode_prompt(target.tokenizer, r.prompt) for r in RECORDS]
    settings = RegenerateSettings(max_new_tokens=12, temperature=temperature, seed=5)
    indices = list(range(len(prompts)))
    ours = _generate(target, prompts, settings, indices, loop)
    theirs = _generate(target, prompts, settings, indices)
    assert ours == theirs
    if temperature:
        assert len({tuple(o) for o in ours}) > 1  # not one continuation for every prompt (the streams differ)


def test_sampling_is_seeded_and_resume_is_identical(target, tmp_path):
    settings = RegenerateSettings(max_new_tokens=6, temperature=1.0, seed=3, batch_size=3)
    full = tmp_path / "full.jsonl"
    regenerate(target, RECORDS, full, settings)
    greedy = regenerate(target, RECORDS, tmp_path / "greedy.jsonl", RegenerateSettings(max_new_tokens=6, batch_size=3))
    assert [r["response_ids"] for r in _rows(full)] != [g.response_ids for g in greedy]

    cut = tmp_path / "cut.jsonl"
    regenerate(target, RECORDS, cut, settings)
    lines = cut.read_bytes().splitlines(keepends=True)
    cut.write_bytes(b"".join(lines[:4]) + lines[4][:7])  # killed mid-way through a batch and a line
    assert sorted(read_done(cut)) == [0, 1, 2, 3] and cut.read_bytes().endswith(b"\n")
    seen = []
    regenerate(target, RECORDS, cut, settings, progress=seen.append)
    assert seen[0] == 4 and sum(seen) == len(RECORDS)
    assert _rows(cut) == _rows(full)


def test_other_settings_refused_until_fresh(target, tmp_path):
    path = tmp_path / "r.jsonl"
    regenerate(target, RECORDS[:2], path, RegenerateSettings(max_new_tokens=3))
    with pytest.raises(PdraftError, match=r"other settings \(changed: settings\)"):
        regenerate(target, RECORDS[:2], path, RegenerateSettings(max_new_tokens=4))
    out = regenerate(target, RECORDS[:2], path, RegenerateSettings(max_new_tokens=4), fresh=True)
    assert len(_rows(path)) == 2 and all(len(o.response_ids) <= 4 for o in out)
