"""The drafter contract (pdraft.models.api) as the engine reads it: what each family declares (a compilable pass,
fused kernels, state placement for continuous batching, its drafting kind), and the defaults a family that
declares nothing gets, which leave it as it is or refuse in one line. Nothing outside pdraft/models/ asks a
drafter, a state or a config what it has by `hasattr`."""

import re
import subprocess
from pathlib import Path

import pytest
import torch

from doubles import tiny_target
from pdraft.decode.backend import Backend, drafter_pass
from pdraft.decode.engine import generate
from pdraft.decode.ngram import NgramDrafter
from pdraft.errors import PdraftError
from pdraft.models.api import Drafter, DraftState, TrainOutput
from pdraft.models.build import build_drafter
from pdraft.models.families import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 16


@pytest.fixture(scope="module")
def target():
    return tiny_target(VOCAB, 32, num_layers=4)


def make(kind, target):
    extra = ({"ttt_steps": 2} if kind == "eagle3" else
             {"mask_token_id": VOCAB - 1, "num_hidden_layers": 1, "block_size": 4,
              **({"markov_rank": 4} if kind == "dspark" else {})})
    drafter = build_drafter(kind, target.config, seed=0, **extra)
    drafter.attach_target(target)
    return drafter.eval()


@pytest.mark.parametrize("kind", FAMILIES.kinds)
def test_each_family_declares_its_pass_and_drafting(target, kind):
    drafter = make(kind, target)
    spec = FAMILIES.get(kind)
    # the parallel backbone's one pass per block compiles; EAGLE-3's chain of passes runs as written
    assert drafter.compilable_pass == (spec.drafting == "parallel")
    compiled = Backend("on", static=True, compiled=True, graphs=False, why="test")
    eager = Backend("auto", static=True, compiled=False, graphs=False, why="test")
    assert (drafter_pass(drafter, compiled) != drafter.propose) == drafter.compilable_pass
    assert drafter_pass(drafter, eager) == drafter.propose
    # every family's state takes a new request in a row (continuous batching)
    assert type(drafter.new_state(2, 16)).place is not DraftState.place


def test_defaults_leave_alone_or_refuse_in_one_line(target):
    ngram = NgramDrafter.__new__(NgramDrafter)
    assert Drafter.compilable_pass is False and ngram.compilable_pass is False
    assert Drafter.set_fused_kernels(ngram, True) is None  # no fused kernel: nothing to switch
    with pytest.raises(PdraftError) as e:
        DraftState().place(torch.tensor([0]), DraftState())
    assert "\n" not in e.value.one_line() and "continuous batching" in str(e.value)


def test_a_state_without_place_refuses_continuous_batching(target):
    drafter = make("dflash", target)
    real = drafter.new_state

    def new_state(batch, capacity=None):
        state = real(batch, capacity)
        state.__class__ = type("Unplaced" + type(state).__name__, (type(state),), {"place": DraftState.place})
        return state

    drafter.new_state = new_state
    with pytest.raises(PdraftError, match="cannot take a new request in a row"):
        generate(target, drafter, [[1, 2], [3], [4, 5]], gamma=2, max_new_tokens=3, concurrency=1, compile="auto")


def test_fused_kernels_setting_reaches_the_family_that_has_them(target):
    dspark = make("dspark", target)
    generate(target, dspark, [[1, 2, 3]], gamma=2, max_new_tokens=2, fused_kernels=True)
    assert dspark.use_fused_kernel is True
    generate(target, dspark, [[1, 2, 3]], gamma=2, max_new_tokens=2, fused_kernels=False)
    assert dspark.use_fused_kernel is False


def test_train_output_is_part_of_the_contract():
    import pdraft.models as models
    assert models.TrainOutput is TrainOutput


def test_no_hasattr_on_a_collaborator_outside_models():
    out = subprocess.run(["grep", "-rnE", r"hasattr\((drafter|state|self\.drafter|cfg)", "pdraft", "--include=*.py"],
                         cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    assert [line for line in out if not re.match(r"pdraft/models/", line)] == []
