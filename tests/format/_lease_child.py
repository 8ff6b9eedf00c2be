"""A child process of the lease tests (a real process per contender). Not a test module.

    _lease_child.py URL TIMELINE [STORAGE_OPTIONS_JSON]

prints ``ready``, waits for a line on stdin (``go``), takes the timeline's lease without
waiting, prints ``won <generation>`` or ``busy <message>``, then holds it (this process alive)
until stdin closes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ravex.format.errors import TimelineBusyError
from ravex.format.history.leases import Lease
from ravex.format.storage import open_storage


def main() -> None:
    url, timeline = sys.argv[1], sys.argv[2]
    options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    storage = open_storage(url, options)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        lease = Lease.acquire(storage, timeline, wait=False)
        print(f"won {lease.holder.generation}", flush=True)
    except TimelineBusyError as exc:
        print(f"busy {exc}", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
