"""gpu_tests.sh's reading of pytest's junit reports: which failures ran out of GPU memory, and each test's last
outcome. Several test processes share the one GPU (gpu_tests.sh --workers N), and a test that allocates tens of GiB
can run out of memory beside the others although it passes alone; the script runs those again alone, and this
tool tells them apart from real failures.

    python3 scripts/junit_outcomes.py --out-of-memory PATH JUNIT    # node ids (PATH::name) that ran out of memory
    python3 scripts/junit_outcomes.py --only-out-of-memory JUNIT    # exit 0 if those were its only failures
    python3 scripts/junit_outcomes.py --totals JUNIT...             # "N passed, N failed, N skipped, N errors"

--totals counts each test once, by its last outcome: the reports of tests run again alone (named *-alone.xml)
are read after the others. A report that is missing (pytest killed by the file's time limit writes none) is
counted as such, so that the tests it held do not leave the totals unsaid.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET

OUT_OF_MEMORY = ("outofmemoryerror", "cuda out of memory")


def _cases(path: str):
    """(classname, name, outcome, text of its failure or error) of each test case in a junit report."""
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                text = f"{child.get('message') or ''}\n{child.text or ''}"
                break
        yield case.get("classname") or "", case.get("name") or "", outcome, text


def _out_of_memory(outcome: str, text: str) -> bool:
    return outcome in ("failed", "errors") and any(m in text.lower() for m in OUT_OF_MEMORY)


def node_id(path: str, classname: str, name: str) -> str:
    """pytest's node id of a junit test case of the test file `path`: a test class (the part of the classname
    after the module's, whose name starts with test_) between the path and the name."""
    parts = classname.split(".")
    module = next((i for i in range(len(parts) - 1, -1, -1) if parts[i].startswith("test_")), len(parts) - 1)
    return "::".join([path, *parts[module + 1 :], name])


def out_of_memory(path: str, report: str) -> list[str]:
    return [node_id(path, c, n) for c, n, outcome, text in _cases(report) if _out_of_memory(outcome, text)]


def only_out_of_memory(report: str) -> bool:
    bad = [(outcome, text) for _, _, outcome, text in _cases(report) if outcome in ("failed", "errors")]
    return bool(bad) and all(_out_of_memory(*b) for b in bad)


def totals(reports: list[str]) -> str:
    last: dict[tuple[str, str], str] = {}
    missing = 0
    for report in sorted(reports, key=lambda r: r.endswith("-alone.xml")):  # stable: the alone runs last
        try:
            cases = list(_cases(report))
        except (OSError, ET.ParseError):  # a run cut by its time limit writes no report, or half of one
            missing += 1
            continue
        for classname, name, outcome, _ in cases:
            last[(classname, name)] = outcome
    counts = {k: sum(v == k for v in last.values()) for k in ("passed", "failed", "skipped", "errors")}
    line = ", ".join(f"{n} {k}" for k, n in counts.items())
    return line + (f"; {missing} run(s) with no report (cut by their time limit: see the log)" if missing else "")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out-of-memory", nargs=2, metavar=("PATH", "JUNIT"))
    group.add_argument("--only-out-of-memory", metavar="JUNIT")
    group.add_argument("--totals", nargs="+", metavar="JUNIT")
    args = parser.parse_args(argv)
    if args.out_of_memory:
        for node in out_of_memory(*args.out_of_memory):
            print(node)
        return 0
    if args.only_out_of_memory:
        return 0 if only_out_of_memory(args.only_out_of_memory) else 1
    print(totals(args.totals))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
