"""The count tools (instructions, bytecodes, memory) on in-process
workloads.  Imports the harness only (see benchmarks/__init__.py)."""
