#!/usr/bin/env python3
"""bench/plot.py on a short replay: kvhal-replay --timeline (with and without a host tier), bench/hit-rate-sweep.sh
over two budgets and kvhal-bench --csv, each drawn to PNG and SVG; every file must be written and be what its
extension says. Skipped (exit 77) when matplotlib is not installed.
Usage: check_plot.py <repository root> <kvhal-replay> <kvhal-bench>."""
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile



def has_matplotlib(py):
    return py and subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode == 0


# the interpreter that runs plot.py: this one, or the system's (where a virtual environment runs the tests)
py = sys.executable if importlib.util.find_spec("matplotlib") else next(
    (p for p in (shutil.which("python3"), "/usr/bin/python3") if has_matplotlib(p)), None)
if py is None:
    print("SKIP: matplotlib is not installed (Debian: python3-matplotlib)")
    sys.exit(77)
root, replay, bench = sys.argv[1:4]
plot = os.path.join(root, "bench", "plot.py")
tmp = tempfile.mkdtemp(prefix="kvhal-plot-")
failures = []


def run(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, timeout=240, **kw)
    if p.returncode != 0:
        failures.append(f"{' '.join(args)}: rc {p.returncode}: {p.stderr[-500:]}")
    return p


def written(path):
    with open(path, "rb") as f:
        head = f.read(256)
    ok = head.startswith(b"\x89PNG\r\n\x1a\n") if path.endswith(".png") else b"<svg" in head or b"<?xml" in head
    if not ok or os.path.getsize(path) < 1000:
        failures.append(f"{path}: not a {os.path.splitext(path)[1]} figure ({os.path.getsize(path)} bytes)")


w = ["--groups", "6", "--prompts", "4", "--system-len", "256", "--question-len", "16", "--output-len", "8",
     "--zipf", "1.0", "--quiet"]
t = ["--kv-budget", "256KiB", "--timeline-window", "2"]
run([replay] + w + t + ["--timeline", os.path.join(tmp, "dev.csv")])
run([replay] + w + t + ["--timeline", os.path.join(tmp, "host.csv"), "--host-tier", "2MiB"])
sweep = run(["bash", os.path.join(root, "bench", "hit-rate-sweep.sh")],
            env=dict(os.environ, R=replay, BUDGETS="256KiB 1MiB", ARGS=" ".join(w + ["--host-tier", "2MiB"])))
with open(os.path.join(tmp, "sweep.csv"), "w") as f:
    f.write(sweep.stdout)
if len(sweep.stdout.splitlines()) != 3:
    failures.append(f"hit-rate-sweep.sh: {sweep.stdout!r}")
run([bench, "--quick", "--op", "desc_cache", "-q", "--csv", os.path.join(tmp, "bench.csv")])
for ext in ("png", "svg"):
    for kind, args in (("timeline", [f"device=" + os.path.join(tmp, "dev.csv"), "host=" + os.path.join(tmp, "host.csv")]),
                       ("sweep", [os.path.join(tmp, "sweep.csv")]),
                       ("bench", [os.path.join(tmp, "bench.csv"), "--column", "ns"])):
        out = os.path.join(tmp, f"{kind}.{ext}")
        if run([py, plot, kind] + args + ["-o", out]).returncode == 0:
            written(out)
# a bad output name and a missing input are refused
p = subprocess.run([py, plot, "sweep", os.path.join(tmp, "sweep.csv"), "-o", os.path.join(tmp, "x.gif")],
                   capture_output=True, text=True)
if p.returncode != 2:
    failures.append(f"plot.py -o x.gif: rc {p.returncode}")
p = subprocess.run([py, plot, "sweep", os.path.join(tmp, "none.csv"), "-o", os.path.join(tmp, "y.png")],
                   capture_output=True, text=True)
if p.returncode != 1 or os.path.exists(os.path.join(tmp, "y.png")):
    failures.append(f"plot.py on a missing CSV: rc {p.returncode}")
shutil.rmtree(tmp)
for f in failures:
    print("FAIL:", f)
print("plot.py:", "FAIL" if failures else "OK")
sys.exit(1 if failures else 0)
