"""kvfuzz's harness, grouped by job: ``engine`` (op language, generators, differential
runner and oracles, minimizer, case files, campaign), ``sync`` (host-sync checks),
``tools`` (mutants, benchmarks, exports), ``clients`` (real servers' kernels as kernel
sets: SGLang), and the ``kvfuzz`` CLI (``cli``) on top.

Layering: ``engine`` and ``sync`` import ``kvref``, ``kvkernels``, torch and
hypothesis; ``tools`` and ``clients`` may import the engine; only ``cli`` imports ``tools``.
"""
