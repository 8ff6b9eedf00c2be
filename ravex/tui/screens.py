"""The inspector's screens: the help (``?``), over the main one the app composes."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

HELP_KEYS = (
    ("↑ ↓  mouse", "move in the focused pane"),
    ("tab", "next pane: steps, tensors, the right pane"),
    ("enter", "open a group, select a row"),
    ("/", "filter tensors by name (esc clears)"),
    ("d", "diff this step with the marked one, or the previous"),
    ("m", "mark the highlighted step as the diff base"),
    ("v", "validate the store (rehash every object)"),
    ("i  esc", "back to details"),
    ("r", "reload the steps (a run may still be writing)"),
    ("t", "next timeline (resuming an older step forks one)"),
    ("?", "this help"),
    ("q", "quit"),
)


def help_text() -> Text:
    """The help screen's text: keys, then how to read the panes."""
    t = Text()
    t.append("ravex inspect", style="bold")
    t.append(" — browse a checkpoint store\n\n")
    for key, what in HELP_KEYS:
        t.append(f"{key:<12}", style="bold")
        t.append(f"{what}\n")
    t.append("\nSteps: the bar is the bytes a step added; ✗ incomplete, ◆ tagged.\n")
    t.append("Chunk map: █ written by this step, ░ shared with the previous one.\n")
    t.append("Diff: ")
    t.append("red", style="bold red")
    t.append(" ≥ 10% relative change, ")
    t.append("yellow", style="yellow")
    t.append(" ≥ 0.1%, ")
    t.append("green", style="green")
    t.append(" smaller.")
    return t


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        yield Static(help_text(), id="help")

    def on_click(self) -> None:
        self.dismiss()
