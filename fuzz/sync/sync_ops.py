"""Which torch ops the runtime host-sync detector (``runtime``) treats as host waits, and why:
the tables it reads, kept apart from the detector so each can be read on its own."""

from __future__ import annotations

_DATA_DEPENDENT_SHAPE = {
    "nonzero": "the output size is the number of nonzeros, which the host must read back",
    "argwhere": "the output size is the number of nonzeros, which the host must read back",
    "_unique": "the number of unique values sizes the output; the host reads it back",
    "_unique2": "the number of unique values sizes the output; the host reads it back",
    "unique_dim": "the number of unique values sizes the output; the host reads it back",
    "unique_consecutive": "the number of runs sizes the output; the host reads it back",
    "unique_dim_consecutive": "the number of runs sizes the output; the host reads it back",
    "masked_select": "the number of selected elements sizes the output; the host reads it back",
    "equal": "returns a Python bool, read from the device",
    "allclose": "returns a Python bool, read from the device",
    "is_nonzero": "returns a Python bool, read from the device",
    "bincount": "the output length is max(input) + 1, read from the device",
}

_SCALAR_READ_METHODS = {
    "tolist": "copies the whole tensor to host memory",
    "numpy": "needs the data in host memory (a device→host copy)",
    "cpu": "copies the tensor to host memory",
    "__array__": "numpy conversion needs the data in host memory",
    "__repr__": "printing reads the values back",
    "__format__": "formatting reads the values back",
    "__str__": "printing reads the values back",
}

_FACTORIES = {
    "tensor",
    "as_tensor",
    "asarray",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "range",
    "linspace",
    "randperm",
    "randint",
    "rand",
    "randn",
    "eye",
    "empty_strided",
}
_FROM_HOST_DATA = {"tensor", "as_tensor", "asarray"}


def _op_base_name(func) -> str:
    # func is an OpOverload: aten.nonzero.default -> "nonzero"
    try:
        return func._schema.name.split("::", 1)[1]
    except Exception:
        return str(func).split(".")[1] if "." in str(func) else str(func)


def _op_label(func) -> str:
    return f"aten.{_op_base_name(func)}"


def _func_name(func) -> str:
    name = getattr(func, "__name__", None) or str(func)
    return name
