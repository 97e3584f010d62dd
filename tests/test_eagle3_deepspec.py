"""DeepSpec's EAGLE-3 (`Qwen3Eagle3Model`, deepseek-ai/DeepSpec @ afdfa7c) decodes in pdraft as DeepSpec's own
evaluator decodes it: the same tokens and the same accepted count in every round, on a 6-layer and a 4-layer
tiny target, at gamma (DeepSpec's `ttt_length`, its `max_proposal_tokens`) 7 and 3, for a random drafter and a
trained one.

The fixture is this file's own re-implementation of DeepSpec's rules, written from reading (not copying) their
code: the decoder layer of deepspec/modeling/eagle3/qwen3/modeling.py (hidden_norm / input_layernorm, [embedding
; hidden] into q/k/v, q/k norms, the raw hidden state as the residual, the final norm before lm_head, the
pre-norm output fed to the next step), the feature layers of deepspec/modeling/eagle3/common.py
(`hidden_states[id + 1]`, fused in the order given), and the loop of deepspec/eval/eagle3/evaluator.py with
deepspec/eval/base_evaluator.py (the prompt's entries pair feature i with token i + 1 at RoPE position i; a
proposal runs `ttt_length` passes, pass k at position start + k - 1 over the draft cache; verification over
[last token, drafts]; the cache cropped to its length before the proposal and extended with the committed
tokens, without a causal mask among them). It reads the checkpoint by DeepSpec's weight names from the files,
never through pdraft. Where `PDRAFT_DEEPSPEC_SRC` names a DeepSpec checkout or git directory, the same
comparison also runs DeepSpec's evaluator code itself (their `generate_decoding_sample` with
`Qwen3Eagle3Evaluator`'s init/propose/update) on a checkpoint written by their own `save_pretrained`."""

import functools
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache

from doubles import tiny_target
from pdraft.decode.engine import generate
from pdraft.errors import PdraftError
from pdraft.hub import pull
from pdraft.models import load_drafter, save_drafter
from pdraft.models.build import build_drafter
from pdraft.models.families import family_of, layout_of
from pdraft.train.losses import drafter_loss, position_weights
from test_models_reference import source
from test_models_support import captured

VOCAB = 16
MAX_NEW = 24
PROMPTS = [[3, 5, 7, 1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11], [2, 4, 2]]
LAYERS = {6: [0, 1, 2, 3, 4], 4: [0, 1, 2]}  # DeepSpec's recipes read five layers; a 4-layer target has three


@functools.cache
def target_of(depth: int):
    return tiny_target(vocab_size=VOCAB, hidden_size=32, num_layers=depth, seed=depth)


# ---- a DeepSpec-layout folder, by DeepSpec's names ------------------------------------------------------
def deepspec_config(target, ids, ttt) -> dict:
    """config.json as build_draft_config (deepspec/modeling/eagle3/qwen3/config.py) writes it: the target's
    config with the drafter's fields set."""
    data = target.config.to_dict()
    data.update(architectures=["Qwen3Eagle3Model"], num_target_layers=target.config.num_hidden_layers,
                num_hidden_layers=1, layer_types=["full_attention"], target_model_name_or_path="tiny",
                target_layer_ids=list(ids), ttt_length=ttt, step_loss_decay=0.8, draft_num_hidden_layers=1,
                tie_word_embeddings=False)
    return data


def random_deepspec_folder(path: Path, target, ids, ttt, seed=5) -> Path:
    """A random Qwen3Eagle3Model checkpoint under the names its state dict has, the embedding and head copied
    from the target (initialize_embeddings_and_head, as DeepSpec's trainer starts one)."""
    c, g = target.config, torch.Generator().manual_seed(seed)
    h, d, heads, kv, inter = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
    shapes = {"fc.weight": (h, len(ids) * h), "layers.0.self_attn.q_proj.weight": (heads * d, 2 * h),
              "layers.0.self_attn.k_proj.weight": (kv * d, 2 * h), "layers.0.self_attn.v_proj.weight": (kv * d, 2 * h),
              "layers.0.self_attn.o_proj.weight": (h, heads * d), "layers.0.mlp.gate_proj.weight": (inter, h),
              "layers.0.mlp.up_proj.weight": (inter, h), "layers.0.mlp.down_proj.weight": (h, inter)}
    norms = {"layers.0.self_attn.q_norm.weight": d, "layers.0.self_attn.k_norm.weight": d,
             "layers.0.hidden_norm.weight": h, "layers.0.input_layernorm.weight": h,
             "layers.0.post_attention_layernorm.weight": h, "norm.weight": h}
    tensors = {k: torch.randn(s, generator=g) * 0.3 for k, s in shapes.items()}
    tensors.update({k: 1.0 + 0.3 * torch.randn(n, generator=g) for k, n in norms.items()})
    tensors["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().clone()
    tensors["lm_head.weight"] = target.lm_head.weight.detach().clone()
    path.mkdir(parents=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(deepspec_config(target, ids, ttt)))
    return path


@functools.cache
def trained_drafter(depth: int, steps: int = 120):
    """A pdraft EAGLE-3 of DeepSpec's shape (q/k norms, the whole vocabulary, DeepSpec's feature layers)
    distilled on the target's greedy continuations over 7 training-time-test steps."""
    target, ids, ttt = target_of(depth), LAYERS[depth], 7
    d = build_drafter("eagle3", target.config, seed=0, draft_vocab_size=VOCAB, ttt_steps=ttt, qk_norm=True,
                      target_layer_ids=ids)
    d.attach_target(target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        prompts = torch.randint(0, VOCAB, (32, 4), generator=g)
        seqs = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=28,
                               do_sample=False, pad_token_id=-1)  # [32, 32]
        feats, last = captured(target, seqs, ids), target.model(seqs).last_hidden_state
        d.lm_head.weight.copy_(target.lm_head.weight)  # DeepSpec starts its head as the target's
    opt = torch.optim.AdamW([p for p in d.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(steps):
        rows = torch.randint(0, 32, (8,), generator=g)
        anchors = torch.randint(4, 32 - ttt, (8, 6), generator=g).sort(1).values
        out = d.forward_train(seqs[rows], feats[rows], anchors, compute_logits=False)
        t_hidden = last[rows][torch.arange(8)[:, None, None], anchors[:, :, None] + torch.arange(ttt)]
        k = torch.arange(ttt).expand(8, 6, ttt)
        res = drafter_loss(out.hidden.flatten(0, 2), target.lm_head.weight, t_hidden.flatten(0, 2),
                           out.target_ids.flatten(), position_weights(k, 4.48).flatten(), head=out.head,
                           vocab=out.vocab, alpha_kl=1.0)
        opt.zero_grad()
        res.loss.backward()
        opt.step()
    return d.eval()


def trained_deepspec_folder(path: Path, target, ids, ttt) -> Path:
    """trained_drafter written in DeepSpec's layout by save_drafter, with `ttt` as its ttt_length, then made
    exactly what DeepSpec writes: save_drafter adds a `pdraft` object to config.json, which DeepSpec's
    build_draft_config never writes and which would have the folder read back as pdraft's own eagle3, so it is
    removed and the folder goes through the DeepSpec reader as a checkpoint of theirs would."""
    d = trained_drafter(target.config.num_hidden_layers)
    assert d.config.target_layer_ids == list(ids)
    d.config.ttt_steps = ttt
    try:
        folder = save_drafter(d, path, layout="deepspec-eagle3")
    finally:
        d.config.ttt_steps = 7
    data = json.loads((folder / "config.json").read_text())
    data.pop("pdraft")
    (folder / "config.json").write_text(json.dumps(data))
    return folder


# ---- DeepSpec's rules, re-implemented from reading their code ---------------------------------------------
def rms(x, w, eps):
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Reference:
    """Qwen3Eagle3Model's drafting pass and the evaluator's draft cache, from the checkpoint's own files."""

    def __init__(self, folder: Path):
        self.cfg = json.loads((folder / "config.json").read_text())
        self.w = load_file(str(folder / "model.safetensors"))
        self.ids = self.cfg["target_layer_ids"]
        self.eps = self.cfg["rms_norm_eps"]
        self.heads, self.kv, self.d = self.cfg["num_attention_heads"], self.cfg["num_key_value_heads"], self.cfg["head_dim"]
        theta = (self.cfg.get("rope_parameters") or {}).get("rope_theta") or self.cfg["rope_theta"]
        self.inv_freq = 1.0 / theta ** (torch.arange(0, self.d, 2).float() / self.d)
        self.keys = self.values = None  # [kv, T, d]

    def rope(self, x, pos):  # x [n, T, d], pos [T]; rotate_half convention
        f = pos[:, None].float() * self.inv_freq
        emb = torch.cat([f, f], -1)
        x1, x2 = x[..., : self.d // 2], x[..., self.d // 2 :]
        return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()

    def run(self, hidden, tokens, pos):
        """hidden [T, m*H] (target features, through fc) or [T, H] (the previous output); tokens, pos [T] -> the
        layer's outputs [T, H] before the final norm; the entries' keys and values join the cache."""
        w, p = self.w, "layers.0."
        if hidden.shape[-1] != w["norm.weight"].shape[0]:
            hidden = hidden @ w["fc.weight"].T
        emb = w["embed_tokens.weight"][tokens]
        x = torch.cat([rms(emb, w[p + "input_layernorm.weight"], self.eps),
                       rms(hidden, w[p + "hidden_norm.weight"], self.eps)], -1)
        t = x.shape[0]
        q = rms((x @ w[p + "self_attn.q_proj.weight"].T).view(t, self.heads, self.d), w[p + "self_attn.q_norm.weight"], self.eps)
        k = rms((x @ w[p + "self_attn.k_proj.weight"].T).view(t, self.kv, self.d), w[p + "self_attn.k_norm.weight"], self.eps)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(t, self.kv, self.d)
        q, k, v = self.rope(q.transpose(0, 1), pos), self.rope(k.transpose(0, 1), pos), v.transpose(0, 1)
        past = 0 if self.keys is None else self.keys.shape[1]
        self.keys = k if self.keys is None else torch.cat([self.keys, k], 1)
        self.values = v if self.values is None else torch.cat([self.values, v], 1)
        rep = self.heads // self.kv
        kk, vv = self.keys.repeat_interleave(rep, 0), self.values.repeat_interleave(rep, 0)
        scores = q @ kk.transpose(-1, -2) * self.d ** -0.5  # [heads, T, past + T]
        if past == 0 and t > 1:  # the prompt: causal (sdpa's is_causal); later extensions attend to every key
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        attn = (scores.softmax(-1) @ vv).transpose(0, 1).reshape(t, -1)
        h = hidden + attn @ w[p + "self_attn.o_proj.weight"].T
        y = rms(h, w[p + "post_attention_layernorm.weight"], self.eps)
        mlp = (torch.nn.functional.silu(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T))
        return h + mlp @ w[p + "mlp.down_proj.weight"].T

    def draft(self, hidden):
        return int((rms(hidden, self.w["norm.weight"], self.eps) @ self.w["lm_head.weight"].T).argmax(-1))

    def crop(self, n):
        self.keys, self.values = self.keys[:, :n], self.values[:, :n]


@torch.no_grad()
def reference_decode(target, folder: Path, prompt: list[int], max_new: int):
    """DeepSpec's greedy loop (base_evaluator.generate_decoding_sample with Qwen3Eagle3Evaluator's init,
    propose and update) -> (new tokens, accepted drafts per round)."""
    ref = Reference(folder)
    ttt = ref.cfg["ttt_length"]

    def features(seq):
        out = target(torch.tensor([seq]), output_hidden_states=True)
        return out.logits[0].argmax(-1), torch.cat([out.hidden_states[i + 1][0] for i in ref.ids], -1)

    n = len(prompt)
    preds, feats = features(prompt)
    seq = prompt + [int(preds[-1])]
    hidden = ref.run(feats, torch.tensor(seq[1 : n + 1]), torch.arange(n))[-1:]
    start, limit, rounds = n, n + max_new, []
    while start < limit:
        before = ref.keys.shape[1]
        cand, h = [seq[start]], hidden
        for k in range(ttt):  # every pass also runs the model on its draft, the last one's output unused
            cand.append(ref.draft(h))
            h = ref.run(h, torch.tensor(cand[-1:]), torch.tensor([start + k]))
        preds, feats = features(seq[:start] + cand)
        preds, feats = preds[start:], feats[start:]
        accepted = 0
        while accepted < ttt and cand[accepted + 1] == int(preds[accepted]):
            accepted += 1
        committed = cand[1 : accepted + 1] + [int(preds[accepted])]
        seq = seq[: start + 1] + committed
        rounds.append(accepted)
        ref.crop(before)
        hidden = ref.run(feats[: accepted + 1], torch.tensor(committed), torch.arange(start, start + accepted + 1))[-1:]
        start += accepted + 1
    return seq[n : min(start + 1, limit)], rounds


def pdraft_decode(target, folder: Path, prompt, max_new):
    drafter = load_drafter(folder, target.config)
    drafter.attach_target(target)
    out = generate(target, drafter, [prompt], gamma=drafter.config.ttt_steps, max_new_tokens=max_new)
    rounds = [r for r in out.records if r.gamma > 0]
    return out.output_ids[0], [r.accepted for r in rounds], [r.verified for r in rounds]


def within_budget(accepted: list[int], max_new: int = MAX_NEW) -> list[int]:
    """DeepSpec's rounds that commit a token inside the budget: its loop runs while start < prompt + max_new and
    trims the output after, so a round starting at the budget's last token commits only tokens trimmed away
    (pdraft does not run it)."""
    out, start = [], 0  # start: the round's last committed token, counted from the first generated one
    for a in accepted:
        if start >= max_new - 1:
            break
        out.append(a)
        start += a + 1
    return out


def assert_same_rounds(mine, theirs):
    """Every round equal; in the last one pdraft verifies only the drafts its token budget can still take, so it
    keeps min(DeepSpec's accepted, drafts verified) (the same drafts, greedy)."""
    tokens, accepted, verified = mine
    ref_tokens, ref_accepted = theirs[0], within_budget(theirs[1])
    assert tokens == ref_tokens
    assert len(accepted) == len(ref_accepted)
    assert accepted[:-1] == ref_accepted[:-1]
    assert accepted[-1] == min(ref_accepted[-1], verified[-1])


@pytest.mark.parametrize("trained", [False, True], ids=["random", "trained"])
@pytest.mark.parametrize("ttt", [7, 3])
@pytest.mark.parametrize("depth", [6, 4])
def test_deepspec_eagle3_decodes_as_their_evaluator(tmp_path, depth, ttt, trained):
    target = target_of(depth)
    make = trained_deepspec_folder if trained else random_deepspec_folder
    folder = make(tmp_path / "ckpt", target, LAYERS[depth], ttt)
    data = json.loads((folder / "config.json").read_text())
    assert layout_of(data).name == family_of(data) == "deepspec-eagle3"  # read as DeepSpec's, not pdraft's own
    total = []
    for prompt in PROMPTS:
        theirs = reference_decode(target, folder, prompt, MAX_NEW)
        mine = pdraft_decode(target, folder, prompt, MAX_NEW)
        assert_same_rounds(mine, theirs)
        assert mine[0] == generate(target, None, [prompt], max_new_tokens=MAX_NEW).output_ids[0]
        total += theirs[1]
    if trained:  # the fixture is not vacuous: drafts are both accepted and rejected
        assert 0 < sum(total) < ttt * len(total), total


def test_the_alias_and_the_layout_round_trip(tmp_path):
    target = target_of(4)
    folder = random_deepspec_folder(tmp_path / "a", target, LAYERS[4], 3)
    data = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**data, "architectures": ["Eagle3DraftModel"]}))
    got = pull(str(folder), out=tmp_path / "pulled", target_config=target.config)
    assert got.family == "deepspec-eagle3" and got.config.kind == "eagle3"
    d = load_drafter(folder, target.config)
    assert d.config.qk_norm and not d.config.reduced_vocab and d.config.ttt_steps == 3
    assert d.config.target_layer_ids == LAYERS[4] and d.config.extra["step_loss_decay"] == 0.8
    d.attach_target(target)
    save_drafter(d, tmp_path / "b", layout="deepspec-eagle3")
    back = load_file(str(tmp_path / "b" / "model.safetensors"))
    orig = load_file(str(folder / "model.safetensors"))
    assert set(back) == set(orig)  # DeepSpec's names, its embedding and head included
    for k in orig:
        assert torch.equal(back[k], orig[k]), k
    written = json.loads((tmp_path / "b" / "config.json").read_text())
    assert written["architectures"] == ["Qwen3Eagle3Model"] and written["ttt_length"] == 3
    assert written["draft_num_hidden_layers"] == 1 and written["target_layer_ids"] == LAYERS[4]


@pytest.mark.parametrize("change,needle", [
    (dict(draft_num_hidden_layers=2, num_hidden_layers=2), "draft_num_hidden_layers == 1"),
    (dict(ttt_length=None), "ttt_length"),
    (dict(attention_bias=True), "attention biases"),
    (dict(draft_vocab_size=8), "whole vocabulary"),
])
def test_what_deepspec_cannot_be_is_refused_in_one_line(tmp_path, change, needle):
    target = target_of(4)
    folder = random_deepspec_folder(tmp_path / "a", target, LAYERS[4], 3)
    data = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**data, **change}))
    with pytest.raises(PdraftError, match=needle):
        load_drafter(folder, target.config)


def test_a_reduced_vocabulary_is_not_written_as_deepspec(tmp_path):
    target = target_of(4)
    d = build_drafter("eagle3", target.config, seed=0, draft_vocab_size=12, qk_norm=True)
    d.attach_target(target)
    with pytest.raises(PdraftError, match="reduced draft vocabulary"):
        save_drafter(d, tmp_path / "x", layout="deepspec-eagle3")
    assert not (tmp_path / "x").exists()


# ---- DeepSpec's own code, where the user has it -------------------------------------------------------------
@pytest.mark.parametrize("ttt", [7, 3])
@pytest.mark.parametrize("depth", [6, 4])
def test_deepspec_own_evaluator_agrees(tmp_path, monkeypatch, depth, ttt):
    root = source("PDRAFT_DEEPSPEC_SRC", "deepspec", tmp_path,
                  "DeepSpec's code is not on PyPI, so CI cannot run this cross-check: set PDRAFT_DEEPSPEC_SRC to a "
                  "DeepSpec checkout or git directory to run it")
    sys.path.insert(0, str(root))
    try:
        from deepspec.eval.base_evaluator import generate_decoding_sample
        from deepspec.eval.eagle3.evaluator import Qwen3Eagle3Evaluator
        from deepspec.modeling.eagle3.qwen3 import Qwen3Eagle3Model
    finally:
        sys.path.remove(str(root))
    # Their code crops a cache to an absolute length (transformers 4's `crop(max_length)`); transformers 5 takes the
    # number of tokens to remove. The same crop, in the installed version's terms; nothing of their logic changes.
    class LegacyCrop(DynamicCache):
        def crop(self, max_length: int) -> None:
            super().crop(max_length - self.get_seq_length() if max_length >= 0 else max_length)

    for module in ("deepspec.eval.base_evaluator", "deepspec.eval.eagle3.evaluator"):
        monkeypatch.setattr(sys.modules[module], "DynamicCache", LegacyCrop)
    target = target_of(depth)
    folders = {"random": random_deepspec_folder(tmp_path / "random", target, LAYERS[depth], ttt),
               "trained": trained_deepspec_folder(tmp_path / "trained", target, LAYERS[depth], ttt)}
    # A checkpoint of their own writer: their model loaded from our random folder and saved by save_pretrained.
    theirs = Qwen3Eagle3Model.from_pretrained(str(folders["random"]), attn_implementation="sdpa").eval()
    theirs.save_pretrained(str(tmp_path / "saved"))
    folders["their save_pretrained"] = tmp_path / "saved"
    for name, folder in folders.items():
        model = Qwen3Eagle3Model.from_pretrained(str(folder), attn_implementation="sdpa").float().eval()
        ev = SimpleNamespace(draft_model=model, args=SimpleNamespace(temperature=0.0), max_proposal_tokens=ttt)
        for prompt in PROMPTS:
            out = generate_decoding_sample(
                target_model=target, input_ids=torch.tensor([prompt]), max_new_tokens=MAX_NEW,
                max_proposal_tokens=ttt, temperature=0.0, stop_token_ids=None,
                init_context=functools.partial(Qwen3Eagle3Evaluator._init_context, ev),
                propose=functools.partial(Qwen3Eagle3Evaluator._propose, ev),
                update=functools.partial(Qwen3Eagle3Evaluator._update, ev))
            ref = (out.output_ids[0, len(prompt):].tolist(), list(out.accepted_draft_lengths))
            assert reference_decode(target, folder, prompt, MAX_NEW) == ref, name  # the fixture is theirs
            assert_same_rounds(pdraft_decode(target, folder, prompt, MAX_NEW), ref)
