"""The version of Ravex: ``ravex.__version__``, ``ravex status`` and each checkpoint's
metadata report this one; ``pyproject.toml`` reads it through ``ravex.__version__``."""

__version__ = "0.1.0"
