"""The production track's parts: kernel-level ops at the sizes where grid, stride and tail bugs live.

- ``arith``: integer hashing and affine id slices, exact on CPU and GPU;
- ``limits``: how big the generator goes per device;
- ``ops``: the ``p_*`` op records (SPEC §2 on raw tables, generative);
- ``graph``: ``g_read_table``, CUDA-graph capture and replay (emulated on the CPU);
- ``hostile``: the probes of SPEC §2's memory-safety promises (``p_free_unbind_any``,
  ``p_read_table_overflow``, ``p_read_table_packed_disagree``), memory judged only;
- ``compare``: results against the oracle, on the device;
- ``run``: ``ScaleRun``, both sides' state and the checks;
- ``generator``: the op stream of a seed, sizes at the kernel set's boundaries.

``tracks.production`` puts them behind the track protocol. May import the engine's leaf
modules (``ops``, ``verdict``, ``memory``, ``boundary``, ``knobs``, ``vector_oracle``),
never the runner of the small track, the campaign or the tracks.
"""
