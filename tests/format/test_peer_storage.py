"""``PeerStorage``/``StorageServer``: another machine's store as a store (replicas, issue 33):
``copy_step``, GC and reading work through it as on the served disk; a wrong token or a key
outside the store is refused; the server's missing keys stay ``FileNotFoundError``."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fmt_helpers import assert_same

from ravex.format import copy_step, open_store
from ravex.format.storage.peer import PeerStorage, StorageServer
from ravex.format.store import store_on


def _state(step: int) -> dict:
    rng = np.random.default_rng(3)
    return {"model": {"w": rng.standard_normal((512, 512)).astype("float32") + step,
                      "frozen": rng.standard_normal((512, 512)).astype("float32")}, "step": step}


@pytest.fixture
def served(tmp_path):
    """A store on 'the other machine' (a directory here), served on 127.0.0.1, and a client."""
    there = open_store(tmp_path / "there", create=True)
    server = StorageServer(there.storage, "127.0.0.1", "secret-token")
    client = PeerStorage("127.0.0.1", server.port, "secret-token")
    yield there, client
    client.close()
    server.close()


def test_a_step_copied_through_the_peer_lands_whole_and_reads_back(tmp_path, served):
    there, client = served
    here = open_store(tmp_path / "here", create=True)
    with here.writer() as w:
        for step in (10, 20):
            w.commit(step, _state(step))
    peer = store_on(client)
    first = copy_step(here, peer, 10)
    second = copy_step(here, peer, 20)
    assert first.objects_copied > 0 and second.objects_present > 0  # the frozen tensor went once
    assert there.complete_steps() == [10, 20]
    assert_same(there.read(20), here.read(20))
    assert peer.complete_steps() == [10, 20]  # and read back through the peer
    assert_same(peer.read(10), here.read(10))
    peer.gc(keep_last=1)
    assert there.complete_steps() == [20]


def test_missing_keys_stay_file_not_found(served):
    _, client = served
    with pytest.raises(FileNotFoundError):
        client.read("steps/7/rank-0.json")
    assert not client.exists("nothing")
    assert client.list_dir("objects") == []


def test_a_wrong_token_is_refused(served):
    _, client = served
    intruder = PeerStorage("127.0.0.1", client.port, "not-the-token")
    with pytest.raises(ConnectionError):
        intruder.read("ravex.json")


def test_a_connection_naming_a_huge_first_frame_is_closed_unread(served):
    """Before the token, a frame's lengths buy nothing: the server closes the connection rather
    than allocate what an unknown caller names (here 8 GiB, then wait for them), and goes on serving."""
    import socket
    import struct

    _, client = served
    with socket.create_connection(("127.0.0.1", client.port), timeout=10) as sock:
        sock.sendall(struct.pack("!QQ", 1 << 33, 0))
        assert sock.recv(1) == b""  # closed by the server
    assert client.list_dir("objects") == []  # the server still answers the job's client


def test_a_key_outside_the_store_is_refused(tmp_path, served):
    _, client = served
    (tmp_path / "secret.txt").write_text("not yours")
    with pytest.raises(OSError, match="not a key of this store"):
        client.read("../secret.txt")
    with pytest.raises(OSError, match="not a key of this store"):
        client.write("/etc/passwd-copy", b"x")


def test_ages_hold_whatever_the_two_clocks_say(served):
    """The client's clock an hour ahead of the server's: a file the server just wrote is young
    in the client's listing, and GC's delete of objects older than 10 s spares it (with bare
    timestamps it would be an hour old, and deleted)."""
    there, _ = served
    server = StorageServer(there.storage, "127.0.0.1", "t")
    ahead = PeerStorage("127.0.0.1", server.port, "t", clock=lambda: time.time() + 3600)
    try:
        ahead.write("objects/ab/fresh", b"x")
        (info,) = [o for o in ahead.walk("objects") if o.key == "objects/ab/fresh"]
        assert abs(ahead.clock() - info.mtime) < 60
        assert not ahead.delete_if_older("objects/ab/fresh", ahead.clock() - 10)
        assert there.storage.exists("objects/ab/fresh")
        assert ahead.delete_if_older("objects/ab/fresh", ahead.clock() + 10)  # older than a cutoff ahead of it
        assert not there.storage.exists("objects/ab/fresh")
    finally:
        ahead.close()
        server.close()
