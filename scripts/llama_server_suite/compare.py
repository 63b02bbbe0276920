"""Summarise JUnit reports of llama.cpp's server suite (scripts/llama_server_suite/run.sh): passed /
total of each, and with two (cooktop's, then llama-server's) the cases llama-server passes and cooktop
does not, counted by file, then named.

Usage: python compare.py COOKTOP.xml [LLAMA_SERVER.xml]
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET


def outcomes(path: str) -> dict[str, str]:
    """``file::case`` -> ``passed`` / ``failed`` / ``skipped`` of one JUnit XML report."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[name] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    return out


def main(argv: list[str]) -> int:
    """Print the summary; returns 0 (a comparison, not a verdict; also for -h/--help), 2 on bad arguments
    (a missing or unreadable report is named)."""
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    for p in argv:
        try:
            ET.parse(p)
        except (OSError, ET.ParseError) as e:
            print(f"compare.py: {p}: not a readable JUnit XML report ({e})", file=sys.stderr)
            return 2
    runs = [outcomes(p) for p in argv]
    for label, run in zip(("cooktop", "llama-server"), runs):
        n = collections.Counter(run.values())
        print(f"{label}: {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped of {len(run)}")
    if len(runs) == 2:
        ours, theirs = runs
        both = sorted(k for k, v in theirs.items() if v == "passed" and ours.get(k) == "passed")
        missing = sorted(k for k, v in theirs.items() if v == "passed" and ours.get(k) != "passed")
        print(f"llama-server passes {sum(v == 'passed' for v in theirs.values())}; cooktop passes {len(both)} of those")
        by_file = collections.Counter(k.split("::")[0] for k in missing)
        for f, n in by_file.most_common():
            print(f"  {f}: {n}")
        for k in missing:
            print(f"    {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
