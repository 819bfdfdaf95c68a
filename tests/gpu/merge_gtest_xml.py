#!/usr/bin/python3
"""Merges GoogleTest XML reports into one and prints their counts (run_on_gpu.sh's results).

  merge_gtest_xml.py MERGED.xml REPORT.xml...   prints "N tests: P passed, F failed, S skipped"

A test counts as skipped when its <testcase> holds <skipped> (GoogleTest 1.11+) or says
result="skipped"; as failed when it holds <failure> or <error>. Used by tests/gpu/run_on_gpu.sh.
"""
import sys
import xml.etree.ElementTree as ET


def main(merged_path, report_paths):
    merged = ET.Element("testsuites", name="AllTests")
    tests = failed = skipped = 0
    for path in report_paths:
        for suite in ET.parse(path).getroot().iter("testsuite"):
            suite.set("name", f"{path.rsplit('/', 1)[-1].removesuffix('.xml')}.{suite.get('name')}")
            merged.append(suite)
            for case in suite.iter("testcase"):
                tests += 1
                if case.find("failure") is not None or case.find("error") is not None:
                    failed += 1
                elif case.find("skipped") is not None or case.get("result") == "skipped":
                    skipped += 1
    merged.set("tests", str(tests))
    merged.set("failures", str(failed))
    merged.set("skipped", str(skipped))
    ET.ElementTree(merged).write(merged_path, encoding="utf-8", xml_declaration=True)
    print(f"{tests} tests: {tests - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return 0 if report_paths else 1


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: merge_gtest_xml.py MERGED.xml REPORT.xml...")
    sys.exit(main(sys.argv[1], [p for p in sys.argv[2:] if not p.endswith("*.xml")]))
