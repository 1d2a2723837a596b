"""Compile checks: every Triton kernel of a set compiled for a GPU target, without a GPU.

A kernel the interpreter runs can still fail to compile: Triton specializes an int argument
equal to 1 into a constant and marks one divisible by 16, and code that is fine on the
interpreter's tensors (``n.to(tl.int64)``) breaks on a Python int. The ``compile`` track
(``tracks/compile.py``) finds that on the CPU:

* ``learn``: in the worker, the set's functions run a few small sequences (interpreter or
  GPU) while one observer (``launches.observe``) digests every launch into what the
  launcher would specialize: each parameter's kind (pointer and its dtype, int, fixed
  scalar, constexpr and its value), the launch options, per distinct shape. From that come
  the ``c_compile`` ops (``ops``): each kernel at its ints' base types, with every
  specializable int equal to 1, and with every int and pointer divisible by 16.
* ``child``: a process without ``TRITON_INTERPRET`` that imports the set, finds each
  kernel's ``JITFunction`` and runs ``triton.compile(ASTSource(...), target=GPUTarget)``;
  results are cached per (kernel source hash, specialization).
* ``client``: the worker's side of that process (start, probe, requests, a death or a hang
  of the compiler is a verdict too) and ``CompileRun``, the runner: a failed screen
  (``n,v2p_len==1``) is narrowed to the one argument that breaks it (``n==1``), and the
  case names it: ``c_compile/compile/_k_free_wide@n==1``.
"""
