"""Client adapters: real inference servers' kernels as kvfuzz kernel sets.

A client adapter is a kernel set (docs/kernel-sets.md) whose functions are a server's own
kernels, loaded from that server's installed distribution and called as the server calls
them; where the server's signatures differ from the kernel-set contract, the adapter maps
them and its docstring says how. The server is not a dependency of kvfuzz: an adapter
raises ``SetupError`` (exit 2, with the install command) when it is not installed.

- ``sglang`` (``--kernels kvfuzz-sglang``): SGLang's unified-pool page-table kernels
  (docs/sglang.md).
- ``loader``: finding a distribution's files and executing only those, never the
  server's top-level package (which imports its whole runtime).
"""
