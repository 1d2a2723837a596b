"""Tools built on the engine: the mutant catalogue (``mutants``), the benchmarks
(``bench``, ``bench_kernels``), exports (``pytest_export``), merging shards and nights
(``merge``, ``baseline``) and the morning page (``morning``: a night read by ``night``, the
nights before it by ``nights``, drawn by ``page`` with ``svg``).

May import ``fuzz.engine``, ``kvkernels``, ``kvref``, torch; imported only by the CLI
(never by the engine). Modules that import Triton are imported after the CLI has chosen
the backend.
"""
