"""``replicas: 1``: each rank's local step is also kept in the other machines' local tiers.

With ``local:`` and the ranks on several machines (torchrun nodes), a step on one machine's disk
is lost with that machine. So every rank pairs with the ranks of the same local rank on the
other machines (:func:`partners_of`), serves its machine's local tier to them
(:class:`~ravex.format.storage.peer.StorageServer`) and reaches each partner's tier as a store
(:class:`~ravex.format.storage.peer.PeerStorage`). The backend then treats each partner's tier as
one more destination of the same background copy as the durable tier's
(:class:`~.tiers.Persister`, every step): each rank copies its own manifest and the objects the
other tier lacks. Each machine's local tier thus holds every rank's manifest of each step, so
the rules that read one store (rank 0's settle and retention, the resume's agreement) hold on
any machine's tier. At start, a machine whose tier is gone or older takes the newest step of the
partners' tiers first (:func:`~.tiers.fetch`), before the durable tier's.

On more than two machines that is one copy per machine, not one replica: a tier holding a part
of a step (a ring of single replicas) cannot be resumed from, settled or collected alone
(``docs/SCALE.md``), so a job of ``M`` machines keeps ``M`` copies of each step, and each rank
sends what it writes ``M - 1`` times; said once at start (:func:`say_copies`), and refused above
:data:`MAX_MACHINES` machines.

The partners meet through the job's rendezvous store (torchrun's, ``MASTER_ADDR:MASTER_PORT``),
which exists before ``init_process_group`` (``ravex.activate()`` usually runs before it): each
publishes the address of its server and a token, and reads its partners'. No collective of the
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
#: how long a closing rank keeps serving its tier for the partners' last copies (their exit checkpoints)
BYE_TIMEOUT_S = 120.0
#: the most machines ``replicas: 1`` takes: each keeps a full copy of every step, and each rank
#: sends its writes to every other machine, so the cost grows with the machines (refused above)
MAX_MACHINES = 8


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


def partners_of(rank: int, world_size: int, local_world_size: int) -> list[int]:
    """The ranks that keep ``rank``'s replicas, and whose replicas it keeps: the same local rank
    on each other machine, the next machine first (torchrun numbers the ranks machine by machine)."""
    machines = world_size // local_world_size
    return [(rank + k * local_world_size) % world_size for k in range(1, machines)]


def check_machines(machines: Machines, local: str) -> None:
    """``replicas: 1`` needs several machines of equal size: a clear line otherwise."""
    if machines.count == 1:
        raise RavexError(f"replicas: 1 keeps each step of local: {local!r} on another machine too, and all "
                         f"{machines.world_size} rank(s) run on this one: drop 'replicas: 1' (or run on two "
                         f"machines)")
    if machines.world_size % machines.local_world_size:
        raise RavexError(f"replicas: 1 needs machines (torchrun nodes) of equal size; these "
                         f"{machines.world_size} ranks run {machines.local_world_size} per machine: give every "
                         f"node the same --nproc-per-node, or drop 'local:' (every checkpoint then goes to "
                         f"'storage:')")
    if machines.count > MAX_MACHINES:
        raise RavexError(f"replicas: 1 keeps a full copy of each step in every machine's local tier, and these "
                         f"ranks run on {machines.count} machines ({machines.count} copies, each rank's writes sent "
                         f"{machines.count - 1} times; a ring of single replicas is not done: docs/SCALE.md); it "
                         f"takes up to {MAX_MACHINES} machines: drop 'local:' and 'replicas:' (every checkpoint then "
                         f"goes to 'storage:')")


def say_copies(machines: Machines, local: str) -> None:
    """Rank 0, more than two machines: the copies ``replicas: 1`` keeps there, once."""
    if machines.rank == 0 and machines.count > 2:
        logger.warning("ravex: replicas: 1 on %d machines keeps each step in every machine's local tier "
                       "(%s): %d copies, each rank's writes sent to %d other machines; a tier holding part "
                       "of a step could not be resumed from alone (docs/SCALE.md). With many machines, "
                       "drop 'local:' and checkpoint to 'storage:'", machines.count, local, machines.count,
                       machines.count - 1)


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


@dataclass(frozen=True)
class Partner:
    """A partner's local tier: its rank, its connection and the tier as a store."""

    rank: int
    storage: PeerStorage
    store: CheckpointStore

    @property
    def source(self) -> str:
        """The tier in a log line."""
        return f"rank {self.rank}'s machine"


class ReplicaLink:
    """This rank's side of the replicas: the server of its machine's local tier, and each
    partner's tier (:attr:`partners`)."""

    def __init__(self, local: CheckpointStore, machines: Machines) -> None:
        master = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self.server = StorageServer(local.storage, _reachable_address(master), secrets.token_hex(16))
        store = _rendezvous_store()
        job = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        store.set(f"ravex/replicas/{job}/rank-{machines.rank}",  # type: ignore[attr-defined]
                  f"{self.server.address} {self.server.token}")
        #: rank 0's tier, reached from the other machines (where it forks a timeline); None on its machine
        self.first_machine: CheckpointStore | None = None
        self.partners: list[Partner] = []
        for rank in partners_of(machines.rank, machines.world_size, machines.local_world_size):
            try:
                theirs = store.get(f"ravex/replicas/{job}/rank-{rank}").decode()  # type: ignore[attr-defined]
            except Exception as exc:
                self.close_now()
                raise RavexError(f"replicas: 1: rank {rank} (this rank's partner on another machine) did not "
                                 f"publish its local tier within {RENDEZVOUS_TIMEOUT_S:.0f} s ({exc}); is it "
                                 f"running with the same ravex.yaml?") from None
            address, token = theirs.split()
            host, port = address.rsplit(":", 1)
            storage = PeerStorage(host, int(port), token, name=f"peer://{address} (rank {rank}'s local tier)")
            self.partners.append(Partner(rank, storage, store_on(storage)))
            if rank < machines.local_world_size:
                self.first_machine = self.partners[-1].store

    def close(self) -> None:
        """Say bye to each partner's server, then keep serving this tier until every partner said
        bye too (its last copy, the exit checkpoint's, lands here), bounded by :data:`BYE_TIMEOUT_S`."""
        answered = 0
        for partner in self.partners:
            try:
                partner.storage.bye()
                answered += 1
            except OSError as exc:  # its server is gone: so is the partner, and nothing more comes
                logger.warning("ravex: rank %d (a replica on another machine) did not answer at exit: %s",
                               partner.rank, exc)
        if answered and not self.server.wait_for_byes(answered, BYE_TIMEOUT_S):
            logger.warning("ravex: %d of the other machines did not finish their copies into this local tier "
                           "within %.0f s; stopping to serve it", answered - self.server.byes, BYE_TIMEOUT_S)
        self.close_now()

    def close_now(self) -> None:
        """Stop serving and drop the links without waiting for the partners (a backend that could
        not open)."""
        for partner in self.partners:
            partner.storage.close()
        self.server.close()
