"""Reliability, sharing: `pull` (bad ids and revisions, uncached ids offline, interrupted downloads in the
Hugging Face cache: a `.incomplete` blob, a missing blob, a truncated or bit-flipped blob; damaged local
folders; a non-empty or file --out), `push` (missing or damaged drafters, bad ids, no token, offline, a commit
the Hub refuses) and `export` (unknown format, refused conversion, damaged drafter, occupied --out). The Hub is
FakeHub at the HTTP boundary (tests/test_hub_support.py); a fake token is set in HF_TOKEN for every case and
must never be printed. Contract in reliability_support.check; besides, no case may reach the commit call, and no
request body may carry the token (the hard-link cases). A test below shows the same folders push once the hostile
file is gone, so the refusals are the hostile files', not a refusal of everything."""

import os

import pytest

import reliability_support
from reliability_support import FAKE_TOKEN, Case, bitflip, check, copy_tree, param, truncate, write
from test_hub_support import FakeHub

w = reliability_support.w  # the shared world, a module fixture

REPO = "someone/tiny-dspark"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """FakeHub behind huggingface_hub's client factory, the fake token, and no saved login."""
    import httpx2
    import huggingface_hub
    from huggingface_hub.utils._http import default_client_factory

    fake = FakeHub()
    huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(fake.handler)))
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # conftest's default; push cases need the (fake) Hub
    yield fake
    huggingface_hub.set_client_factory(default_client_factory)


def cache_copy(w, t, damage):
    """A copy of the world's Hugging Face cache with one damage applied to the snapshot of REPO."""
    if (t / "hf-cache").exists():  # env() is asked more than once per case
        return t / "hf-cache"
    cache = copy_tree(w.hf_cache, t / "hf-cache")
    repo = cache / "models--someone--tiny-dspark"
    snap = next((repo / "snapshots").iterdir())
    damage(repo, snap)
    return cache


def blob_of(snap, name):
    return (snap / name).resolve()


def incomplete(repo, snap):
    """An interrupted download as huggingface_hub leaves it: the weights blob still `<sha>.incomplete` and no link
    in the snapshot yet."""
    blob = blob_of(snap, "model.safetensors")
    (snap / "model.safetensors").unlink()
    data = blob.read_bytes()
    blob.unlink()
    (blob.parent / (blob.name + ".incomplete")).write_bytes(data[: len(data) // 3])


def missing_blob(repo, snap):
    blob_of(snap, "model.safetensors").unlink()  # the snapshot link now dangles


def offline_cache(damage):
    return lambda w, t: {"HF_HUB_CACHE": str(cache_copy(w, t, damage)), "HF_HUB_OFFLINE": "1"}


OFFLINE = lambda w, t: {"HF_HUB_CACHE": str(w.hf_cache), "HF_HUB_OFFLINE": "1"}  # noqa: E731

CASES = [
    Case("pull", "repo-id-traversal", "a repository id that climbs out (../etc)", lambda w, t: ["pull", "../etc/x"],
         r"Hub repository id", env=OFFLINE),
    Case("pull", "repo-id-malformed", "a malformed repository id (a/b/c/d)", lambda w, t: ["pull", "a/b/c/d"],
         r"Hub repository id", env=OFFLINE),
    Case("pull", "revision-traversal", "--revision ../../x", lambda w, t: ["pull", REPO, "--revision", "../../x"],
         r"revision", env=OFFLINE),
    Case("pull", "uncached-offline", "an id that is not in the cache, offline",
         lambda w, t: ["pull", "someone/other-drafter"], r"not in the Hugging Face cache", env=OFFLINE),
    Case("pull", "uncached-revision-offline", "a revision that is not in the cache, offline",
         lambda w, t: ["pull", REPO, "--revision", "v9"], r"@v9 is not in the Hugging Face cache", env=OFFLINE),
    Case("pull", "interrupted-download-incomplete-blob", "an interrupted download: weights blob left `.incomplete`",
         lambda w, t: ["pull", REPO, "--out", str(t / "out")], r"has no model\.safetensors|incomplete",
         env=offline_cache(incomplete)),
    Case("pull", "interrupted-download-missing-blob", "an interrupted download: snapshot link to a missing blob",
         lambda w, t: ["pull", REPO, "--out", str(t / "out")], r"model\.safetensors is missing from .*interrupted download",
         env=offline_cache(missing_blob)),
    Case("pull", "truncated-blob", "a truncated weights file in the cache",
         lambda w, t: ["pull", REPO, "--out", str(t / "out")], r"truncated or corrupted safetensors",
         env=offline_cache(lambda r, s: truncate(blob_of(s, "model.safetensors")))),
    Case("pull", "bit-flipped-blob", "a bit-flipped weights file in the cache (used in place)",
         lambda w, t: ["pull", REPO], r"is corrupted: its tensor bytes",
         env=offline_cache(lambda r, s: bitflip(blob_of(s, "model.safetensors")))),
    Case("pull", "config-malformed-blob", "a malformed config.json in the cache",
         lambda w, t: ["pull", REPO], r"config\.json is not valid JSON",
         env=offline_cache(lambda r, s: write(blob_of(s, "config.json"), "{oops"))),
    Case("pull", "out-not-empty", "--out naming a non-empty folder",
         lambda w, t: ["pull", REPO, "--out", str(write(t / "out" / "keep.txt", "mine").parent)],
         r"already exists and is not empty", env=OFFLINE),
    Case("pull", "out-is-a-file", "--out naming a file",
         lambda w, t: ["pull", REPO, "--out", str(write(t / "out", "mine"))], r"already exists", env=OFFLINE),
    Case("pull", "local-pickle-only", "a local folder with only pickle weights",
         lambda w, t: ["pull", str(_local(w, t, lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin")))],
         r"only pickle weights", env=OFFLINE),
    Case("pull", "local-truncated", "a local folder with truncated weights",
         lambda w, t: ["pull", str(_local(w, t, lambda f: truncate(f / "model.safetensors"))), "--out", str(t / "out")],
         r"truncated or corrupted safetensors", env=OFFLINE),
    Case("pull", "local-not-a-drafter", "a local folder holding a target model, not a drafter",
         lambda w, t: ["pull", str(w.target)], r"not a drafter of any family pdraft knows", env=OFFLINE),
    Case("pull", "local-unsafe-index", "a weight index naming a shard outside the folder",
         lambda w, t: ["pull", str(_local(w, t, _unsafe_index))], r"unsafe|\.\./", env=OFFLINE),
]


def _local(w, t, damage):
    return copy_tree(w.dspark, t / "local", damage)


def _unsafe_index(folder):
    (folder / "model.safetensors").rename(folder / "part.safetensors")
    write(folder / "model.safetensors.index.json", '{"weight_map": {"fc.weight": "../../etc/passwd"}}')


# push checks every byte against what pdraft wrote (issue 33) before loading anything: damage is refused as such
CHANGED = r"{}\.\w+ is not the file pdraft wrote there: its content changed since .*damaged, edited"


def push_args(drafter):
    return lambda w, t: ["push", str(drafter(w, t)), REPO]


CASES += [
    Case("push", "drafter-missing", "a drafter folder that does not exist", push_args(lambda w, t: t / "nope"),
         r"nope does not exist"),
    Case("push", "not-a-drafter", "a folder without model.safetensors",
         push_args(lambda w, t: write(t / "d" / "config.json", "{}").parent), r"has no model\.safetensors"),
    Case("push", "drafter-truncated", "truncated drafter weights",
         push_args(lambda w, t: _local(w, t, lambda f: truncate(f / "model.safetensors"))), CHANGED.format("model")),
    Case("push", "drafter-bit-flipped", "bit-flipped drafter weights",
         push_args(lambda w, t: _local(w, t, lambda f: bitflip(f / "model.safetensors"))), CHANGED.format("model")),
    Case("push", "repo-id-malformed", "a malformed repository id",
         lambda w, t: ["push", str(w.dspark), "../etc"], r"Hub repository id"),
    Case("push", "no-token", "no token anywhere (HF_TOKEN unset, no login)",
         lambda w, t: ["push", str(w.dspark), REPO], r"no Hugging Face token", env=lambda w, t: {"HF_TOKEN": None}),
    Case("push", "offline", "HF_HUB_OFFLINE=1", lambda w, t: ["push", str(w.dspark), REPO], r"offline mode is on",
         env=lambda w, t: {"HF_HUB_OFFLINE": "1"}),
    Case("push", "commit-refused", "the Hub answers the commit with HTTP 500",
         lambda w, t: ["push", str(w.dspark), REPO], r"no file was committed", env=lambda w, t: {"FAKEHUB_FAIL": "1"}),
]


def export_args(drafter, fmt="vllm", out=None):
    return lambda w, t: ["export", str(drafter(w, t)), "--format", fmt, "--out", str(out(w, t) if out else t / "out")]


CASES += [
    Case("export", "format-unknown", "--format tensorrt", export_args(lambda w, t: w.dspark, "tensorrt"), r"tensorrt"),
    Case("export", "dspark-to-zlab", "a DSpark drafter to the z-lab DFlash layout",
         export_args(lambda w, t: w.dspark, "zlab-dflash"), r"zlab|DFlash"),
    Case("export", "drafter-missing", "a drafter folder that does not exist", export_args(lambda w, t: t / "nope"),
         r"nope"),
    Case("export", "drafter-truncated", "truncated drafter weights",
         export_args(lambda w, t: _local(w, t, lambda f: truncate(f / "model.safetensors"))), r"truncated or corrupted"),
    Case("export", "drafter-bit-flipped", "bit-flipped drafter weights",
         export_args(lambda w, t: _local(w, t, lambda f: bitflip(f / "model.safetensors"))), r"corrupted"),
    Case("export", "out-not-empty", "--out naming a non-empty folder",
         export_args(lambda w, t: w.dspark, out=lambda w, t: write(t / "out" / "keep.txt", "mine").parent),
         r"not empty"),
]


# issue 20: hostile config.json fields and edited safetensors headers, refused before anything is allocated
from test_reliability_run import edit_config, edit_header, retype, sparse_pad, swap_offsets  # noqa: E402

CASES += [
    Case("pull", "local-block-size-string", "a local folder whose config.json block_size is a string",
         lambda w, t: ["pull", str(_local(w, t, edit_config(block_size="4")))], r"block_size is '4', expected a whole number",
         env=OFFLINE),
    Case("pull", "local-pdraft-string", "a local folder whose config.json pdraft object is a string",
         lambda w, t: ["pull", str(_local(w, t, edit_config(pdraft="x")))], r"pdraft is 'x', expected a JSON object", env=OFFLINE),
    Case("pull", "local-rank-string", "a local folder whose config.json markov_rank is a string",
         lambda w, t: ["pull", str(_local(w, t, edit_config(markov_rank="8")))], r"markov_rank is '8', expected a whole number",
         env=OFFLINE),
    Case("pull", "local-vocab-1e9", "a local folder whose config.json vocab_size is 10**9",
         lambda w, t: ["pull", str(_local(w, t, edit_config(vocab_size=10**9)))], r"vocab_size is 1000000000", env=OFFLINE),
    Case("pull", "local-offsets-swapped", "a local folder whose weights header has two offsets swapped",
         lambda w, t: ["pull", str(_local(w, t, edit_header(swap_offsets)))], r"its header .* does not match the checksum",
         env=OFFLINE),
    Case("export", "offsets-swapped", "two tensors' offsets swapped in the weights header",
         export_args(lambda w, t: _local(w, t, edit_header(swap_offsets))), r"its header .* does not match the checksum"),
    Case("export", "dtype-edited", "a tensor's dtype edited in the weights header",
         export_args(lambda w, t: _local(w, t, edit_header(retype))), r"its header .* does not match the checksum"),
    Case("export", "config-experts-million", "config.json pdraft.num_experts 1000000",
         export_args(lambda w, t: _local(w, t, edit_config(pdraft__num_experts=10**6))), r"pdraft\.num_experts is 1000000"),
    Case("export", "weights-sparse", "weights padded to 256 MB with a sparse hole",
         export_args(lambda w, t: _local(w, t, lambda f: sparse_pad(f / "model.safetensors"))), r"the header describes"),
    Case("push", "offsets-swapped", "two tensors' offsets swapped in the weights header",
         push_args(lambda w, t: _local(w, t, edit_header(swap_offsets))), CHANGED.format("model")),
    Case("push", "dtype-edited", "a tensor's dtype edited in the weights header",
         push_args(lambda w, t: _local(w, t, edit_header(retype))), CHANGED.format("model")),
    Case("push", "config-block-size-string", "config.json block_size a string",
         push_args(lambda w, t: _local(w, t, edit_config(block_size="4"))), CHANGED.format("config")),
]


# issue 33: push uploads only files pdraft wrote, by content (the folder's ledger), so neither a symbolic nor a hard
# link to the token file travels; YAML pdraft did not just write is read within the recipe's limits.
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def token_file(t):
    return write(t / "secret" / "token", FAKE_TOKEN)


def _with_link(name, hard):
    def damage(folder):
        t = folder.parent
        (folder / name).unlink(missing_ok=True)
        (os.link if hard else os.symlink)(token_file(t), folder / name)
    return damage


def _recorded(name, text):
    """`name` written through pdraft's own ledger writer: content pdraft itself would have pushed."""
    from pdraft import ledger

    return lambda folder: ledger.write_text(folder / name, text)


def _link_over(path, t):
    path.unlink()
    os.link(token_file(t), path)
    return path


def _bench_elsewhere(w, t, text=None):
    """A bench report in its own folder: written by pdraft's report writer, or by hand when `text` is given."""
    if text is not None:
        return write(t / "bench" / "bench.json", text)
    from pdraft.bench.report import SCHEMA, write_report

    return write_report({"schema": SCHEMA, "runs": []}, t / "bench")  # what a bench report read back must hold


CASES += [
    Case("push", "hard-link-to-token", "sps_table.json a hard link to a file holding the Hub token",
         push_args(lambda w, t: _local(w, t, _with_link("sps_table.json", hard=True))),
         r"sps_table\.json was not written there by pdraft"),
    Case("push", "symlink-to-token", "confidence_sts.json a symbolic link to a file holding the Hub token",
         push_args(lambda w, t: _local(w, t, _with_link("confidence_sts.json", hard=False))),
         r"confidence_sts\.json is a symbolic link"),
    Case("push", "hard-link-over-config", "config.json replaced by a hard link to the token file",
         push_args(lambda w, t: _local(w, t, _with_link("config.json", hard=True))), CHANGED.format("config")),
    Case("push", "hard-link-as-recipe", "recipe.resolved.yaml a hard link to the token file",
         push_args(lambda w, t: _local(w, t, _with_link("recipe.resolved.yaml", hard=True))),
         r"recipe\.resolved\.yaml was not written there by pdraft"),
    Case("push", "hand-copied-calibration", "a calibration file copied into the folder by hand",
         push_args(lambda w, t: _local(w, t, lambda f: write(f / "confidence_sts.json", '{"temperatures": [1, 1, 1, 1]}'))),
         r"confidence_sts\.json was not written there by pdraft"),
    Case("push", "older-folder-no-ledger", "a drafter folder written by an older pdraft (no .pdraft-files)",
         push_args(lambda w, t: _local(w, t, lambda f: (f / ".pdraft-files").unlink())),
         r"has no record of the files pdraft wrote there .*pdraft pull .* --out NEW_FOLDER"),
    Case("push", "alias-bomb-by-hand", "a YAML alias bomb written into the folder as recipe.resolved.yaml",
         push_args(lambda w, t: _local(w, t, lambda f: write(f / "recipe.resolved.yaml", BOMB))),
         r"recipe\.resolved\.yaml was not written there by pdraft"),
    Case("push", "alias-bomb-listed", "a YAML alias bomb as recipe.resolved.yaml, listed as written by pdraft",
         push_args(lambda w, t: _local(w, t, _recorded("recipe.resolved.yaml", BOMB))),
         r"recipe\.resolved\.yaml: recipe refused: more than 100000 values once aliases are expanded"),
    Case("push", "bench-report-by-hand", "--bench-report naming a bench.json written by hand",
         lambda w, t: ["push", str(w.dspark), REPO, "--bench-report", str(_bench_elsewhere(w, t, '{"runs": []}'))],
         r"bench has no record of the files pdraft wrote there"),
    Case("push", "bench-report-edited", "--bench-report naming a bench.json edited after bench wrote it",
         lambda w, t: ["push", str(w.dspark), REPO, "--bench-report",
                       str(write(_bench_elsewhere(w, t), '{"runs": [], "edited": true}'))], CHANGED.format("bench")),
    Case("push", "bench-report-hard-link", "--bench-report naming a hard link to the token file, in bench's folder",
         lambda w, t: ["push", str(w.dspark), REPO, "--bench-report", str(_link_over(_bench_elsewhere(w, t), t))],
         CHANGED.format("bench")),
]


@param(CASES)
def test_case(case, w, tmp_path, monkeypatch, hub):
    refused = bool(case.env(w, tmp_path).get("FAKEHUB_FAIL"))
    hub.fail_commit = refused
    if case.env(w, tmp_path).get("HF_TOKEN", "") is None:
        monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    res = check(case, w, tmp_path, monkeypatch)
    assert hub.commits == []  # nothing reached the remote
    assert [c["status"] for c in hub.attempts] == ([500] if refused else [])  # and only the refused push tried
    assert FAKE_TOKEN not in res.out + res.err
    assert all(FAKE_TOKEN.encode() not in body for _, _, _, body in hub.requests)


def test_the_refused_folders_push_once_the_link_is_gone(w, tmp_path, monkeypatch, hub):
    """Negative proof for the hard-link case: the FakeHub records what a push uploads, and the same folder
    without the link pushes, its commit holding only pdraft's files and never the token."""
    monkeypatch.chdir(tmp_path)
    folder = _local(w, tmp_path, _with_link("sps_table.json", hard=True))
    res = reliability_support.run_cli(["push", str(folder), REPO])
    assert res.code == 2 and hub.commits == [] and all(FAKE_TOKEN.encode() not in b for *_, b in hub.requests)
    (folder / "sps_table.json").unlink()
    res = reliability_support.run_cli(["push", str(folder), REPO, "--bench-report", str(_bench_elsewhere(w, tmp_path))])
    assert res.code == 0, res.err[-2000:]
    files = hub.commits[0]["files"]
    assert set(files) == {"config.json", "model.safetensors", "bench.json", "README.md"}
    assert all(FAKE_TOKEN.encode() not in blob for blob in files.values())
    assert all(FAKE_TOKEN.encode() not in body for *_, body in hub.requests)
