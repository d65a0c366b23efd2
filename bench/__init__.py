"""CaseHub benchmarks: run with ``python -m bench`` (``make bench``)."""
