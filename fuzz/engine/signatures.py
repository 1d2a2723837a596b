"""A ``@triton.jit`` function's parameters as Triton reads them: its signature and constexpr
names (``_params``), and a launch's arguments bound to them (``_bound``) without
``inspect.Signature.bind`` where the parameters are plain (``_layout``: a launch hook pays
a dict build per launch, not ``bind``'s). Imports nothing of kvfuzz."""

from __future__ import annotations

import functools
import inspect


@functools.lru_cache(maxsize=None)
def _params(pyfn) -> tuple[inspect.Signature | None, frozenset]:
    """The kernel's signature and its constexpr parameters (annotated ``tl.constexpr``, or a
    string naming it under ``from __future__ import annotations``), as Triton reads them."""
    try:
        sig = inspect.signature(pyfn)
    except (TypeError, ValueError):
        return None, frozenset()
    return sig, frozenset(p.name for p in sig.parameters.values()
                          if "constexpr" in str(getattr(p.annotation, "__name__", p.annotation)))


@functools.lru_cache(maxsize=None)
def _layout(pyfn) -> tuple | None:
    """(parameter names, {name: default}, constexpr names) of a kernel whose parameters are all
    plain (positional or keyword, no ``*args``/``**kwargs``), so ``_bound`` can map a launch's
    arguments without ``Signature.bind``; None otherwise (``bind`` then)."""
    sig, const = _params(pyfn)
    if sig is None or any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in sig.parameters.values()):
        return None
    ps = sig.parameters.values()
    return tuple(p.name for p in ps), {p.name: p.default for p in ps if p.default is not p.empty}, const


def _bound(pyfn, args, kwargs) -> dict | None:
    """The launch's arguments by parameter name, defaults applied, in parameter order, as
    ``Signature.bind(...).apply_defaults()`` gives them (kwargs naming no parameter left out);
    None where they do not bind (too many, a duplicate, a required one missing)."""
    layout = _layout(pyfn)
    if layout is None:
        sig, _ = _params(pyfn)
        if sig is None:
            return None
        try:
            bound = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
        except TypeError:
            return None
        bound.apply_defaults()
        return dict(bound.arguments)
    names, defaults, _ = layout
    if len(args) > len(names) or any(k in kwargs for k in names[: len(args)]):
        return None  # too many, or a positional argument named again
    out = dict(zip(names, args))
    for name in names[len(args):]:
        if name in kwargs:
            out[name] = kwargs[name]
        elif name in defaults:
            out[name] = defaults[name]
        else:
            return None
    return out


@functools.lru_cache(maxsize=None)
def _constexpr_slots(pyfn) -> tuple | None:
    """Each constexpr parameter's (name, position, default or ``inspect.Parameter.empty``) of a
    kernel ``_layout`` reads; None where it cannot (``_bound`` then)."""
    layout = _layout(pyfn)
    if layout is None:
        return None
    names, defaults, const = layout
    return tuple((n, i, defaults.get(n, inspect.Parameter.empty)) for i, n in enumerate(names) if n in const)


def constexpr_args(pyfn, args, kwargs) -> dict | None:
    """The launch's constexpr arguments by name, as ``_bound`` would give them for those names
    (defaults applied, one passed neither way left out), without binding the others: a launch
    hook reads a few slots, not every argument. Arguments that do not bind (Triton refuses the
    launch) give what the slots hold where the parameters are plain, else None."""
    slots = _constexpr_slots(pyfn)
    if slots is None or len(args) > len(_layout(pyfn)[0]):
        bound = _bound(pyfn, args, kwargs)
        return None if bound is None else {k: v for k, v in bound.items() if k in _params(pyfn)[1]}
    out = {}
    for name, i, default in slots:
        if i < len(args):
            out[name] = args[i]
        elif name in kwargs:
            out[name] = kwargs[name]
        elif default is not inspect.Parameter.empty:
            out[name] = default
    return out

