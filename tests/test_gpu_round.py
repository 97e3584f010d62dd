"""benchmarks/gpu_round.py's CPU dry run (required in CI: every code path of the GPU benchmark runs on tiny
configs)."""

import importlib.util
import json
import time
from pathlib import Path

import pytest

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
    for kind in ("dflash", "dspark", "dflash2"):  # "block" is the tokens a block drafts (DFlash2's holds the anchor too)
        for s in ("greedy", "t1"):
            assert {(kind, 16, s, g) for g in (4, 8, 12, 16)} <= seen and {(kind, 7, s, g) for g in (4, 7)} <= seen
    assert all(r["propose_s"] > 0 and r["sample_block_s"] > 0 for r in rows)
    d = res["derived"]
    assert {s["tau"] for s in d["speedup"] if s["gamma"] == 16} == {4.0}
    one = next(s for s in d["speedup"] if s["gamma"] == 4 and s["drafter"] == "dflash")
    draft4 = next(r["propose_s"] for r in rows if (r["drafter"], r["block"], r["sampling"], r["gamma"],
                                                   r["variant"]) == ("dflash", 16, "greedy", 4, "eager"))
    assert one["speedup"] == pytest.approx(2.5 * verify["1"] / (draft4 + verify["5"]))
    assert set(d["host_overhead"]) == {"dflash", "dspark", "dflash2"}
    assert "eager/greedy" in d["head_share"]
    assert d["dflash2_draft_ratio"]["greedy"] > 0 and set(d["selector_share"]) == {"greedy", "t1"}
    assert res["loss"]["torch_s"] > 0 and "fused_s" not in res["loss"]  # no fused kernels without CUDA


def test_readme_names_the_report_bench_writes(tmp_path):
    """benchmarks/README.md feeds --bench-json the file `pdraft bench recipes/quickstart.yaml` writes (its default
    folder, OUTPUT_DIR/bench, and the report's own file name)."""
    import re

    from pdraft.bench.report import write_report
    from pdraft.recipe import load_recipe

    quickstart = load_recipe(ROOT / "recipes" / "quickstart.yaml")
    written = Path(quickstart.output_dir) / "bench" / write_report({}, tmp_path).name
    named = re.findall(r"--bench-json (\S+)", (ROOT / "benchmarks" / "README.md").read_text())
    assert named and all(Path(p) == written for p in named), (named, written)
