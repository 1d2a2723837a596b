"""torch, imported where it is first used rather than where a module is imported.

Why: a command line parent (``kvfuzz run``, ``replay``, ``minimize``, ``merge``) parses op
kinds from case files and workers' reports, so it imports every module that defines an op
kind, and those run their ops with torch. Importing torch costs a parent 2-3 CPU s and
buys it nothing: the ops run in its children. The test suite starts well over a hundred
such parents, and a nightly one per shard and replay.

``torch = lazy.Torch(globals())`` at a module's top stands for torch in that module until
the first ``torch.<name>`` is looked up; that lookup imports torch and puts the real module
in the module's globals, so every later lookup is an ordinary global one. A module-level
``torch.<name>`` (a dtype as a constant, a default argument) would import it at once: such
modules use ``torch.int64`` inside their functions instead.
"""

from __future__ import annotations

import importlib


class Torch:
    """Stands for ``torch`` in the globals it is given until first used."""

    __slots__ = ("_globals",)

    def __init__(self, module_globals: dict):
        self._globals = module_globals

    def __getattr__(self, name: str):
        torch = importlib.import_module("torch")
        if self._globals.get("torch") is self:
            self._globals["torch"] = torch
        return getattr(torch, name)

    def __repr__(self) -> str:
        return f"<torch, not imported yet, for {self._globals.get('__name__')}>"
