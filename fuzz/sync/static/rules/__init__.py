"""The rule families, one module each; the registry (``..registry``) reads them from here.

Adding a rule: declare a ``Rule`` record in the family it belongs to (or a new family
module, listed below) and report it from that family's hooks. The docs table, ``--help``,
``--list-rules`` and SARIF's rule metadata follow from the record.
"""

from __future__ import annotations

from . import data_dependent, host_reads, pragmas, transfers, waits

FAMILIES = (host_reads.FAMILY, data_dependent.FAMILY, transfers.FAMILY, waits.FAMILY, pragmas.FAMILY)
