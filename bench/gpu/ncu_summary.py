"""Per-kernel totals from an Nsight Compute CSV (bench/gpu/diag.sh: --csv --page raw with
gpu__time_duration.sum and dram__bytes_read/write.sum): kernels grouped by name and launch shape,
their count, summed time, share of the total, and DRAM bytes. Usage: ncu_summary.py FILE.csv"""
import collections
import csv
import re
import sys

lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.DictReader(lines))[1:]  # the first row holds the units
if not rows:
    sys.exit(f"{sys.argv[1]}: no kernels profiled")
key_of = lambda part: next(k for k in rows[0] if part in k)
tk, rk, wk = key_of("gpu__time_duration"), key_of("dram__bytes_read"), key_of("dram__bytes_write")
num = lambda v: float(v.replace(",", "")) if v else 0.0
agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
for r in rows:
    name = re.sub(r"\(.*", "", r["Kernel Name"])[:60]
    a = agg[(name, r["Grid Size"], r["Block Size"])]
    a[0] += 1
    a[1] += num(r[tk])
    a[2] += num(r[rk])
    a[3] += num(r[wk])
total = sum(a[1] for a in agg.values())
print(f"{len(rows)} kernels, {total / 1e3:.1f} us in all")
print("count | us | share | DRAM read MB | DRAM write MB | kernel | grid | block")
for (name, grid, block), a in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{a[0]} | {a[1] / 1e3:.1f} | {a[1] / total * 100:.1f}% | {a[2] / 1e6:.1f} | "
          f"{a[3] / 1e6:.1f} | {name} | {grid} | {block}")
