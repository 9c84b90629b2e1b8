import os
import sys

from .cli import main

code = main()
if code == 130:
    # Interrupted: the one line is written and every journal is flushed line by line. Exit at once
    # with 130: under ``-m``, the interpreter's shutdown otherwise ends 1 run in about 15 as death by
    # SIGINT (status -2) after the line is printed (tests/test_hardening_runs.py, start-up Ctrl-C).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)
sys.exit(code)
