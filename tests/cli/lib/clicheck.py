"""The report checks of tests/cli/*.sh: need() records each failed check,
finish() prints them and exits 1 if there were any (via tests/cli/lib/common.bash
this folder is on PYTHONPATH)."""
import sys

errors = []


def need(cond, what):
    if not cond:
        errors.append(what)


def finish(prefix="FAIL:"):
    for e in errors:
        print(prefix, e)
    sys.exit(1 if errors else 0)
