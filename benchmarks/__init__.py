"""The asyncio_relaxed benchmark suite: ``python -m benchmarks run``.

Every workload runs on every loop in one run, server and client in separate
processes pinned to different CPUs, loops interleaved (A B A B), with a
warm-up and repeats; the report quotes medians and the spread of the repeats.
See docs/benchmarks.md and the README's "Benchmarks" section.

Layout: ``cli`` (the one command line: run, compare, fairness,
instructions), ``loops`` (the one name -> loop-factory table, shared with
the tests and the examples), ``checkout`` (loops run from another checkout,
``--baseline``), ``workloads`` (every workload and the default set),
``maths`` (spread, percentiles, Jain's index), ``server`` (the server
process of every workload), ``asgi`` (its uvicorn kind: uvicorn + httptools
on the loop uvicorn's ``--loop`` makes), ``client`` (the built-in load
generators), ``openloop`` (the constant-rate load generator: latency from
each request's due time), ``fairness`` (K pre-forked workers on one listen
socket), ``instructions`` (instructions per request under callgrind),
``runner`` (the run), ``report`` (every table, Markdown, charts, compare).
Only asyncio_relaxed's public namespace is used.
"""
