"""pull from a local folder and from huggingface_hub's own cache layout (offline) for every family; the atomic
install; refusal of pickle-only repositories, unsafe file names (in the listing and in a weight index) and
uncached ids when offline; no repository code is ever fetched."""

import json
import time

import pytest
import torch

from pdraft.errors import PdraftError
from pdraft.hub import pull
from pdraft.hub.files import check_name, classify
from pdraft.models.dflash.config import DFlashConfig
from pdraft.models.dspark.config import DSparkConfig
from test_hub_support import FAMILIES, fake_hub, folder_files, put_in_cache, write_family  # noqa: F401
import test_models_support
from test_models_support import tiny_target_config

target = test_models_support.target  # tiny_target(), a module fixture

torch.set_num_threads(1)


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("family", FAMILIES)
def test_pull_local_folder(tmp_path, target, family):
    d = write_family(tmp_path / "src", family, target)
    got = pull(str(tmp_path / "src"), out=tmp_path / "out", target_config=tiny_target_config())
    assert got.family == family and got.path == (tmp_path / "out").absolute()
    assert type(got.config) is (DSparkConfig if family.endswith("dspark") else DFlashConfig)
    assert got.config.block_convention == ("zlab" if family.startswith("zlab") else "deepspec")
    from pdraft.models import load_drafter
    assert same_weights(load_drafter(got.path), d)
    assert "dflash.py" not in {p.name for p in got.path.iterdir()}  # code is never copied
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize("family", FAMILIES)
def test_pull_from_hub_cache_offline(tmp_path, target, monkeypatch, family):
    write_family(tmp_path / "src", family, target)
    snap = put_in_cache(tmp_path / "cache", "someone/tiny-drafter", folder_files(tmp_path / "src"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    got = pull("someone/tiny-drafter")  # no out: the snapshot is used in place
    assert got.family == family and got.path == snap and got.revision == snap.name
    got2 = pull("someone/tiny-drafter", out=tmp_path / "copy")
    assert folder_files(got2.path) == {n: b for n, b in folder_files(tmp_path / "src").items() if n != "dflash.py"}
    if family.startswith("zlab"):
        assert "dflash.py" in got.ignored


def test_offline_uncached_id_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(PdraftError) as info:
        pull("deepseek-ai/dspark_qwen3_4b_block7")
    assert time.monotonic() - start < 5
    msg = info.value.one_line()
    assert "deepseek-ai/dspark_qwen3_4b_block7" in msg and "not in the Hugging Face cache" in msg and "\n" not in msg


def test_pickle_only_is_refused(tmp_path, target, monkeypatch):
    src = tmp_path / "src"
    write_family(src, "deepspec-dspark", target)
    (src / "model.safetensors").rename(src / "pytorch_model.bin")  # the bytes do not matter: never opened
    with pytest.raises(PdraftError, match="only pickle weights .*pytorch_model.bin.*arbitrary code"):
        pull(str(src))
    put_in_cache(tmp_path / "cache", "o/pickled", folder_files(src))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PdraftError, match="only pickle weights"):
        pull("o/pickled", out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["../evil.json", "/etc/passwd.json", "a/../../b.safetensors", "x\\..\\y.json",
                                  "bad\x1b[2Jname.json", "C:/win.json", "", "./config.json", "a//b.json"])
def test_unsafe_names_are_refused(name):
    with pytest.raises(PdraftError, match="unsafe"):
        check_name(name)
    with pytest.raises(PdraftError, match="unsafe"):
        classify(["config.json", "model.safetensors", name])


def test_safe_names_sorted():
    got = classify(["config.json", "model.safetensors", "dflash.py", "pytorch_model.bin", "figs/a.png", "README.md"])
    assert got.fetch == ["README.md", "config.json", "model.safetensors"]
    assert got.pickles == ["pytorch_model.bin"] and got.ignored == ["dflash.py", "figs/a.png"]


def test_online_listing_with_traversal_is_refused_before_download(tmp_path, fake_hub):
    hub = fake_hub(siblings=["config.json", "model.safetensors", "../../.bashrc.json"])
    with pytest.raises(PdraftError, match="unsafe"):
        pull("owner/hostile", out=tmp_path / "out")
    assert [(m, p) for m, p, _, _ in hub.requests] == [("GET", "/api/models/owner/hostile")]
    assert not (tmp_path / "out").exists() and not (tmp_path / "hf-cache").exists()


def test_online_pickle_only_is_refused_before_download(tmp_path, fake_hub):
    hub = fake_hub(siblings=["config.json", "pytorch_model.bin", "modeling.py"])
    with pytest.raises(PdraftError, match="only pickle weights"):
        pull("owner/pickled")
    assert len(hub.requests) == 1


def test_index_shard_names_are_checked(tmp_path, target):
    src = tmp_path / "src"
    write_family(src, "pdraft-dspark", target)
    (src / "model.safetensors").rename(src / "model-00001-of-00001.safetensors")
    index = {"weight_map": {"fc.weight": "../outside.safetensors"}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PdraftError, match="unsafe"):
        pull(str(src))


def test_sharded_checkpoint_pulls(tmp_path, target):
    src = tmp_path / "src"
    d = write_family(src, "pdraft-dspark", target)
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    save_file({k: tensors[k] for k in names[:half]}, str(src / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in names[half:]}, str(src / "model-00002-of-00002.safetensors"))
    (src / "model.safetensors").unlink()
    wm = {k: f"model-0000{1 if i < half else 2}-of-00002.safetensors" for i, k in enumerate(names)}
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    got = pull(str(src), out=tmp_path / "out")
    from pdraft.models import load_drafter
    assert same_weights(load_drafter(got.path), d)


def test_wrong_target_and_damaged_weights(tmp_path, target):
    src = tmp_path / "src"
    write_family(src, "pdraft-dspark", target)
    with pytest.raises(PdraftError, match="does not fit the target"):
        pull(str(src), out=tmp_path / "o1", target_config=tiny_target_config(hidden_size=48, head_dim=12))
    blob = bytearray((src / "model.safetensors").read_bytes())
    blob[-3] ^= 0xFF
    (src / "model.safetensors").write_bytes(bytes(blob))
    with pytest.raises(PdraftError, match="corrupted"):
        pull(str(src), out=tmp_path / "o2")
    # a failed validation leaves neither the target folder nor a temporary one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_out_must_be_new_or_empty(tmp_path, target):
    write_family(tmp_path / "src", "pdraft-dflash", target)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(PdraftError, match="not empty"):
        pull(str(tmp_path / "src"), out=tmp_path / "out")
    (tmp_path / "empty").mkdir()
    assert pull(str(tmp_path / "src"), out=tmp_path / "empty").path.is_dir()


def test_not_a_repo_id(tmp_path):
    with pytest.raises(PdraftError, match="neither an existing folder nor a Hub repository id"):
        pull(str(tmp_path / "missing"))


def test_loader_refuses_index_pointing_outside(tmp_path, target):
    src = tmp_path / "src"
    write_family(src, "pdraft-dspark", target)
    (src / "model.safetensors").rename(tmp_path / "outside.safetensors")
    index = {"weight_map": {"fc.weight": "../outside.safetensors"}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    from pdraft.models import load_drafter
    with pytest.raises(PdraftError, match="unsafe shard"):
        load_drafter(src)


def test_no_network_falls_back_to_cache(tmp_path, target, fake_hub, monkeypatch):
    import httpx2
    hub = fake_hub()

    def down(request):
        hub.requests.append((request.method, request.url.path, {}, b""))
        raise httpx2.ConnectError("network is unreachable")

    hub.handler = down
    with pytest.raises(PdraftError, match="cannot reach the Hub for owner/absent .*not in the Hugging Face cache"):
        pull("owner/absent")
    write_family(tmp_path / "src", "deepspec-dspark", target)
    snap = put_in_cache(tmp_path / "hf-cache", "owner/cached", folder_files(tmp_path / "src"))
    got = pull("owner/cached")
    assert got.path == snap and got.family == "deepspec-dspark" and len(hub.requests) == 2
