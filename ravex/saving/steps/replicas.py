"""``replicas: 1``: each rank's local step is also kept in another machine's local tier.

With ``local:`` and the ranks on two machines (torchrun nodes), a step on one machine's disk
is lost with that machine. So every rank pairs with the rank of the same local rank on the
other machine (:func:`partner_of`), serves its machine's local tier to that partner
(:class:`~ravex.format.storage.peer.StorageServer`) and reaches the partner's tier as a store
(:class:`~ravex.format.storage.peer.PeerStorage`). The backend then treats the partner's tier as
a second destination of the same background copy as the durable tier's
(:class:`~.tiers.Persister`, every step): each rank copies its own manifest and the objects the
other tier lacks. Each machine's local tier thus holds every rank's manifest of each step, so
the rules that read one store (rank 0's settle and retention, the resume's agreement) hold on
either machine's tier. At start, a machine whose tier is gone or older takes the partner's
newest step first (:func:`~.tiers.fetch`), before the durable tier's.

The pair meet through the job's rendezvous store (torchrun's, ``MASTER_ADDR:MASTER_PORT``),
which exists before ``init_process_group`` (``ravex.activate()`` usually runs before it): each
publishes the address of its server and a token, and reads its partner's. No collective of the
user's process group is used, so nothing here has to happen at the same point on every rank.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta

from ravex.format import CheckpointStore, RavexError
from ravex.format.storage.peer import PeerStorage, StorageServer
from ravex.format.store import store_on

logger = logging.getLogger("ravex")

#: how long a rank waits at start for its partner to publish its address (it opens its backend
#: at the same ``ravex.activate()``; a partner that never does fails this start, said in one line)
RENDEZVOUS_TIMEOUT_S = 300.0
#: how long a closing rank keeps serving its tier for the partner's last copy (its exit checkpoint)
BYE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Machines:
    """Where this rank stands among the job's machines (torchrun's environment)."""

    rank: int
    world_size: int
    local_world_size: int

    @property
    def count(self) -> int:
        return self.world_size // self.local_world_size

    @classmethod
    def from_env(cls, rank: int, world_size: int) -> Machines:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)) or world_size)
        return cls(rank, world_size, local)


def partner_of(rank: int, world_size: int, local_world_size: int) -> int:
    """The rank that keeps ``rank``'s replica: the same local rank on the next machine (torchrun
    numbers the ranks machine by machine). With two machines the pairing is mutual."""
    return (rank + local_world_size) % world_size


def check_machines(machines: Machines, local: str) -> None:
    """``replicas: 1`` needs exactly two machines of equal size: a clear line otherwise."""
    if machines.count == 1:
        raise RavexError(f"replicas: 1 keeps each step of local: {local!r} on another machine too, and all "
                         f"{machines.world_size} rank(s) run on this one: drop 'replicas: 1' (or run on two "
                         f"machines)")
    if machines.count != 2 or machines.world_size % machines.local_world_size:
        raise RavexError(f"replicas: 1 supports two machines (torchrun nodes) of equal size; these "
                         f"{machines.world_size} ranks run {machines.local_world_size} per machine: run on two "
                         f"machines, or drop 'local:' (every checkpoint then goes to 'storage:')")


def _reachable_address(toward: str) -> str:
    """This machine's address on the route to ``toward`` (the rendezvous host), which the
    partner machine can reach as the rendezvous host reaches it."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((toward, 9))  # UDP: no packet is sent, the route is chosen
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _rendezvous_store() -> object:
    """The job's rendezvous store (torchrun's), as a client."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    try:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError):
        raise RavexError("replicas: 1 finds the other machine through torchrun's rendezvous, and MASTER_ADDR/"
                         "MASTER_PORT are not set: launch with torchrun, or drop 'replicas: 1'") from None
    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT_S),
                    wait_for_workers=False)


class ReplicaLink:
    """This rank's side of a pair: the server of its machine's local tier, and the partner's tier
    as a :class:`~ravex.format.CheckpointStore` (:attr:`peer`)."""

    def __init__(self, local: CheckpointStore, machines: Machines) -> None:
        self.partner = partner_of(machines.rank, machines.world_size, machines.local_world_size)
        master = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self.server = StorageServer(local.storage, _reachable_address(master), secrets.token_hex(16))
        store = _rendezvous_store()
        job = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        store.set(f"ravex/replicas/{job}/rank-{machines.rank}",  # type: ignore[attr-defined]
                  f"{self.server.address} {self.server.token}")
        try:
            theirs = store.get(f"ravex/replicas/{job}/rank-{self.partner}").decode()  # type: ignore[attr-defined]
        except Exception as exc:
            self.server.close()
            raise RavexError(f"replicas: 1: rank {self.partner} (this rank's partner on the other machine) did not "
                             f"publish its local tier within {RENDEZVOUS_TIMEOUT_S:.0f} s ({exc}); is it running "
                             f"with the same ravex.yaml?") from None
        address, token = theirs.split()
        host, port = address.rsplit(":", 1)
        self.storage = PeerStorage(host, int(port), token, name=f"peer://{address} (rank {self.partner}'s local tier)")
        self.peer: CheckpointStore = store_on(self.storage)

    @property
    def url(self) -> str:
        return self.storage.url

    def close(self) -> None:
        """Say bye to the partner's server, then keep serving this tier until the partner said
        bye too (its last copy, the exit checkpoint's, lands here), bounded by :data:`BYE_TIMEOUT_S`."""
        try:
            self.storage.bye()
        except OSError as exc:  # its server is gone: so is the partner, and nothing more comes
            logger.warning("ravex: rank %d (replica on the other machine) did not answer at exit: %s",
                           self.partner, exc)
        else:
            self._wait_for_partner()
        self.close_now()

    def close_now(self) -> None:
        """Stop serving and drop the link without waiting for the partner (a backend that could
        not open)."""
        self.storage.close()
        self.server.close()

    def _wait_for_partner(self) -> None:
        if not self.server.wait_for_byes(1, BYE_TIMEOUT_S):
            logger.warning("ravex: rank %d's machine did not finish its copies into this local tier within %.0f s; "
                           "stopping to serve it", self.partner, BYE_TIMEOUT_S)
