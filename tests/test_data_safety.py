"""No data loss, no token upload, one writer per folder (issue 20, items 1, 2 and 5). `train --fresh` deletes
only the checkpoints pdraft wrote (by name and ownership marker), refuses a run folder holding anything else
and the working folder, and never touches a hidden-state cache sharing the folder; push refuses a drafter
folder whose files are links (to a fake token file here) and files of the wrong shape, sending nothing; pull
--out never copies a link's target from outside the source folder; calibration files picked up from a drafter
folder must not be links; a second writer into a locked run folder or cache (held by a real second process)
stops with one line naming that process, and a lock left by a dead process is taken over."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import reliability_support
from pdraft.errors import PdraftError
from pdraft.hub import pull, push
from pdraft import ledger
from pdraft.ledger import LEDGER_NAME
from pdraft.locks import LOCK_NAME, folder_lock
from pdraft.paths import OWNED_MARKER, mark_owned
from pdraft import run_folder as ck
from pdraft.train.fresh import clear_run
from reliability_support import copy_tree, diff, run_cli, snapshot, write
from test_hub_support import fake_hub, write_family  # noqa: F401
import test_models_support

w = reliability_support.w  # the shared world (tiny target, cache, a short training run), a module fixture
target = test_models_support.target

torch.set_num_threads(1)
TOKEN = "hf_dataSafetyFakeToken0123456789abcdef"  # a fake credential: it must never reach the Hub


def train_argv(w, run, *extra):
    return ["train", str(w.recipe), "--set", f"train.output_dir={run}", *extra]


# ---- train --fresh -----------------------------------------------------------------------------------------
def test_fresh_refuses_a_run_folder_holding_user_files(w, tmp_path):
    run = copy_tree(w.run_dir, tmp_path / "run")
    write(run / "notes.txt", "my notes")
    copy_tree(run / "final", run / "best")  # a copied drafter: it carries the marker, not a pdraft name
    before = snapshot(run)
    res = run_cli(train_argv(w, run, "--fresh"))
    assert res.code == 2 and len(res.error_lines) == 1, res.err[-2000:]
    assert "notes.txt" in res.error_lines[0] and "best" in res.error_lines[0] and "Traceback" not in res.err
    assert diff(before, snapshot(run)) == []  # nothing deleted, nothing changed


def test_fresh_clears_its_run_and_keeps_a_cache_in_the_same_folder(w, tmp_path):
    shared = copy_tree(w.cache, tmp_path / "shared")
    for entry in w.run_dir.iterdir():  # the run's checkpoints beside the cache's shards and manifest
        if entry.is_dir():
            copy_tree(entry, shared / entry.name)
        else:
            write(shared / entry.name, entry.read_bytes())
    cache_before = snapshot(w.cache)
    old_final = (shared / "final" / "model.safetensors").read_bytes()
    res = run_cli(["train", str(w.recipe), "--set", f"data.cache_dir={shared}", "--set", f"train.output_dir={shared}",
                   "--set", "runtime.seed=7", "--fresh", "--json"])
    assert res.code == 0, res.err[-2000:]
    assert json.loads(res.out)["resumed_from"] is None  # started over
    after = snapshot(shared)
    for key, digest in cache_before.items():  # every shard, the manifest and its recipe, byte for byte
        if Path(key).name != LEDGER_NAME:  # the folder's list of what pdraft wrote gains the run's files
            assert after.get(key.replace(str(w.cache), str(shared))) == digest, key
    assert (shared / "final" / OWNED_MARKER).is_file()
    assert (shared / "final" / "model.safetensors").read_bytes() != old_final  # the new seed's drafter
    assert not (shared / LOCK_NAME).exists()  # the lock goes with the run


def test_fresh_refuses_the_working_folder(w, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    res = run_cli(train_argv(w, ".", "--fresh"))
    assert res.code == 2 and len(res.error_lines) == 1 and "working folder" in res.error_lines[0], res.err[-2000:]
    with pytest.raises(PdraftError, match="working folder"):
        clear_run(tmp_path)  # a folder above the working folder is refused too


def test_clear_run_removes_only_named_and_marked_entries(tmp_path):
    run = tmp_path / "run"
    for name in ("step_2", "step_4", "final", ".tmp_step_6"):
        (run / name).mkdir(parents=True)
        write(run / name / "model.safetensors", b"w")
        if not name.startswith("."):
            mark_owned(run / name)
    write(run / "latest", "step_4\n")
    write(run / "metrics.jsonl", "{}\n")
    write(run / "manifest.json", json.dumps({"format": "pdraft-hidden-cache"}))  # a cache sharing the folder
    write(run / "shard-00000.safetensors", b"shard")
    write(run / "hidden" / "manifest.json", json.dumps({"format": "pdraft-hidden-cache"}))  # output_dir/hidden
    removed = clear_run(run)
    assert sorted(removed) == [".tmp_step_6", "final", "latest", "metrics.jsonl", "step_2", "step_4"]
    assert sorted(p.name for p in run.iterdir()) == ["hidden", "manifest.json", "shard-00000.safetensors"]


def test_clear_run_and_install_refuse_an_unmarked_checkpoint_name(tmp_path):
    run = tmp_path / "run"
    write(run / "final" / "mine.txt", "a folder the user named final")
    write(run / "step_3" / "model.safetensors", "x")  # a checkpoint an older pdraft wrote (no ledger)
    mark_owned(run / "step_3")
    with pytest.raises(PdraftError, match=r"did not write there \(final\)"):
        clear_run(run)
    assert (run / "step_3" / "model.safetensors").exists() and (run / "final" / "mine.txt").exists()
    (tmp_path / "tmp").mkdir()
    with pytest.raises(PdraftError, match="not written by pdraft"):
        ck.install_dir(tmp_path / "tmp", run / "final")
    assert (run / "final" / "mine.txt").exists()


def test_cache_fresh_refuses_a_foreign_manifest(tmp_path):
    from pdraft.cache.writer import remove_cache

    write(tmp_path / "manifest.json", '{"my": "project"}')
    write(tmp_path / "shard-00000.safetensors", b"not ours")
    with pytest.raises(PdraftError, match="not a pdraft hidden-state cache manifest"):
        remove_cache(tmp_path)
    (tmp_path / "manifest.json").unlink()
    remove_cache(tmp_path)  # no manifest: a shard-named file whose header is not pdraft's stays
    assert (tmp_path / "shard-00000.safetensors").read_bytes() == b"not ours"


# ---- one writer per folder ---------------------------------------------------------------------------------
HOLDER = ("import sys, time; from pdraft.locks import folder_lock\n"
          "with folder_lock(sys.argv[1], 'run folder'):\n    print('locked', flush=True); time.sleep(120)\n")


@pytest.fixture
def held(tmp_path):
    """A real second process holding the lock of a folder until the test ends; yields (folder, its pid)."""
    procs = []

    def hold(folder):
        p = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(reliability_support.ROOT)})
        procs.append(p)
        assert p.stdout.readline().strip() == "locked"
        return p.pid

    yield hold
    for p in procs:
        p.kill()
        p.wait()


def test_second_train_into_one_folder_stops_with_one_line(w, tmp_path, held):
    run = copy_tree(w.run_dir, tmp_path / "run")
    pid = held(run)
    before = snapshot(run)
    res = run_cli(train_argv(w, run))
    assert res.code == 2 and len(res.error_lines) == 1, res.err[-2000:]
    assert f"in use by pid {pid}" in res.error_lines[0] and "Traceback" not in res.err
    assert diff(before, snapshot(run)) == []


def test_second_export_into_one_cache_stops_with_one_line(w, tmp_path, held):
    cache = copy_tree(w.cache, tmp_path / "cache")
    pid = held(cache)
    res = run_cli(["export-hidden", str(w.recipe), "--set", f"data.cache_dir={cache}", "--fresh"])
    assert res.code == 2 and len(res.error_lines) == 1 and f"pid {pid}" in res.error_lines[0], res.err[-2000:]
    assert {p.name for p in cache.iterdir()} == {p.name for p in w.cache.iterdir()} | {LOCK_NAME}  # untouched


def test_lock_of_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write(tmp_path / LOCK_NAME, json.dumps({"pid": dead.pid, "host": "h", "since": "t", "command": "pdraft train"}))
    with folder_lock(tmp_path, "run folder"):
        with folder_lock(tmp_path, "run folder"):  # re-entrant within one process
            holder = json.loads((tmp_path / LOCK_NAME).read_text())
    assert holder["pid"] == os.getpid()
    assert not (tmp_path / LOCK_NAME).exists()


def test_lock_held_in_this_process_refuses_another_process(tmp_path):
    with folder_lock(tmp_path, "hidden-state cache folder"):
        code = ("import sys; from pdraft.locks import folder_lock\nfrom pdraft.errors import PdraftError\n"
                "try:\n    folder_lock(sys.argv[1]).__enter__()\nexcept PdraftError as e:\n    print(e.one_line())\n")
        res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(reliability_support.ROOT)}, timeout=60)
    assert f"in use by pid {os.getpid()}" in res.stdout, res.stdout + res.stderr


# ---- nothing outside a folder is read as part of it --------------------------------------------------------
@pytest.fixture
def token_file(tmp_path):
    return write(tmp_path / "hf-home" / "token", TOKEN)


@pytest.mark.parametrize("name", ["recipe.resolved.yaml", "sps_table.json", "calibration.json", "config.json"])
def test_push_never_uploads_a_link_to_the_token(tmp_path, target, fake_hub, monkeypatch, token_file, name):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub = fake_hub()
    folder = tmp_path / "drafter"
    write_family(folder, "pdraft-dspark", target)
    (folder / name).unlink(missing_ok=True)
    os.symlink(token_file, folder / name)
    with pytest.raises(PdraftError, match="symbolic link") as err:
        push(folder, "someone/tiny-dspark")
    assert TOKEN not in err.value.one_line()
    assert hub.requests == [] and hub.commits == []  # nothing was sent at all


@pytest.mark.parametrize("name, text, what", [
    ("recipe.resolved.yaml", "- a list\n- not a recipe\n", "valid resolved recipe .*expected a mapping of sections"),
    ("recipe.resolved.yaml", "key: [unclosed\n", "valid resolved recipe .*malformed YAML"),
    ("sps_table.json", '{"sample_batch_tokens": ["a"], "sample_steps_per_sec": [1.0]}', "valid SPS table"),
    ("calibration.json", '{"temperatures": "hot"}', "valid calibration"),
    ("bench.json", '"just a string"', "valid bench report"),
])
def test_push_checks_the_shape_of_what_it_uploads(tmp_path, target, fake_hub, monkeypatch, name, text, what):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub = fake_hub()
    folder = tmp_path / "drafter"
    write_family(folder, "pdraft-dspark", target)
    write(folder / name, text)
    ledger.record(folder / name)  # listed as pdraft's: the shape check is the second line of defence
    with pytest.raises(PdraftError, match=what):
        push(folder, "someone/tiny-dspark")
    assert hub.commits == []


def test_push_uploads_only_files_pdraft_wrote_there(tmp_path, target, fake_hub, monkeypatch, token_file):
    """By content: a hard link to the token file, a file copied in by hand and a file edited after pdraft wrote
    it are each refused before any request, and a folder without pdraft's ledger is refused with the way out;
    a validated copy made by `pull --out` then pushes."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub = fake_hub()
    folder = tmp_path / "drafter"
    write_family(folder, "pdraft-dspark", target)
    os.link(token_file, folder / "sps_table.json")  # a hard link: a regular file, one of two names
    with pytest.raises(PdraftError, match=r"sps_table\.json was not written there by pdraft") as err:
        push(folder, "someone/tiny-dspark")
    assert TOKEN not in err.value.one_line()
    (folder / "sps_table.json").unlink()
    write(folder / "calibration.json", '{"temperatures": [1.0, 1.0, 1.0, 1.0]}')  # copied in by hand
    with pytest.raises(PdraftError, match=r"calibration\.json was not written there by pdraft"):
        push(folder, "someone/tiny-dspark")
    (folder / "calibration.json").unlink()
    write(folder / "recipe.resolved.yaml", (folder / "recipe.resolved.yaml").read_text() + "# edited\n")
    with pytest.raises(PdraftError, match=r"recipe\.resolved\.yaml is not the file pdraft wrote there"):
        push(folder, "someone/tiny-dspark")
    (folder / LEDGER_NAME).unlink()  # as an older pdraft left it
    with pytest.raises(PdraftError, match=r"no record of the files pdraft wrote there") as err:
        push(folder, "someone/tiny-dspark")
    assert f"pdraft pull {folder} --out" in err.value.one_line()
    assert hub.requests == []
    copy = pull(str(folder), out=tmp_path / "copy").path
    push(copy, "someone/tiny-dspark")
    assert set(hub.commits[0]["files"]) == {"config.json", "model.safetensors", "recipe.resolved.yaml", "README.md"}
    assert all(TOKEN.encode() not in body for _, _, _, body in hub.requests)


def test_pull_out_refuses_a_hard_link_in_a_local_folder(tmp_path, target, token_file):
    src = tmp_path / "src"
    write_family(src, "pdraft-dspark", target)
    os.link(token_file, src / "sps_table.json")
    with pytest.raises(PdraftError, match=r"sps_table\.json is a hard link \(2 names\)"):
        pull(str(src), out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_pull_out_never_copies_a_link_leaving_the_folder(tmp_path, target, token_file):
    src = tmp_path / "src"
    write_family(src, "pdraft-dspark", target)
    os.symlink(token_file, src / "calibration.json")
    with pytest.raises(PdraftError, match="outside"):
        pull(str(src), out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink() and p != token_file and TOKEN in p.read_text("latin-1")]


def test_pull_out_keeps_links_inside_the_folder(tmp_path, target):
    src = tmp_path / "src"
    write_family(src, "pdraft-dspark", target)
    write(src / "real" / "sps.json", '{"sample_batch_tokens": [1], "sample_steps_per_sec": [1.0]}')
    os.symlink(src / "real" / "sps.json", src / "sps_table.json")
    got = pull(str(src), out=tmp_path / "out")
    assert (got.path / "sps_table.json").is_file() and not (got.path / "sps_table.json").is_symlink()


def test_calibration_files_picked_up_from_a_drafter_folder_must_not_be_links(tmp_path, token_file):
    from pdraft.calibrate import find_calibration, find_sps_table

    folder = tmp_path / "drafter"
    folder.mkdir()
    assert find_sps_table(folder) is None
    os.symlink(token_file, folder / "sps_table.json")
    os.symlink(token_file, folder / "confidence_sts.json")
    with pytest.raises(PdraftError, match="symbolic link"):
        find_sps_table(folder)
    with pytest.raises(PdraftError, match="symbolic link"):
        find_calibration(folder)


# ---- file-system errors: one line at the CLI boundary ------------------------------------------------------
@pytest.mark.parametrize("argv, expect", [
    (lambda w, f: ["export-hidden", str(w.recipe), "--set", f"data.cache_dir={f / 'sub'}"], r"Not a directory: .*/f/sub"),
    (lambda w, f: ["train", str(w.recipe), "--set", f"train.output_dir={f / 'run'}"], r"Not a directory: .*/f/run"),
    (lambda w, f: ["bench", str(w.recipe), "--drafter", str(w.dspark), "--out", str(f / "b")], r"Not a directory"),
    (lambda w, f: ["decode", "--recipe", str(w.recipe), "--drafter", str(w.dspark), "--prompt", "def f",
                   "--metrics", "/dev/full"], r"metrics stream /dev/full is not a regular file"),  # never into a device
], ids=["export-hidden", "train", "bench", "decode-metrics-dev-full"])
def test_os_errors_are_one_line(w, tmp_path, argv, expect):
    import re

    if "/dev/full" in argv(w, tmp_path) and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    f = write(tmp_path / "f", "a file where a folder belongs")
    res = run_cli(argv(w, f))
    assert res.code == 2 and len(res.error_lines) == 1 and "Traceback" not in res.err, res.err[-2000:]
    assert re.search(expect, res.error_lines[0]), res.error_lines


def test_os_error_traceback_with_debug(w, tmp_path, monkeypatch):
    f = write(tmp_path / "f", "x")
    argv = ["train", str(w.recipe), "--set", f"train.output_dir={f / 'run'}"]
    res = run_cli(["--debug", *argv])
    assert res.code == 1 and "NotADirectoryError" in res.err and "Traceback" in res.err
    monkeypatch.setenv("PDRAFT_DEBUG", "1")
    res = run_cli(argv)
    assert res.code == 1 and "Traceback" in res.err



@pytest.mark.parametrize("name", ["recipe.resolved.yaml", "sps_table.json", "calibration.json"])
def test_export_never_reads_a_link_leaving_the_drafter_folder(tmp_path, target, token_file, name):
    """`pdraft export` copies the recipe and turns the calibration and cost table into engine files: a link in
    the drafter folder must be refused, never read into the export."""
    from pdraft.hub.export import export

    folder = tmp_path / "drafter"
    write_family(folder, "pdraft-dspark", target)
    (folder / name).unlink(missing_ok=True)
    os.symlink(token_file, folder / name)
    with pytest.raises(PdraftError, match="symbolic link") as err:
        export(folder, "sglang", tmp_path / "out")
    assert TOKEN not in err.value.one_line()
    assert not (tmp_path / "out").exists()
