"""The comparison rule of the vLLM engine check (tests/engines/vllm_dflash_check.py `compare`), on hand-made
records: which rounds it compares (pdraft's round 0 never; the final round only when the request stopped on
eos) and that every kind of disagreement fails it. The check itself runs vLLM in .ci/run."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_check():
    spec = importlib.util.spec_from_file_location("vllm_dflash_check", ROOT / "tests/engines/vllm_dflash_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write(work: Path, pdraft_rows, vllm_steps, vllm_outputs=None, target_outputs=None):
    """One pdraft row per request: (output_ids, finish_reason, accepted per drafting round)."""
    plan = {"prompt_ids": [[1, 2]] * len(pdraft_rows), "max_new_tokens": 8, "layer_ids": [0, 1, 2],
            "speculative_config": {"method": "dflash", "num_speculative_tokens": 15}}
    (work / "plan.json").write_text(json.dumps(plan))
    lines = []
    for out, reason, acc in pdraft_rows:
        rounds = [{"drafted": 0, "verified": 0, "accepted": 0}] + [{"drafted": 15, "verified": 15, "accepted": a}
                                                                     for a in acc]
        lines.append(json.dumps({"output_ids": out, "finish_reason": reason, "rounds": rounds}))
    (work / "pdraft.jsonl").write_text("\n".join(lines) + "\n")
    outs = vllm_outputs or [r[0] for r in pdraft_rows]
    spec = [{"output_ids": o, "per_step_accepted": s, "per_step_drafted": [15] * len(s)}
            for o, s in zip(outs, vllm_steps)]
    base = [{"output_ids": o} for o in (target_outputs or outs)]
    (work / "vllm-spec.json").write_text(json.dumps({"rows": spec}))
    (work / "vllm-target.json").write_text(json.dumps({"rows": base}))


def run(tmp_path, capsys):
    rc = load_check().compare(type("A", (), {"work": str(tmp_path)})())
    return rc, capsys.readouterr().out


OUT = list(range(10, 18))


def test_agreement_passes_and_the_capped_final_round_is_not_compared(tmp_path, capsys):
    # request 0 stopped on max tokens: pdraft's capped last round accepted 1, vLLM (full draft) 6
    write(tmp_path, [(OUT, "length", [3, 2, 1]), (OUT[:5], "eos", [2, 1])], [[3, 2, 6], [2, 1]])
    rc, out = run(tmp_path, capsys)
    assert rc == 0, out
    assert "rounds compared: 4 (4 equal)" in out
    assert "engine-check: 2 passed, 0 failed" in out


@pytest.mark.parametrize("case, rows, steps, outs, target, needle", [
    ("a round differs", [(OUT, "length", [3, 2, 1])], [[3, 1, 1]], None, None, "first at drafting round 2"),
    ("eos final round differs", [(OUT[:5], "eos", [2, 1])], [[2, 2]], None, None, "first at drafting round 2"),
    ("an extra vLLM step", [(OUT, "length", [3, 2, 1])], [[3, 2, 1, 0]], None, None, "pdraft drafted 3 rounds"),
    ("output differs from pdraft", [(OUT, "length", [3])], [[3]], [OUT[:-1] + [0]], None, "differs from pdraft"),
    ("speculative differs from target", [(OUT, "length", [3])], [[3]], None, [OUT[:-1] + [0]], "target-only"),
])
def test_every_disagreement_fails(tmp_path, capsys, case, rows, steps, outs, target, needle):
    write(tmp_path, rows, steps, outs, target)
    rc, out = run(tmp_path, capsys)
    assert rc == 1, case
    assert needle in out, out
    assert "engine-check: 0 passed, 1 failed" in out
