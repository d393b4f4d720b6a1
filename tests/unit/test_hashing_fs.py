"""Digests computed while DCP writes a file are the file's own (and dropped when the stream seeks
back), and the seal takes them without reading the file again."""
from __future__ import annotations

import json

import xxhash

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save  # noqa: E402

from slurmtools.checkpoint import hashing_fs  # noqa: E402
from slurmtools.checkpoint.manager import SHARD_HASHES_DIR, seal_own_files  # noqa: E402
from slurmtools.checkpoint.torch_dcp import hashing_writer  # noqa: E402


def _xxh(path) -> str:
    """Computed here with the library itself, not through slurmtools.checkpoint.digests."""
    return xxhash.xxh3_128(path.read_bytes()).hexdigest()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_every_file_dcp_writes_is_hashed_as_written_and_the_metadata_keeps_its_digest_through_the_rename(tmp_path,
                                                                                                         monkeypatch):
    monkeypatch.setattr(hashing_fs, "CHUNK_BYTES", 1000)       # many chunks, short writes included
    writer = hashing_writer(str(tmp_path))
    dcp_save({"w": torch.arange(100_000, dtype=torch.float32), "note": {"a": 1}}, storage_writer=writer)
    digests = writer.fs.digests()
    assert set(digests) == {p.name for p in tmp_path.iterdir()} == {"__0_0.distcp", ".metadata"}
    for name, (size, digest) in digests.items():
        assert (size, digest) == ((tmp_path / name).stat().st_size, _xxh(tmp_path / name)), name


def test_a_stream_that_seeks_back_records_no_digest(tmp_path):
    fs = hashing_fs.HashingFileSystem()
    with fs.create_stream(tmp_path / "f", "wb") as stream:
        stream.write(b"abcdef")
        stream.flush()
        stream.seek(0)
        stream.write(b"X")
    with fs.create_stream(tmp_path / "g", "wb") as stream:
        stream.write(b"ghi")
    assert (tmp_path / "f").read_bytes() == b"Xbcdef"
    assert fs.digests() == {"g": (3, xxhash.xxh3_128(b"ghi").hexdigest())}


def test_the_seal_takes_digests_of_hashed_files_unread_and_hashes_the_rest(tmp_path):
    (tmp_path / "a").write_bytes(b"aaaa")
    (tmp_path / "b").write_bytes(b"bb")
    told = "0" * 32                      # not a's real digest: shows the file was not read again
    entries = seal_own_files(tmp_path, "rank_0", ["a", "b"], {"a": (4, told), "b": (99, told)})
    assert entries == {"a": {"size": 4, "xxh3_128": told}, "b": {"size": 2, "xxh3_128": _xxh(tmp_path / "b")}}
    assert json.loads((tmp_path / SHARD_HASHES_DIR / "rank_0.json").read_text()) == entries
