"""Tensors the CPU-side bookkeeping builds meet the device the model computes on. A lent H200 found two places
where a CUDA run failed on `Expected all tensors to be on the same device` (training's supervised mask, the
acceptance test of a round without drafts) that every CPU test passed. These run on torch's `meta` device: it
computes shapes only, but refuses to mix with CPU tensors exactly as CUDA does, so a CPU machine catches the
same mistake."""

import torch

from doubles import tiny_target
from pdraft.decode.acceptance import accept
from pdraft.decode.inputs import load_attached_drafter
from pdraft.models.build import build_drafter
from pdraft.models.checkpoint import save_drafter
from pdraft.train.batches import supervised_mask


def test_supervised_mask_follows_the_anchors_device():
    anchors = torch.tensor([[0, 3], [1, 2]], device="meta")
    keep = torch.ones(2, 2, dtype=torch.bool, device="meta")
    loss_mask = torch.ones(2, 8, dtype=torch.bool, device="meta")
    assert supervised_mask(anchors, keep, loss_mask, 4).device.type == "meta"


def test_greedy_acceptance_takes_cpu_drafts_against_device_logits():
    logits = torch.empty(2, 3, 16, device="meta")  # [batch, L+1, vocab] on the model's device
    drafts = torch.zeros(2, 2, dtype=torch.long)  # the book's drafts stay on the CPU
    for width in (0, 2):  # a round without drafts (the first token) and one with
        acc = accept(logits[:, : width + 1], drafts[:, :width], None, torch.full((2,), width), None)
        assert acc.accepted.device.type == "meta" and acc.next_token.device.type == "meta"


def test_an_attached_drafter_follows_the_targets_device(tmp_path):
    """bench, decode and the quickstart load a drafter through load_attached_drafter: on a CUDA target it was left on
    the CPU and its first round failed (the H200 of 2026-12-04 evening); calibration moved it itself."""
    target = tiny_target(64, 32, num_layers=3)
    save_drafter(build_drafter("dflash", target.config, seed=0, mask_token_id=63, block_size=4,
                             num_hidden_layers=1, target_layer_ids=[0, 1]), tmp_path / "d")
    drafter = load_attached_drafter(tmp_path / "d", target.to("meta"))
    assert {p.device.type for p in drafter.parameters()} == {"meta"}


def test_an_attached_drafter_takes_the_targets_dtype(tmp_path):
    """A float32 checkpoint beside a bfloat16 target runs in bfloat16, as the engines serve a drafter and as
    calibration measured it; beside a float32 target it stays float32 (issue 38)."""
    target = tiny_target(64, 32, num_layers=3)
    save_drafter(build_drafter("dspark", target.config, seed=0, mask_token_id=63, block_size=4,
                               num_hidden_layers=1, target_layer_ids=[0, 1]), tmp_path / "d")
    assert {p.dtype for p in load_attached_drafter(tmp_path / "d", target).parameters()} == {torch.float32}
    drafter = load_attached_drafter(tmp_path / "d", target.to(torch.bfloat16))
    assert {p.dtype for p in drafter.parameters()} == {torch.bfloat16}
