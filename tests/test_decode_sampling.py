"""Statistical tests that speculative sampling reproduces the target's distribution exactly.

Each test draws many independent samples of the first two generated tokens, compares their empirical joint
with the exact target joint (computed by enumeration) by a chi-square goodness-of-fit test, and fails when
p < ALPHA = 1e-3: under a correct sampler a given test raises a false alarm with probability 1e-3 (seeds are
fixed, so a run is reproducible). Cells whose expected count is below 5 are pooled into one; cells of
probability 0 must stay empty. Negative controls check the harness and the scheduler's early stop: a sampler
told the wrong draft distribution, and the DSpark scheduler without its early stop (paper Appendix A), must
both be detected as biased."""

import math

import pytest
import torch

from pdraft.decode.acceptance import accept
from doubles import DoubleConfig, RandomDrafter, tiny_target
from pdraft.metrics import summarize
from pdraft.decode.engine import generate
from pdraft.streams import request_seeds
from pdraft.models.sampling import probs_from_logits
from pdraft.policies.base import VerifyConfig
from policy_controls import policy
from pdraft.policies.cost import SpsTable
from test_decode_scheduler import verify_lengths
from pdraft.models.api import SamplingParams

ALPHA = 1e-3


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    counts, probs = counts.flatten().double(), probs.flatten().double()
    assert counts[probs == 0].sum() == 0, "a token of probability 0 under the target was produced"
    expected = probs * counts.sum()
    big = expected >= 5
    obs, exp = counts[big], expected[big]
    if (~big & (probs > 0)).any():
        obs = torch.cat([obs, counts[~big].sum().view(1)])
        exp = torch.cat([exp, expected[~big].sum().view(1)])
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def joint_counts(y1, y2, vocab):
    return torch.bincount(y1 * vocab + y2, minlength=vocab * vocab).view(vocab, vocab)


def draw(p: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.multinomial(p, 1, generator=g).squeeze(-1)


class TwoStep:
    """A two-position world: target logits for token 1 and, given token 1, for token 2; draft distributions
    q1 and q2[x1] the drafts are sampled from."""

    def __init__(self, vocab: int, seed: int, sharp: float = 1.5):
        g = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.t1 = torch.randn(vocab, generator=g) * sharp  # [V]
        self.t2 = torch.randn(vocab, vocab, generator=g) * sharp  # [V, V] logits of token 2 given token 1
        q = torch.softmax(torch.randn(vocab + 1, vocab, generator=g) * sharp, -1)
        q[:, 0] = 0.0  # the drafter never proposes token 0 ...
        q[:, -1] *= 4.0  # ... and over-proposes the last one, so residuals matter
        q = q / q.sum(-1, keepdim=True)
        self.q1, self.q2 = q[0], q[1:]  # [V], [V, V]

    def exact(self, sampling):
        p1 = probs_from_logits(self.t1, sampling)  # [V]
        p2 = probs_from_logits(self.t2, sampling)  # [V, V]
        return p1.unsqueeze(1) * p2

    def sample(self, n, sampling, g, lengths, claimed_q=None):
        """Draft d1, d2, verify `lengths` [n] of them, and return the first two output tokens."""
        d1 = draw(self.q1.expand(n, -1), g)
        d2 = draw(self.q2[d1], g)
        logits = torch.stack([self.t1.expand(n, -1), self.t2[d1], torch.zeros(n, self.vocab)], 1)  # [n, 3, V]
        probs = torch.stack([self.q1.expand(n, -1), self.q2[d1]], 1)  # [n, 2, V]
        if claimed_q is not None:
            probs = claimed_q.expand(n, 2, -1)
        acc = accept(logits, torch.stack([d1, d2], 1), probs, lengths, sampling, torch.rand(n, 3, generator=g))
        y1 = torch.where(acc.accepted == 0, acc.next_token, d1)
        # After a rejection at position 1 the second token comes from the next round, i.e. from the target.
        fresh = draw(probs_from_logits(self.t2[y1], sampling), g)
        y2 = torch.where(acc.accepted == 0, fresh, torch.where(acc.accepted == 1, acc.next_token, d2))
        return y1, y2


SAMPLINGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.5, top_p=0.7),
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.7-k3", "t1.5-p0.7"])
def test_acceptance_matches_target_distribution(sampling):
    world, g = TwoStep(vocab=6, seed=1), torch.Generator().manual_seed(7)
    n = 40000
    lengths = torch.randint(0, 3, (n,), generator=g)  # verify 0, 1 or 2 drafts
    y1, y2 = world.sample(n, sampling, g, lengths)
    assert chi_square_p(joint_counts(y1, y2, 6), world.exact(sampling)) > ALPHA


def test_harness_detects_a_wrong_draft_distribution():
    """Negative control of the harness: a sampler told a draft distribution other than the one the drafts
    came from is biased, and the same test must say so."""
    world, g = TwoStep(vocab=6, seed=1), torch.Generator().manual_seed(7)
    sampling = SAMPLINGS[0]
    y1, y2 = world.sample(40000, sampling, g, torch.full((40000,), 2), claimed_q=torch.full((6,), 1 / 6))
    assert chi_square_p(joint_counts(y1, y2, 6), world.exact(sampling)) < ALPHA


def test_greedy_acceptance_rule():
    logits = torch.tensor([[[0.0, 5, 0], [0, 0, 5], [5, 0, 0]]]).expand(3, -1, -1)  # argmax 1, 2, 0
    drafts = torch.tensor([[1, 2], [1, 0], [2, 2]])
    acc = accept(logits, drafts, None, torch.tensor([2, 2, 2]), None)
    assert acc.accepted.tolist() == [2, 1, 0] and acc.next_token.tolist() == [0, 2, 1]
    acc = accept(logits, drafts, None, torch.tensor([1, 0, 2]), None)
    assert acc.accepted.tolist() == [1, 0, 0] and acc.next_token.tolist() == [2, 1, 1]


def test_top_p_and_top_k_transform():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(probs_from_logits(logits, SamplingParams(1.0, top_p=0.8)), torch.tensor([0.625, 0.375, 0, 0]))
    assert torch.allclose(probs_from_logits(logits, SamplingParams(1.0, top_p=0.81)), torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95)
    assert torch.allclose(probs_from_logits(logits, SamplingParams(1.0, top_k=1)), torch.tensor([1.0, 0, 0, 0]))
    assert probs_from_logits(logits, SamplingParams(0.0)).tolist() == [1.0, 0, 0, 0]


# --- the scheduler: lossless with the early stop, biased without it (paper Appendix A) -------------------

def logit(p):
    return math.log(p / (1 - p))


def run_scheduler_world(world, c1, c2_logits, sps, n, requests, early_stop, seed, **cost):
    g = torch.Generator().manual_seed(seed)
    sampling = SamplingParams(temperature=1.0)
    config = policy(VerifyConfig(mode="scheduler", sps=sps, **cost), control=not early_stop)
    y1s, y2s, all_lengths = [], [], []
    for _ in range(n // requests):
        d1 = draw(world.q1.expand(requests, -1), g)
        d2 = draw(world.q2[d1], g)
        confidence = torch.stack([torch.full((requests,), logit(c1)), c2_logits[d1]], 1)  # [R, 2]
        lengths = verify_lengths(config, 2, confidence, torch.full((requests,), 2))
        logits = torch.stack([world.t1.expand(requests, -1), world.t2[d1], torch.zeros(requests, world.vocab)], 1)
        probs = torch.stack([world.q1.expand(requests, -1), world.q2[d1]], 1)
        acc = accept(logits, torch.stack([d1, d2], 1), probs, lengths, sampling,
                     torch.rand(requests, 3, generator=g))
        y1 = torch.where(acc.accepted == 0, acc.next_token, d1)
        fresh = draw(probs_from_logits(world.t2[y1], sampling), g)
        y2 = torch.where(acc.accepted == 0, fresh, torch.where(acc.accepted == 1, acc.next_token, d2))
        y1s.append(y1), y2s.append(y2), all_lengths.append(lengths)
    return torch.cat(y1s), torch.cat(y2s), torch.cat(all_lengths)


def appendix_world():
    """Vocabulary {A, B}: p_t(A) = 0.7, p_d(A) = 0.5 at position 1; c_1 = 0.8; c_2 = 0.9 after A, ~0 after B;
    SPS(1) = 1.0, SPS(2) = 0.5, SPS(3) = 0.45, exactly the paper's counterexample."""
    world = TwoStep(vocab=2, seed=3)
    world.t1 = torch.log(torch.tensor([0.7, 0.3]))
    world.q1 = torch.tensor([0.5, 0.5])
    sps = SpsTable([1, 2, 3], [1.0, 0.5, 0.45], 3)
    return world, torch.tensor([logit(0.9), -30.0]), sps


@pytest.mark.parametrize("cost", ["packed", "padded"])
def test_scheduler_without_early_stop_is_biased(cost):
    world, c2, sps = appendix_world()
    y1, y2, _ = run_scheduler_world(world, 0.8, c2, sps, n=4000, requests=1, early_stop=False, seed=11,
                                    **COST_MODELS[cost])
    share_a = float((y1 == 0).float().mean())
    assert abs(share_a - 0.85) < 0.03  # the paper's biased 0.85 instead of 0.7
    assert chi_square_p(joint_counts(y1, y2, 2), world.exact(SamplingParams(1.0))) < ALPHA


@pytest.mark.parametrize("cost", ["packed", "padded"])
def test_scheduler_with_early_stop_is_lossless_on_the_counterexample(cost):
    world, c2, sps = appendix_world()
    y1, y2, lengths = run_scheduler_world(world, 0.8, c2, sps, n=4000, requests=1, early_stop=True, seed=11,
                                          **COST_MODELS[cost])
    assert lengths.max() == 0  # Theta_1 < Theta_0: it stops before looking at c_2
    assert chi_square_p(joint_counts(y1, y2, 2), world.exact(SamplingParams(1.0))) > ALPHA


COST_MODELS = {"packed": {}, "padded": {"packed": False}, "overhead": {"knobs": {"round_overhead_s": 0.5}}}
# Tables under which, for each cost model, the verified length really depends on the drafted first token.
DEPENDENT_TABLES = {
    "packed": SpsTable([4, 6, 8, 10, 12], [1.0, 0.8, 0.62, 0.5, 0.4], 12),
    "padded": SpsTable([4, 8, 12], [1.0, 0.9, 0.84], 12),  # a whole column per new length
    "overhead": SpsTable([4, 6, 8, 10, 12], [1.0, 0.6, 0.4, 0.3, 0.22], 12),
}


@pytest.mark.parametrize("cost", list(COST_MODELS))
def test_scheduler_lossless_when_lengths_depend_on_drafts(cost):
    """A batch of 4 requests per scheduling call and a table under which the verified length depends on the
    drafted first token (through c_2): still exactly the target's joint distribution, under the packed and
    the padded cost model and with a round overhead."""
    world = TwoStep(vocab=5, seed=5)
    c2 = torch.tensor([3.0, 1.0, -1.0, -3.0, 0.0])
    y1, y2, lengths = run_scheduler_world(world, 0.7, c2, DEPENDENT_TABLES[cost], n=20000, requests=4,
                                          early_stop=True, seed=12, **COST_MODELS[cost])
    assert len(set(lengths.tolist())) >= 2, "the table should make the scheduler choose different lengths"
    assert chi_square_p(joint_counts(y1, y2, 5), world.exact(SamplingParams(1.0))) > ALPHA


# --- end to end through generate(): tiny Qwen3 target, random drafter, many requests in one batch ---------

@pytest.fixture(scope="module")
def small_target():
    return tiny_target(vocab_size=16, hidden_size=32, num_layers=2)


def exact_two_token_joint(model, prompt, sampling):
    with torch.no_grad():
        p1 = probs_from_logits(model(torch.tensor([prompt])).logits[0, -1], sampling)  # [V]
        rows = [probs_from_logits(model(torch.tensor([prompt + [x]])).logits[0, -1], sampling)
                for x in range(p1.numel())]
    return p1.unsqueeze(1) * torch.stack(rows)  # [V, V]


def sampled_runs(model, drafter, prompt, n, batch, seed, **fields):
    """`prompt` decoded n times by `generate` in batches of `batch` (gamma 3), each request its own seeded stream
    (request_seeds(seed, ...)), the rest `fields` -> (every request's output ids, every batch's GenerateResult)."""
    outputs, results = [], []
    for start in range(0, n, batch):
        out = generate(model, drafter, [prompt] * batch, gamma=3, seeds=request_seeds(seed, start, batch), **fields)
        outputs += out.output_ids
        results.append(out)
    return outputs, results


@pytest.mark.parametrize("mode", ["full", "scheduler", "scheduler-padded"])
def test_generate_matches_target_distribution(small_target, mode):
    """4000 samples from one run in 4 batches of 1000: a random stream shared by the batches would repeat
    every sample 4 times, which this test would see."""
    prompt, n, batch = [3, 1, 4, 1, 5], 4000, 1000
    sampling = SamplingParams(temperature=1.0, top_k=6) if mode == "full" else SamplingParams(0.8, top_p=0.9)
    # The padded cost charges a whole column of `batch` tokens for the first draft of each new length, so its
    # table must be nearly flat for anything to be verified: the second column is worth it, the third is not.
    table = [1.0, 0.7, 0.5, 0.3] if mode == "scheduler" else [1.0, 0.99999, 0.999, 0.998]
    verify = VerifyConfig() if mode == "full" else VerifyConfig(mode="scheduler", sps=SpsTable(
        [batch, 2 * batch, 3 * batch, 4 * batch], table, 4 * batch), packed=mode == "scheduler")
    drafter = RandomDrafter(DoubleConfig(16, 32, [-1, 0], block_size=4), seed=2, sharpness=1.0)
    outputs, results = sampled_runs(small_target, drafter, prompt, n, batch, 5, sampling=sampling, max_new_tokens=4,
                                    verify=verify)
    records = [r for out in results for r in out.records]
    y = torch.tensor([o[:2] for o in outputs])
    assert sum(a == b for a, b in zip(outputs[:batch], outputs[batch:])) < batch // 2  # not a replayed batch
    summary = summarize(records)
    assert 0 < summary.token_acceptance < 1  # drafts were both accepted and rejected
    if mode != "full":
        assert summary.verification_utilization < 1
    exact = exact_two_token_joint(small_target, prompt, sampling)
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), exact) > ALPHA


# --- drafts drawn as the drafter's argmax at temperature > 0 (decode.draft_sample_method: greedy) --------------

class _SpyDrafter(RandomDrafter):
    """RandomDrafter that records the sampling each proposal was asked for; `lie` (negative control) turns its
    sampled proposal into the argmax of the same distribution while still handing that distribution to the
    verifier, the mistake a greedy proposal rule must not make."""

    def __init__(self, *args, lie: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked, self.lie = [], lie

    def propose(self, state, anchor_ids, anchor_positions, gamma, sampling=None, uniforms=None):
        self.asked.append((sampling, uniforms is None))
        p = super().propose(state, anchor_ids, anchor_positions, gamma, sampling, uniforms)
        if self.lie and p.probs is not None:
            p.tokens = p.probs.argmax(-1)
        return p


@pytest.mark.parametrize("mode", ["full", "scheduler"])
def test_greedy_drafts_at_temperature_one_follow_the_target(small_target, mode):
    """Argmax drafts tested as a one-hot distribution (vLLM's draft_sample_method greedy): the output is still the
    target's joint distribution of the first two tokens, and the drafter is asked for its argmax every round."""
    prompt, n, batch = [3, 1, 4, 1, 5], 4000, 1000
    sampling = SamplingParams(temperature=1.0)
    verify = VerifyConfig() if mode == "full" else VerifyConfig(mode="scheduler", sps=SpsTable(
        [batch, 2 * batch, 3 * batch, 4 * batch], [1.0, 0.7, 0.5, 0.3], 4 * batch), packed=True)
    drafter = _SpyDrafter(DoubleConfig(16, 32, [-1, 0], block_size=4), seed=2, sharpness=2.0)
    outputs, results = sampled_runs(small_target, drafter, prompt, n, batch, 7, sampling=sampling, max_new_tokens=4,
                                    verify=verify, draft_sample_method="greedy")
    assert drafter.asked and all(s.temperature == 0 and no_uniforms for s, no_uniforms in drafter.asked)
    summary = summarize([r for out in results for r in out.records])
    assert 0 < summary.token_acceptance < 1
    y = torch.tensor([o[:2] for o in outputs])
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), exact_two_token_joint(small_target, prompt, sampling)) > ALPHA


def test_argmax_drafts_tested_against_the_drafters_distribution_are_caught(small_target):
    """Negative control: argmax drafts verified against the distribution they were not drawn from (the bug the
    greedy rule avoids by proposing no distribution) bias the output, and the same chi-square test sees it."""
    prompt, n, batch = [3, 1, 4, 1, 5], 4000, 1000
    sampling = SamplingParams(temperature=1.0)
    drafter = _SpyDrafter(DoubleConfig(16, 32, [-1, 0], block_size=4), seed=2, sharpness=2.0, lie=True)
    outputs, _ = sampled_runs(small_target, drafter, prompt, n, batch, 7, sampling=sampling, max_new_tokens=4)
    y = torch.tensor([o[:2] for o in outputs])
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), exact_two_token_joint(small_target, prompt, sampling)) < ALPHA


def test_greedy_draft_rule_at_temperature_zero_is_the_same_run(small_target):
    drafter = RandomDrafter(DoubleConfig(16, 32, [-1, 0], block_size=4), seed=2)
    runs = [generate(small_target, drafter, [[3, 1, 4, 1, 5], [2, 7]], gamma=3, max_new_tokens=6,
                     draft_sample_method=m).output_ids for m in ("probabilistic", "greedy")]
    assert runs[0] == runs[1]
