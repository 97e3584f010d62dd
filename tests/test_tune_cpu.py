"""The threads of a CPU run are chosen on its own work, and every product plan already built is timed again at the
chosen count (issue 59: decode loads its drafter, whose plans are timed when built, before the threads are
chosen, so its plans kept a choice made at the default count)."""

from __future__ import annotations

import os

import pytest
import torch

from pdraft import gemm
from pdraft.decode.backend import resolve, tune_cpu
from pdraft.models.build import build_drafter
from pdraft.models.layers import prepare_products, product_plans
from test_models_support import tiny_target


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: nothing to measure between")
def test_a_loaded_drafters_plans_are_timed_again_at_the_chosen_threads(monkeypatch):
    target = tiny_target().eval()
    drafter = build_drafter("dflash", target.config, seed=0, num_hidden_layers=1, target_layer_ids=[0, 1], mask_token_id=1).eval()
    drafter.attach_target(target)
    prepare_products(drafter)
    plans = product_plans(drafter)
    assert plans, "prepare_products built no plan on the drafter"
    timed: list[int] = []
    real = gemm.FastLinear.measure

    def measure(self):
        timed.append(id(self))
        real(self)

    monkeypatch.setattr(gemm.FastLinear, "measure", measure)
    before = torch.get_num_threads()
    try:
        choice = tune_cpu(target, [0, 1], resolve("auto", target), 5, "auto", drafters=[drafter])
        assert choice.measured
        assert {id(p) for p in plans} <= set(timed), "a drafter plan kept the choice made before the threads"
        timed.clear()
        choice = tune_cpu(target, [0, 1], resolve("auto", target), 5, 1, drafters=[drafter])  # a fixed count
        assert choice.how == "recipe" and not timed, "plans re-timed though nothing was measured"
    finally:
        torch.set_num_threads(before)
