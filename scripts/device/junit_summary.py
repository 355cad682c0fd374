"""pytest's JUnit XML (run.sh's OUT/pytest.xml) as a bench/results record:
commit, GPU, torch, date, command, passed/failed/skipped counts and every test.

    python3 scripts/device/junit_summary.py pytest.xml --commit SHA --command "pytest ..." --out FILE.json
"""
import argparse
import datetime
import json
import xml.etree.ElementTree as ET


def summarize(xml_path):
    rows = []
    for case in ET.parse(xml_path).iter("testcase"):
        result = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                result = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
        rows.append({"test": case.get("name"), "seconds": round(float(case.get("time", 0)), 3), "result": result})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("xml")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--gpu", default="NVIDIA H200")
    ap.add_argument("--torch", default="2.11.0+cu130")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = summarize(args.xml)
    count = {r: sum(t["result"] == r for t in rows) for r in ("passed", "failed", "error", "skipped")}
    record = {"commit": args.commit, "gpu": args.gpu, "torch": args.torch, "date": datetime.date.today().isoformat(),
              "command": args.command, **count, "tests": rows}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(args.out, count)


if __name__ == "__main__":
    main()
