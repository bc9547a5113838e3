"""The report checks of tests/cli/*.sh: need() records each failed check,
finish() prints them and exits 1 if there were any, load() reads a report (via
tests/cli/lib/common.bash this folder is on PYTHONPATH)."""
import json
import os
import sys

errors = []


def load(folder, name):
    """The JSON report folder/name.json, or {} with the reason recorded."""
    try:
        with open(os.path.join(folder, name + ".json")) as f:
            return json.load(f)
    except Exception as e:
        errors.append(f"{name}: {e}")
        return {}


def need(cond, what):
    if not cond:
        errors.append(what)


def finish(prefix="FAIL:"):
    for e in errors:
        print(prefix, e)
    sys.exit(1 if errors else 0)
