"""The online acceptance estimator (pdraft.policies.estimator): its counts, cost fit and length choice on
hand-computed cases; the stopping-rule property checked directly; greedy output identical to the target alone
for DFlash, DSpark, DFlash2 and EAGLE-3 drafters; sampled output following the target's exact joint (chi-square,
false-alarm rate 1e-3) for DFlash, DSpark and DFlash2, both for the first two tokens and for tokens 3-4, which
come from rounds the estimator has learned from; and the negative control, the peek variant (tests/policy_controls.py) that reads the
realised token's probability q_k(x_k), caught as biased by the same chi-square test: in a two-position world
built to make its bias plain, and end to end for each of DFlash, DSpark and DFlash2 with a policy warmed on an
earlier run (so token 2's round is decided from learned counts)."""

import pytest
import torch

from doubles import tiny_target, widen as widen_weights
from pdraft.decode.acceptance import accept
from pdraft.decode.engine import generate
from pdraft.models.api import Proposal, SamplingParams
from pdraft.models.build import build_drafter, draft_step
from pdraft.models.sampling import probs_from_logits
from pdraft.policies import policy_spec
from pdraft.policies.base import VerifyConfig, make_policy
from pdraft.policies.cost import SpsTable
from pdraft.policies.estimator import COST_ROUNDS, EXPLORE_EVERY, AcceptanceCounts, EstimatorPolicy, LinearCost, bins
from pdraft.policies.scheduler import schedule_prefixes
from pdraft.streams import request_seeds
from policy_controls import policy as control_or_policy
from test_decode_sampling import ALPHA, TwoStep, chi_square_p, draw, joint_counts

# --- the fit ----------------------------------------------------------------------------------------------


def test_bins_of_the_features():
    values = torch.tensor([[0.0, 0.29, 0.3, 0.5, 0.69, 0.9, 1.0]])
    assert bins(values, values.shape).tolist() == [[0, 0, 1, 2, 2, 4, 4]]
    assert bins(None, (2, 3)).tolist() == [[0] * 3] * 2  # an absent feature is one bin


def test_counts_by_hand():
    """One request verified 3 drafts and had 1 accepted: position 1 reached and accepted, position 2 reached
    and rejected, position 3 not reached. Prior Beta(1.8, 0.2) per position, 4 pseudo-counts per cell."""
    counts = AcceptanceCounts()
    zeros = torch.zeros(1, 3, dtype=torch.long)
    counts.add(zeros, zeros, torch.tensor([3]), torch.tensor([1]))
    p1 = (1 + 1.8) / (1 + 2)  # position 1: 1 of 1
    p2 = (0 + 1.8) / (1 + 2)  # position 2: 0 of 1
    want = [(1 + 4 * p1) / 5, (0 + 4 * p2) / 5, 0.9]  # cell (bin 0): the same rounds; position 3: the prior
    assert counts.estimate(zeros, zeros)[0].tolist() == pytest.approx(want)
    other = torch.tensor([[4, 4, 4]])  # an unseen cell borrows its position's rate
    assert counts.estimate(other, zeros)[0].tolist() == pytest.approx([p1, p2, 0.9])
    # A finished request (-1) and a request that verified nothing (0) add nothing; all accepted: none rejected.
    counts.add(other, zeros, torch.tensor([-1]), torch.tensor([0]))
    counts.add(other, zeros, torch.tensor([0]), torch.tensor([0]))
    assert counts.reached.sum() == 2
    counts.add(other, zeros, torch.tensor([2]), torch.tensor([2]))
    assert counts.estimate(other, zeros)[0, :2].tolist() == pytest.approx(
        [(1 + 4 * (2 + 1.8) / 4) / 5, (1 + 4 * (1 + 1.8) / 4) / 5])


def test_cost_fit():
    line = LinearCost.fit([(b, 0.002 + 0.0001 * b) for b in (10, 20, 40, 80)])
    assert (line.intercept_s, line.slope_s) == pytest.approx((0.002, 0.0001))
    assert line(100) == pytest.approx(1 / 0.012)
    assert LinearCost.fit([(16, 0.1), (16, 0.2)]) is None  # no spread in B: nothing to fit
    falling = LinearCost.fit([(10, 0.2), (20, 0.1)])  # noise can say longer is cheaper; never believed
    assert falling.slope_s == 0 and falling.intercept_s == pytest.approx(0.1)  # torch's median: the lower middle
    # A pass stalled by another process (B = 80 took 0.5 s, not 0.01) leaves the line where it was; least
    # squares would have put the slope at 0.0055 s a token, 55 times the truth.
    stalled = LinearCost.fit([(b, 0.5 if b == 80 else 0.002 + 0.0001 * b) for b in (10, 20, 30, 40, 50, 60, 80)])
    assert (stalled.intercept_s, stalled.slope_s) == pytest.approx((0.002, 0.0001))


def proposal(top_prob, confidence=None, gamma=None):
    top_prob = torch.as_tensor(top_prob, dtype=torch.float32)
    return Proposal(tokens=torch.zeros(top_prob.shape, dtype=torch.long), probs=None, confidence=confidence,
                    top_prob=top_prob)


TABLE = SpsTable([2, 3, 4, 5, 6], [1.0, 0.9, 0.75, 0.6, 0.5], 6)


def test_length_choice_by_hand():
    """Two requests, gamma 2, with the cost table. Without data every p_hat is the prior 0.9, survival 0.9 and
    0.81: Theta = 2 * 1.0 (B=2), 2.9 * 0.9 = 2.61, 3.8 * 0.75 = 2.85, then 4.61 * 0.6 = 2.766 < 2.85: stop."""
    policy = make_policy(VerifyConfig(mode="estimator", sps=TABLE))
    assert isinstance(policy, EstimatorPolicy)
    policy.rounds = 1  # a round in which neither row explores
    drafts = proposal([[0.95, 0.95], [0.1, 0.1]])
    caps = torch.tensor([2, 2])
    assert policy.lengths(drafts, caps).tolist() == [1, 1]
    # Learn that low-probability drafts are rejected and confident ones accepted: 20 rounds of request 0
    # accepting both, request 1 rejecting its first. Then p_hat of request 1's first draft is
    # (0 + 4 * p_pos) / 24 with p_pos = (20 + 1.8) / (40 + 2), about 0.086: not worth a token, and
    # request 0's 0.99 / 0.98 take both its drafts (Theta 2.99 * 0.9 = 2.69, 3.97 * 0.75 = 2.98, then request
    # 1's 0.09: 4.06 * 0.6 = 2.43, stop).
    for _ in range(20):
        policy.observe(drafts, torch.tensor([2, 2]), torch.tensor([2, 0]), 0.01)
    p = policy.counts.estimate(*policy.features(drafts))
    assert p[1, 0].item() == pytest.approx(4 * (21.8 / 42) / 24, rel=1e-5)
    policy.rounds = 1
    assert policy.lengths(drafts, caps).tolist() == [2, 0]
    assert policy.lengths(drafts, torch.tensor([1, -1])).tolist() == [1, -1]  # caps and finished requests
    # Exploration: in round t, request r verifies its whole block when (t + r) % EXPLORE_EVERY == 0.
    policy.rounds = EXPLORE_EVERY - 1
    assert policy.lengths(drafts, caps).tolist() == [2, 2]
    # The choice is Algorithm 1 on the estimated survival, nothing else.
    policy.rounds = 1
    s = policy.survival(drafts, caps)
    assert policy.lengths(drafts, caps).tolist() == schedule_prefixes(s, TABLE)


def test_measured_cost_and_overhead():
    """Without a table: the whole block until COST_ROUNDS rounds are timed, then the fitted line."""
    policy = make_policy(VerifyConfig(mode="estimator"))
    assert policy.config.sps is None and not policy_spec("estimator").files["cost table"]
    drafts = proposal([[0.95, 0.95], [0.1, 0.1]])
    caps = torch.tensor([2, 2])
    for i in range(COST_ROUNDS):
        assert policy.lengths(drafts, caps).tolist() == [2, 2]
        lengths = torch.tensor([i % 3, 2])  # B = 2 + i % 3 + 3 tokens
        policy.observe(drafts, lengths, torch.tensor([min(i % 3, 2), 0]), 0.001 + 0.01 * int((1 + lengths).sum()))
    assert (policy.cost.intercept_s, policy.cost.slope_s) == pytest.approx((0.001, 0.01))
    assert len(policy.overheads) == COST_ROUNDS - 1 and min(policy.overheads) >= 0
    policy.rounds = 1
    # A token costs ten times the pass's intercept: request 1's first draft (p_hat 0.37) does not pay.
    assert policy.lengths(drafts, caps).tolist()[1] == 0
    # The padded verifier's B is R * (1 + max l).
    padded = make_policy(VerifyConfig(mode="estimator", packed=False))
    padded.observe(drafts, torch.tensor([0, 2]), torch.tensor([0, 0]), 0.5)
    assert padded.cost_points[-1] == (6, 0.5)


def _violations(trials: int = 200) -> int:
    """How often the decision l_r >= j changed when only the features of positions > j changed (the drafted
    x_j decides them), over random learned counts and tables."""
    g = torch.Generator().manual_seed(0)
    found = 0
    for t in range(trials):
        rows, gamma = 3, 4
        policy = make_policy(VerifyConfig(mode="estimator", sps=SpsTable(
            list(range(rows, rows * (gamma + 1) + 1)),
            torch.empty(rows * gamma + 1).uniform_(0.6, 1.0, generator=g).cumprod(0).tolist(), rows * (gamma + 1))))
        policy.counts.add(torch.randint(0, 5, (64, gamma), generator=g), torch.zeros(64, gamma, dtype=torch.long),
                          torch.full((64,), gamma), torch.randint(0, gamma + 1, (64,), generator=g))
        policy.rounds = 1 + t % (EXPLORE_EVERY - rows)
        top = torch.rand(rows, gamma, generator=g)
        caps = torch.full((rows,), gamma)
        before = policy.lengths(proposal(top), caps)
        for r in range(rows):
            for j in range(1, gamma):
                changed = top.clone()
                changed[r, j:] = torch.rand(gamma - j, generator=g)
                after = policy.lengths(proposal(changed), caps)
                found += int((before[r] >= j) != (after[r] >= j))
    return found


def test_decisions_never_look_past_the_position():
    assert _violations() == 0


# --- greedy identity --------------------------------------------------------------------------------------

PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4]]


def make(kind, target, vocab, widen=None, **extra):
    fields = {"dflash": {}, "dspark": {"markov_rank": 8},
              "dflash2": dict(conv_group_size=8, selector_rank=8, selector_top_k=4)}[kind]
    fields.update(extra)
    drafter = build_drafter(kind, target.config, seed=0, mask_token_id=vocab - 1, num_hidden_layers=1, **fields)
    if widen is not None:
        widen_weights(drafter, widen)
    drafter.attach_target(target)
    return drafter.eval()


@pytest.fixture(scope="module")
def target():
    return tiny_target(64, 32, num_layers=4)


@pytest.mark.parametrize("kind", ["dflash", "dspark", "dflash2"])
def test_greedy_matches_target(target, kind):
    drafter = make(kind, target, 64, widen=0.3, block_size=8)
    utilisation = []
    for prompts in (PROMPTS, PROMPTS[2:3]):
        refs = generate(target, None, prompts, max_new_tokens=40).output_ids
        for gamma in (1, 3, drafter.max_gamma()):
            for verify in (VerifyConfig(mode="estimator"), VerifyConfig(mode="estimator", sps=TABLE)):
                out = generate(target, drafter, prompts, gamma=gamma, max_new_tokens=40, verify=verify)
                assert out.output_ids == refs, (kind, len(prompts), gamma, verify.sps is not None)
                utilisation.append(out.summary().verification_utilization)
    assert min(utilisation) < 1  # the estimator really shortened blocks


def test_greedy_eagle3_matches_target(target):
    drafter = build_drafter("eagle3", target.config, seed=0, ttt_steps=4)
    drafter.attach_target(target)
    drafter.eval()
    refs = generate(target, None, PROMPTS, max_new_tokens=24).output_ids
    for gamma in (1, 4):
        out = generate(target, drafter, PROMPTS, gamma=gamma, max_new_tokens=24, verify=VerifyConfig(mode="estimator"))
        assert out.output_ids == refs, gamma


def test_top_prob_is_the_distributions_max(target):
    """Every family fills Proposal.top_prob: max_v q_k(v) of the distribution it samples from, and of the
    temperature-1 softmax when greedy; scatter carries it."""
    for kind in ("dflash", "dspark", "dflash2"):
        drafter = make(kind, target, 64, widen=0.3, block_size=8)
        hidden = torch.randn(2, 5, len(drafter.config.target_layer_ids) * 32)
        sampling = SamplingParams(1.0)
        p = draft_step(drafter, hidden, torch.tensor([3, 4]), 3, sampling, torch.rand(2, 3))
        assert torch.allclose(p.top_probabilities(), p.probs.amax(-1)), kind
        greedy = draft_step(drafter, hidden, torch.tensor([3, 4]), 3)
        top = greedy.top_probabilities()
        assert greedy.probs is None and top.shape == (2, 3) and (top <= 1).all() and (top > 1 / 64).all(), kind
    spread = p.scatter(torch.tensor([0, 2]), 3)
    top = spread.top_probabilities()
    assert top[[0, 2]].tolist() == p.top_probabilities().tolist() and top[1].tolist() == [0.0] * 3


# --- sampling: the exact joint, and the negative control ---------------------------------------------------

class Peek:
    """A two-position world built so that the realised token's probability predicts its acceptance: p_t(A) =
    0.2, q(A) = 0.8 at position 1, so A drafted (q = 0.8) is accepted with probability 0.25 and B (q = 0.2)
    always. The lossless estimator sees max q = 0.8 for every draft and learns 0.4 for position 1; the peek
    variant learns 0.25 for A and 1 for B, verifies only B and outputs B with probability 0.84 instead of 0.8."""

    vocab = 2

    def __init__(self, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.t1 = torch.log(torch.tensor([0.2, 0.8]))
        self.t2 = torch.randn(2, 2, generator=g)  # [V, V] target logits of token 2 given token 1
        self.q1 = torch.tensor([0.8, 0.2])
        self.q2 = torch.softmax(torch.randn(2, 2, generator=g), -1)  # [V, V]

    def exact(self, sampling):
        return probs_from_logits(self.t1, sampling).unsqueeze(1) * probs_from_logits(self.t2, sampling)


def run_world(world, policy, n, requests, seed):
    """The engine's round in a two-position world: draft, lengths, accept, observe; returns the first two
    tokens of every request and the lengths."""
    g = torch.Generator().manual_seed(seed)
    sampling = SamplingParams(temperature=1.0)
    y1s, y2s, all_lengths = [], [], []
    for _ in range(n // requests):
        d1 = draw(world.q1.expand(requests, -1), g)
        d2 = draw(world.q2[d1], g)
        probs = torch.stack([world.q1.expand(requests, -1), world.q2[d1]], 1)  # [R, 2, V]
        p = Proposal(tokens=torch.stack([d1, d2], 1), probs=probs, confidence=None, top_prob=probs.amax(-1))
        lengths = policy.lengths(p, torch.full((requests,), 2))
        logits = torch.stack([world.t1.expand(requests, -1), world.t2[d1], torch.zeros(requests, world.vocab)], 1)
        acc = accept(logits, p.tokens, probs, lengths, sampling, torch.rand(requests, 3, generator=g))
        policy.observe(p, lengths, acc.accepted, 0.01)
        y1 = torch.where(acc.accepted == 0, acc.next_token, d1)
        fresh = draw(probs_from_logits(world.t2[y1], sampling), g)
        y2 = torch.where(acc.accepted == 0, fresh, torch.where(acc.accepted == 1, acc.next_token, d2))
        y1s.append(y1), y2s.append(y2), all_lengths.append(lengths)
    return torch.cat(y1s), torch.cat(y2s), torch.cat(all_lengths)


# Eight requests a round; each verified token costs 8% of the round's rate, so a draft is worth verifying
# when its survival is above about 0.64 (0.08 x tau).
WORLD_TABLE = SpsTable(list(range(8, 25)), [1.08 ** -i for i in range(17)], 24)


@pytest.mark.parametrize("peek", [False, True], ids=["estimator", "peek-negative-control"])
def test_estimator_in_the_peek_world(peek):
    world = Peek()
    policy = control_or_policy(VerifyConfig(mode="estimator", sps=WORLD_TABLE), control=peek)
    y1, y2, lengths = run_world(world, policy, n=24000, requests=8, seed=11)
    p = chi_square_p(joint_counts(y1, y2, 2), world.exact(SamplingParams(1.0)))
    share_b = float((y1 == 1).float().mean())
    if peek:
        assert abs(share_b - 0.84) < 0.01  # the bias the docstring computes (diluted a little by exploration)
        assert p < ALPHA
    else:
        assert abs(share_b - 0.8) < 0.01
        assert p > ALPHA


def test_estimator_lossless_when_lengths_depend_on_drafts():
    """A random world where the second draft's top probability varies with the first and a cheaper table
    (2% a token): whether draft 2 is verified depends on draft 1, and the joint stays exact."""
    world = TwoStep(vocab=5, seed=5)
    policy = make_policy(VerifyConfig(mode="estimator", sps=SpsTable(list(range(8, 25)),
                                                                     [1.02 ** -i for i in range(17)], 24)))
    y1, y2, lengths = run_world(world, policy, n=24000, requests=8, seed=12)
    shares = torch.bincount(lengths, minlength=3) / len(lengths)
    assert shares[1] > 0.05 and shares[2] > 0.05, f"the lengths should depend on the drafts: {shares.tolist()}"
    assert chi_square_p(joint_counts(y1, y2, 5), world.exact(SamplingParams(1.0))) > ALPHA


# --- end to end through generate(): the real families, the first two tokens and tokens 3-4 ----------------

@pytest.fixture(scope="module")
def small_target():
    return tiny_target(vocab_size=16, hidden_size=32, num_layers=2)


def exact_joints(model, prompt, sampling):
    """The target's exact joint of tokens (1, 2) and of tokens (3, 4) after `prompt`, by enumerating every
    continuation of three tokens in one batch: [V, V] each."""
    v = model.config.vocab_size
    grid = torch.cartesian_prod(*[torch.arange(v)] * 3)  # [V^3, 3]
    seqs = torch.cat([torch.tensor(prompt).expand(len(grid), -1), grid], 1)  # [V^3, n + 3]
    with torch.no_grad():
        p = probs_from_logits(model(seqs).logits[:, len(prompt) - 1:], sampling)  # [V^3, 4, V]
    p = p.view(v, v, v, 4, v)
    p1, p2, p3, p4 = p[0, 0, 0, 0], p[:, 0, 0, 1], p[:, :, 0, 2], p[:, :, :, 3]  # p(y_k | y_<k)
    return p1[:, None] * p2, torch.einsum("a,ab,abc,abcd->cd", p1, p2, p3, p4)


def sample_estimator(small_target, drafter, sampling, *, n=4000):
    """n requests of one prompt in one batch, four tokens each, with the estimator and a table under which
    not every draft pays (B = n .. 4n tokens)."""
    prompt = [3, 1, 4, 1, 5]
    verify = VerifyConfig(mode="estimator", sps=SpsTable([n, 2 * n, 3 * n, 4 * n], [1.0, 0.7, 0.5, 0.3], 4 * n))
    out = generate(small_target, drafter, [prompt] * n, gamma=3, sampling=sampling, max_new_tokens=4,
                   seeds=request_seeds(5, 0, n), verify=verify)
    y = torch.tensor(out.output_ids)  # [n, 4]
    return y, out.records, exact_joints(small_target, prompt, sampling)


@pytest.mark.parametrize("kind,sampling", [("dflash", SamplingParams(1.0)),
                                           ("dspark", SamplingParams(0.8, top_k=8, top_p=0.95)),
                                           ("dflash2", SamplingParams(0.8, top_k=6, top_p=0.9))],
                         ids=["dflash-t1", "dspark-t0.8-k8-p0.95", "dflash2-t0.8-k6-p0.9"])
def test_sampling_matches_the_target_joint(small_target, kind, sampling):
    """Tokens 1-2 come from rounds 0-1 (the estimator knows only its prior); tokens 3-4 also from round 2,
    whose lengths it chose from round 1's 4000 verified requests and the drafts' features."""
    drafter = make(kind, small_target, 16, widen=0.3, block_size=4)
    y, records, (first, later) = sample_estimator(small_target, drafter, sampling)
    round2 = torch.tensor([r.verified for r in records if r.round == 2])
    assert 0.05 < float((round2 == 0).float().mean()) < 0.95, "round 2's lengths should depend on the drafts"
    assert 0 < sum(r.accepted for r in records) < sum(r.verified for r in records)
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), first) > ALPHA
    assert chi_square_p(joint_counts(y[:, 2], y[:, 3], 16), later) > ALPHA


# Per family, a sampling and a table under which the warmed estimator's round-1 lengths depend on the drafts.
WARM = {"dflash": (SamplingParams(0.8, top_k=8, top_p=0.95), [1.0, 0.75, 0.55, 0.4]),
        "dspark": (SamplingParams(0.8, top_k=8, top_p=0.95), [1.0, 0.7, 0.5, 0.3]),
        "dflash2": (SamplingParams(0.8, top_k=6, top_p=0.9), [1.0, 0.9, 0.8, 0.7])}


@pytest.mark.parametrize("kind", list(WARM))
def test_warmed_estimator_first_two_tokens_and_the_peek_control(small_target, kind, monkeypatch):
    """The first two tokens again, with a policy that has already learned from a run of 4000 requests (the
    engine is handed that policy object), so round 1's lengths, which decide token 2, come from learned
    counts: the estimator stays exact, and the peek variant, whose feature is the realised q_1(x_1), is caught
    as biased by the same chi-square test, for each family."""
    sampling, table = WARM[kind]
    drafter = make(kind, small_target, 16, widen=0.3, block_size=4)
    prompt, n = [3, 1, 4, 1, 5], 4000
    first, _ = exact_joints(small_target, prompt, sampling)
    for peek in (False, True):
        verify = VerifyConfig(mode="estimator", sps=SpsTable([n, 2 * n, 3 * n, 4 * n], table, 4 * n))
        policy = control_or_policy(verify, control=peek)
        monkeypatch.setattr("pdraft.decode.engine.make_policy", lambda config: policy)
        generate(small_target, drafter, [prompt] * n, gamma=3, sampling=sampling, max_new_tokens=8,
                 seeds=request_seeds(9, 0, n), verify=verify)  # the rounds it learns from
        out = generate(small_target, drafter, [prompt] * n, gamma=3, sampling=sampling, max_new_tokens=4,
                       seeds=request_seeds(5, 0, n), verify=verify)
        y = torch.tensor(out.output_ids)
        p = chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), first)
        if peek:
            round1 = torch.tensor([r.verified for r in out.records if r.round == 1])
            assert len(set(round1.tolist())) >= 2, "the peek variant's lengths should depend on the drafts"
            assert p < ALPHA, (kind, p)
        else:
            assert p > ALPHA, (kind, p)
