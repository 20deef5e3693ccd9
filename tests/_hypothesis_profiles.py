"""Hypothesis profiles of the differential and fault-injection tests.

The default, ``ci``, runs a bounded number of examples per test (each test
says how many), derandomized, so that every CI run sees the same examples,
and keeps no example database.  ``long`` runs LONG_SCALE times as many, from
a fresh random seed each run: the run before a release (docs/testing.md has
the command and the counts it reached).

Registered when this module is imported.  pytest loads a
``--hypothesis-profile`` before it imports any test module, so that option
needs this module loaded as a plugin first::

    python3 -m pytest -p tests._hypothesis_profiles --hypothesis-profile=long \\
        tests/test_differential.py tests/test_faults.py
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

#: How many times the CI count of examples ``long`` runs.
LONG_SCALE = 10

_COMMON = {
    "deadline": None,  # an example runs real sockets on a loop: its time varies
    "database": None,  # no .hypothesis/ directory in the checkout
    "print_blob": True,  # a failure prints @reproduce_failure(...)
    # The tests take `loop_name` (a parametrized name, never mutated).
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}

settings.register_profile("ci", derandomize=True, **_COMMON)
settings.register_profile("long", **_COMMON)


def is_long() -> bool:
    return settings.get_current_profile_name() == "long"


def bounded(ci_examples: int) -> settings:
    """Settings for one test: *ci_examples* examples, LONG_SCALE times that
    under ``--hypothesis-profile=long``."""
    long = is_long()
    return settings(
        settings.get_profile("long" if long else "ci"),
        max_examples=ci_examples * (LONG_SCALE if long else 1),
    )


def timeout(ci_seconds: float = 60) -> pytest.MarkDecorator:
    """A test's pytest-timeout: *ci_seconds*, LONG_SCALE times that under
    ``long`` (as many times the examples)."""
    return pytest.mark.timeout(ci_seconds * (LONG_SCALE if is_long() else 1))
