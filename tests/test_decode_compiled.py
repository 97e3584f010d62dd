"""decode.compile: which backend each setting runs (pdraft.decode.backend), and the compiled path's losslessness:
greedy output token-identical to the reference target alone with a real DSpark drafter (batch 5, requests
finishing at different rounds), sampled output following the target's exact two-token joint (chi-square), and
compile time kept out of the rounds' timings and paid once per process. torch.compile runs with the
"aot_eager" backend here: the same Dynamo graph, functionalised by AOTAutograd as inductor receives it, without
inductor's C++ code generation (minutes per graph on a 2-core CPU)."""

import pytest
import torch

from doubles import DoubleConfig, RandomDrafter, tiny_target
from pdraft.decode import backend as backends
from pdraft.decode.engine import generate
from pdraft.decode.settings import DecodeSettings
from pdraft.decode.target_runner import PackedVerifier
from pdraft.decode.static_target import StaticVerifier
from pdraft.errors import PdraftError
from pdraft.models import build_drafter
from pdraft.models.api import SamplingParams
from test_decode_sampling import ALPHA, chi_square_p, exact_two_token_joint, joint_counts, sampled_runs

PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4], [6, 11, 12, 13, 0, 1, 2]]


@pytest.fixture(autouse=True)
def aot_eager(monkeypatch):
    monkeypatch.setattr(backends, "CPU_COMPILER", "aot_eager")


@pytest.fixture(scope="module")
def target():
    """One target for both compiled tests, so its forward compiles once for the module (vocabulary 16: the
    sampling test enumerates the exact two-token joint)."""
    return tiny_target(vocab_size=16, hidden_size=32, num_layers=2)


def test_each_setting_runs_its_backend():
    model = tiny_target(64, 32, num_layers=2)
    off, auto, on = (backends.resolve(m, model) for m in ("off", "auto", "on"))
    assert (off.static, auto.static, auto.compiled, on.compiled) == (False, True, False, True)
    assert isinstance(backends.target_runner(model, [0], off), PackedVerifier)
    assert isinstance(backends.target_runner(model, [0], auto), StaticVerifier)
    assert generate(model, None, [[1, 2]], max_new_tokens=2, compile="off").backend == "reference eager"
    model.config.model_type = "gemma"  # a family the static forward does not reproduce
    assert not backends.resolve("auto", model).static and "gemma" in backends.resolve("auto", model).why
    with pytest.raises(PdraftError, match="decode.compile on"):
        backends.resolve("on", model)
    with pytest.raises(PdraftError, match="decode.compile"):
        DecodeSettings(compile="fast")


def test_compiled_greedy_matches_the_reference_and_compiles_once(target):
    drafter = build_drafter("dspark", target.config, seed=0, mask_token_id=15, num_hidden_layers=1, block_size=6,
                            target_layer_ids=[-1, 0], markov_rank=8)
    drafter.attach_target(target)
    drafter.eval()
    alone = generate(target, None, PROMPTS, max_new_tokens=20, compile="off")
    eos = [alone.output_ids[1][4]]  # one request stops early: the drafter's batch narrows as the run goes
    ref = generate(target, None, PROMPTS, max_new_tokens=20, eos_token_ids=eos, compile="off")
    first = generate(target, drafter, PROMPTS, gamma=4, max_new_tokens=20, eos_token_ids=eos, compile="on")
    assert first.backend == "static compiled" and first.compile_s > 0
    assert first.output_ids == ref.output_ids and first.finish_reasons == ref.finish_reasons
    again = generate(target, drafter, PROMPTS, gamma=4, max_new_tokens=20, eos_token_ids=eos, compile="on")
    assert again.output_ids == ref.output_ids and again.compile_s == 0  # the same compiled code serves it
    # Compilation is out of the rounds' times: had it leaked in, they would add up to at least compile_s.
    assert sum(r.round_s for r in {r.round: r for r in first.records}.values()) < first.compile_s / 2


def test_compiled_sampling_matches_the_target_joint(target):
    model = target
    prompt, n, batch = [3, 1, 4, 1, 5], 4000, 1000
    sampling = SamplingParams(temperature=1.0, top_k=6)
    drafter = RandomDrafter(DoubleConfig(16, 32, [-1, 0], block_size=4), seed=2, sharpness=1.0)
    outputs, results = sampled_runs(model, drafter, prompt, n, batch, 5, sampling=sampling, max_new_tokens=3,
                                    compile="on")
    assert all(out.backend == "static compiled" for out in results)
    y = torch.tensor([o[:2] for o in outputs])
    counts = joint_counts(y[:, 0], y[:, 1], 16)
    assert chi_square_p(counts, exact_two_token_joint(model, prompt, sampling)) > ALPHA
    # Negative control on the same samples: the joint without the top-k cut is a different distribution.
    assert chi_square_p(counts, exact_two_token_joint(model, prompt, SamplingParams(temperature=1.0))) < ALPHA
