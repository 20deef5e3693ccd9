"""The throughput workloads: servers and load generators in their own
processes, the runner and its report.  Imports the harness only (see
benchmarks/__init__.py)."""
