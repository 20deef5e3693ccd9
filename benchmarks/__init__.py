"""The asyncio_relaxed benchmark suite: ``python -m benchmarks run``.

Every workload runs on every loop in one run, server and client in separate
processes pinned to different CPUs, loops interleaved (A B A B), with a
warm-up and repeats; the report quotes medians and the spread of the repeats.
See docs/benchmarks.md and the README's "Benchmarks" section.

Three parts, which import one way (tests/test_layering.py checks it):

- ``harness``: what every measurement needs: ``loops`` (the one name ->
  loop-factory table, shared with the tests' behaviour suite), ``checkout``
  (loops run from another checkout, ``--baseline``), ``processes`` (the one
  way a child process starts, the CPUs it is pinned to), ``maths`` (spread,
  percentiles, Jain's index), ``tables`` (text and Markdown tables),
  ``results`` (the one writer of results/), ``tls`` (the TLS workloads'
  certificates and contexts);
- ``workloads`` (imports the harness): the throughput runs: ``catalog``
  (every workload and the default set), ``runner`` (the run), ``report``
  (its tables, summary, charts, compare), ``server``, ``asgi``, ``floors``
  and ``control`` (the server processes and how they answer the runner),
  ``client`` and ``openloop`` (the load generators), ``fairness`` (K
  pre-forked workers on one listening socket);
- ``counts`` (imports the harness, not the workloads): the count tools,
  each on the in-process workloads of ``driver``: ``instructions``
  (callgrind), ``bytecodes`` (sys.monitoring), ``memory`` (tracemalloc),
  with ``sites`` (where code lives).

``cli`` (the one command line) imports all three; only ``__main__`` imports
it.  Only asyncio_relaxed's public namespace is used.
"""
