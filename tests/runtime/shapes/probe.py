"""What every shape trainee shares with the test that runs it (test_script_shapes.py).

``T_ENTRY=activate`` activates Ravex on the trainee's first line, as ``ravex.activate()``
at the top of a script does; otherwise the trainee runs on plain torch (the reference).
``T_BLOCK_AT=<n>``: after the n-th optimizer step of this process, wait for the checkpoints
in flight to be durable, print ``BLOCKED`` and block on stdin, so that the test SIGKILLs a
process known to be there. ``T_OUT``: where :func:`finish` writes the final state.
"""

import os
import sys

_count = 0


def entry() -> None:
    if os.environ.get("T_ENTRY") == "activate":
        import ravex

        ravex.activate()


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def done_step() -> None:
    """One optimizer step of this process is done."""
    global _count
    _count += 1
    if os.environ.get("T_BLOCK_AT") == str(_count):
        if os.environ.get("T_ENTRY") == "activate":
            import ravex

            ravex.flush()
        say("BLOCKED")
        sys.stdin.read()


def finish(**state: object) -> None:
    import torch

    out = os.environ.get("T_OUT")
    if out:
        torch.save(state, out)
