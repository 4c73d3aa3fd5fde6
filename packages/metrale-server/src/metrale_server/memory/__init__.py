"""Memory: the preflight plan, the allocation ledger, host readings, the ``/memory`` report."""
