"""``python -m benchmarks run|compare|fairness|instructions|bytecodes|memory``:
see benchmarks.cli."""

import sys

from benchmarks.cli import main

sys.exit(main())
