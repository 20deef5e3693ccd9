"""The asyncio_relaxed benchmark suite: ``python -m benchmarks run``.

Every workload runs on every loop in one run, server and client in separate
processes pinned to different CPUs, loops interleaved (A B A B), with a
warm-up and repeats; the report quotes medians and the spread of the repeats.
See DESIGN.md section 4 and the README's "Benchmarks" section.

Layout: ``loops`` (one name -> loop-factory table), ``maths`` (median,
percentiles, Jain's index), ``server`` (the server process of every
workload), ``client`` (the built-in load generators), ``fairness`` (K
pre-forked workers on one listen socket), ``runner`` (the run), ``report``
(terminal table, Markdown, charts, compare).  Only asyncio_relaxed's public
namespace is used.
"""
