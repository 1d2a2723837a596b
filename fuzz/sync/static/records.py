"""The rule record types: a ``Rule`` is one code the checker reports, a ``Family`` the rules of one cause with their hooks.

A leaf module: the rule family modules (``rules/``) import it to declare their records,
and the registry (``registry``), above them, collects the families by explicit import.
Nothing here imports the rest of the checker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rule:
    code: str  # SYNCnn, stable: users select, ignore and suppress by it
    name: str  # kebab-case, for SARIF and humans
    forms: str  # what the rule matches, as a reader would search for it
    message: str  # the finding's text; ``{form}`` is the offending code
    why: str  # why the host waits for the device
    # Lines in the body of ``def free(self, pages: torch.Tensor)`` of a pool with v2p/p2v
    # tables; tests hold the example to being reported and ``instead`` to being quiet.
    example: str  # a line that is reported
    instead: str = ""  # a line that does the same job without waiting, when there is one
    variants: Mapping[str, str] = field(default_factory=dict)  # other messages for the same code

    def render(self, form: str = "", variant: str | None = None) -> str:
        template = self.variants[variant] if variant else self.message
        return template.format(form=form)


# A hook receives the function checker and the node it fires on.
Hook = Callable[..., None]


@dataclass(frozen=True)
class Family:
    """Rules that share a cause, with the hooks that detect them.

    Hook events, each hook called as ``hook(checker, *args)``:
    ``call(node, torch_name)`` for an ``ast.Call`` (``torch_name`` is ``"cuda.synchronize"``
    for ``torch.cuda.synchronize(...)``, None when the callee is not ``torch.*``);
    ``index(node, parts, store_value)`` for a tensor indexed by ``parts`` (a read, an
    augmented store, or a store of ``store_value``); ``store(target, value)`` for a
    subscript store; ``truth(expr, form)`` for an expression tested for truth;
    ``fstring(node)`` for an ``ast.JoinedStr``.
    """

    name: str
    title: str
    rules: tuple[Rule, ...]
    hooks: Mapping[str, Hook] = field(default_factory=dict)
