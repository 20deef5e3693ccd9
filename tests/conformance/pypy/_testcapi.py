"""A ``_testcapi`` that is not there: first on sys.path of a conformance run on PyPy.

PyPy's own ``_testcapi.py`` builds the module from ``_testcapimodule.c`` with
cpyext the first time it is imported, and Debian's PyPy (pypy3,
pypy3-lib-testsuite 8.0.1) does not ship that C file: the import raises
FileNotFoundError, which ``test.support`` (``from _testcapi import
unicode_legacy_string``) does not catch, so no ``test.test_asyncio`` module
imports.  ``test.support`` takes a missing ``_testcapi`` (ImportError) as
CPython builds without it do, and no ``test.test_asyncio`` module uses it.
swap.py puts this folder first on sys.path on PyPy only: on CPython
``_testcapi`` is a real extension module the suite may use.
"""

raise ImportError("_testcapi: PyPy's needs _testcapimodule.c, which Debian's PyPy does not "
                  "ship (tests/conformance/pypy/_testcapi.py)")
