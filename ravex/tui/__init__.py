"""``ravex inspect``: a Textual app over a checkpoint store. Reads through :mod:`ravex.format` only.

Importing this package imports nothing heavy; :mod:`ravex.tui.app` pulls in Textual.
"""
