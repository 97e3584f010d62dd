"""Regeneration by the target: greedy output equals plain generation, sampling (temperature, top-k, top-p, a
greedy/sampled mix) is seeded per prompt and equal in pdraft's own loop and generate(), and an interrupted run
resumes to the same file."""

import json

import pytest
import torch

from pdraft.data.prompts import Conversation
from pdraft.decode.session import target_alone_loop as own_loop
from pdraft.data.regenerate import RegenerateSettings, _generate, read_done, regenerate
from pdraft.data.templates import encode_prompt
from pdraft.errors import PdraftError
from pdraft.recipe import RuntimeSection, TargetSection
from pdraft.runtime import make_runtime
from pdraft.targets.loader import load_target
from test_data_tinytarget import make_tiny_target


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    # float32, pinned: these tests hold pdraft's own loop to generate()'s tokens exactly, and under runtime.dtype
    # auto a CPU with bf16 units computes in bf16, where the two forwards (static cache against transformers')
    # round near-ties differently (docs/PERFORMANCE.md, what "the target's output" means on the fast path).
    return load_target(TargetSection(id=str(make_tiny_target(tmp_path_factory.mktemp("regen") / "t"))),
                       make_runtime(RuntimeSection(dtype="float32")))


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


SAMPLINGS = {"greedy": {}, "T1": dict(temperature=1.0), "T0.7 top-k 20 top-p 0.8": dict(temperature=0.7, top_k=20, top_p=0.8),
             "mix": dict(temperature=1.0, greedy_share=0.5)}


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_own_loop_gives_generates_tokens(target, sampling):
    """The batches pdraft's own loop regenerates are generate()'s, greedy and sampled (top-k and top-p included)
    from the same streams, over prompts of different lengths (left padding on one side, per-row lengths on the
    other) and early stops."""
    loop = own_loop(target)
    assert loop is not None  # the tiny Qwen3 target on a CPU, one process: export-hidden regenerates with it
    prompts = [encode_prompt(target.tokenizer, r.prompt) for r in RECORDS]
    settings = RegenerateSettings(max_new_tokens=12, seed=5, **sampling)
    indices = list(range(len(prompts)))
    ours = _generate(target, prompts, settings, indices, loop)
    theirs = _generate(target, prompts, settings, indices)
    assert ours == theirs
    if sampling:
        assert len({tuple(o) for o in ours}) > 1  # not one continuation for every prompt (the streams differ)


def test_top_k_and_top_p_reach_the_draws(target):
    """top-k 1 (and a top-p below every token's share but the first's) sample the argmax whatever the temperature:
    the greedy tokens exactly, in both engines; a top-k of 3 at a high temperature draws only among each step's
    three likeliest tokens, and differs from unrestricted sampling from the same streams."""
    prompts = [encode_prompt(target.tokenizer, r.prompt) for r in RECORDS]
    indices = list(range(len(prompts)))
    greedy = _generate(target, prompts, RegenerateSettings(max_new_tokens=10), indices)
    for loop in (own_loop(target), None):
        for cut in (dict(top_k=1), dict(top_p=1e-6)):
            assert _generate(target, prompts, RegenerateSettings(max_new_tokens=10, temperature=3.0, seed=2, **cut),
                             indices, loop) == greedy
    hot = RegenerateSettings(max_new_tokens=10, temperature=3.0, seed=2)
    top3 = RegenerateSettings(max_new_tokens=10, temperature=3.0, seed=2, top_k=3)
    free, kept = _generate(target, prompts, hot, indices), _generate(target, prompts, top3, indices)
    assert free != kept
    for p, new in zip(prompts, kept):
        ids = list(p)
        for t in new:
            logits = target.model(torch.tensor([ids])).logits[0, -1]
            assert t in torch.topk(logits, 3).indices.tolist()
            ids.append(t)


def test_a_mix_is_the_greedy_and_the_sampled_run_interleaved(target, tmp_path):
    """greedy_share 0.5 regenerates every other prompt greedily (the same response as an all-greedy run) and the
    rest sampled (the same response as an all-sampled run: each prompt keeps its own stream whatever its batch
    holds), so a mix is a spread of both runs' samples, not a third distribution."""
    base = dict(max_new_tokens=6, seed=3, batch_size=3)
    greedy = regenerate(target, RECORDS, tmp_path / "g.jsonl", RegenerateSettings(**base))
    sampled = regenerate(target, RECORDS, tmp_path / "s.jsonl", RegenerateSettings(temperature=1.0, **base))
    mixed = regenerate(target, RECORDS, tmp_path / "m.jsonl", RegenerateSettings(temperature=1.0, greedy_share=0.5, **base))
    modes = [RegenerateSettings(temperature=1.0, greedy_share=0.5).sampling_of(i).temperature for i in range(len(RECORDS))]
    assert modes == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    for i, (g, s, m) in enumerate(zip(greedy, sampled, mixed)):
        assert m.response_ids == (g.response_ids if modes[i] == 0 else s.response_ids)
    assert [g.response_ids for g in greedy] != [s.response_ids for s in sampled]
    assert [RegenerateSettings(temperature=1.0, greedy_share=0.25).sampling_of(i).temperature
            for i in range(8)].count(0.0) == 2


def test_a_greedy_file_from_before_the_sampling_keys_still_resumes(target, tmp_path):
    """The metadata leaves top_k, top_p and greedy_share out at their defaults: a greedy responses file written
    before those keys existed (its settings without them) resumes instead of being refused."""
    path = tmp_path / "r.jsonl"
    settings = RegenerateSettings(max_new_tokens=3)
    regenerate(target, RECORDS[:2], path, settings)
    meta = path.with_name(path.name + ".meta.json")
    old = json.loads(meta.read_text())
    assert not {"top_k", "top_p", "greedy_share"} & set(old["settings"])
    out = regenerate(target, RECORDS[:2], path, settings)
    assert len(out) == 2
    with pytest.raises(PdraftError, match=r"changed: settings"):
        regenerate(target, RECORDS[:2], path, RegenerateSettings(max_new_tokens=3, temperature=1.0, top_p=0.9))


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
