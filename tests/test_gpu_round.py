"""benchmarks/gpu_round.py's CPU dry run (required in CI: every code path of the GPU benchmark runs on tiny
configs), and pdraft.decode.cuda_graphs: importable and explicit about being unavailable on CPU; on CUDA (gpu
tests) graph replay equals the eager passes."""

import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch

from pdraft.errors import PdraftError

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_round", ROOT / "benchmarks" / "gpu_round.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cpu_dry_run(tmp_path, capsys):
    script = load_script()
    bench = tmp_path / "bench.json"  # a pdraft bench report: tau per gamma feeds the implied speedup
    bench.write_text(json.dumps({"runs": [{"gamma": 4, "summary": {"tau": 2.5}},
                                          {"gamma": 16, "summary": {"tau": 4.0}}]}))
    out = tmp_path / "gpu_round.json"
    t0 = time.perf_counter()
    assert script.main(["--device", "cpu", "--tiny", "--out", str(out), "--bench-json", str(bench)]) == 0
    assert time.perf_counter() - t0 < 60
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("full JSON") and printed[-2].startswith("tiny")  # the table comes last
    report = json.loads(out.read_text())
    assert report["machine"]["note"].startswith("CPU dry run")
    res = report["results"][0]
    verify = res["target"]["eager_s"]
    assert sorted(int(q) for q in verify) == list(range(1, 18)) and all(v > 0 for v in verify.values())
    rows = res["drafters"]
    seen = {(r["drafter"], r["block"], r["sampling"], r["gamma"]) for r in rows}
    for kind in ("dflash", "dspark"):
        for s in ("greedy", "t1"):
            assert {(kind, 16, s, g) for g in (4, 8, 12, 16)} <= seen and {(kind, 7, s, g) for g in (4, 7)} <= seen
    assert all(r["propose_s"] > 0 and r["sample_block_s"] > 0 for r in rows)
    d = res["derived"]
    assert {s["tau"] for s in d["speedup"] if s["gamma"] == 16} == {4.0}
    one = next(s for s in d["speedup"] if s["gamma"] == 4 and s["drafter"] == "dflash")
    draft4 = next(r["propose_s"] for r in rows if (r["drafter"], r["block"], r["sampling"], r["gamma"],
                                                   r["variant"]) == ("dflash", 16, "greedy", 4, "eager"))
    assert one["speedup"] == pytest.approx(2.5 * verify["1"] / (draft4 + verify["5"]))
    assert set(d["host_overhead"]) == {"dflash", "dspark"}
    assert "eager/greedy" in d["head_share"]
    assert res["loss"]["torch_s"] > 0 and "fused_s" not in res["loss"]  # no fused kernels without CUDA


def test_cuda_graphs_say_they_are_unavailable_without_cuda(monkeypatch):
    from pdraft.decode import cuda_graphs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not cuda_graphs.available()
    assert "CUDA" in cuda_graphs.why_unavailable()
    with pytest.raises(PdraftError, match="CUDA graphs need a CUDA device"):
        cuda_graphs.GraphedVerify(torch.nn.Linear(2, 2), 1, 4, 16)
    assert cuda_graphs.bucket(3) == 4 and cuda_graphs.bucket(1) == 1
    with pytest.raises(PdraftError):
        cuda_graphs.bucket(10_000)


class _EagerGraph:
    """Stands in for a CUDA graph on CPU: replay re-runs the captured function and writes its results into the
    first run's output tensors, as a replay refreshes a graph's static outputs. It checks the static-buffer and
    device-side bookkeeping of the graphed passes, not the capture itself (the gpu tests do that)."""

    def __init__(self, fn):
        self.fn = fn
        self.out = fn()

    def replay(self):
        new = self.fn()
        for name in vars(self.out):
            old = getattr(self.out, name)
            if isinstance(old, torch.Tensor):
                old.copy_(getattr(new, name))


@pytest.fixture
def eager_graphs(monkeypatch):
    from pdraft.decode import cuda_graphs

    monkeypatch.setattr(cuda_graphs, "_require_cuda", lambda what: None)
    monkeypatch.setattr(cuda_graphs, "_capture", lambda fn, warmup=2: (lambda g: (g, g.out))(_EagerGraph(fn)))
    return cuda_graphs


def _tiny_pair(device):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pdraft.models import build_drafter

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    cfg._attn_implementation = "sdpa"
    target = Qwen3ForCausalLM(cfg).to(device).eval()
    drafter = build_drafter("dspark", cfg, seed=0, mask_token_id=255, num_hidden_layers=2, block_size=8,
                            markov_rank=16).to(device).eval()
    drafter.attach_target(target)
    return target, drafter


def _check_propose(cuda_graphs, device):
    _, drafter = _tiny_pair(device)
    b, ctx = 2, 20
    state = cuda_graphs.static_draft_state(drafter, b, 64)
    feats = torch.randn(b, ctx, len(drafter.config.target_layer_ids) * 64, device=device)
    drafter.extend_context(state, feats, torch.arange(ctx, device=device).expand(b, ctx))
    anchors, apos = torch.tensor([5, 9], device=device), torch.full((b,), ctx, device=device)
    graphed = cuda_graphs.GraphedPropose(drafter, state, 6)
    for _ in range(3):  # the context grows between replays, in place
        eager = drafter.propose(state, anchors, apos, 6)
        out = graphed.replay(state, anchors, apos)
        assert torch.equal(out.tokens, eager.tokens)
        torch.testing.assert_close(out.confidence, eager.confidence)
        more = torch.randn(b, 3, feats.shape[-1], device=device)
        drafter.extend_context(state, more, apos[:, None] + torch.arange(3, device=device))
        apos = apos + 3
        anchors = eager.tokens[:, 0]
    drafter.extend_context(state, torch.randn(b, 64, feats.shape[-1], device=device),
                           apos[:, None] + torch.arange(64, device=device))  # past capacity: buffers regrow
    with pytest.raises(PdraftError, match="reallocated"):
        graphed.replay(state, anchors, apos)


def _check_verify(cuda_graphs, device):
    """Three rounds in which the two requests accept different numbers of drafts (holes in the shared slots):
    every replay's logits equal a full forward of each request's own committed sequence."""
    target, _ = _tiny_pair(device)
    b, ctx, gamma = 2, 12, 4
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 255, (ctx + 1,), generator=g).tolist() for _ in range(b)]  # committed + anchor
    gv = cuda_graphs.GraphedVerify(target, b, gamma, 64, layer_ids=[1, 7])
    gv.prefill(torch.tensor([s[:ctx] for s in seqs], device=device), torch.full((b,), ctx, device=device))
    for accepted in ([gamma, 1], [0, 3], [2, gamma]):
        drafts = torch.randint(0, 255, (b, gamma), generator=g)
        anchors = torch.tensor([s[-1] for s in seqs], device=device)
        apos = torch.tensor([len(s) - 1 for s in seqs], device=device)
        out = gv.verify(anchors, apos, drafts.to(device))
        for i, s in enumerate(seqs):
            ids = torch.tensor([s + drafts[i].tolist()], device=device)
            full = target(ids).logits[0, len(s) - 1:]  # [gamma + 1, vocab]
            torch.testing.assert_close(out.logits[i].float(), full.float(), rtol=1e-4, atol=1e-4)
        assert out.hidden.shape == (b, gamma + 1, 2 * 64)
        gv.commit(torch.tensor(accepted, device=device))  # anchor + accepted drafts stay; the rest are holes
        for i, a in enumerate(accepted):
            seqs[i] += drafts[i, :a].tolist() + [int(drafts[i, a]) if a < gamma else 7]  # next anchor


@torch.no_grad()
def test_graphed_passes_bookkeeping_on_cpu(eager_graphs):
    _check_propose(eager_graphs, "cpu")
    _check_verify(eager_graphs, "cpu")


@pytest.mark.gpu
@torch.no_grad()
def test_graphed_propose_equals_eager_on_cuda():
    from pdraft.decode import cuda_graphs

    _check_propose(cuda_graphs, "cuda")


@pytest.mark.gpu
@torch.no_grad()
def test_graphed_verify_equals_a_full_forward_on_cuda():
    from pdraft.decode import cuda_graphs

    _check_verify(cuda_graphs, "cuda")
