"""The rule families, one module each; the registry (``..registry``) collects them by name.

Adding a rule: declare a ``Rule`` record (``..records``) in the family it belongs to
(or in a new family module, then listed in ``registry.FAMILIES``) and report it from
that family's hooks. The docs table, ``--help``, ``--list-rules`` and SARIF's rule
metadata follow from the record. The family modules import only ``..records`` and
``..vocab``: never the registry, which sits above them.
"""
