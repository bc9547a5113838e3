#!/usr/bin/env python3
"""The comparisons of bench/gpu/run.sh, each printing one JSON object (a part of the summary):

  check.py losses NAME A.jsonl B.jsonl FIRST_REL LAST_REL
      the training losses of two --metrics files (one line per step): the first step's within
      FIRST_REL relative, the last common step's within LAST_REL
  check.py same NAME REPORT.json...
      every report's params_fnv1a64 and last loss equal (bit-identical runs)
  check.py resume NAME FULL.jsonl RESUMED.jsonl REL
      the resumed run's steps equal the uninterrupted run's within REL (0: bit for bit)
  check.py part NAME STATUS [KEY VALUE]...
      one part as given, each VALUE as JSON where it parses, else as a string
  check.py merge PARTS.jsonl... [KEY=VALUE...]
      the summary on stdout: every part, the count of each status, and the given fields
"""
import json
import sys


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "train":
                out[r["step"]] = r["loss"]
    return out


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def emit(name, ok, **fields):
    print(json.dumps({"part": name, "status": "pass" if ok else "fail", **fields}))
    return 0


def main(argv):
    what, name = argv[1], argv[2]
    if what == "losses":
        a, b = losses(argv[3]), losses(argv[4])
        first_rel, last_rel = float(argv[5]), float(argv[6])
        steps = sorted(set(a) & set(b))
        if not steps:
            return emit(name, False, why="no common steps")
        s0, s1 = steps[0], steps[-1]
        r0, r1 = rel(a[s0], b[s0]), rel(a[s1], b[s1])
        worst = max(rel(a[s], b[s]) for s in steps)
        return emit(name, r0 <= first_rel and r1 <= last_rel, first_step=s0, last_step=s1,
                    first_rel=r0, last_rel=r1, worst_rel=worst, first_loss=[a[s0], b[s0]],
                    last_loss=[a[s1], b[s1]], limits=[first_rel, last_rel])
    if what == "same":
        reps = []
        for p in argv[3:]:
            with open(p) as f:
                r = json.load(f)
            reps.append({"report": p, "params_fnv1a64": r.get("params_fnv1a64"),
                         "final_loss": r.get("train", {}).get("final_loss")})
        hashes = {r["params_fnv1a64"] for r in reps}
        return emit(name, len(hashes) == 1 and None not in hashes, runs=reps)
    if what == "resume":
        a, b = losses(argv[3]), losses(argv[4])
        tol = float(argv[5])
        steps = sorted(set(a) & set(b))
        worst = max((rel(b[s], a[s]) for s in steps), default=None)
        ok = bool(steps) and worst <= tol
        return emit(name, ok, steps=[steps[0], steps[-1]] if steps else [], worst_rel=worst,
                    limit=tol)
    if what == "part":
        # part NAME STATUS [KEY VALUE]...: VALUE as JSON where it parses, else as a string
        fields = {}
        for k, v in zip(argv[4::2], argv[5::2]):
            try:
                fields[k] = json.loads(v)
            except ValueError:
                fields[k] = v
        print(json.dumps({"part": name, "status": argv[3], **fields}))
        return 0
    if what == "merge":
        parts, fields = [], {}
        for p in argv[2:]:
            if "=" in p and not p.endswith(".json"):
                k, v = p.split("=", 1)
                fields[k] = v
                continue
            with open(p) as f:
                for line in f:
                    if line.strip():
                        parts.append(json.loads(line))
        count = {s: sum(1 for p in parts if p["status"] == s)
                 for s in ("pass", "fail", "unavailable", "skipped")}
        out = {**fields, "counts": count, "parts": parts}
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0
    print("check.py: unknown comparison %r" % what, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
