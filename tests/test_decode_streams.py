"""Per-request random streams (pdraft.streams): copies of one prompt are independent samples whatever
the batches, a seed reproduces a run, a batch size does not change it, a prompt's own seed wins, sampled
decoding is lossless when a run spans several batches (chi-square against the exact joint, and a two-sample
test against target-only sampling with a negative control), and random numbers are drawn on the generator's
own device, never by handing a generator to an op on the model's tensors (issue 16's device defect)."""

import json

import pytest
import torch

from doubles import DoubleConfig, RandomDrafter, tiny_target
from pdraft.decode.engine import generate
from pdraft.streams import request_seed, request_seeds, run_seed
from pdraft.models.api import SamplingParams
from pdraft.recipe import Recipe
from test_decode_cli import run, save_tiny
from test_decode_sampling import ALPHA, chi_square_p, exact_two_token_joint

PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("target")
    save_tiny(path)
    return path


def decode_json(target_dir, prompt_file, *flags):
    code, out, err = run(["--target", str(target_dir), "--prompt-file", str(prompt_file), "--raw", "--no-draft",
                          "--temperature", "1", "--max-new-tokens", "8", "--json", *flags])
    assert code == 0, err
    return [json.loads(line) for line in out.strip().splitlines()]


@pytest.fixture(scope="module")
def copies(target_dir, tmp_path_factory):
    """200 copies of one prompt, decoded by `pdraft decode` in batches of 100, again, in one batch of 200,
    and with another seed (the issue's best-of-n example)."""
    path = tmp_path_factory.mktemp("prompts") / "copies.txt"
    path.write_text("hello world\n" * 200)
    outs = {name: [r["output_ids"] for r in decode_json(target_dir, path, "--seed", seed, "--batch-size", bs)]
            for name, seed, bs in [("b100", "7", "100"), ("b100-again", "7", "100"), ("b200", "7", "200"),
                                   ("other-seed", "8", "100")]}
    return outs


def test_copies_across_batches_are_independent_samples(copies):
    b100, b200 = copies["b100"], copies["b200"]
    first, second = b100[:100], b100[100:]
    assert sum(a == b for a, b in zip(first, second)) < 5  # the second batch does not replay the first
    distinct_100, distinct_200 = len(set(map(tuple, b100))), len(set(map(tuple, b200)))
    assert distinct_200 > 150  # the prompt has enough entropy for the comparison to mean something
    assert distinct_100 >= 0.95 * distinct_200


def test_same_seed_same_run_other_seed_other_run(copies):
    assert copies["b100-again"] == copies["b100"]
    assert sum(a == b for a, b in zip(copies["other-seed"], copies["b100"])) < 5


def test_batch_size_does_not_change_the_samples(copies):
    # Up to floating-point differences between batch shapes: copies of one prompt pad nothing, so in practice
    # every sample agrees; allow a few flips of a near-tie.
    assert sum(a == b for a, b in zip(copies["b100"], copies["b200"])) >= 195


def test_prompt_seed_field_wins_and_reproduces_a_row(target_dir, tmp_path):
    path = tmp_path / "p.jsonl"
    rows = decode_json(target_dir, _jsonl(path, [{"prompt": "hello world"}] * 3), "--seed", "7")
    assert [r["seed"] for r in rows] == request_seeds(7, 0, 3)
    again = decode_json(target_dir, _jsonl(path, [{"prompt": "hello world", "seed": rows[2]["seed"]},
                                                 {"prompt": "hello world", "seed": 5},
                                                 {"prompt": "hello world", "seed": 5}]), "--seed", "99")
    assert again[0]["output_ids"] == rows[2]["output_ids"]  # a row's seed redraws that row, in any position
    assert again[1]["output_ids"] == again[2]["output_ids"] and again[1]["seed"] == 5


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bad_prompt_seed_is_one_clean_error(target_dir, tmp_path):
    code, _, err = run(["--target", str(target_dir), "--prompt-file", str(_jsonl(tmp_path / "p.jsonl",
                        [{"prompt": "hi", "seed": "seven"}])), "--no-draft", "--raw"])
    assert code == 2 and "seed" in err and "Traceback" not in err


def test_run_seed_precedence_and_request_seeds():
    r = Recipe()
    assert run_seed(r) == r.runtime.seed
    r.decode.seed = 11
    assert run_seed(r) == 11 and run_seed(r, section="bench") == 11 and run_seed(r, flag=3) == 3
    r.bench.seed = 12
    assert run_seed(r, section="bench") == 12 and run_seed(r) == 11
    assert request_seeds(4, 10, 3) == [request_seed(4, 10), request_seed(4, 11), request_seed(4, 12)]
    assert request_seed(0, 1) != request_seed(1, 0)  # not seed + index
    assert request_seeds(4, 0, 2, own=[None, 9]) == [request_seed(4, 0), 9]


# --- losslessness over several batches per run ------------------------------------------------------------

@pytest.fixture(scope="module")
def small_target():
    return tiny_target(vocab_size=16, hidden_size=32, num_layers=2)


def sample_copies(model, drafter, n, sampling, seed, batch=1000):
    """First two tokens of n copies of PROMPT, decoded in batches of `batch` from one run's streams."""
    outs = []
    for start in range(0, n, batch):
        count = min(batch, n - start)
        res = generate(model, drafter, [PROMPT] * count, gamma=3 if drafter else None, sampling=sampling,
                       max_new_tokens=4, seeds=request_seeds(seed, start, count))
        outs += [o[:2] for o in res.output_ids]
    y = torch.tensor(outs)  # [n, 2]
    return y[:, 0] * 16 + y[:, 1]  # [n] joint cell


def drafter16():
    return RandomDrafter(DoubleConfig(16, 32, [-1, 0], block_size=4), seed=2, sharpness=1.0)


def test_speculative_sampling_over_several_batches_matches_target(small_target):
    """Four batches of 1000 from one run: shared streams would repeat each sample four times and fail."""
    sampling = SamplingParams(temperature=1.0, top_k=6)
    cells = sample_copies(small_target, drafter16(), 4000, sampling, seed=5)
    exact = exact_two_token_joint(small_target, PROMPT, sampling)
    assert chi_square_p(torch.bincount(cells, minlength=256).view(16, 16), exact) > ALPHA


def two_sample_p(a: torch.Tensor, b: torch.Tensor, cells: int) -> float:
    """Chi-square test of homogeneity of two samples of cell ids; cells with a pooled expected count below
    5 are merged into one."""
    ca, cb = torch.bincount(a, minlength=cells).double(), torch.bincount(b, minlength=cells).double()
    big = (ca + cb) * min(len(a), len(b)) / (len(a) + len(b)) >= 5
    table = torch.stack([torch.cat([ca[big], ca[~big].sum().view(1)]), torch.cat([cb[big], cb[~big].sum().view(1)])])
    table = table[:, table.sum(0) > 0]
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    df = table.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def test_two_sample_speculative_vs_target_alone(small_target):
    """Speculative and target-only sampling of 4000 copies (batches of 1000, other seeds) are one
    distribution; target-only at temperature 0.8 instead of 1.0 is detected (p far below ALPHA)."""
    sampling, n = SamplingParams(temperature=1.0), 4000
    spec = sample_copies(small_target, drafter16(), n, sampling, seed=21)
    alone = sample_copies(small_target, None, n, sampling, seed=22)
    colder = sample_copies(small_target, None, n, SamplingParams(temperature=0.8), seed=23)
    assert two_sample_p(spec, alone, 256) > ALPHA
    assert two_sample_p(spec, colder, 256) < ALPHA * 1e-3


# --- random numbers on the generator's own device (issue 16's defect) -------------------------------------

class _OtherDeviceGenerator:
    """Stands for a generator on another device than the model (a CPU generator beside a CUDA model, or the
    reverse): it claims cuda:0 while the model computes on the CPU. The patched random ops below check, as
    torch does, that a generator is used only for numbers made on its own device."""

    made = 0

    def __init__(self, device=None):
        self.real = _REAL["Generator"]()
        self.device = torch.device("cuda", 0)

    def manual_seed(self, seed):
        self.real.manual_seed(seed)
        return self


_REAL = {name: getattr(torch, name) for name in ("Generator", "rand", "randn", "randint", "multinomial")}


def _checked(name):
    real = _REAL[name]

    def op(*args, generator=None, device=None, **kw):
        if isinstance(generator, _OtherDeviceGenerator):
            where = args[0].device if name == "multinomial" else torch.device(device or "cpu")
            if where.type != generator.device.type:
                raise RuntimeError(f"Expected a '{where.type}' device type for generator but found "
                                   f"'{generator.device.type}'")
            _OtherDeviceGenerator.made += 1
            return real(*args, generator=generator.real, **kw)  # made here, as if on the generator's device
        return real(*args, generator=generator, **({} if device is None else {"device": device}), **kw)
    return op


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_sampled_decoding_with_generator_and_model_on_different_devices(monkeypatch, small_target, kind):
    from pdraft.models import build_drafter

    extra = {"markov_rank": 8} if kind == "dspark" else {}
    drafter = build_drafter(kind, small_target.config, seed=0, mask_token_id=15, num_hidden_layers=1,
                            block_size=4, **extra)
    drafter.attach_target(small_target)
    drafter.eval()  # the non-fused path: use_fused_kernel stays off
    monkeypatch.setattr(torch, "Generator", _OtherDeviceGenerator)
    for name in ("rand", "randn", "randint", "multinomial"):
        monkeypatch.setattr(torch, name, _checked(name))
    _OtherDeviceGenerator.made = 0
    out = generate(small_target, drafter, [PROMPT] * 3, gamma=3, sampling=SamplingParams(temperature=1.0),
                   max_new_tokens=6, seed=1)
    assert all(len(o) == 6 for o in out.output_ids)
    assert _OtherDeviceGenerator.made > 0  # the run's randomness really came from those generators
