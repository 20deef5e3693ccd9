"""What every measurement needs: the loop table, child processes, maths,
tables, the results writer, TLS certificates.  Imports nothing else of
benchmarks/ (see benchmarks/__init__.py)."""
