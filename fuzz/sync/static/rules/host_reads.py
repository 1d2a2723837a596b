"""Device values read on the host: the host needs a number, a bool or a string that lives on the GPU."""

from __future__ import annotations

import ast

from ..records import Family, Rule
from ..vocab import SIZE_FACTORIES, is_literal_cpu, kwarg, segment

WAITS = "the host waits for the GPU"

ITEM = Rule(
    "SYNC01", "item", "`.item()`",
    f"`.item()` copies a device value into a Python number: {WAITS}",
    "the value is on the device; the copy to the host waits for every queued kernel that writes it",
    "top = pages.max().item()", "top = pages.max()")
TOLIST = Rule(
    "SYNC02", "tolist", "`.tolist()`",
    f"`.tolist()` copies the tensor to host memory: {WAITS}",
    "a device→host copy of the whole tensor, after the queued kernels finish",
    "freed = pages.tolist()", "self.free_virtual = torch.cat((self.free_virtual, pages))")
TO_HOST = Rule(
    "SYNC03", "to-host", "`.cpu()`, `.to(\"cpu\")`",
    f"`{{form}}` copies the tensor to host memory: {WAITS}",
    "a blocking device→host copy",
    "host = self.v2p.cpu()")
NUMPY = Rule(
    "SYNC04", "numpy", "`.numpy()`",
    f"`.numpy()` needs the data in host memory (a device→host copy): {WAITS}",
    "NumPy reads host memory, so the data is copied back first",
    "arr = pages.numpy(force=True)")
SCALAR_CONVERSION = Rule(
    "SYNC05", "scalar-conversion", "`int()`/`float()`/`bool()`/`complex()` of a tensor; `sorted`/`max`/`min`/`any`/`all` over one",
    f"`{{form}}` of a tensor reads its value on the host (`.item()`): {WAITS}",
    "the conversion calls `.item()`; iterating a tensor yields 0-dim tensors that are compared on the host",
    "n = int(self.v2p[pages].max())", "n = pages.numel()")
TRUTH_TEST = Rule(
    "SYNC06", "truth-test", "truth test of a tensor: `if t:`, `while t:`, `assert t`, `not t`, `a and t`, `x if t else y`, a comprehension filter",
    f"truth test of a tensor (`{{form}}`) calls `bool()`, which reads the value on the host: {WAITS}",
    "Python asks the tensor for a bool, which `.item()` reads from the device",
    "if (self.v2p[pages] == -1).any(): raise ValueError('double free')",
    "if self.checked and (self.v2p[pages] == -1).any(): raise ValueError('double free')")
TENSOR_AS_INT = Rule(
    "SYNC16", "tensor-as-int", "a tensor used as a Python int: a factory's size, `range(t)`, a slice bound",
    f"`{{form}}` uses a tensor as a Python int (`__index__` calls `.item()`): {WAITS}",
    "a size or bound must be a host integer, so the tensor is read back",
    "buf = torch.empty(pages.max(), device=pages.device)", "buf = torch.empty(pages.numel(), device=pages.device)")
DEVICE_COMPARE = Rule(
    "SYNC18", "device-compare", "`torch.equal`, `torch.allclose`, `t.equal(u)`",
    f"`{{form}}` returns a Python bool read from the device: {WAITS}",
    "the answer is a host bool computed from device data",
    "same = torch.equal(self.v2p, self.p2v)")
FORMAT_TENSOR = Rule(
    "SYNC19", "format-tensor", "formatting a tensor: f-strings, `str()`, `repr()`, `format()`, `print()`",
    "`{form}` formats a tensor, which reads its values back to the host",
    "printing needs the values, which are copied back from the device",
    "print(f'freeing {pages}')", "print(f'freeing {pages.numel()} pages')")
ZERO_DIM_INDEX = Rule(
    "SYNC20", "zero-dim-index", "a 0-dim integer tensor (`idx[0]`) used as an index",
    "`{form}` indexes with a 0-dim integer tensor: ATen reads it with `.item()`, so the host waits",
    "indexing with a 0-dim tensor converts it to a host int",
    "row = self.v2p[pages[0]]", "row = self.v2p[pages[:1]]")


def _call(ck, node: ast.Call, t: str | None) -> None:
    ev, func = ck.ev, node.func
    if isinstance(func, ast.Name):
        name = func.id
        if name in ("int", "float", "bool", "complex") and node.args and ev.is_device(node.args[0]):
            ck.report(SCALAR_CONVERSION, node, f"{name}({segment(node.args[0], 40)})")
        elif name == "range" and any(ev.is_device(a) for a in node.args):
            ck.report(TENSOR_AS_INT, node, segment(node))
        elif name in ("str", "repr", "format", "print") and any(ev.is_device(a) for a in node.args):
            ck.report(FORMAT_TENSOR, node, segment(node))
        elif name in ("sorted", "max", "min", "any", "all") and len(node.args) == 1 and ev.is_device(node.args[0]):
            ck.report(SCALAR_CONVERSION, node, f"{name}({segment(node.args[0], 40)})")
        return
    if t is not None:
        if t in ("equal", "allclose") and not (node.args and all(ev.is_host(a) for a in node.args)):
            ck.report(DEVICE_COMPARE, node, f"torch.{t}(...)")
        if t in SIZE_FACTORIES:
            sizes = [e for a in node.args for e in (a.elts if isinstance(a, (ast.Tuple, ast.List)) else [a])]
            bad = next((e for e in sizes if ev.is_device(e)), None)
            if bad is not None:
                ck.report(TENSOR_AS_INT, bad, segment(node))
        return
    if not isinstance(func, ast.Attribute) or ev.is_host(func.value):
        return  # a host tensor's values are already on the host
    meth = func.attr
    if meth == "item" and not node.args:
        ck.report(ITEM, node)
    elif meth == "tolist":
        ck.report(TOLIST, node)
    elif meth == "cpu":
        ck.report(TO_HOST, node, segment(node))
    elif meth == "to" and is_literal_cpu(node.args[0] if node.args else kwarg(node, "device")):
        ck.report(TO_HOST, node, segment(node))
    elif meth == "numpy":
        ck.report(NUMPY, node)
    elif meth in ("equal", "allclose") and ev.is_tensor(func.value):
        ck.report(DEVICE_COMPARE, node, segment(node))


def _truth(ck, test: ast.expr, form: str) -> None:
    if ck.ev.is_device(test):
        ck.report(TRUTH_TEST, test, form.replace("...", segment(test, 40), 1))


def _fstring(ck, node: ast.JoinedStr) -> None:
    for value in node.values:
        if isinstance(value, ast.FormattedValue) and ck.ev.is_device(value.value):
            ck.report(FORMAT_TENSOR, value.value, "f\"{" + segment(value.value, 40) + "}\"")


def _index(ck, node: ast.Subscript, parts: list[ast.expr], store_value: ast.expr | None) -> None:
    ev = ck.ev
    for part in parts:
        if isinstance(part, ast.Slice):
            for bound in (part.lower, part.upper, part.step):
                if bound is not None and ev.is_device(bound):
                    ck.report(TENSOR_AS_INT, bound, f"{segment(node)} (tensor slice bound)")
        elif not ev.is_mask(part) and not ev.is_host(part) and _is_zero_dim_index(ev, part):
            ck.report(ZERO_DIM_INDEX, part, segment(node))


def _is_zero_dim_index(ev, part: ast.expr) -> bool:
    """idx[0], idx[i] with a Python int: a 0-dim tensor (for the 1-D index tensors of a free path)."""
    if not isinstance(part, ast.Subscript) or not ev.is_tensor(part.value):
        return False
    inner = part.slice
    return not isinstance(inner, (ast.Slice, ast.Tuple)) and ev.is_pyscalar(inner)


FAMILY = Family(
    "host-reads", "Device values read on the host",
    (ITEM, TOLIST, TO_HOST, NUMPY, SCALAR_CONVERSION, TRUTH_TEST, TENSOR_AS_INT, DEVICE_COMPARE, FORMAT_TENSOR,
     ZERO_DIM_INDEX),
    {"call": _call, "truth": _truth, "fstring": _fstring, "index": _index},
)
