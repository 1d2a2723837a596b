"""Tools built on the engine: the mutant catalogue (``mutants``), the benchmarks
(``bench``, ``bench_kernels``) and exports (``pytest_export``).

May import ``fuzz.engine``, ``kvkernels``, ``kvref``, torch; imported only by the CLI
(never by the engine). Modules that import Triton are imported after the CLI has chosen
the backend.
"""
