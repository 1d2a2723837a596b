"""A ``@triton.jit`` function's parameters as Triton reads them: its signature and constexpr
names (``_params``), a launch's arguments bound to them (``_bound``) without
``inspect.Signature.bind`` where the parameters are plain (``_layout``: a launch hook pays
a dict build per launch, not ``bind``'s), and what a GPU compiles a variant of a launch per
(``specialization``). Imports nothing of kvfuzz."""

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


def _arg_class(value, specialize: bool):
    """One argument's share of Triton's specialization key (3.6 through 3.9): a tensor's dtype and
    16-byte alignment, an int's width and (unless not specialized) whether it is 1 or a multiple
    of 16, else the type; a constexpr's value is taken by the caller."""
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return (str(value.dtype), specialize and value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        width = "i32" if -(1 << 31) <= value < (1 << 31) else "i64"
        if not specialize:
            return width
        return (width, "1" if value == 1 else "D" if value % 16 == 0 else "")
    return type(value).__name__


def specialization(launch) -> tuple:
    """What a GPU compiles one variant of this launch's (``launches.Launch``) kernel per, approximated from the launch
    alone (the same for compiled and interpreted launches, so a CPU run can count the variants a
    GPU campaign would compile): the kernel, each argument's class (``_arg_class``; the
    ``do_not_specialize`` ones by width or dtype only), the constexprs' values and the launch
    options (``num_warps``, ``num_stages``)."""
    fn = launch.fn
    sig, const = _params(getattr(fn, "fn", fn))
    names = list(sig.parameters) if sig is not None else []
    nospec = getattr(fn, "do_not_specialize", None)
    if nospec is None:
        nospec = getattr(fn, "kwargs", {}).get("do_not_specialize")
    nospec = {names[a] if isinstance(a, int) and a < len(names) else a for a in (nospec or ())}
    values = by_name(getattr(fn, "fn", fn), launch.args, launch.kwargs)
    key = []
    for name in names:
        if name not in values:
            continue
        v = values[name]
        v = getattr(v, "value", v) if type(v).__name__ == "constexpr" else v
        key.append((name, v if name in const else _arg_class(v, name not in nospec)))
    options = tuple(sorted((k, v) for k, v in launch.kwargs.items() if k not in names and isinstance(v, (int, str))))
    return (launch.name, tuple(key), options)


def by_name(pyfn, args, kwargs) -> dict:
    """A launch's arguments by parameter name: the positional ones, then the kwargs naming a
    parameter (no defaults applied, unlike ``_bound``)."""
    layout = _layout(pyfn)
    if layout is not None:
        names = layout[0]
    else:
        sig, _ = _params(pyfn)
        names = tuple(sig.parameters) if sig is not None else ()
    values = dict(zip(names, args))
    if kwargs:
        values.update({k: v for k, v in kwargs.items() if k in names})
    return values


def int_constexprs(pyfn, args, kwargs) -> dict:
    """The launch's int constexpr arguments by name (``constexpr_args``; a wrapped
    ``tl.constexpr`` by its value, bools left out): what a launch's features and its
    ``launches.Launch`` read of its constexprs."""
    out = {}
    for k, v in (constexpr_args(pyfn, args, kwargs) or {}).items():
        v = getattr(v, "value", v) if type(v).__name__ == "constexpr" else v
        if isinstance(v, int) and not isinstance(v, bool):
            out[k] = v
    return out


def kernel_name(fn) -> str:
    """A launched kernel's name (a ``JITFunction``'s, or the function's it wraps)."""
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", "?")
