#!/usr/bin/env python3
"""Summarize a same-process A/B of timing-tool binaries (ab_decode.sh's or
the silu_timeline loop's output): one line per run, "ROUND BINARY ... ROW:
... X us a call ... output HASH ...". Rows are keyed by the text before the
first ':' (round and binary left out); each binary's median us is compared
with the baseline binary's, and the output hashes tell whether the versions
computed the same bits. The loops shuffle the binaries' order, so the
baseline is named, not taken from the file.

  usage: ab_summary.py AB.txt --baseline NAME [--json OUT.json --commit C --gpu G --op OP --command CMD]
"""
import argparse
import datetime
import json
import re
import statistics
import sys

US = re.compile(r"([0-9.]+) us a call")
HASH = re.compile(r"output ([0-9a-f]+)")


def parse(lines):
    """{row: {binary: {"us": [...], "hashes": set()}}} and the binaries in order of appearance."""
    rows, binaries = {}, []
    for line in lines:
        head, _, tail = line.partition(":")
        parts = head.split()
        us, digest = US.search(tail), HASH.search(tail)
        if len(parts) < 3 or not parts[0].isdigit() or not us:
            continue  # an error line or a tool's extra output
        binary, row = parts[1], " ".join(parts[2:])
        if binary not in binaries:
            binaries.append(binary)
        entry = rows.setdefault(row, {}).setdefault(binary, {"us": [], "hashes": set()})
        entry["us"].append(float(us.group(1)))
        if digest:
            entry["hashes"].add(digest.group(1))
    return rows, binaries


def summarize(rows, binaries, baseline):
    out = []
    for row, runs in rows.items():
        base = runs.get(baseline)
        record = {"row": row}
        for binary in binaries:
            if binary not in runs:
                continue
            record[f"{binary}_us"] = runs[binary]["us"]
            if base and binary != baseline:
                ratio = statistics.median(runs[binary]["us"]) / statistics.median(base["us"])
                record[f"ratio_{binary}_over_{baseline}"] = round(ratio, 4)
        hashes = [runs[b]["hashes"] for b in binaries if b in runs]
        # None where the tool printed no output hash for the row (nothing to compare)
        record["outputs_identical"] = len(set().union(*hashes)) == 1 if any(hashes) else None
        out.append(record)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ab", help="the A/B loop's output")
    ap.add_argument("--baseline", required=True, help="binary the others are compared with (its file name)")
    ap.add_argument("--json", help="also write the rows here, with the metadata below")
    ap.add_argument("--commit", default="")
    ap.add_argument("--gpu", default="")
    ap.add_argument("--op", default="")
    ap.add_argument("--command", default="")
    args = ap.parse_args()
    with open(args.ab) as f:
        rows, binaries = parse(f)
    if not rows:
        sys.exit(f"no timing lines in {args.ab}")
    baseline = args.baseline
    if baseline not in binaries:
        sys.exit(f"--baseline {baseline!r} is not among the binaries {binaries}")
    records = summarize(rows, binaries, baseline)
    for r in records:
        medians = "  ".join(f"{b} {statistics.median(r[b + '_us']):8.2f}" for b in binaries if b + "_us" in r)
        ratios = "  ".join(f"{v:.4f}" for k, v in r.items() if k.startswith("ratio_"))
        print(f"{r['row']:<48} {medians}  ratio {ratios}  same bits {r['outputs_identical']}")
    if args.json:
        meta = {"commit": args.commit, "gpu": args.gpu, "op": args.op, "date": datetime.date.today().isoformat()}
        with open(args.json, "w") as f:
            json.dump({"command": args.command, "baseline": baseline, "rows": [{**meta, **r} for r in records]}, f,
                      indent=1)


if __name__ == "__main__":
    main()
