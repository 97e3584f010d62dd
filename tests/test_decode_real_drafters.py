"""The engine with the real DFlash and DSpark drafters (pdraft.models, from the drafter branch): greedy output
token-identical to the target alone for gammas across the block, every verification mode, both block
conventions; and sampled output following the target's distribution. Skipped where pdraft.models has no
`build_drafter` yet (the engine's own tests use drafter doubles)."""

import pytest
import torch

from doubles import tiny_target
from pdraft.decode.engine import generate
from pdraft.policies.base import VerifyConfig
from pdraft.policies.cost import SpsTable
from pdraft.models.api import SamplingParams

models = pytest.importorskip("pdraft.models", reason="real drafters not in this build")
if not hasattr(models, "build_drafter"):
    pytest.skip("real drafters not in this build", allow_module_level=True)

from test_decode_sampling import ALPHA, chi_square_p, exact_two_token_joint, joint_counts  # noqa: E402

PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4]]
SPS = SpsTable([1, 4, 16, 64], [100.0, 95.0, 60.0, 20.0], 128)


def make(kind, target, vocab, **extra):
    if kind == "dspark":
        extra.setdefault("markov_rank", 8)
    drafter = models.build_drafter(kind, target.config, seed=0, mask_token_id=vocab - 1, num_hidden_layers=1,
                                   **extra)
    drafter.attach_target(target)
    return drafter.eval()


@pytest.fixture(scope="module")
def target():
    return tiny_target(64, 32, num_layers=4)


@pytest.mark.parametrize("kind,extra", [("dflash", {}), ("dflash", {"block_convention": "zlab"}),
                                        ("dspark", {}), ("dspark", {"sequential_head": "rnn", "denoise_steps": 2})])
def test_greedy_matches_target(target, kind, extra):
    refs = generate(target, None, PROMPTS, max_new_tokens=16).output_ids
    drafter = make(kind, target, 64, block_size=16, **extra)
    modes = [VerifyConfig()]
    if drafter.config.has_confidence:
        modes += [VerifyConfig(mode="threshold", knobs={"threshold": 0.3}), VerifyConfig(mode="scheduler", sps=SPS)]
    for gamma in (1, 2, 7, drafter.max_gamma()):
        for verify in modes:
            out = generate(target, drafter, PROMPTS, gamma=gamma, max_new_tokens=16, verify=verify)
            assert out.output_ids == refs, (kind, extra, gamma, verify.mode)


@pytest.mark.parametrize("mode", ["full", "scheduler"])
def test_dspark_sampling_matches_target(mode):
    target = tiny_target(16, 32, num_layers=2)
    drafter = make("dspark", target, 16, block_size=4)
    with torch.no_grad():  # wider weights than the 0.02 init, so drafts are sometimes accepted
        for p in drafter.parameters():
            if p.dim() > 1 and p.requires_grad:
                p.normal_(0, 0.3)
    prompt, n = [3, 1, 4, 1, 5], 4000
    sampling = SamplingParams(0.8, top_k=8, top_p=0.95)
    verify = VerifyConfig() if mode == "full" else VerifyConfig(
        mode="scheduler", sps=SpsTable([n, 2 * n, 3 * n, 4 * n], [1.0, 0.7, 0.5, 0.3], 4 * n))
    out = generate(target, drafter, [prompt] * n, gamma=3, sampling=sampling, max_new_tokens=4, seed=5,
                   verify=verify)
    y = torch.tensor([o[:2] for o in out.output_ids])
    assert out.summary().token_acceptance > 0
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), exact_two_token_joint(target, prompt, sampling)) > ALPHA
