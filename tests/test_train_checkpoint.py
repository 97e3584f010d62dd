"""Atomic checkpoints: round trip of optimizer/scheduler/RNG state, and a failure mid-write (a full disk)
leaves the previous checkpoint and `latest` intact."""

import random

import pytest
import torch

from pdraft.errors import PdraftError
from pdraft import run_folder as ck
from pdraft.train.schedule import warmup_cosine


def make(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = warmup_cosine(opt, 20, 3, 0.1)
    return model, opt, sched


def step(model, opt, sched):
    loss = model(torch.randn(5, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def write_model(model):
    def write(folder):
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    return write


def test_resume_continues_exactly(tmp_path):
    model, opt, sched = make()
    for _ in range(3):
        step(model, opt, sched)
    ck.save_checkpoint(tmp_path, 3, write_model(model), opt, sched, {"data": {"epoch": 0, "index": 3}})
    for _ in range(3):
        step(model, opt, sched)
    expected = [p.detach().clone() for p in model.parameters()]

    model2, opt2, sched2 = make(seed=1)
    path = ck.latest_checkpoint(tmp_path)
    from safetensors.torch import load_file
    model2.load_state_dict(load_file(str(path / "model.safetensors")))
    state = ck.load_trainer_state(path, opt2, sched2)
    assert state["step"] == 3 and state["data"] == {"epoch": 0, "index": 3}
    for _ in range(3):
        step(model2, opt2, sched2)
    for a, b in zip(expected, model2.parameters()):
        assert torch.equal(a, b)


def test_failure_during_save_keeps_previous(tmp_path):
    model, opt, sched = make()
    step(model, opt, sched)
    ck.save_checkpoint(tmp_path, 1, write_model(model), opt, sched, {})
    before = (tmp_path / "step_1" / "model.safetensors").read_bytes()

    def full_disk(folder):
        (folder / "model.safetensors").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    step(model, opt, sched)
    with pytest.raises(PdraftError, match="disk full while writing checkpoint step_2 .*step_1 is intact"):
        ck.save_checkpoint(tmp_path, 2, full_disk, opt, sched, {})
    assert ck.latest_checkpoint(tmp_path).name == "step_1"
    assert (tmp_path / "step_1" / "model.safetensors").read_bytes() == before
    assert not (tmp_path / "step_2").exists() and not list(tmp_path.glob(".tmp_*"))


def test_pruning_keeps_latest_and_k_more(tmp_path):
    model, opt, sched = make()
    for s in range(1, 6):
        ck.save_checkpoint(tmp_path, s, write_model(model), opt, sched, {}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_3", "step_4", "step_5"]


def test_rng_round_trip():
    state = ck.rng_state()
    a = (random.random(), torch.rand(2))
    ck.set_rng_state(state)
    b = (random.random(), torch.rand(2))
    assert a[0] == b[0] and torch.equal(a[1], b[1])
