"""Greedy speculative decoding is token-identical to the target alone: every gamma 1..16, batch of one and of
several prompts of different lengths, full / threshold / scheduler verification, random and oracle drafters.
Also checks the runner's KV bookkeeping (holes, compaction) and that the drafter receives exactly the target
features a fresh full forward would give."""

import pytest
import torch

from doubles import DoubleConfig, OracleDrafter, RandomDrafter, tiny_target
from pdraft.decode.engine import generate
from pdraft.policies.base import VerifyConfig
from pdraft.policies.cost import SpsTable
from pdraft.targets.capture import capture_layers, stack_captured

VOCAB, HIDDEN, NEW = 64, 32, 24
PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4], [60, 61, 62, 63, 0, 1, 2]]
LAYERS = [0, 2]
SPS = SpsTable([1, 4, 16, 64], [100.0, 95.0, 60.0, 20.0], 128)


@pytest.fixture(scope="module")
def target():
    return tiny_target(VOCAB, HIDDEN, num_layers=3)


def reference(model, prompt, n):
    """Target-only greedy decoding without any cache: argmax of a full forward, token by token."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def refs(target):
    return [reference(target, p, NEW) for p in PROMPTS]


def config():
    return DoubleConfig(VOCAB, HIDDEN, LAYERS, block_size=16)


MODES = {
    "full": VerifyConfig(),
    "threshold": VerifyConfig(mode="threshold", knobs={"threshold": 0.4}),
    "scheduler": VerifyConfig(mode="scheduler", sps=SPS),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("gamma", range(1, 17))
def test_greedy_matches_target(target, refs, gamma, mode):
    oracle = OracleDrafter(config(), [p + r for p, r in zip(PROMPTS, refs)], miss_rate=0.25, seed=gamma)
    for drafter in (RandomDrafter(config(), seed=gamma), oracle):
        batched = generate(target, drafter, PROMPTS, gamma=gamma, max_new_tokens=NEW, verify=MODES[mode])
        assert batched.output_ids == refs
    single = generate(target, RandomDrafter(config(), seed=100 + gamma), [PROMPTS[gamma % len(PROMPTS)]],
                      gamma=gamma, max_new_tokens=NEW, verify=MODES[mode])
    assert single.output_ids == [refs[gamma % len(PROMPTS)]]


def test_oracle_drafter_is_accepted(target, refs):
    """The same loop really accepts drafts (tau > 1), so equality above is not the target-only path."""
    oracle = OracleDrafter(config(), [p + r for p, r in zip(PROMPTS, refs)], miss_rate=0.0)
    out = generate(target, oracle, PROMPTS, gamma=8, max_new_tokens=NEW)
    assert out.output_ids == refs
    assert out.summary().tau > 5


def test_target_only_same_loop(target, refs):
    out = generate(target, None, PROMPTS, max_new_tokens=NEW)
    assert out.output_ids == refs
    assert all(r.gamma == 0 and r.verified == 0 and r.committed == 1 for r in out.records)


def test_eos_and_budget(target, refs):
    eos = refs[0][5]
    out = generate(target, RandomDrafter(config()), PROMPTS[:1], gamma=4, max_new_tokens=NEW, eos_token_ids=[eos])
    assert out.output_ids[0] == refs[0][: refs[0].index(eos) + 1]
    assert out.finish_reasons == ["eos"]
    out = generate(target, RandomDrafter(config()), PROMPTS, gamma=16, max_new_tokens=3)
    assert out.output_ids == [r[:3] for r in refs] and set(out.finish_reasons) == {"length"}


def test_context_limit_stops_generation():
    model = tiny_target(VOCAB, HIDDEN, num_layers=3, context=16)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    out = generate(model, RandomDrafter(config()), [prompt], gamma=16, max_new_tokens=50)
    assert len(prompt) + len(out.output_ids[0]) == 16 and out.finish_reasons == ["context"]
    assert out.output_ids[0] == reference(model, prompt, 6)


@pytest.mark.parametrize("compile_mode", ["off", "auto"])
def test_long_batch_compacts_cache_and_feeds_exact_features(target, compile_mode):
    """Long generations with very different acceptance per request leave holes that the reference runner
    compacts (compile off) and that the static cache never has (auto: rollback by length); either way the
    drafter context must hold, for every committed token, the features of a fresh full forward."""
    prompts = [[5, 9, 13], [7] * 20, [1, 2]]
    n = 120
    refs = [reference(target, p, n) for p in prompts]
    # Request 0 accepts almost everything, request 2 almost nothing: holes pile up for request 2.
    oracle = OracleDrafter(config(), [p + r for p, r in zip(prompts, refs)], miss_rate=0.0)
    oracle_miss = torch.tensor([[0.0], [0.3], [1.0]])
    noise = torch.Generator().manual_seed(0)

    compactions = []
    from pdraft.decode import target_runner

    original = target_runner.TargetRunner._compact

    def counting(self, live):
        compactions.append(self.slots)
        original(self, live)

    target_runner.TargetRunner._compact = counting
    base_propose = oracle.propose

    def propose(state, anchor_ids, anchor_positions, gamma, sampling=None, generator=None):
        p = base_propose(state, anchor_ids, anchor_positions, gamma, sampling, generator)
        miss = torch.rand(p.tokens.shape, generator=noise) < oracle_miss[state.requests]  # rows still running
        p.tokens = torch.where(miss, (p.tokens + 1) % VOCAB, p.tokens)
        return p

    oracle.propose = propose
    state_box = {}
    base_new_state = oracle.new_state
    oracle.new_state = lambda b, capacity=None: state_box.setdefault("s", base_new_state(b, capacity))
    try:
        out = generate(target, oracle, prompts, gamma=16, max_new_tokens=n, compile=compile_mode)
    finally:
        target_runner.TargetRunner._compact = original
    assert out.output_ids == refs
    if compile_mode == "off":
        assert compactions, "the test should exercise cache compaction"
    else:
        assert not compactions and out.backend == "static eager"
    state = state_box["s"]
    for b, (p, r) in enumerate(zip(prompts, refs)):
        seq = p + r
        with torch.no_grad(), capture_layers(target, LAYERS) as captured:
            target(torch.tensor([seq]))
        fresh = stack_captured(captured, LAYERS)[0]  # [len, F]
        got = torch.stack(state.features[b])  # committed tokens whose features the drafter holds
        assert got.shape[0] >= len(seq) - 1
        torch.testing.assert_close(got[: len(seq) - 1], fresh[: len(seq) - 1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["dspark", "dflash"])
def test_finished_requests_are_not_drafted_for_and_output_stays_exact(target, kind):
    """Requests that reach EOS early leave the drafter's batch (it drafts for the active rows only) while the
    others go on; the outputs still equal the target alone, greedy and sampled runs finish without NaN."""
    from pdraft.models import build_drafter
    from pdraft.models.api import SamplingParams

    extra = {"markov_rank": 8} if kind == "dspark" else {}
    drafter = build_drafter(kind, target.config, seed=0, mask_token_id=VOCAB - 1, num_hidden_layers=1,
                            block_size=4, target_layer_ids=LAYERS, **extra)
    drafter.attach_target(target)
    drafter.eval()
    alone = generate(target, None, PROMPTS, max_new_tokens=NEW)
    eos = [alone.output_ids[1][2]]  # request 1 stops after 3 tokens; the others at their own first EOS, if any
    ref = generate(target, None, PROMPTS, max_new_tokens=NEW, eos_token_ids=eos)
    seen = []
    propose = drafter.propose

    def spy(state, anchors, *args, **kwargs):
        seen.append(int(anchors.shape[0]))
        return propose(state, anchors, *args, **kwargs)

    drafter.propose = spy
    out = generate(target, drafter, PROMPTS, gamma=3, max_new_tokens=NEW, eos_token_ids=eos)
    assert out.output_ids == ref.output_ids and out.finish_reasons == ref.finish_reasons
    assert "eos" in out.finish_reasons and min(seen) < len(PROMPTS), seen
    active = [sum(r.round == n for r in out.records) for n in range(1, max(r.round for r in out.records) + 1)]
    assert seen == active  # every drafting round drafts for exactly the requests it verifies
    sampled = generate(target, drafter, PROMPTS, gamma=3, max_new_tokens=NEW, eos_token_ids=eos,
                       sampling=SamplingParams(temperature=1.0), seed=3)
    assert all(0 < len(o) <= NEW for o in sampled.output_ids)
    assert all(0 <= t < VOCAB for o in sampled.output_ids for t in o)
