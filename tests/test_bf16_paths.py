"""Losslessness on each bfloat16 path `runtime.dtype: auto` can choose on a CPU (issue 38, item 5).

FastLinear picks a backend per product and row count by timing (mkl, oneDNN, the compiled one-row loop, AMX
tiles), so which one a run takes depends on the machine and its load. Here each backend is pinned in turn for
every product of the static target's step and verify (and of the drafters' passes), and on that path:

- greedy speculative output is the target alone's on the same path, token for token up to the bf16 rounding the
  greedy auditor accepts (a near-tie a verify of many rows and a one-row step break differently), with oracle,
  random and real DSpark / DFlash2 drafters (whose bf16 heads run the compiled walks where the CPU has them);
- sampled output follows the target's exact two-token joint (chi-square) at batch sizes whose verify rows stay
  under the AMX tiles' limit, so the tiles, not oneDNN's hand-over, compute the verify;
- the negative controls: a verifier that keeps every draft is a loss on the pinned path, and the sampled joint
  without its top-k cut is rejected.

Each test counts the pinned backend's calls, so a path that silently fell back would fail, not pass."""

import weakref

import pytest
import torch

import pdraft.decode.engine as engine
from doubles import DoubleConfig, OracleDrafter, RandomDrafter, tiny_target
from pdraft import gemm
from pdraft.decode.engine import generate
from pdraft.decode.greedy_audit import GreedyAuditor, verdict
from pdraft.kernels import cpu_bf16
from pdraft.models import build_drafter
from pdraft.models.api import SamplingParams
from test_decode_sampling import ALPHA, chi_square_p, exact_two_token_joint, joint_counts, sampled_runs
from test_greedy_audit import broken_accept

VOCAB, HIDDEN, NEW = 256, 64, 32
PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4], [60, 61, 62, 63, 0, 1, 2]]


def offered() -> list[str]:
    """The backends FastLinear offers for a bf16 weight on this machine and torch (a width the AMX tiles take:
    a multiple of 32)."""
    return list(gemm.FastLinear(torch.zeros(8, 64, dtype=torch.bfloat16), measure=False).backends)


BACKENDS = ["mkl", "onednn", "gemv", "amx"]


@pytest.fixture(params=BACKENDS)
def pinned(request, monkeypatch):
    """Every FastLinear built from here on takes `backend` at every row count (where it offers it); yields the
    backend's call counter."""
    backend = request.param
    if backend not in offered():
        pytest.skip(f"FastLinear offers no {backend} backend here (offered: {', '.join(offered())})")
    calls = {"n": 0}
    timed = gemm.FastLinear.measure

    def measure(self):
        if backend not in self.backends:  # a width the tiles do not take: measured as in a run
            return timed(self)
        chosen = self.backends[backend]

        def counted(x):
            calls["n"] += 1
            return chosen(x)

        self.backends[backend] = counted
        self.choice = [backend] * len(gemm.BUCKETS)

    monkeypatch.setattr(gemm.FastLinear, "measure", measure)
    built = gemm.FastLinear.__init__

    def init(self, *args, **kwargs):  # a sole backend is never measured (the AVX2 class offers mkl alone)
        built(self, *args, **kwargs)
        if list(self.backends) == [backend] and kwargs.get("measure", True):
            measure(self)

    monkeypatch.setattr(gemm.FastLinear, "__init__", init)
    monkeypatch.setattr(gemm, "_plans", weakref.WeakKeyDictionary())  # no plan measured before the pin is reused
    yield calls
    assert calls["n"] > 0, f"the pinned {backend} backend never ran: the test did not exercise its path"


@pytest.fixture
def bf16_target():
    """A new model per test: the static runner and its product plans are kept per model for the process."""
    return tiny_target(VOCAB, HIDDEN, num_layers=3, init_std=0.05).to(torch.bfloat16)


def real_drafters(target):
    dspark = build_drafter("dspark", target.config, seed=0, mask_token_id=VOCAB - 1, num_hidden_layers=1,
                           block_size=8, target_layer_ids=[0, 1], markov_rank=16)
    dflash2 = build_drafter("dflash2", target.config, seed=0, mask_token_id=VOCAB - 1, num_hidden_layers=1,
                            block_size=8, target_layer_ids=[0, 1])
    for d in (dspark, dflash2):
        d.to(torch.bfloat16).attach_target(target)
        d.eval()
    return [dspark, dflash2]


@pytest.mark.parametrize("gamma", [4, 7])
def test_greedy_speculative_output_is_the_target_alones_on_the_pinned_path(pinned, bf16_target, gamma):
    alone = generate(bf16_target, None, PROMPTS, max_new_tokens=NEW).output_ids
    assert generate(bf16_target, None, PROMPTS, max_new_tokens=NEW).backend.startswith("static")
    config = DoubleConfig(VOCAB, HIDDEN, [0, 1], block_size=16)
    drafters = [OracleDrafter(config, [p + r for p, r in zip(PROMPTS, alone)], miss_rate=0.25, seed=gamma),
                RandomDrafter(config, seed=gamma)] + real_drafters(bf16_target)
    auditor = GreedyAuditor(bf16_target)
    for drafter in drafters:
        out = generate(bf16_target, drafter, PROMPTS, gamma=gamma, max_new_tokens=NEW)
        found = auditor.audit(PROMPTS, out.output_ids, alone)
        assert verdict(found) in ("identical", "rounding"), (type(drafter).__name__, [d for d in found
                                                                                      if not d.rounding])
        if isinstance(drafter, OracleDrafter):  # long acceptances: the verify's many-row products did run
            assert out.summary().tau > 2.0


def test_a_broken_verifier_is_a_loss_on_the_pinned_path(pinned, bf16_target, monkeypatch):
    alone = generate(bf16_target, None, PROMPTS, max_new_tokens=NEW).output_ids
    monkeypatch.setattr(engine, "accept", broken_accept)
    out = generate(bf16_target, RandomDrafter(DoubleConfig(VOCAB, HIDDEN, [0, 1], block_size=16), seed=3),
                   PROMPTS, gamma=4, max_new_tokens=NEW).output_ids
    assert verdict(GreedyAuditor(bf16_target).audit(PROMPTS, out, alone)) == "loss"


def test_sampling_follows_the_bf16_targets_joint_on_the_pinned_path(pinned):
    """Batch 8 with gamma 3: a verify is 32 rows, the most the AMX tiles take, so on the amx pin the tiles do it."""
    model = tiny_target(vocab_size=16, hidden_size=32, num_layers=2).to(torch.bfloat16)
    prompt, n, batch = [3, 1, 4, 1, 5], 2400, 8
    sampling = SamplingParams(temperature=1.0, top_k=6)
    drafter = RandomDrafter(DoubleConfig(16, 32, [-1, 0], block_size=4), seed=2, sharpness=1.0)
    outputs, _ = sampled_runs(model, drafter, prompt, n, batch, 11, sampling=sampling, max_new_tokens=2)
    y = torch.tensor([o[:2] for o in outputs])
    counts = joint_counts(y[:, 0], y[:, 1], 16)
    assert chi_square_p(counts, exact_two_token_joint(model, prompt, sampling)) > ALPHA
    # Negative control on the same samples: the joint without the top-k cut is a different distribution.
    assert chi_square_p(counts, exact_two_token_joint(model, prompt, SamplingParams(temperature=1.0))) < ALPHA


@pytest.mark.skipif(cpu_bf16.kernels() is None, reason=f"no compiled bf16 loops: {cpu_bf16.status()}")
def test_the_compiled_loops_are_offered_here():
    """Where the loops compile, the pins above cover them: a machine that has them must offer both backends the
    pins name (AMX only where the CPU has tiles)."""
    assert "gemv" in offered()
    assert ("amx" in offered()) == bool(cpu_bf16.kernels().amx)
