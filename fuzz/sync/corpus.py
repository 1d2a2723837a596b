"""The calibration corpus: small labelled snippets of free-path code (SPEC.md §5).

Why: three detectors (static AST check, CPU runtime modes, GPU capture) disagree at the
edges, and none is the truth by construction. Each snippet here is a tiny function over
the page tables (``v2p``, ``p2v``) and the usual free-path inputs (``idx``, ``vals``,
``mask``…), runnable unchanged on the CPU and on CUDA. The label is what we believe;
the GPU (``fuzz.sync.gpu``) is the truth the detectors are scored against, and it is
allowed to overrule a label (the calibration table shows where it did).

Every form SPEC.md §5 names is here (``spec_form``), with its look-alikes: aliases of a
table, a variable right-hand side, slices, ``index_fill_``, ``fill_``, kernel launches,
``numel``, a boolean mask written with a scalar, ``nonzero_static``…

Each snippet's ``source`` is a module that defines ``snippet(...)`` (and sometimes a
helper); the parameters it names are filled by ``make_args``. The static checker reads
the same source with ``snippet`` forced as a free-path root.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

try:  # the kernel-launch snippets need Triton (compiled on CUDA, interpreted on the CPU)
    import triton
    import triton.language as tl

    @triton.jit
    def _tombstone_kernel(v2p_ptr, idx_ptr, n, BLOCK: tl.constexpr):
        # v2p_ptr: in/out, [rows] int64; idx_ptr: in, [n] int64 virtual pages
        offs = tl.arange(0, BLOCK)
        live = offs < n
        v = tl.load(idx_ptr + offs, mask=live, other=0)
        tl.store(v2p_ptr + v, -1, mask=live)

    # On CPU tensors a Triton kernel runs only under the interpreter (TRITON_INTERPRET=1
    # before import); on a GPU machine the kernel_launch snippet is judged on CUDA only.
    CPU_KERNELS = type(_tombstone_kernel).__name__ == "InterpretedFunction"
except Exception:  # pragma: no cover - Triton is a hard dependency of the project
    _tombstone_kernel = None
    CPU_KERNELS = False

SYNCS = "syncs"
NO_SYNC = "does not"

# SPEC.md §5, in its order. Every entry must be covered by at least one snippet.
SPEC_SYNC_FORMS = (
    ".item()",
    ".tolist()",
    ".cpu()",
    ".numpy()",
    "int()/float()/bool() of a tensor",
    "if tensor:",
    "torch.nonzero",
    "torch.unique",
    "masked_select",
    "boolean-mask indexing",
    "torch.tensor(list, device=cuda)",
    "table[idx] = <python scalar>",
    "*.synchronize()",
)
SPEC_NO_SYNC_FORMS = (
    "index_fill_",
    "a kernel that stores the value itself",
    "slice fill_",
    "device-valued scatters",
    "numel/shape/len",
)
OTHER = "beyond §5"


@dataclass(frozen=True)
class Snippet:
    name: str
    label: str  # SYNCS or NO_SYNC: what we believe; the GPU decides
    spec_form: str  # the SPEC.md §5 form it exercises or imitates (or OTHER)
    source: str
    note: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def filename(self) -> str:
        return f"<sync-corpus:{self.name}>"

    def function(self) -> Callable:
        """Compile the source (registered with linecache, so tracebacks show it) and return ``snippet``."""
        linecache.cache[self.filename] = (len(self.source), None, self.source.splitlines(True), self.filename)
        namespace = {"torch": torch, "_tombstone_kernel": _tombstone_kernel, "__name__": f"sync_corpus_{self.name}"}
        exec(compile(self.source, self.filename, "exec"), namespace)
        return namespace["snippet"]

    @property
    def needs_kernels(self) -> bool:
        """It launches a Triton kernel: on CPU tensors that needs the interpreter."""
        return "_tombstone_kernel" in self.source

    def params(self) -> list[str]:
        import inspect

        return list(inspect.signature(self.function()).parameters)

    def run(self, device: str | torch.device = "cpu", args: dict | None = None):
        fn = self.function()
        args = make_args(device) if args is None else args
        return fn(**{p: args[p] for p in self.params()})


ROWS = 17  # num_pages = 16, plus the sentinel row


def make_args(device: str | torch.device = "cpu") -> dict:
    """Fresh inputs for one run: tables with pages 1..8 bound, three live pages to free."""
    device = torch.device(device)
    v2p = torch.full((ROWS,), -1, dtype=torch.int64)
    p2v = torch.full((ROWS,), -1, dtype=torch.int64)
    v2p[0] = 0
    p2v[0] = 0
    for v in range(1, 9):
        p = 9 - v
        v2p[v] = p
        p2v[p] = v
    mask = torch.zeros(ROWS, dtype=torch.bool)
    mask[[3, 5, 7]] = True
    req_to_token = torch.arange(4 * 32, dtype=torch.int64).reshape(4, 32) % 8 + 1
    host = {
        "v2p": v2p,
        "p2v": p2v,
        "idx": torch.tensor([3, 5, 7], dtype=torch.int64),
        "vals": torch.tensor([11, 12, 13], dtype=torch.int64),
        "mask": mask,
        "out": torch.zeros((4, 8), dtype=torch.int32),
        "req_to_token": req_to_token,
        "req_pool_indices": torch.arange(4, dtype=torch.int64),
        "seq_lens": torch.tensor([4, 8, 1, 0], dtype=torch.int64),
    }
    args = {k: v.to(device) for k, v in host.items()}
    args["tomb"] = -1  # a Python int reaching a free path through a parameter
    return args


def _s(name, label, spec_form, body, note="", tags=()):
    return Snippet(name, label, spec_form, body.strip("\n") + "\n", note, tuple(tags))


T = "torch.Tensor"

SNIPPETS: tuple[Snippet, ...] = (
    # ------------------------------------------------------------------ forms that sync
    _s("item", SYNCS, ".item()", f"""
def snippet(v2p, idx: {T}):
    first = v2p[idx][0].item()
    return first
"""),
    _s("tolist", SYNCS, ".tolist()", f"""
def snippet(v2p, idx: {T}):
    pages = idx.tolist()
    return pages
"""),
    _s("cpu", SYNCS, ".cpu()", """
def snippet(v2p):
    return v2p.cpu()
"""),
    _s("to_cpu_string", SYNCS, ".cpu()", """
def snippet(v2p):
    return v2p.to("cpu")
""", note="the same copy spelled .to('cpu'); on the CPU tier the call returns its input", tags=("look-alike",)),
    _s("numpy", SYNCS, ".numpy()", f"""
def snippet(idx: {T}):
    return idx.numpy(force=True)
""", note="force=True so the snippet also runs on CUDA (plain .numpy() refuses device tensors)"),
    _s("int_of_tensor", SYNCS, "int()/float()/bool() of a tensor", f"""
def snippet(v2p, idx: {T}):
    top = int(v2p[idx].max())
    return top
"""),
    _s("float_of_tensor", SYNCS, "int()/float()/bool() of a tensor", """
def snippet(p2v):
    return float(p2v.sum())
"""),
    _s("bool_of_tensor", SYNCS, "int()/float()/bool() of a tensor", f"""
def snippet(v2p, idx: {T}):
    return bool((v2p[idx] >= 0).all())
"""),
    _s("if_tensor", SYNCS, "if tensor:", f"""
def snippet(v2p, idx: {T}):
    if (v2p[idx] == -1).any():
        raise RuntimeError("double free")
"""),
    _s("while_tensor", SYNCS, "if tensor:", """
def snippet(v2p):
    while v2p[0] < 0:
        v2p[0] += 1
""", note="while tests bool() of the tensor each time round"),
    _s("assert_tensor", SYNCS, "if tensor:", f"""
def snippet(v2p, idx: {T}):
    assert (v2p[idx] != -1).all()
"""),
    _s("nonzero", SYNCS, "torch.nonzero", """
def snippet(v2p):
    return torch.nonzero(v2p >= 0)
"""),
    _s("nonzero_method", SYNCS, "torch.nonzero", """
def snippet(p2v):
    return (p2v[1:] != -1).nonzero()
"""),
    _s("where_one_arg", SYNCS, "torch.nonzero", """
def snippet(v2p):
    return torch.where(v2p == -1)
""", note="one-argument torch.where is nonzero(as_tuple=True)"),
    _s("unique", SYNCS, "torch.unique", f"""
def snippet(idx: {T}):
    return torch.unique(idx)
"""),
    _s("unique_consecutive_method", SYNCS, "torch.unique", f"""
def snippet(idx: {T}):
    return idx.unique_consecutive()
"""),
    _s("masked_select", SYNCS, "masked_select", f"""
def snippet(v2p, mask: {T}):
    return torch.masked_select(v2p, mask)
"""),
    _s("bool_mask_read", SYNCS, "boolean-mask indexing", """
def snippet(v2p):
    live = v2p[v2p >= 0]
    return live
"""),
    _s("bool_mask_read_named", SYNCS, "boolean-mask indexing", """
def snippet(p2v):
    bound = p2v != -1
    return p2v[bound]
"""),
    _s("bool_mask_store_device_value", SYNCS, "boolean-mask indexing", f"""
def snippet(v2p, p2v, mask: {T}):
    v2p[mask] = p2v[0]
""", note="a device 0-dim value misses the masked_fill fast path: index_put_ lowers the mask to nonzero() "
          "(the value comes from another table: v2p[0] would alias the destination, which CUDA refuses)"),
    _s("tensor_list_device", SYNCS, "torch.tensor(list, device=cuda)", """
def snippet(v2p):
    pages = torch.tensor([3, 5, 7], device=v2p.device)
    v2p.index_fill_(0, pages, -1)
"""),
    _s("tensor_scalar_device", SYNCS, "torch.tensor(list, device=cuda)", """
def snippet(v2p):
    return torch.tensor(-1, device=v2p.device)
"""),
    _s("tensor_then_to", SYNCS, "torch.tensor(list, device=cuda)", """
def snippet(v2p):
    pages = torch.tensor([3, 5, 7]).to(v2p.device)
    return v2p[pages]
"""),
    _s("host_index", SYNCS, OTHER, """
def snippet(v2p):
    return v2p[torch.tensor([3, 5, 7])]
""", note="a host index tensor is copied to the device before the gather"),
    _s("store_minus_one", SYNCS, "table[idx] = <python scalar>", f"""
def snippet(v2p, idx: {T}):
    v2p[idx] = -1
""", note="-1 parses as UnaryOp(USub, Constant(1))"),
    _s("store_unbind_pair", SYNCS, "table[idx] = <python scalar>", f"""
def snippet(v2p, p2v, idx: {T}):
    phys = v2p[idx]
    v2p[idx] = -1
    p2v[phys] = -1
    return phys
"""),
    _s("store_int_index", SYNCS, "table[idx] = <python scalar>", """
def snippet(v2p):
    v2p[3] = -1
""", note="an int index selects a 0-dim view; the 0-dim host value is copied into it"),
    _s("store_zero", SYNCS, "table[idx] = <python scalar>", f"""
def snippet(p2v, idx: {T}):
    p2v[idx] = 0
""", note="a plain Constant, not a unary minus"),
    _s("store_scalar_variable", SYNCS, "table[idx] = <python scalar>", f"""
def snippet(v2p, idx: {T}):
    tomb = -1
    v2p[idx] = tomb
""", tags=("variable right-hand side",)),
    _s("store_module_constant", SYNCS, "table[idx] = <python scalar>", f"""
TOMBSTONE = -1


def snippet(v2p, idx: {T}):
    v2p[idx] = TOMBSTONE
""", tags=("variable right-hand side",)),
    _s("store_alias_local", SYNCS, "table[idx] = <python scalar>", f"""
def snippet(v2p, idx: {T}):
    table = v2p
    table[idx] = -1
""", tags=("alias",)),
    _s("store_alias_tuple", SYNCS, "table[idx] = <python scalar>", f"""
def snippet(v2p, p2v, idx: {T}):
    fwd, back = v2p, p2v
    back[fwd[idx]] = -1
""", tags=("alias",)),
    _s("store_alias_helper", SYNCS, "table[idx] = <python scalar>", f"""
def _mark(table, rows, value):
    table[rows] = value


def snippet(v2p, idx: {T}):
    _mark(v2p, idx, -1)
""", note="the table and the scalar reach the store through a helper's parameters", tags=("alias",)),
    _s("store_host_tensor", SYNCS, "table[idx] = <python scalar>", f"""
def snippet(v2p, idx: {T}):
    v2p[idx] = torch.tensor(-1)
"""),
    _s("index_put_host_value", SYNCS, "table[idx] = <python scalar>", f"""
def snippet(v2p, idx: {T}):
    v2p.index_put_((idx,), torch.tensor(-1))
"""),
    _s("zero_dim_index", SYNCS, OTHER, f"""
def snippet(v2p, idx: {T}):
    return v2p[idx[0]]
""", note="ATen turns a 0-dim integer index into an int with .item()"),
    _s("factory_tensor_size", SYNCS, OTHER, """
def snippet(v2p, p2v):
    return torch.arange(p2v[0] + 3, device=v2p.device)
""", note="a tensor used as a size goes through __index__ / .item()"),
    _s("slice_tensor_bound", SYNCS, OTHER, f"""
def snippet(v2p, idx: {T}):
    return v2p[: idx[0]]
"""),
    _s("synchronize", SYNCS, "*.synchronize()", """
def snippet(v2p):
    torch.get_device_module(v2p.device).synchronize()
"""),
    _s("copy_into_host_buffer", SYNCS, ".cpu()", f"""
def snippet(v2p, idx: {T}):
    staging = torch.empty(3, dtype=torch.int64)
    staging.copy_(v2p[idx])
    return staging
""", note="a device→host copy spelled as copy_ into a host buffer"),
    _s("repeat_interleave", SYNCS, OTHER, f"""
def snippet(idx: {T}):
    return torch.repeat_interleave(idx, torch.ones_like(idx))
"""),
    _s("equal", SYNCS, OTHER, """
def snippet(v2p, p2v):
    return torch.equal(v2p, p2v)
"""),
    _s("fstring", SYNCS, ".tolist()", f"""
def snippet(idx: {T}):
    return f"freeing {{idx}}"
""", note="formatting reads the values back"),
    # --------------------------------------------------------------- forms that do not
    _s("index_fill", NO_SYNC, "index_fill_", f"""
def snippet(v2p, idx: {T}):
    v2p.index_fill_(0, idx, -1)
"""),
    _s("index_fill_unbind_pair", NO_SYNC, "index_fill_", f"""
def snippet(v2p, p2v, idx: {T}):
    phys = v2p[idx]
    v2p.index_fill_(0, idx, -1)
    p2v.index_fill_(0, phys, -1)
    return phys
"""),
    _s("index_fill_alias", NO_SYNC, "index_fill_", f"""
def snippet(v2p, idx: {T}):
    table = v2p
    table.index_fill_(0, idx, -1)
""", tags=("alias",)),
    _s("fill_whole_table", NO_SYNC, "slice fill_", """
def snippet(p2v):
    p2v.fill_(-1)
"""),
    _s("slice_fill", NO_SYNC, "slice fill_", """
def snippet(v2p):
    v2p[2:5].fill_(-1)
"""),
    _s("slice_store_scalar", NO_SYNC, "slice fill_", """
def snippet(v2p):
    v2p[2:5] = -1
""", note="a slice assignment of a scalar is a fill_ on a view", tags=("look-alike",)),
    _s("slice_store_one_row", NO_SYNC, "slice fill_", """
def snippet(v2p):
    v2p[3:4] = -1
""", note="a one-row slice is still a 1-D view, so fill_ (contrast store_int_index)", tags=("look-alike",)),
    _s("slice_store_alias", NO_SYNC, "slice fill_", """
def snippet(v2p):
    table = v2p
    table[1:4] = 0
""", tags=("alias", "look-alike")),
    _s("scatter_device_values", NO_SYNC, "device-valued scatters", f"""
def snippet(v2p, idx: {T}, vals: {T}):
    v2p[idx] = vals
""", tags=("variable right-hand side", "look-alike")),
    _s("scatter_full_like", NO_SYNC, "device-valued scatters", f"""
def snippet(v2p, idx: {T}):
    v2p[idx] = torch.full_like(idx, -1)
"""),
    _s("scatter_device_zero_dim", NO_SYNC, "device-valued scatters", f"""
def snippet(v2p, p2v, idx: {T}):
    v2p[idx] = p2v[0]
""", note="a 0-dim value already on the device needs no copy", tags=("look-alike",)),
    _s("index_copy", NO_SYNC, "device-valued scatters", f"""
def snippet(v2p, idx: {T}, vals: {T}):
    v2p.index_copy_(0, idx, vals)
"""),
    _s("scatter_scalar", NO_SYNC, "index_fill_", f"""
def snippet(v2p, idx: {T}):
    v2p.scatter_(0, idx, -1)
""", note="scatter_ with a Scalar value passes it as a kernel argument"),
    _s("masked_fill", NO_SYNC, "index_fill_", f"""
def snippet(v2p, mask: {T}):
    v2p.masked_fill_(mask, -1)
"""),
    _s("bool_mask_store_scalar", NO_SYNC, "boolean-mask indexing", f"""
def snippet(v2p, mask: {T}):
    v2p[mask] = -1
""", note="ATen lowers a one-element host value under a mask to masked_fill_ (canDispatchToMaskedFill)",
       tags=("look-alike",)),
    _s("where_three_args", NO_SYNC, "torch.nonzero", f"""
def snippet(v2p, mask: {T}):
    return torch.where(mask, -1, v2p)
""", tags=("look-alike",)),
    _s("nonzero_static", NO_SYNC, "torch.nonzero", f"""
def snippet(mask: {T}):
    return torch.nonzero_static(mask, size=4, fill_value=-1)
""", note="a fixed output size needs no count from the device", tags=("look-alike",)),
    _s("gather_int_index", NO_SYNC, "device-valued scatters", f"""
def snippet(v2p, idx: {T}):
    phys = v2p[idx]
    return phys
""", note="integer-tensor indexing is a gather"),
    _s("kernel_launch", NO_SYNC, "a kernel that stores the value itself", f"""
def snippet(v2p, idx: {T}):
    _tombstone_kernel[(1,)](v2p, idx, idx.numel(), BLOCK=8)
"""),
    _s("numel_guard", NO_SYNC, "numel/shape/len", f"""
def snippet(v2p, idx: {T}):
    if idx.numel() == 0:
        return None
    v2p.index_fill_(0, idx, -1)
"""),
    _s("shape_len_size", NO_SYNC, "numel/shape/len", f"""
def snippet(v2p, idx: {T}):
    n = len(idx) + idx.shape[0] + idx.size(0)
    return torch.arange(n, device=v2p.device)
"""),
    _s("int_of_numel", NO_SYNC, "numel/shape/len", f"""
def snippet(idx: {T}):
    return int(idx.numel())
""", tags=("look-alike",)),
    _s("and_tensor_last", NO_SYNC, "if tensor:", f"""
def snippet(v2p, idx: {T}):
    ok = idx.numel() > 0 and (v2p[idx] >= 0).all()
    return ok
""", note="`a and t` tests only a; the tensor t is returned, not tested", tags=("look-alike",)),
    _s("any_kept_on_device", NO_SYNC, "if tensor:", f"""
def snippet(v2p, idx: {T}):
    ok = (v2p[idx] >= 0).all()
    return ok
""", tags=("look-alike",)),
    _s("host_tensor_unused", NO_SYNC, "torch.tensor(list, device=cuda)", """
def snippet(v2p):
    offsets = torch.tensor([0, 1, 2])
    return offsets
""", note="a host tensor that never meets the device costs nothing", tags=("look-alike",)),
    _s("arange_device", NO_SYNC, "torch.tensor(list, device=cuda)", f"""
def snippet(v2p, idx: {T}):
    return torch.arange(idx.numel(), device=v2p.device)
""", tags=("look-alike",)),
    _s("cat_free_list", NO_SYNC, "numel/shape/len", f"""
def snippet(idx: {T}, vals: {T}):
    free_virtual = torch.cat((vals, idx))
    return free_virtual[: idx.numel()]
""", note="the allocator's free list grows with torch.cat; sizes come from numel"),
    _s("repeat_interleave_output_size", NO_SYNC, OTHER, f"""
def snippet(idx: {T}):
    return torch.repeat_interleave(idx, torch.ones_like(idx), output_size=idx.numel())
""", tags=("look-alike",)),
    _s("copy_device_to_device", NO_SYNC, "device-valued scatters", """
def snippet(v2p, p2v):
    p2v[1:4].copy_(v2p[1:4])
"""),
    _s("pages_of_run", NO_SYNC, "numel/shape/len", f"""
def snippet(v2p, idx: {T}):
    pages = torch.div(idx[::1], 1, rounding_mode="floor")
    v2p.index_fill_(0, pages, -1)
    return pages
"""),
)

# Written against the detectors' documented limits, not to pass them: each is realistic
# code where one detector is expected to be wrong. They keep the table honest.
ADVERSARIAL: tuple[Snippet, ...] = (
    _s("store_scalar_parameter", SYNCS, "table[idx] = <python scalar>", f"""
def snippet(v2p, idx: {T}, tomb):
    v2p[idx] = tomb
""", note="the scalar arrives through an unannotated parameter: statically unknown", tags=("adversarial",)),
    _s("table_in_container", SYNCS, "table[idx] = <python scalar>", f"""
def snippet(v2p, p2v, idx: {T}):
    tables = {{"fwd": v2p, "back": p2v}}
    tables["fwd"][idx] = -1
""", note="a table reached through a dict is not tracked statically", tags=("adversarial", "alias")),
    _s("tolist_via_getattr", SYNCS, ".tolist()", f"""
def snippet(idx: {T}):
    read = getattr(idx, "to" + "list")
    return read()
""", note="a method reached through getattr", tags=("adversarial",)),
    _s("tensor_from_local_helper", SYNCS, "int()/float()/bool() of a tensor", """
def _live_count(table):
    return (table >= 0).sum()


def snippet(v2p):
    return int(_live_count(v2p))
""", note="the tensor comes back from a helper: its return type is not inferred", tags=("adversarial",)),
    _s("list_named_like_table", NO_SYNC, "table[idx] = <python scalar>", """
def snippet(v2p):
    v2p_ids = [0, 1, 2]
    v2p_ids[0] = -1
    return v2p_ids
""", note="a Python list whose name contains v2p", tags=("adversarial", "look-alike")),
    _s("host_scalar_item", NO_SYNC, ".item()", """
def snippet(v2p):
    budget = torch.tensor(5, device="cpu")
    return budget.item()
""", note="a host tensor's .item() reads host memory", tags=("adversarial", "look-alike")),
)

ALL_SNIPPETS: tuple[Snippet, ...] = SNIPPETS + ADVERSARIAL
BY_NAME = {s.name: s for s in ALL_SNIPPETS}
assert len(BY_NAME) == len(ALL_SNIPPETS), "snippet names must be unique"
