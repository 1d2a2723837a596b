"""What a function checker asks of the analysis that runs it: the project, the strict kinds, and
whether a call always raises.

A leaf module: the analysis (``reach``) makes the function checkers (``checker``) and hands
itself to each; the checker needs only these three things of it, so it reads them through this
protocol and never imports the analysis (which imports the checker).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Protocol

from .model import Project


class CheckerHost(Protocol):
    project: Project
    strict: frozenset[str]

    def always_raises_call(self, checker: object) -> Callable[[ast.Call], bool]:
        """A predicate on calls: does the callee raise on every path?"""
        ...
