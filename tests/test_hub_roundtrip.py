"""Round trip: push (Hub mocked at the HTTP boundary) -> the exact uploaded bytes laid out as huggingface_hub's
cache -> pull offline -> greedy decode on the tiny target. Output and per-round acceptance equal the original
drafter's, and the output equals the target alone (lossless). A DeepSpec or z-lab folder, written by those
tools rather than by pdraft, is pushed the documented way: `pull FOLDER --out COPY` first (a validated copy
that lists what pdraft wrote), then push the copy."""

import pytest
import torch

from pdraft.decode.engine import generate
from pdraft.hub import pull, push
from pdraft.models import load_drafter
from test_hub_support import fake_hub, put_in_cache, write_family  # noqa: F401
import test_models_support
from test_models_support import tiny_target_config

target = test_models_support.target  # tiny_target(), a module fixture

torch.set_num_threads(1)
PROMPTS = [[5, 9, 11, 3, 7, 2], [1, 2, 3, 4, 5, 6, 7, 8, 9], [40, 41, 42]]


@pytest.mark.parametrize("family", ["pdraft-dspark", "deepspec-dflash", "zlab-dflash"])
def test_push_pull_decode_round_trip(tmp_path, target, fake_hub, monkeypatch, family):
    original = write_family(tmp_path / "drafter", family, target, seed=3)
    monkeypatch.setenv("HF_TOKEN", "hf_roundtripSecret")
    hub = fake_hub()
    folder = tmp_path / "drafter"
    if not family.startswith("pdraft"):
        folder = pull(str(folder), out=tmp_path / "adopted").path
    push(folder, "someone/round-trip")
    uploaded = hub.commits[0]["files"]
    put_in_cache(tmp_path / "cache", "someone/round-trip", uploaded, commit="b" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    got = pull("someone/round-trip", out=tmp_path / "pulled", target_config=tiny_target_config())
    assert got.revision == "b" * 40 and "README.md" in got.files
    pulled = load_drafter(got.path, tiny_target_config())
    pulled.attach_target(target)
    before = generate(target, original, PROMPTS, max_new_tokens=20)
    after = generate(target, pulled, PROMPTS, max_new_tokens=20)
    alone = generate(target, None, PROMPTS, max_new_tokens=20)
    assert after.output_ids == before.output_ids == alone.output_ids
    counts = [(r.request, r.gamma, r.verified, r.accepted) for r in before.records]
    assert counts == [(r.request, r.gamma, r.verified, r.accepted) for r in after.records]
    assert after.summary().tau == before.summary().tau
