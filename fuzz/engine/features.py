"""Features: what a sequence made the code under test do, as plain integers in named domains.

The model is libFuzzer's ``InputCorpus`` and Centipede's ``feature.h``: a feature is an
integer whose top bits name its domain (``DOMAINS``) and whose low bits hash a key within
it, so one set type serves code coverage and value features alike, and a corpus keeps an
input for the features it alone reaches. Names (``"trips|read_table_kernel|3+|partial"``)
are kept beside the integers only so that a report can say what was never reached; the
integer of a name is a stable hash (``feature_id``), the same in every process.

Two sources, both collected per sequence (``Collector``):

* **Value features**, from the one launch hook (``launches.observe``): per launch, the
  grid's size per dimension (log buckets), for each size argument (``SIZES``) against each ``*BLOCK*`` constexpr whether the last program's block is full, partial or empty and how far the
  size is from a block boundary (log buckets), how far each int argument and each
  tensor's extent is from the int32 boundary (log buckets, near ones only), and for
  read-table launches (a ``seq_lens`` argument and a ``BLOCK``) the loop trips each
  program makes, bucketed 0/1/2/3/4-7/8+, with whether its last trip's block is partial,
  and the **stepping stones** to the next bucket (``progress``, libFuzzer's value profile:
  a comparison's distance as a feature): how many pages short of one more trip a program
  is (1, 2, 3-4, 5-8, ...) and its row's length in half strides, so a row one page short of
  a third trip is kept before the third trip is reached, and its mutations try from there;
  only **within reach** (at most one block and ``REACH`` pages short): a row hundreds of
  pages short of a 512-page block's second trip is no stone, and such buckets flooded the
  progress domain (benchmarks/results/guided-vs-blind/stones-and-resizes.md).
  Trips are computed from the sizes the launch was given (``seq_lens``, ``max_pages`` /
  ``max_tokens``, ``col_stride``), the way the kernel's while loop counts them, so they are
  the same on every tier; ``seq_lens`` is read only where it lives on the CPU (reading a
  GPU tensor would synchronise, and inside a graph capture would break it).
* **Code coverage** (``CodeCoverage``): branch arcs of the files under test, through
  ``coverage``'s C tracer (Python 3.11 has no ``sys.monitoring``): the kernel set's own
  files (on the interpreter its ``@triton.jit`` bodies run as Python there, so their lines
  and branches count), the allocator's and kvref's allocator (fast vs slow alloc path,
  holes taken, pending moved, refusals). Measured once per sequence (start, stop, read),
  never per op; its per-op cost is the tracer's (``benchmarks/guided_vs_blind.py``).

Plus the run's own counts (op kinds run, hostile classes probed), what a chain of pools did
(``chain``: which rung of the relief ladder ran and the gate it met, the gate at each flush,
the frontier distance after each alloc and flush, from the spec's ``Chain.feature_log``, so
the same on every tier), and what it ran under
(``config_features``: scenario, page size, growth, launch knobs).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import zlib
from pathlib import Path
from typing import NamedTuple, Sequence

from . import spec_features
from .signatures import by_name, int_constexprs, kernel_name
from .spec_features import REACH, derived_trips, log_bucket, program_trips, trip_bucket  # noqa: F401 - REACH and trip_bucket: imported from here

DOMAINS = ("code", "grid", "mask", "block_dist", "i32_dist", "trips", "hostile", "op", "config", "progress", "chain",
           "spec", "start")  # new domains go last: a feature's integer holds its domain's index
_DOMAIN_BITS = 40
_IDS: dict[str, int] = {}
TRIP_BUCKETS = ("0", "1", "2", "3+")  # what the report expects every read-table kernel to reach
MASKS = ("full", "partial", "empty")
INT32 = 1 << 31
SIZES = ("N", "n", "n_elements", "max_pages", "max_tokens")  # int arguments a block's mask is measured against


def feature_id(name: str) -> int:
    """The integer of a feature name ``DOMAIN|key...``: the domain's index in the top bits, a
    crc32 of the name below (stable across processes, unlike ``hash``)."""
    fid = _IDS.get(name)
    if fid is None:
        domain = name.split("|", 1)[0]
        fid = _IDS[name] = (DOMAINS.index(domain) << _DOMAIN_BITS) | zlib.crc32(name.encode())
    return fid


def domain_of(fid: int) -> str:
    return DOMAINS[fid >> _DOMAIN_BITS]


def config_features(config, scenario: str, knobs: dict | None) -> set[str]:
    """What a sequence ran under, as features: its scenario, page size, growth direction, laziness
    and launch knobs. Not reached by the code but chosen before it; as features they make the
    rarity schedule spread over them (a corpus grown from its first few entries keeps their
    scenario and knobs otherwise: long rows come from the ``long`` scenario, second trips
    only from small blocks)."""
    out = {f"config|scenario|{scenario}", f"config|page_size|{config.page_size}", f"config|grow|{config.grow}",
           f"config|lazy|{config.lazy}"}
    if knobs:
        out.add(knobs_feature(knobs))
    return out


def knobs_feature(knobs: dict) -> str:
    """The feature of a sequence's launch knobs (one per combination)."""
    return "config|knobs|" + ",".join(f"{k}={v}" for k, v in sorted(knobs.items()))


def _is_tensor(v) -> bool:
    return hasattr(v, "data_ptr") and hasattr(v, "numel")


_MEMO: dict[tuple, object] = {}  # (kernel id, grid, int arguments) -> its _Entry; (kernel, size argument, blocks, remainders) -> features
MEMO_MAX = 1 << 15  # keys kept (then the memo starts again)
_SERIAL = itertools.count()  # each entry's number: a collector skips the names of an entry it has taken
_HOST_ROWS: dict[int, Sequence[int]] = {}  # a device tensor's data_ptr -> the host values copied into it


def host_copy(tensor, values: Sequence[int]) -> None:
    """Note that ``tensor`` (on a GPU) holds ``values``, copied there from the host, so that a read
    table launched on it has its trips features without a read of the device (``_extras``): the
    runner notes each read-table op's ``seq_lens`` (``PoolRun.batch``), and the next op's replace them."""
    _HOST_ROWS.clear()
    _HOST_ROWS[tensor.data_ptr()] = values


def _host_rows(v) -> Sequence[int] | None:
    """The row lengths of a read table's ``seq_lens`` argument: a CPU tensor's, or a GPU tensor's
    that ``host_copy`` noted (the same pointer and size); None otherwise (not read from the device)."""
    if getattr(v, "is_cpu", True):
        return v.tolist() if hasattr(v, "tolist") else None
    got = _HOST_ROWS.get(v.data_ptr())
    return got if got is not None and len(got) == v.numel() else None


class _Entry(NamedTuple):
    """What a launch's features are, but for what is read from the launch every time (``_extras``)."""

    names: tuple  # its grid's and int arguments' features
    tensors: tuple  # the positions or kwargs that hold a tensor
    params: dict  # position or kwarg -> parameter name
    lens: int | str | None  # where a read table's row lengths are (its trips are read); None: not a read table
    kernel: str
    constexprs: dict  # int constexprs by name
    fn: object  # the kernel (the memo keys it by id)
    serial: int


def launch_features(launch, out: set[str], goals: dict | None = None) -> None:
    """Add the value features of one launch (``launches.Launch``, or a launch's kernel, arguments
    and grid dims alike) to ``out`` (names); ``goals`` (``_trip_features``): for its trip features,
    the row that reached them."""
    dims = launch.grid_dims or ()
    got = _entry(launch.fn, launch.args, launch.kwargs, dims)
    out.update(got.names)
    _extras(got, launch.args, launch.kwargs, dims, out, goals)


@functools.lru_cache(maxsize=1)
def _constexpr_type():
    """``triton.language.constexpr`` (a launch has imported Triton), or None without Triton."""
    try:
        from triton.language import constexpr
    except ImportError:
        return None
    return constexpr


def _entry(fn, args, kwargs, dims: tuple) -> _Entry:
    """A launch's ``_MEMO`` entry: its features but the trips are a function of the kernel, the
    grid and the int arguments (constexprs among them; a wrapped ``tl.constexpr`` by its value),
    so a launch hook pays one key and one lookup, and a new key is built from the kernel's
    parameters and per-argument memos, no launch described. The key holds the kernel's ``id``,
    checked against the entry's kernel: a ``JITFunction`` hashes its source's hash under a lock.
    An int is ``type(v) is int`` (a bool or an ``IntEnum`` is not a size)."""
    cx = _constexpr_type()
    key = (id(fn), dims, tuple([v if type(v) is int else v.value if type(v) is cx else None for v in args]),
           tuple([kv for kv in kwargs.items() if type(kv[1]) is int]) if kwargs else ())
    got = _MEMO.get(key)
    if got is None or got.fn is not fn:
        if len(_MEMO) >= MEMO_MAX:
            _MEMO.clear()
        got = _MEMO[key] = _launch_entry(fn, args, kwargs, dims)
    return got


def _extras(got: _Entry, args, kwargs, dims: tuple, out: set[str], goals: dict | None) -> None:
    """What a launch adds to its entry's features, read from it every time: a tensor's size near
    int32's, and a read table's trips where its row lengths are on the CPU."""
    for i in got.tensors:
        v = args[i] if type(i) is int else kwargs.get(i)
        try:
            n = v.numel()
        except (AttributeError, TypeError):  # not a tensor in this launch
            continue
        if INT32 - n < (1 << 20):
            out.add(f"i32_dist|{got.kernel}|{got.params[i]}.numel|{log_bucket(INT32 - n)}")
    if got.lens is not None:
        v = args[got.lens] if type(got.lens) is int else kwargs.get(got.lens)
        rows = None
        with contextlib.suppress(Exception):
            rows = _host_rows(v)  # a GPU tensor's rows are never read from the device
        if rows is not None:
            values = by_name(getattr(got.fn, "fn", got.fn), args, kwargs)
            _trip_features(got.kernel, values, rows, got.constexprs, dims, out, {} if goals is None else goals)


def _launch_entry(fn, args, kwargs, dims: tuple) -> _Entry:
    """``_MEMO``'s entry for a launch (``_Entry``), from the kernel's parameters and the arguments."""
    pyfn, kernel = getattr(fn, "fn", fn), kernel_name(fn)
    values, constexprs = by_name(pyfn, args, kwargs), int_constexprs(pyfn, args, kwargs)
    names = [f"grid|{kernel}|dim{i}|{log_bucket(d)}" for i, d in enumerate(dims)]
    blocks = tuple((k, v) for k, v in constexprs.items() if "BLOCK" in k and v > 0)
    position = {name: i for i, name in enumerate(list(values)[: len(args)])}
    tensors, params = [], {}
    for name, v in values.items():
        if type(v) is int:
            if name in constexprs:
                continue
            if INT32 - abs(v) < (1 << 20):
                names.append(f"i32_dist|{kernel}|{name}|{log_bucket(INT32 - abs(v))}")
            if name in SIZES and blocks:  # a stride or a row count: its remainder by a block means nothing
                rems = None if v <= 0 else tuple([v % b for _, b in blocks])
                if (feats := _MEMO.get(k := (kernel, name, blocks, rems))) is None:
                    feats = _MEMO[k] = tuple(_size_features(kernel, name, rems, blocks))
                names += feats
        elif _is_tensor(v):
            slot = position.get(name, name)
            tensors.append(slot)
            params[slot] = name
    reads = "seq_lens_ptr" in values and "col_stride" in values and len(dims) >= 2 and constexprs.get("BLOCK", 0) > 0
    lens = position.get("seq_lens_ptr", "seq_lens_ptr") if reads else None
    return _Entry(tuple(names), tuple(tensors), params, lens, kernel, constexprs, fn, next(_SERIAL))


def _size_features(kernel: str, name: str, rems: tuple | None, blocks: tuple) -> list[str]:
    """A size argument's (``SIZES``) last block against each ``*BLOCK*`` constexpr (full, partial
    or empty) and how far from a block boundary (log buckets), from its remainders by the blocks
    (None: not positive)."""
    out = []
    for j, (b_name, b) in enumerate(blocks):
        rem = 0 if rems is None else rems[j]
        mask = "empty" if rems is None else "full" if rem == 0 else "partial"
        out.append(f"mask|{kernel}|{name}/{b_name}|{mask}")
        if rems is not None:
            out.append(f"block_dist|{kernel}|{name}/{b_name}|{log_bucket(min(rem, b - rem))}")
    return out


def _trip_features(kernel: str, values: dict, rows: Sequence[int], constexprs: dict, grid: tuple, out: set[str],
                   goals: dict) -> None:
    """Trips of each program (b, j) of a read table's strided loop: ``start = j * BLOCK``, then
    ``start += col_stride`` while ``start < n`` (a kernel without ``col_stride``, the legacy
    grid, makes one trip by construction: its masks say the rest), where n is the row's live
    pages (``max_pages``: cdiv(seq_len, PAGE_SIZE), capped) or tokens (``max_tokens``).
    ``goals[name] = [n, short, BLOCK, trips, stride]`` for each trips and progress feature (its
    first row): the comparison's operands (libFuzzer's CMP tracing), so a mutation can set the row
    that reached a stone to the length of one more trip, or of the same trips with the other last
    block (``mutations.row_target``), instead of stepping towards it blind."""
    block, ps = constexprs["BLOCK"], constexprs.get("PAGE_SIZE", 1)
    stride = values["col_stride"]
    step = stride * max(1, constexprs.get("UNROLL", 1))
    cap = values.get("max_pages", values.get("max_tokens"))
    per_page = "max_pages" in values
    with contextlib.suppress(Exception):
        for seq in rows[: grid[0]]:
            n = -(-max(int(seq), 0) // ps) if per_page else max(int(seq), 0)
            if isinstance(cap, int):
                n = min(n, cap)
            for j in range(grid[1]):
                program_trips(kernel, n, j * block, block, step, out, goals)


class CodeCoverage:
    """Branch arcs of ``files`` (absolute paths of the code under test), per sequence, through
    one ``coverage.Coverage`` that is started and stopped around each sequence; None of it
    when ``coverage`` is missing (the value features still work)."""

    def __init__(self, files, trace_kernels: bool = False):
        self.trace_kernels = trace_kernels
        self.files = sorted({str(Path(f).resolve()) for f in files})
        self._cov = None
        with contextlib.suppress(ImportError):
            import coverage

            self._cov = coverage.Coverage(data_file=None, branch=True, include=self.files, config_file=False)

    @property
    def available(self) -> bool:
        return self._cov is not None

    def start(self) -> None:
        if self._cov is not None:
            self._cov.erase()
            self._cov.start()

    def stop(self, out: set[str]) -> None:
        """Stop measuring; add ``code|FILE|FROM>TO`` for every arc run (FILE relative to its folder's parent)."""
        if self._cov is None:
            return
        self._cov.stop()
        data = self._cov.get_data()
        for f in data.measured_files():
            short = "/".join(Path(f).parts[-2:])
            for a, b in data.arcs(f) or ():
                out.add(f"code|{short}|{a}>{b}")


def files_under_test(tier) -> list[str]:
    """The files whose branches count: the kernel set's (its package's .py files, or its file;
    the files it names as ``KVFUZZ_SOURCES`` instead: an adapter over code executed from elsewhere),
    the allocator's (``allocators.Protocol.sources``: the team's allocator, never kvfuzz's adapter
    around it), and kvref's allocator (the spec's branches)."""
    import kvref.allocator as spec_alloc

    from .allocators import protocol_of

    files = {spec_alloc.__file__, *protocol_of(tier).sources}
    named = getattr(tier.kernels, "KVFUZZ_SOURCES", None)
    if named:
        return sorted(files | set(named))
    for mod in (tier.kernels, getattr(tier.kernels, "launchers", None), getattr(tier.kernels, "_k", None)):
        path = getattr(mod, "__file__", None)
        if not path:
            continue
        p = Path(path)
        files |= {str(x) for x in p.parent.glob("*.py")} if p.name == "__init__.py" else {str(p)}
    return sorted(files)


class Collector:
    """The features of one sequence: enter it around the sequence, then ``add_run(run)`` for
    the runner's own counts; ``names`` holds what it saw, ``ids()`` the integers."""

    def __init__(self, code: CodeCoverage | None = None, deferred: bool = False):
        self.code = code
        self.names: set[str] = set()
        self.op = -1  # the op running now (``at``), -1 before the first
        self.where: dict[str, int] = {}  # a value feature -> the op that first reached it
        self.goals: dict[str, list] = {}  # a trip feature -> [row length, short of one more trip, BLOCK, trips, stride]
        self.programs = 0  # programs launched (the grids' sizes): what the sequence cost on the interpreter
        self.log: list | None = None  # while a list: each launch's (programs, features, goals), for ``take``
        self._taken: set[int] = set()  # the memo entries (serials) whose names are in ``names``
        # deferred: a light launch is kept (its kernel, arguments and dims) and its features made at the
        # op's end (``flush``), where the launches of an op run one after another with their code warm
        # (inside a sequence each launch met the collector cold: 18.6 us a call against 5 in a loop, on
        # the H200's host). Only where no launch argument is read later than its launch could change it:
        # the CUDA tier, whose row lengths are on the GPU and never read (``_extras``).
        self._pending: list | None = [] if deferred else None

    def at(self, marks: list, pos: int) -> None:
        """The next op begins (its draws at ``pos`` of the stream, appended to ``marks``)."""
        self.flush()
        spec_features.end_op()
        marks.append(pos)
        self.op += 1

    def flush(self) -> None:
        """Make the features of the launches kept so far (a deferred collector's), as at the op
        that ran them."""
        pending = self._pending
        if pending:
            self._pending = []
            for fn, args, kwargs, dims in pending:
                self._one(fn, args, kwargs, dims, counted=True)

    def __call__(self, launch) -> None:
        self._one(launch.fn, launch.args, launch.kwargs, launch.grid_dims or ())

    def light(self, fn, args, kwargs, dims) -> None:
        """A launch as ``launches._run_light`` hands it: its kernel, arguments (kwargs as passed) and
        grid's dims as Triton resolved them, no ``Launch`` built."""
        dims = () if dims is None else dims if type(dims) is tuple else tuple(dims)
        if type(math.prod(dims)) is not int:  # dims a launcher gave as tensors or numpy ints
            try:
                dims = tuple(int(d) for d in dims)
            except Exception:  # unreadable: no grid features, no programs
                dims = ()
        if self._pending is not None:
            self.programs += math.prod(dims)  # now: a fresh sequence's launch budget reads it at the next launch
            self._pending.append((fn, args, kwargs, dims))
            return
        self._one(fn, args, kwargs, dims)

    def _one(self, fn, args, kwargs, dims: tuple, counted: bool = False) -> None:
        """One launch: its entry's names unless this sequence took them already (the hook's common
        case, a shape met before), then its extras (``_extras``); ``counted``: its programs are."""
        new: set[str] = set()
        goals: dict[str, list] = {}
        try:
            got = _entry(fn, args, kwargs, dims)
            if self.log is not None or got.serial not in self._taken:
                new.update(got.names)
            _extras(got, args, kwargs, dims, new, goals)
            if got.lens is None:  # a kernel whose parameters say nothing: its trips from the op and its grid
                derived_trips(got.kernel, got.constexprs, dims, new, goals)
        except Exception:  # a launch shape we cannot read adds nothing, never fails a run
            got = None
        programs = math.prod(dims)
        if self.log is not None:
            self.log.append((programs, frozenset(new), {k: tuple(v) for k, v in goals.items()}))
        self.take(0 if counted else programs, new, goals)
        if got is not None:
            self._taken.add(got.serial)

    def take(self, programs: int, new, goals: dict) -> None:
        """One launch's programs and value features (its trip features' ``goals``), as at the op
        running now: a launch seen, or one of a known read's replayed (``guide.KnownReads``)."""
        self.programs += programs
        if new and (fresh := new - self.names):
            for name in fresh:
                self.where[name] = self.op
                if name in goals:
                    self.goals[name] = list(goals[name])
            self.names |= fresh

    def __enter__(self):
        from .launches import observe, untraced_launches

        self._stop = observe(self)
        spec_features.ACTIVE.append(self)
        self._untraced = contextlib.ExitStack()
        if self.code is not None:
            if not self.code.trace_kernels:
                self._untraced.enter_context(untraced_launches())
            self.code.start()
        return self

    def __exit__(self, *exc):
        self._stop()
        self.flush()
        with contextlib.suppress(ValueError):
            spec_features.ACTIVE.remove(self)
        spec_features.end_op()
        if self.code is not None:
            self.code.stop(self.names)
        self._untraced.close()

    def add_run(self, run) -> None:
        stats = getattr(run, "stats", None)
        for kind in getattr(stats, "by_kind", {}) or {}:
            self.names.add(f"op|{kind}")
        for cls in getattr(stats, "hostile", {}) or {}:
            self.names.add(f"hostile|{cls}")
        chain = getattr(getattr(run, "spec", None), "chain", None)
        if chain is not None:  # what a chain did (kvref.chain: the ladder's rung, gates at flushes, frontiers)
            self.names.update(f"chain|{event}" for event in chain.feature_log)

    def ids(self) -> set[int]:
        return {feature_id(n) for n in self.names}
