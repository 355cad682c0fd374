"""Prints the headline ncu figures per kernel from a `profile` stage log:
    python3 scripts/device/summarize_profile.py profile.log
"""
import re
import sys

KEYS = r"DRAM Throughput|Compute \(SM\) Throughput|Duration|Issue Slots Busy|Registers Per Thread|" \
       r"Achieved Occupancy|Warp Cycles Per Issued|highest-utilized|Executed Instructions  |L2 Hit Rate|" \
       r"L1/TEX Hit Rate|stall|Stall"

text = open(sys.argv[1]).read()
seen = set()
for block in re.split(r"\n  (?=\S)", text):
    head = block.split("\n")[0]
    if "fp8ext" not in head and "copy" not in head.lower() and "elementwise" not in head:
        continue
    name = re.sub(r"\(fp8ext::(cuda::)?(detail::)?Input.*?\) \(", " (", head)
    name = re.sub(r"void |fp8ext::|<unnamed>::|cuda::|detail::", "", name)[:100]
    if name in seen:
        continue
    seen.add(name)
    print("==", name)
    for line in block.split("\n"):
        if re.search(KEYS, line):
            print("   ", re.sub(r"\s{2,}", " ", line.strip())[:150])
