#!/usr/bin/env python3
"""Independent reader for test_trace: parses the Chrome trace JSON with json and the SVG
timeline with xml.etree, and checks their structure. Exit status 0 when all is well.

usage: trace_check.py chrome FILE K N_X_EVENTS
       trace_check.py svg FILE N_RECTS
"""
import json
import sys
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def fail(msg):
    print("trace_check.py: " + msg, file=sys.stderr)
    sys.exit(1)


def check_chrome(path, stages, nx):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        fail(f"{path}: no traceEvents array")
    names = sorted(e["args"]["name"] for e in events
                   if e.get("ph") == "M" and e.get("name") == "thread_name")
    want = sorted(f"stage {k}" for k in range(stages))
    if names != want:
        fail(f"{path}: thread names {names}, expected {want}")
    xs = [e for e in events if e.get("ph") == "X"]
    if len(xs) != nx:
        fail(f"{path}: {len(xs)} complete events, expected {nx}")
    for e in xs:
        for key in ("name", "cat", "ts", "dur", "pid", "tid", "args"):
            if key not in e:
                fail(f"{path}: event {e} lacks {key}")
        if e["dur"] < 0 or e["ts"] < 0 or not 0 <= e["tid"] < stages:
            fail(f"{path}: bad event {e}")
        if not isinstance(e["args"].get("micro_batch"), int):
            fail(f"{path}: event {e} has no integer args.micro_batch")


def check_svg(path, nrects):
    root = ET.parse(path).getroot()
    if root.tag != SVG + "svg":
        fail(f"{path}: root element is {root.tag}, expected svg")
    rects = root.findall(".//" + SVG + "rect")
    if len(rects) != nrects:
        fail(f"{path}: {len(rects)} rects, expected {nrects}")
    texts = ["".join(t.itertext()) for t in root.iter(SVG + "text")]
    for label in ("forward", "backward", "recompute", "send/recv", "wait", "optimizer"):
        if label not in texts:
            fail(f"{path}: legend lacks '{label}'")
    if not any("bubble measured" in t for t in texts):
        fail(f"{path}: no title with the measured bubble")
    titles = ["".join(t.itertext()) for t in root.iter(SVG + "title")]
    if not any("adamw <&\"'>" in t for t in titles):
        fail(f"{path}: escaped label did not read back")


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "chrome":
        check_chrome(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "svg":
        check_svg(sys.argv[2], int(sys.argv[3]))
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
