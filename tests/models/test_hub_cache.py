"""``model.path`` as a hub id resolved from the local Hugging Face cache, offline. No hub is
reachable here, so the cache is a real ``huggingface_hub`` cache layout (``models--org--name``
with ``refs/main`` and ``snapshots/<commit>``, files as blobs behind symlinks) built from the
tiny model; a model that is not cached is an error naming the cache folder."""

from __future__ import annotations

import subprocess

import hashlib
import shutil

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from loongsage.errors import ConfigError
from loongsage.models.resolve import resolve_model_path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, tiny_model_dir):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    repo = cache / "models--loongsage--tiny-qwen2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in tiny_model_dir.iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(blob)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_cached_hub_id_resolves_offline_to_its_snapshot(hub_cache, tiny_model_dir):
    folder = resolve_model_path("loongsage/tiny-qwen2")
    assert folder == hub_cache / "models--loongsage--tiny-qwen2" / "snapshots" / COMMIT
    model = AutoModelForCausalLM.from_pretrained(folder)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert all((a == b).all() for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    assert AutoTokenizer.from_pretrained(folder).encode("1 + 2") == \
        AutoTokenizer.from_pretrained(tiny_model_dir).encode("1 + 2")


def test_uncached_hub_id_names_the_cache_and_a_download_command_that_exists(hub_cache):
    import shutil
    import sys
    from pathlib import Path

    with pytest.raises(ConfigError, match=r"model.path: 'someone/not-cached' .* not in the local cache "
                                          + str(hub_cache)) as err:
        resolve_model_path("someone/not-cached")
    assert "`hf download someone/not-cached`" in str(err.value)
    cli = shutil.which("hf", path=str(Path(sys.executable).parent))  # the installed huggingface-hub's CLI
    assert cli is not None and "download" in subprocess.run([cli, "download", "--help"], capture_output=True,
                                                             text=True, timeout=60).stdout


def test_paths_that_are_no_hub_id_keep_their_error(tmp_path):
    with pytest.raises(ConfigError, match="is not a Hugging Face model folder"):
        resolve_model_path(str(tmp_path / "a" / "b"))
