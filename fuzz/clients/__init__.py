"""Client adapters: real inference servers' kernels as kvfuzz kernel sets, and their
allocators behind kvfuzz's allocator protocol.

A client adapter is a kernel set (docs/kernel-sets.md) whose functions are a server's own
kernels, loaded from that server's installed distribution and called as the server calls
them; where the server's signatures differ from the kernel-set contract, the adapter maps
them and its docstring says how. The server is not a dependency of kvfuzz: an adapter
raises ``SetupError`` (exit 2, with the install command) when it is not installed.

- ``sglang`` (``--kernels kvfuzz-sglang``): SGLang's unified-pool page-table kernels
  (docs/sglang.md).
- ``sglang_allocator`` (``--allocator kvfuzz-sglang``): SGLang's ``MultiEndedAllocator``,
  executed from its installed file (docs/sglang.md); ``sglang_mutants``, its planted bugs;
  ``sglang_files``, which SGLang it runs (for case files, without executing it).
- ``loader``: finding a distribution's files and executing only those, never the
  server's top-level package (which imports its whole runtime).
"""
