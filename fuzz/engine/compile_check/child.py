"""The compile child: a process without ``TRITON_INTERPRET`` that compiles a set's kernels.

``python -m fuzz.engine.compile_check.child FD``: requests are JSON lines on stdin, each
answered by one JSON line on file descriptor ``FD`` (stdout is sent to stderr first, so
whatever a kernel set prints never mixes into the answers). Requests:

* ``{"op": "probe", "kernels", "target", "find": [[kernel, file], ...]}``: load the set
  (``tiers.load_kernels``, so a file, a module or a client's short name), compile a probe
  kernel of our own for the target (a machine that cannot compile for it is a setup error,
  not a finding about the set), and say which of the kernels named it cannot find.
* ``{"op": "compile", "kernels", "kernel", "file", "signature", "constexprs", "attrs",
  "options", "target"}``: ``triton.compile(ASTSource(fn, signature, constexprs, attrs),
  target=GPUTarget(...), options=...)``, as ``JITFunction.run`` would for that
  specialization (constexprs and attributes keyed by parameter index paths, the form every
  Triton from 3.3 on takes). Answers ``{"ok", "error", "message", "seconds", "cached"}``;
  results are cached per (the kernel's source hash with its dependencies, the request).

The child exits when its stdin closes or its parent goes away (a worker killed mid-compile
leaves no compiler behind).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

MESSAGE_CHARS = 4000


def _watch_parent() -> None:
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _message(exc: BaseException) -> tuple[str, str]:
    """(the whole message, capped; its last line: for a CompilationError, the cause)."""
    text = str(exc) or repr(exc)
    lines = [line for line in text.splitlines() if line.strip()]
    return text[-MESSAGE_CHARS:], (lines[-1].strip() if lines else type(exc).__name__)


def jit_index() -> dict:
    """Every JITFunction this process holds (whatever holds it: a set's imports made them), by
    (qualname, file name) and by (qualname, "")."""
    from triton.runtime.jit import JITFunction

    index: dict[tuple[str, str], object] = {}
    with warnings.catch_warnings():  # isinstance on some lazy objects warns (torch's deprecated aliases)
        warnings.simplefilter("ignore")
        found = [obj for obj in gc.get_objects() if isinstance(obj, JITFunction)]
    for obj in found:
        code = getattr(obj.fn, "__code__", None)
        if code is not None:
            index.setdefault((obj.fn.__qualname__, Path(code.co_filename).name), obj)
            index.setdefault((obj.fn.__qualname__, ""), obj)
    return index


class Server:
    def __init__(self):
        self.sets: dict[str, object] = {}
        self.index: dict[str, dict[tuple[str, str], object]] = {}
        self.cache: dict[tuple, dict] = {}
        self.probed: dict[str, dict] = {}

    # ---- the kernel set and its kernels --------------------------------------------------------
    def load(self, kernels: str) -> None:
        if kernels in self.sets:
            return
        from fuzz.engine.tiers import load_kernels

        self.sets[kernels] = load_kernels(kernels)
        self.index[kernels] = jit_index()

    def find(self, kernels: str, kernel: str, file: str):
        self.load(kernels)
        return self.index[kernels].get((kernel, file))

    # ---- compiling ----------------------------------------------------------------------------------
    @staticmethod
    def _target(spec):
        from triton.backends.compiler import GPUTarget

        backend, arch, warp = spec
        return GPUTarget(backend, arch, warp)

    @staticmethod
    def _value(text):
        import ast

        if isinstance(text, str) and text.startswith("tl."):
            import triton.language as tl

            return getattr(tl, text[3:])
        return ast.literal_eval(text)

    def _compile(self, fn, signature: dict, constexprs: dict, attrs: list, options: dict, target) -> None:
        import triton
        from triton.compiler import ASTSource

        names = list(getattr(fn, "arg_names", None) or [p.name for p in fn.params])
        divisible = [["tt.divisibility", 16]]
        try:
            from triton.compiler.compiler import make_backend

            divisible = make_backend(target).parse_attr("D")
        except (ImportError, AttributeError):
            pass
        src = ASTSource(fn=fn, signature=dict(signature),
                        constexprs={(names.index(n),): self._value(v) for n, v in constexprs.items()},
                        attrs={(names.index(n),): divisible for n in attrs})
        triton.compile(src, target=target, options=dict(options) or None)

    def probe(self, req: dict) -> dict:
        key = json.dumps(req["target"])
        if key not in self.probed:
            try:
                from . import probe_kernel as pk

                self._compile(pk.kvfuzz_probe, pk.SIGNATURE, pk.CONSTEXPRS, pk.ATTRS, {}, self._target(req["target"]))
                self.probed[key] = {"ok": True}
            except Exception as exc:  # noqa: BLE001 - this machine cannot compile for the target
                self.probed[key] = {"setup": f"cannot compile Triton kernels for {':'.join(map(str, req['target']))} "
                                             f"here: {type(exc).__name__}: {_message(exc)[1]}"}
        if "setup" in self.probed[key]:
            return self.probed[key]
        self.load(req["kernels"])
        missing = [f"{k} ({f})" for k, f in req.get("find", ()) if self.find(req["kernels"], k, f) is None]
        return {"ok": True, "missing": missing}

    def compile(self, req: dict) -> dict:
        fn = self.find(req["kernels"], req["kernel"], req.get("file", ""))
        if fn is None:
            return {"missing": f"no @triton.jit kernel {req['kernel']} ({req.get('file') or 'any file'}) in "
                               f"--kernels {req['kernels']} after importing it"}
        source = getattr(fn, "cache_key", None) or getattr(fn, "src", "")
        key = (source, json.dumps({k: v for k, v in req.items() if k != "kernels"}, sort_keys=True))
        if key in self.cache:
            return {**self.cache[key], "cached": True}
        start = time.perf_counter()
        try:
            self._compile(fn, req["signature"], req["constexprs"], req["attrs"], req["options"],
                          self._target(req["target"]))
            result = {"ok": True}
        except Exception as exc:  # noqa: BLE001 - whatever stops the compiler is the verdict
            message, last = _message(exc)
            result = {"ok": False, "error": type(exc).__name__, "message": message, "last": last}
        result["seconds"] = round(time.perf_counter() - start, 3)
        self.cache[key] = result
        return {**result, "cached": False}

    def handle(self, req: dict) -> dict:
        from fuzz.engine.tiers import SetupError

        try:
            return self.probe(req) if req.get("op") == "probe" else self.compile(req)
        except SetupError as exc:
            return {"setup": str(exc)}


def main(argv: list[str]) -> int:
    out = os.fdopen(int(argv[1]), "w", buffering=1)
    os.dup2(2, 1)  # the kernel set's prints go to the log, never into the answers
    sys.stdout = sys.stderr
    _watch_parent()
    if os.environ.get("TRITON_INTERPRET") == "1":
        out.write(json.dumps({"setup": "the compile child runs with TRITON_INTERPRET=1 (its parent did not unset it)"})
                  + "\n")
        return 2
    server = Server()
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0
        try:
            answer = server.handle(json.loads(line))
        except Exception:  # noqa: BLE001 - our own bug: said, not swallowed
            answer = {"harness": traceback.format_exc()}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
