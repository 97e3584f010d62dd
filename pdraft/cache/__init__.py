"""The hidden-state cache: sharded safetensors of the target's chosen-layer features and last hidden state
with a versioned manifest (format.py), a resumable writer (writer.py; export_hidden.py runs the whole export-hidden command) and a verifying reader
(reader.py)."""

from pdraft.cache.format import FORMAT_VERSION, check_compatible, read_manifest
from pdraft.targets.fingerprint import target_fingerprint
from pdraft.cache.reader import HiddenCache, collate, open_cache
from pdraft.cache.writer import target_states, write_cache

__all__ = ["FORMAT_VERSION", "HiddenCache", "check_compatible", "collate", "open_cache", "read_manifest",
           "target_fingerprint", "target_states", "write_cache"]
