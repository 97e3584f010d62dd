"""A draft vocabulary for the parallel families (`drafter.draft_vocab_size`, issue 40): DFlash and DSpark get an own
head [V_d, H] started from the target head's rows of the training responses' most frequent tokens, with `d2t` /
`t2d` as vLLM's qwen3_dflash.py / qwen3_dspark.py read them; decoding stays lossless (greedy identity, the
sampled joint of the first two tokens by chi-square, and a negative control whose q leaks outside the draft
vocabulary); the training loss is taken over the reduced head with the target's mass outside it counted in TV;
checkpoints and exports carry `draft_vocab_size`, `lm_head.weight` [V_d, H] and `d2t`, and load back the same,
also through `pull` from a local folder.
DFlash2 takes its selector's candidates from the draft vocabulary (mapped to target ids for the walk and the
codebooks): the same greedy, sampling and checkpoint tests, its selector loss over the reduced head, and an
export to an engine refused in one line (no engine maps DFlash2 candidates through d2t)."""

import json
import types

import pytest
import torch
from safetensors.torch import load_file

from doubles import tiny_target, widen
from pdraft.decode.engine import generate
from pdraft.errors import PdraftError
from pdraft.hub import export, pull
from pdraft.metrics import summarize
from pdraft.models import load_drafter, save_drafter
from pdraft.models.api import Proposal, SamplingParams
from pdraft.models.build import build_drafter
from pdraft.models.vocab import draft_vocabulary
from pdraft.streams import request_seeds
from pdraft.train.losses import drafter_loss
from test_decode_sampling import ALPHA, chi_square_p, exact_two_token_joint, joint_counts
from test_models_support import captured

VOCAB, DRAFT_VOCAB, MASK = 16, 12, 15
PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4], [6, 6, 6, 6]]
KINDS = {"dflash": dict(block_size=5), "dflash zlab": dict(block_size=5, block_convention="zlab"),
         "dspark": dict(block_size=5, markov_rank=4), "dspark rnn": dict(block_size=5, markov_rank=4,
                                                                          sequential_head="rnn"),
         "dflash2": dict(block_size=5, block_convention="zlab", selector_top_k=4, selector_rank=8)}
COUNTS = torch.tensor([50, 3, 40, 7, 30, 30, 2, 9, 11, 60, 1, 8, 5, 13, 0, 4])  # two zero/low ids fall out


@pytest.fixture(scope="module")
def target():
    return tiny_target(vocab_size=VOCAB, hidden_size=32, num_layers=4)


def make(target, variant: str, draft_vocab=DRAFT_VOCAB, seed=0):
    kw = dict(KINDS[variant])
    kind = variant.split()[0]
    d = build_drafter(kind, target.config, seed=seed, mask_token_id=MASK, num_hidden_layers=1,
                      draft_vocab_size=draft_vocab, **kw)
    widen(d, 0.3, seed)
    d.attach_target(target)
    d.init_from_tokens(COUNTS)
    return d.eval()


def test_the_vocabulary_the_head_and_the_mapping(target):
    d = make(target, "dspark")
    want = draft_vocabulary(COUNTS, DRAFT_VOCAB)
    assert torch.equal(d.vocab_ids(), want) and d.needs_token_counts
    assert torch.equal(d.d2t, want - torch.arange(DRAFT_VOCAB))  # vLLM: target id = draft id + d2t[draft id]
    assert d.t2d.sum() == DRAFT_VOCAB and bool(d.t2d[want].all())
    assert torch.equal(d.draft_head.weight, target.lm_head.weight[want])  # started from the target's rows
    assert tuple(d.markov_head.markov_w2.weight.shape) == (DRAFT_VOCAB, 4)  # W2 writes the draft vocabulary
    assert tuple(d.markov_head.markov_w1.weight.shape) == (VOCAB, 4)  # W1 reads target ids
    whole = build_drafter("dflash", target.config, seed=0, mask_token_id=MASK, num_hidden_layers=1,
                          draft_vocab_size=VOCAB)
    assert whole.config.draft_vocab_size is None and not hasattr(whole, "draft_head")  # = the target's head


@pytest.mark.parametrize("variant", list(KINDS))
def test_greedy_is_the_target_alone_and_drafts_stay_in_the_vocabulary(target, variant):
    d = make(target, variant)
    allowed = set(d.vocab_ids().tolist())
    records = []
    alone = generate(target, None, PROMPTS, max_new_tokens=16).output_ids
    for gamma in (1, 3, d.max_gamma()):
        out = generate(target, d, PROMPTS, gamma=gamma, max_new_tokens=16)
        assert out.output_ids == alone
        records += out.records
    # trees from the same pass: children only from the draft vocabulary (logits -inf outside it)
    assert generate(target, d, PROMPTS, gamma=4, max_new_tokens=16, tree=(12, 3)).output_ids == alone
    state = d.new_state(1)
    ids = torch.tensor([PROMPTS[2]])
    d.extend_context(state, captured(target, ids, d.config.target_layer_ids), torch.arange(ids.shape[1])[None])
    greedy = d.propose(state, torch.tensor([4]), torch.tensor([ids.shape[1]]), d.max_gamma(), SamplingParams())
    assert set(greedy.tokens.flatten().tolist()) <= allowed  # target ids, also on DSpark's fast greedy walk
    if variant == "dspark":  # the walk by hand: W1 reads the previous token's target id, W2 writes draft ids
        hidden = d.block_hidden(state, torch.tensor([4]), torch.tensor([ids.shape[1]]))[:, : d.max_gamma()]
        base, prev, want = d.draft_logits(hidden)[0], 4, []
        for k in range(base.shape[0]):
            u = d.markov_head.markov_w1.weight[prev]
            prev = int(d.vocab_ids()[(base[k] + d.markov_head.markov_w2.weight @ u).argmax()])
            want.append(prev)
        assert greedy.tokens[0].tolist() == want
    p = d.propose(state, torch.tensor([4]), torch.tensor([ids.shape[1]]), d.max_gamma(), SamplingParams(1.0))
    assert set(p.tokens.flatten().tolist()) <= allowed
    assert p.probs.shape[-1] == VOCAB and float(p.probs[..., ~d.t2d].abs().sum()) == 0.0  # q = 0 outside
    torch.testing.assert_close(p.probs.sum(-1), torch.ones(p.probs.shape[:-1]))
    assert 0 < summarize(records).token_acceptance < 1  # drafts both accepted and rejected


def sample_first_two(target, drafter, n=4000, batch=1000):
    prompt, sampling = [3, 1, 4, 1, 5], SamplingParams(temperature=1.0)
    outputs, records = [], []
    for start in range(0, n, batch):
        out = generate(target, drafter, [prompt] * batch, gamma=3, sampling=sampling, max_new_tokens=4,
                       seeds=request_seeds(7, start, batch))
        outputs += out.output_ids
        records += out.records
    y = torch.tensor([o[:2] for o in outputs])
    return joint_counts(y[:, 0], y[:, 1], VOCAB), summarize(records), exact_two_token_joint(target, prompt, sampling)


@pytest.mark.parametrize("variant", ["dflash", "dspark", "dflash2"])
def test_sampling_follows_the_target_and_a_leaky_q_is_caught(target, variant):
    d = make(target, variant)
    counts, summary, exact = sample_first_two(target, d)
    assert 0 < summary.token_acceptance < 1
    assert chi_square_p(counts, exact) > ALPHA
    # Negative control: the same drafts, but a q that keeps half its mass spread over the whole target
    # vocabulary (a proposer that forgot to zero q outside the draft vocabulary).
    block = d.sample_block

    def leaky(self, *args):
        p = block(*args)
        q = None if p.probs is None else 0.5 * p.probs + 0.5 / VOCAB
        return Proposal(tokens=p.tokens, probs=q, confidence=p.confidence, top_prob=p.top_prob)

    d.sample_block = types.MethodType(leaky, d)
    counts, _, exact = sample_first_two(target, d)
    assert chi_square_p(counts, exact) < ALPHA


@pytest.mark.parametrize("variant", ["dflash", "dspark", "dflash2"])
def test_the_loss_is_over_the_reduced_head_with_the_mass_outside_counted(target, variant):
    """The chunked loss the trainer runs (head and vocabulary from forward_train) against the definitions in
    the target's vocabulary: p_d = softmax of the draft logits, 0 outside; TV = 1/2 sum |p_d - p_t| (the target's
    mass outside the draft vocabulary counts in full); CE = -log p_d(token) where the token is drafted, 0 else."""
    d = make(target, variant)
    ids = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(3))
    feats = captured(target, ids, d.config.target_layer_ids)
    anchors = torch.tensor([[2, 7, 11], [1, 5, 9]])
    out = d.forward_train(ids, feats, anchors, compute_logits=False)
    assert out.head is d.draft_head.weight and torch.equal(out.vocab, d.vocab_ids())
    full = d.forward_train(ids, feats, anchors).logits  # [b, N, G, VOCAB], -inf outside
    with torch.no_grad():
        last = target.model(ids).last_hidden_state
    g = out.hidden.shape[2]
    t_idx = anchors[:, :, None] + torch.arange(g)
    t_hidden = last[torch.arange(2)[:, None, None], t_idx]  # [b, N, G, H]
    u = None if out.seq_features is None else out.seq_features.flatten(0, 2)
    res = drafter_loss(out.hidden.flatten(0, 2), target.lm_head.weight, t_hidden.flatten(0, 2),
                       out.target_ids.flatten(), torch.ones(2 * 3 * g), u=u, w2=out.seq_w2, head=out.head,
                       vocab=out.vocab, alpha_ce=1.0, alpha_tv=1.0, chunk_size=7)
    p_d = torch.softmax(full.flatten(0, 2).float(), -1)  # exactly 0 outside
    p_t = torch.softmax(target.lm_head(t_hidden).flatten(0, 2).float(), -1)
    tv = 0.5 * (p_d - p_t).abs().sum(-1)
    tgt = out.target_ids.flatten()
    inside = d.t2d[tgt]
    ce = torch.where(inside, -torch.log(p_d.gather(-1, tgt[:, None]).squeeze(-1).clamp_min(1e-30)), 0.0)
    torch.testing.assert_close(res.tv, tv.mean(), rtol=1e-4, atol=1e-5)  # weights 1: the means
    torch.testing.assert_close(res.ce, ce.mean(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(res.accept, 1.0 - tv, rtol=1e-4, atol=1e-5)  # per position
    assert float((p_t[:, ~d.t2d].sum(-1)).min()) > 0  # the outside mass is really there to count


@pytest.mark.parametrize("variant,layout", [("dflash", "deepspec"), ("dflash zlab", "zlab"), ("dspark", "deepspec")])
def test_checkpoints_and_exports_carry_the_vocabulary(tmp_path, target, variant, layout):
    d = make(target, variant)
    path = save_drafter(d, tmp_path / "d")
    cfg = json.loads((path / "config.json").read_text())
    names = load_file(str(path / "model.safetensors"))
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB and tuple(names["lm_head.weight"].shape) == (DRAFT_VOCAB, 32)
    assert names["d2t"].dtype == torch.int64 and tuple(names["t2d"].shape) == (VOCAB,)
    back = load_drafter(path, target.config)
    back.attach_target(target)
    assert torch.equal(back.vocab_ids(), d.vocab_ids())
    assert generate(target, back, PROMPTS, gamma=3, max_new_tokens=8).records[-1].accepted == \
        generate(target, d, PROMPTS, gamma=3, max_new_tokens=8).records[-1].accepted
    got = export(str(path), "vllm", tmp_path / "vllm")
    data = json.loads((got.path / "config.json").read_text())
    weights = load_file(str(got.path / "model.safetensors"))
    assert data["draft_vocab_size"] == DRAFT_VOCAB and tuple(weights["lm_head.weight"].shape) == (DRAFT_VOCAB, 32)
    assert torch.equal(weights["d2t"], d.d2t)
    if "markov_head.markov_w2.weight" in weights:  # DSpark's W2 (or the zero head a DeepSpec DFlash gets)
        assert weights["markov_head.markov_w2.weight"].shape[0] == DRAFT_VOCAB
    with pytest.raises(PdraftError, match="cannot export to sglang: .* the target's LM head"):
        export(str(path), "sglang", tmp_path / "sglang")  # SGLang's loaders skip lm_head: refused, never wrong


@pytest.mark.parametrize("source", ["checkpoint", "vllm export"])
@pytest.mark.parametrize("variant", ["dflash", "dflash zlab", "dspark"])
def test_pull_from_a_local_folder_keeps_the_vocabulary(tmp_path, target, variant, source):
    """A draft-vocabulary checkpoint (pdraft's own, and the vLLM export users would publish) through `pull` from a
    local folder: the installed files keep draft_vocab_size, d2t and t2d, and the pulled drafter drafts as the
    original (the same accepted count in every greedy round, hence the same drafts where they are verified)."""
    d = make(target, variant)
    src = save_drafter(d, tmp_path / "d")
    if source == "vllm export":
        src = export(str(src), "vllm", tmp_path / "vllm").path
    got = pull(str(src), out=tmp_path / "pulled", target_config=target.config)
    assert got.config.draft_vocab_size == DRAFT_VOCAB
    assert json.loads((got.path / "config.json").read_text())["draft_vocab_size"] == DRAFT_VOCAB
    names = load_file(str(got.path / "model.safetensors"))
    assert torch.equal(names["d2t"], d.d2t) and torch.equal(names["t2d"], d.t2d)
    back = load_drafter(got.path, target.config)
    back.attach_target(target)
    assert torch.equal(back.d2t, d.d2t) and torch.equal(back.t2d, d.t2d)
    for gamma in (2, d.max_gamma()):
        mine, theirs = (generate(target, x, PROMPTS, gamma=gamma, max_new_tokens=16) for x in (back, d))
        assert mine.output_ids == theirs.output_ids
        assert [(r.request, r.accepted) for r in mine.records] == [(r.request, r.accepted) for r in theirs.records]
    assert 0 < summarize(mine.records).token_acceptance < 1  # drafts both accepted and rejected: a test of them


def test_dflash2_saves_and_loads_its_vocabulary_and_no_engine_export_takes_it(tmp_path, target):
    d = make(target, "dflash2")
    path = save_drafter(d, tmp_path / "d")
    cfg = json.loads((path / "config.json").read_text())
    names = load_file(str(path / "model.safetensors"))
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert tuple(names["lm_head.weight"].shape) == (DRAFT_VOCAB, 32) and torch.equal(names["d2t"], d.d2t)
    back = load_drafter(path, target.config)
    back.attach_target(target)
    assert torch.equal(back.vocab_ids(), d.vocab_ids())
    assert [r.accepted for r in generate(target, back, PROMPTS, gamma=3, max_new_tokens=8).records] == \
        [r.accepted for r in generate(target, d, PROMPTS, gamma=3, max_new_tokens=8).records]
    for fmt in ("vllm", "sglang"):
        with pytest.raises(PdraftError, match=f"cannot export to {fmt}: this DFlash2 .* no engine maps DFlash2"):
            export(str(path), fmt, tmp_path / fmt)


def test_dflash2_selector_loss_takes_candidates_from_the_draft_vocabulary(target):
    """The selector term over a draft vocabulary: its candidates are drafted ids (as decoding walks them), and a
    position whose gold token is outside the vocabulary leaves the loss but counts as a miss in recall."""
    from pdraft.models.dflash2.selector import selector_loss

    d = make(target, "dflash2")
    inside, outside = d.vocab_ids()[:2].tolist(), int((~d.t2d).nonzero()[0])
    h = torch.randn(3, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    logits = d.draft_logits(h)
    gold = torch.tensor([inside[0], inside[1], outside])
    prev = torch.tensor([inside[1], inside[0], inside[0]])
    res = selector_loss(d.candidate_selector, logits.detach(), h, gold, prev, torch.ones(3, dtype=torch.bool),
                        alpha=1.0, head_weight=d.draft_head.weight, vocab=d.vocab_ids())
    alone = selector_loss(d.candidate_selector, logits.detach()[:2], h[:2], gold[:2], prev[:2],
                          torch.ones(2, dtype=torch.bool), alpha=1.0, head_weight=d.draft_head.weight,
                          vocab=d.vocab_ids())
    torch.testing.assert_close(res.ce, alone.ce)  # the undraftable position adds nothing to the loss
    assert float(res.recall) <= 2 / 3  # ... and is never a hit
    res.loss.backward()
    assert h.grad is not None and float(h.grad[2].abs().sum()) == 0.0
