"""Packed verification (pdraft.decode.target_runner): the verify pass runs exactly sum(1 + l_r) tokens through
the target, gives the same logits and features as the padded pass round after round (through rollback,
holes, compaction and finished requests), under both the sdpa and the eager attention kernel, and greedy
decoding with it stays token-identical to the target alone at batch 5 with different verify lengths."""

import pytest
import torch

from doubles import OracleDrafter, RandomDrafter, tiny_target
from pdraft.decode.engine import generate
from pdraft.policies.base import VerifyConfig
from pdraft.policies.cost import SpsTable
from pdraft.decode.target_runner import PackedVerifier, PaddedVerifier, make_verifier
import test_decode_greedy
from test_decode_greedy import HIDDEN, LAYERS, PROMPTS, VOCAB, config, reference  # reference: cache-free argmax

target = test_decode_greedy.target  # the same tiny target, a module fixture


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_packed_matches_padded_round_after_round(kernel):
    """Both runners in lockstep over 50 rounds of random verify lengths (some requests finished, -1) and
    random accepted counts: same logits and features at every real position, and compaction happens."""
    model = tiny_target(VOCAB, HIDDEN, num_layers=3, seed=1)
    model.config._attn_implementation = kernel
    packed, padded = PackedVerifier(model, LAYERS), PaddedVerifier(model, LAYERS)
    g = torch.Generator().manual_seed(0)
    compactions = {"n": 0}
    original = padded._compact

    def counting(live):
        compactions["n"] += 1
        original(live)

    padded._compact = counting
    with torch.no_grad():
        for runner in (packed, padded):
            runner.prefill(PROMPTS)
        positions = torch.tensor([len(p) - 1 for p in PROMPTS])
        anchors = torch.tensor([p[-1] for p in PROMPTS])
        for step in range(50):
            lengths = torch.randint(-1, 7, (len(PROMPTS),), generator=g)  # -1 = finished this round
            full = step % len(PROMPTS)
            lengths[full] = 6  # one request in turn accepts everything: the others leave holes behind
            drafts = torch.randint(0, VOCAB, (len(PROMPTS), int(lengths.max())), generator=g)
            lp, hp = packed.verify(anchors, positions, drafts, lengths)  # [batch, L+1, vocab], [batch, L+1, F]
            ld, hd = padded.verify(anchors, positions, drafts, lengths)
            real = torch.arange(lp.shape[1]).unsqueeze(0) <= lengths.unsqueeze(1)  # [batch, L+1]
            torch.testing.assert_close(lp[real], ld[real], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(hp[real], hd[real], rtol=1e-4, atol=1e-5)
            assert (lp[~real] == 0).all() and (hp[~real] == 0).all()
            accepted = torch.minimum(torch.randint(0, 2, lengths.shape, generator=g), lengths.clamp(min=0))
            accepted[full] = 6
            accepted = torch.where(lengths >= 0, accepted, -1)
            for runner in (packed, padded):
                runner.commit(accepted)
            assert torch.equal(packed.valid, padded.valid) and packed.slots == padded.slots
            live = lengths >= 0
            anchors = torch.where(live, drafts[torch.arange(len(PROMPTS)), accepted.clamp(min=0) - 1], anchors)
            anchors = torch.where(live & (accepted == 0), 5, anchors)
            positions = positions + torch.where(live, accepted + 1, 0)
    assert compactions["n"] > 0, "the test should exercise compaction"


def test_packed_pass_runs_only_the_real_tokens(target):
    """The MLP of every layer sees exactly sum(1 + l_r) tokens, not batch * (1 + max l)."""
    seen = []
    handle = target.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[:2]))
    try:
        with torch.no_grad():
            for packed in (True, False):
                runner = make_verifier(target, packed=packed)
                runner.prefill(PROMPTS)
                seen.clear()
                lengths = torch.tensor([6, 0, 2, -1, 1])
                runner.verify(torch.tensor([p[-1] for p in PROMPTS]), torch.tensor([len(p) - 1 for p in PROMPTS]),
                              torch.ones(5, 6, dtype=torch.long), lengths)
                tokens = seen[-1][0] * seen[-1][1]
                assert tokens == (7 + 1 + 3 + 0 + 2 if packed else 5 * 7)
    finally:
        handle.remove()


@pytest.mark.parametrize("gamma", [3, 8])
def test_greedy_identity_batch5_different_lengths(target, gamma):
    """Scheduler and threshold modes give each request its own verify length every round; output stays the
    target's, and the run really had different lengths inside one round."""
    n = 20
    refs = [reference(target, p, n) for p in PROMPTS]
    sps = SpsTable([1, 8, 16, 64], [100.0, 90.0, 55.0, 20.0], 128)
    for verify in (VerifyConfig(mode="scheduler", sps=sps), VerifyConfig(mode="threshold", knobs={"threshold": 0.5})):
        oracle = OracleDrafter(config(), [p + r for p, r in zip(PROMPTS, refs)], miss_rate=0.3, seed=gamma)
        out = generate(target, oracle, PROMPTS, gamma=gamma, max_new_tokens=n, verify=verify)
        assert out.output_ids == refs
        per_round: dict[int, set[int]] = {}
        for rec in out.records:
            per_round.setdefault(rec.round, set()).add(rec.verified)
        assert any(len(v) > 1 for v in per_round.values()), "requests should verify different lengths"
        assert out.summary().tau > 1.3
    padded = generate(target, RandomDrafter(config(), seed=4), PROMPTS, gamma=gamma, max_new_tokens=n,
                      verify=VerifyConfig(packed=False))
    assert padded.output_ids == refs
