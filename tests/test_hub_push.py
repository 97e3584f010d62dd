"""push with the Hub replaced at the HTTP boundary only (FakeHub behind huggingface_hub.set_client_factory): the
single commit holds exactly the expected files with the folder's bytes and the generated card; the token is
sent to the Hub and appears nowhere else; a failing commit raises one line and commits nothing; offline push
sends no request; the model card carries the recipe, bench and calibration figures and the serve commands."""

import json
import logging

import pytest
import torch

from pdraft.errors import PdraftError
from pdraft.hub import push
from pdraft.hub.card import bench_rows, build_card
from test_hub_support import fake_hub, write_family  # noqa: F401
import test_models_support

target = test_models_support.target  # tiny_target(), a module fixture

torch.set_num_threads(1)
TOKEN = "hf_pdraftTestSecret0123456789abcdef"
REPO = "someone/tiny-dspark"

CALIBRATION = {"temperatures": [1.3, 1.1, 0.9, 1.0], "dataset": "builtin:code+prose", "num_samples": 512,
               "ece_before": [0.081, 0.064, 0.052, 0.049], "ece_after": [0.012, 0.011, 0.009, 0.010],
               "ece_cumulative_before": 0.071, "ece_cumulative_after": 0.013}
SPS = {"sample_batch_tokens": [1, 8, 64], "sample_steps_per_sec": [50.0, 48.0, 20.0], "max_batch_tokens": 64}
BENCH = {"schema": "pdraft.bench/1", "machine": {"cpu": "test-cpu", "torch": "2.13.0"}, "runs": [
    {"domain": "code", "drafter": "target", "kind": "target", "gamma": 0, "summary": {"tau": 1.0}, "speedup": 1.0},
    {"domain": "code", "drafter": "dspark", "kind": "dspark", "gamma": 4,
     "summary": {"tau": 2.75, "token_acceptance": 0.61}, "speedup": 1.42},
    {"domain": "prose", "drafter": "dspark", "kind": "dspark", "gamma": 4,
     "summary": {"tau": 2.10, "token_acceptance": 0.45}, "speedup": 1.12}]}


@pytest.fixture
def drafter_dir(tmp_path, target):
    """A drafter folder with the sidecars pdraft writes beside it (through its own writers, so they are listed
    in the folder's ledger) and files it did not write, which push leaves out; the bench report lies in its own
    folder, where `pdraft bench` writes it (tmp_path/bench/bench.json)."""
    from pdraft.bench.report import write_report
    from pdraft.calibrate.sps import save_sps_table
    from pdraft.calibrate.sts import save_calibration

    folder = tmp_path / "drafter"
    write_family(folder, "pdraft-dspark", target)
    save_calibration(CALIBRATION, folder / "calibration.json")
    save_sps_table(SPS, folder / "sps_table.json")
    write_report(BENCH, tmp_path / "bench")
    (folder / "notes.txt").write_text("not uploaded")
    (folder / "optimizer.pt").write_bytes(b"\x80\x04not uploaded")
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "step_10.safetensors").write_bytes(b"not uploaded")
    return folder


EXPECTED = {"config.json", "model.safetensors", "recipe.resolved.yaml", "calibration.json", "sps_table.json",
            "bench.json", "README.md"}


def bench_of(drafter_dir):
    return drafter_dir.parent / "bench" / "bench.json"


def test_push_single_commit_payload(drafter_dir, fake_hub, monkeypatch, capsys, caplog):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub = fake_hub()
    caplog.set_level(logging.DEBUG)
    got = push(drafter_dir, REPO, bench_report=bench_of(drafter_dir))
    assert got.commit == "a" * 40 and set(got.files) == EXPECTED
    routes = [(m, p) for m, p, _, _ in hub.requests]
    assert routes == [("POST", "/api/repos/create"), ("POST", "/api/validate-yaml"),
                      ("POST", f"/api/models/{REPO}/preupload/main"), ("POST", f"/api/models/{REPO}/commit/main")]
    assert len(hub.commits) == 1 and hub.commits[0]["other"] == []
    files = hub.commits[0]["files"]
    assert set(files) == EXPECTED
    for name in EXPECTED - {"README.md", "bench.json"}:
        assert files[name] == (drafter_dir / name).read_bytes(), name
    bench = bench_of(drafter_dir).read_bytes()
    assert files["bench.json"] == bench
    assert files["README.md"].decode() == build_card(drafter_dir, REPO, bench=(bench_of(drafter_dir), bench))
    # the token went to the Hub, in the Authorization header, and nowhere else
    assert all(h.get("authorization") == f"Bearer {TOKEN}" for _, _, h, _ in hub.requests)
    assert all(TOKEN.encode() not in body for _, _, _, body in hub.requests)
    out = capsys.readouterr()
    assert TOKEN not in out.out + out.err + caplog.text + json.dumps(got.to_dict())


def test_failed_commit_leaves_nothing_and_hides_token(drafter_dir, fake_hub, monkeypatch, capsys, caplog):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub = fake_hub(fail_commit=True)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(PdraftError) as info:
        push(drafter_dir, REPO, bench_report=bench_of(drafter_dir))
    msg = info.value.one_line()
    assert "\n" not in msg and "committing" in msg and "no file was committed" in msg and "500" in msg
    # One commit holding every file was attempted and refused: no retry, no second write, no partial upload, so
    # the remote files are as they were.
    assert [(c["status"], set(c["files"])) for c in hub.attempts] == [(500, EXPECTED)]
    out = capsys.readouterr()
    assert TOKEN not in msg + out.out + out.err + caplog.text


def test_offline_push_fails_before_any_request(drafter_dir, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub = fake_hub()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PdraftError, match="offline mode is on .*nothing was sent"):
        push(drafter_dir, REPO)
    assert hub.requests == []
    assert (drafter_dir / "model.safetensors").is_file()


def test_push_to_branch_and_private(drafter_dir, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub = fake_hub()
    push(drafter_dir, REPO, private=True, revision="v1")
    create = json.loads(hub.requests[0][3])
    assert create["visibility"] == "private" and create["name"] == "tiny-dspark"
    assert ("POST", f"/api/models/{REPO}/branch/v1") in [(m, p) for m, p, _, _ in hub.requests]
    assert hub.commits[0]["path"] == f"/api/models/{REPO}/commit/v1"


def test_no_token_and_bad_arguments(drafter_dir, fake_hub, monkeypatch, tmp_path):
    hub = fake_hub()
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with pytest.raises(PdraftError, match="no Hugging Face token"):
        push(drafter_dir, REPO)
    with pytest.raises(PdraftError, match="Hub repository id"):
        push(drafter_dir, "../etc", token=TOKEN)
    with pytest.raises(PdraftError, match="does not exist"):
        push(tmp_path / "nope", REPO, token=TOKEN)
    assert hub.requests == []


def test_model_card_figures(drafter_dir):
    card = build_card(drafter_dir, REPO, bench=(bench_of(drafter_dir), bench_of(drafter_dir).read_bytes()))
    assert card.startswith("---\nlibrary_name: pdraft\n") and "base_model: Qwen/Qwen3-4B" in card
    assert "Target model: `Qwen/Qwen3-4B`, revision: `main`" in card
    from pdraft.models import load_drafter
    params = sum(t.numel() for t in load_drafter(drafter_dir).state_dict().values())
    assert f"{params:,} parameters" in card and "Block size: 4" in card and "DeepSpec" in card
    assert "Steps: 40, batch size 4" in card and "`builtin:code+prose` (at most 64 samples)" in card
    assert "| dspark | code | 4 | 2.75 | 0.61 | 1.42 |" in card
    assert "| dspark | prose | 4 | 2.10 | 0.45 | 1.12 |" in card
    assert "cpu: test-cpu" in card
    assert "ece_cumulative_after: 0.0130" in card and "| 1 | 0.0810 | 0.0120 | 1.300 |" in card
    assert "vllm serve Qwen/Qwen3-4B --speculative-config" in card and '"num_speculative_tokens": 4' in card
    assert ("--speculative-algorithm DSPARK --speculative-draft-model-path drafter-sglang "
            "--speculative-dspark-block-size 4 --speculative-dspark-confidence-sts-path drafter-sglang/sglang_sts.json "
            "--speculative-dspark-sps-table-path drafter-sglang/sglang_sps_table.json") in card
    assert f"pdraft pull {REPO} --out drafter" in card


def test_card_without_reports_says_so(tmp_path, target):
    write_family(tmp_path / "d", "zlab-dflash", target)
    card = build_card(tmp_path / "d", REPO)
    assert "No bench report" in card and "No calibration file" in card and "training settings are not recorded" in card
    assert '"method": "dflash"' in card and '"num_speculative_tokens": 3' in card and "<TARGET_MODEL>" in card
    assert "base_model" not in card


def test_bench_rows_are_the_drafters_runs():
    """The card's rows are the report's measured drafter runs (the target alone is the baseline), read by the
    bench report's schema; a figure out of range is refused, not printed."""
    from pdraft.bench.report import BENCH_REPORT
    from pdraft.readback import check

    rows = bench_rows(check(BENCH_REPORT, BENCH, "bench.json"))
    assert [(r["drafter"], r["domain"], r["gamma"], r["tau"]) for r in rows] == [("dspark", "code", 4, 2.75),
                                                                                ("dspark", "prose", 4, 2.10)]
    bad = {**BENCH, "runs": [{**BENCH["runs"][1], "speedup": float("nan")}]}
    with pytest.raises(PdraftError, match=r"bench\.json: runs\.0\.speedup: expected a finite number"):
        check(BENCH_REPORT, bad, "bench.json")