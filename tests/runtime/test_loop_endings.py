"""Which loops a finished run's rerun lets decide again (``ravex.runtime.position.ending``):
every ``break`` must end ``if`` statements whose tests only read values, directly in the loop's
body or nested in one such ``if``'s body; the tests of a nested one are joined."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from ravex.runtime.position.ending import ending


def _ending(tmp_path: Path, body: str):
    source = "def train(self):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    path = tmp_path / "loop.py"
    path.write_text(source)
    return ending(str(path), "train", 1, 2)


def test_a_break_in_nested_ifs_is_tested_again_with_all_their_tests(tmp_path):
    end = _ending(tmp_path, """\
        for epoch in range(self.start, self.epochs + 1):
            self.step(epoch)
            if self.mode != "off":
                count += 1
                if count > self.patience:
                    self.log("stop")
                    break
        """)
    assert end is not None and end.kind == "for"
    [(line, test)] = end.tests
    assert line == 6 and ast.unparse(test) == "self.mode != 'off' and count > self.patience"


def test_a_break_the_source_cannot_test_again_keeps_the_jump_past_the_loop(tmp_path):
    in_else = """\
        while True:
            step()
            if monitored:
                pass
            else:
                if count > 3:
                    break
        """
    called = """\
        while True:
            step()
            if monitored:
                if too_many(count):
                    break
        """
    in_try = """\
        while True:
            if monitored:
                try:
                    break
                finally:
                    pass
        """
    for body in (in_else, called, in_try):
        assert _ending(tmp_path, body) is None, body
