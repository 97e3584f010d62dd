"""Every compiled CPU loop is a capability, probed on every ISA level whatever machine runs the suite (issue 56):
built for native, x86-64-v2, v3 (AVX2 + FMA: the AVX2-only class) and v4 (AVX-512), each loads or steps aside
with one line, and stepping aside happens exactly where this CPU lacks what the level needs; the loaded walks
agree with the torch walks at every level that loads. The ways a library can be wrong (a missing symbol, flags
the compiler refuses, a CPU without the level's instructions, a cache folder that cannot be written, a cached
file truncated or replaced by a link) fall back to torch in one line, never a traceback. Last, a decode and a
bench run end to end with torch held to AVX2 (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS)
and the loops built for x86-64-v3, so an AVX-512 machine shows what the AVX2 class runs."""

import json
import os
import subprocess
import sys

import pytest
import torch

from pdraft.kernels import cc, cpu_bf16, cpu_walks
from test_cpu_walks import torch_markov_walk

X86 = cc.x86()
LEVELS = cc.MARCHES if X86 else ("native",)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache folder of the test's own, and no build or probe remembered from before (nor after)."""
    monkeypatch.setenv("PDRAFT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cc.ENV, raising=False)
    cc.clear(), cpu_walks.load.cache_clear(), cpu_bf16.load.cache_clear()
    yield tmp_path / "cache" / "kernels"
    cc.clear(), cpu_walks.load.cache_clear(), cpu_bf16.load.cache_clear()


@pytest.mark.parametrize("level", LEVELS)
def test_each_level_loads_exactly_where_this_cpu_runs_it(level, own_cache):
    targets, refusal = cc.targeted(level)
    assert targets is not None, refusal
    runs_here = set(targets) <= cc.cpu_flags() if cc.cpu_flags() else True
    walks, why = cpu_walks.load(level)
    assert "\n" not in why and len(why) < 400
    assert (walks is not None) == runs_here, why
    if walks is None:
        assert "which this CPU lacks" in why and "run in torch" in why
    else:
        assert why.startswith(f"compiled for {level}")
    bf16, why16 = cpu_bf16.load(level)
    assert "\n" not in why16
    assert (bf16 is not None) == (runs_here and "avx512_bf16" in targets), why16
    if level == "x86-64-v3":
        assert {"avx2", "fma"} <= set(targets) and not any(t.startswith("avx512") for t in targets)
    if level == "x86-64-v4":
        assert "avx512f" in targets


def test_levels_build_distinct_libraries(own_cache):
    loaded = [lvl for lvl in LEVELS if cpu_walks.load(lvl)[0] is not None]
    names = {p.name for p in own_cache.glob("cpu_walks-*.so")}
    assert len(names) == len(loaded) and all(any(f"-{lvl}-" in n for n in names) for lvl in loaded)


@pytest.mark.parametrize("level", LEVELS)
def test_walks_agree_with_torch_at_every_level_that_loads(level, own_cache):
    walks, why = cpu_walks.load(level)
    if walks is None:
        pytest.skip(why)
    g = torch.Generator().manual_seed(4)
    vocab_t, vocab_d, rank = 1300, 1200, 19  # tiles of 512 and a ragged last one; rank % 8 != 0
    base = torch.randn(2, 9, vocab_d, generator=g)
    w1, w2t = torch.randn(vocab_t, rank, generator=g), 3 * torch.randn(rank, vocab_d, generator=g)
    d2t = torch.randint(0, vocab_t - vocab_d + 1, (vocab_d,), generator=g)
    base[1, 3, 7] = float("nan")  # a NaN takes the scalar rule at every level (argmax ranks it highest)
    anchors = torch.tensor([5, 77])
    tokens, logits, _ = walks.markov_walk(base, anchors, w1, w2t, d2t)
    want_tokens, want_logits = torch_markov_walk(base, anchors, w1, w2t, d2t)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-4, equal_nan=True)


def test_a_missing_symbol_steps_aside(own_cache):
    built = cc.build("probe", "int present(void) { return 1; }\n", ("present", "absent"))
    assert built.lib is None and "lacks absent" in built.why and "run in torch" in built.why
    assert cc.build("probe", "int present(void) { return 1; }\n", ("present",)).lib.present() == 1


def test_flags_the_compiler_refuses_step_aside(own_cache, monkeypatch):
    monkeypatch.setattr(cc, "BASE_FLAGS", cc.BASE_FLAGS + ("-mno-such-flag-anywhere",))
    walks, why = cpu_walks.load("native")
    assert walks is None and "refuses native" in why and "\n" not in why


def test_a_cpu_without_the_levels_instructions_steps_aside(own_cache, monkeypatch):
    monkeypatch.setattr(cc, "cpu_flags", lambda: frozenset({"fpu", "sse2"}))  # another, older CPU
    walks, why = cpu_walks.load("native")
    if not cc.targeted("native")[0]:
        pytest.skip("native targets no extension to miss on this machine")
    assert walks is None and "which this CPU lacks" in why


def test_no_compiler_and_the_off_switch(own_cache, monkeypatch):
    monkeypatch.setattr(cc.shutil, "which", lambda name: None)
    assert cpu_walks.load("native") == (None, "no working C compiler on PATH: the walks loops run in torch")
    monkeypatch.setenv(cc.ENV, "0")
    assert cpu_walks.kernels() is None and cpu_bf16.kernels() is None and "=0" in cpu_bf16.status()


def test_an_unknown_level_in_the_environment_is_native(monkeypatch):
    monkeypatch.setenv(cc.MARCH_ENV, "x86-64-v9")
    assert cc.march() == "native"
    monkeypatch.setenv(cc.MARCH_ENV, " X86-64-V3 ")
    assert cc.march() == "x86-64-v3"
    assert cc.build("walks", "", (), "pentium").lib is None


def _load_elsewhere(cache) -> str:
    """cpu_walks.load('native')'s line in a process of its own: a library is mapped once per process (dlopen
    keeps the first file by its name), so each tampering is judged by a fresh process, as a user's next run."""
    code = "from pdraft.kernels import cpu_walks; w, why = cpu_walks.load('native'); print(w is not None, why)"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PDRAFT_CACHE_DIR": str(cache)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_tampered_cached_library_is_built_again(own_cache):
    first = _load_elsewhere(own_cache.parent)
    if not first.startswith("True"):
        pytest.skip(first)
    (lib,) = own_cache.glob("cpu_walks-native-*.so")
    good = lib.read_bytes()
    lib.write_bytes(good[: len(good) // 3])  # truncated
    again = _load_elsewhere(own_cache.parent)
    assert again.startswith("True") and "built again" in again and lib.read_bytes() == good
    elsewhere = own_cache.parent / "elsewhere.so"
    elsewhere.write_bytes(b"\x7fELF not what pdraft built")
    lib.unlink()
    lib.symlink_to(elsewhere)  # a link where the library goes: replaced, never followed nor loaded
    again = _load_elsewhere(own_cache.parent)
    assert again.startswith("True") and not lib.is_symlink() and lib.read_bytes() == good
    assert elsewhere.read_bytes() == b"\x7fELF not what pdraft built"
    assert _load_elsewhere(own_cache.parent) == first  # a good cached copy is loaded as it is


def test_a_cache_folder_that_cannot_be_written_builds_privately(own_cache, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PDRAFT_CACHE_DIR", str(blocker))  # cache/kernels under a file: mkdir fails
    cc.clear(), cpu_walks.load.cache_clear()
    walks, why = cpu_walks.load("native")
    if cc.targeted("native")[0] is None:
        pytest.skip(why)
    assert walks is not None and "cannot be written" in why and blocker.read_text() == "not a folder"


def test_held_to_avx2_means_no_bf16_units():
    from pdraft.runtime import cpu_class, cpu_has_bf16, held_below_avx512

    amx = "flags : fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile"
    assert cpu_has_bf16(amx, environ={}) and not cpu_has_bf16(amx, environ={"ATEN_CPU_CAPABILITY": "avx2"})
    assert not cpu_has_bf16(amx, environ={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert held_below_avx512({"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx512"}) == \
        ["MKL_ENABLE_INSTRUCTIONS=AVX2"]
    assert cpu_class(amx, "Intel Xeon", {}) == "Intel Xeon, AVX-512 with AMX"
    assert cpu_class("flags : avx2 fma avx512f avx512_bf16", "AMD EPYC", {}) == "AMD EPYC, AVX-512 with avx512_bf16, no AMX"
    assert cpu_class("flags : avx2 fma", "AMD EPYC", {}) == "AMD EPYC, AVX2 only"
    assert cpu_class(amx, "Intel Xeon", {"ATEN_CPU_CAPABILITY": "avx2"}).endswith("held to AVX2 (ATEN_CPU_CAPABILITY=avx2)")


AVX2_CLASS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
              cc.MARCH_ENV: "x86-64-v3"}


@pytest.mark.slow
@pytest.mark.skipif(not X86 or not {"avx2", "fma"} <= cc.cpu_flags(), reason="needs an x86 CPU with AVX2 and FMA")
def test_decode_and_bench_end_to_end_as_the_avx2_class(tmp_path):
    from pdraft.models import build_drafter, save_drafter
    from transformers import AutoConfig

    from test_bench_run import write_jsonl
    from test_data_tinytarget import make_tiny_target

    target = make_tiny_target(tmp_path / "target", hidden=32, layers=2)
    config = AutoConfig.from_pretrained(target)
    for kind, extra in (("dspark", {"markov_rank": 8}), ("dflash2", {"selector_top_k": 4})):
        save_drafter(build_drafter(kind, config, seed=0, mask_token_id=0, num_hidden_layers=1, block_size=6,
                                   **extra), tmp_path / kind)
    prompts = write_jsonl(tmp_path / "code.jsonl", ["def add(a, b):\n    return a + b", "for i in range(3):"])
    env = {**os.environ, **AVX2_CLASS, "PDRAFT_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "pdraft"]
    bench = subprocess.run(cmd + ["bench", "--target", str(target), "--drafter", str(tmp_path / "dspark"),
                                  "--drafter", str(tmp_path / "dflash2"), "--prompt-set", str(prompts),
                                  "--gamma", "3", "--num-prompts", "2", "--max-new-tokens", "8",
                                  "--out", str(tmp_path / "out"), "--set", f"output_dir={tmp_path}"],
                           env=env, capture_output=True, text=True, timeout=600)
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
    assert "Traceback" not in bench.stderr
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    rt = report["runtime"]
    assert "held to AVX2" in rt["cpu_class"] and rt["dtype"] == "float32"
    assert rt["walks_status"].startswith("compiled for x86-64-v3") and rt["walks"] == "compiled"
    assert "stay in torch" in rt["bf16_loops"]
    greedy = [r for r in report["runs"] if r["gamma"] > 0]
    assert greedy and all(r.get("same_as_target", True) for r in greedy)
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "AVX2"
    decode = subprocess.run(cmd + ["decode", "--target", str(target), "--drafter", str(tmp_path / "dspark"),
                                   "--prompt", "def add(a, b):", "--raw", "--max-new-tokens", "8", "--json"],
                            env=env, capture_output=True, text=True, timeout=600)
    assert decode.returncode == 0, decode.stdout[-2000:] + decode.stderr[-2000:]
    assert "Traceback" not in decode.stderr
    env_out = subprocess.run(cmd + ["env", "--json"], env=env, capture_output=True, text=True, timeout=120)
    info = json.loads(env_out.stdout)
    assert info["torch_cpu_capability"] == "AVX2" and info["bf16_units"] is False
    assert info["fast_paths"]["sequential_walks"].startswith("compiled for x86-64-v3")
