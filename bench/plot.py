#!/usr/bin/env python3
"""plot.py: kvhal's tool outputs as figures (PNG or SVG, by the output's extension), with matplotlib.

  plot.py timeline TIMELINE.csv [LABEL=TIMELINE.csv ...] -o FILE   kvhal-replay --timeline: device and host hit
          rates per window of finished requests, and the pages each tier evicted in it
  plot.py sweep SWEEP.csv -o FILE                                 bench/hit-rate-sweep.sh: hit rate against the
          device budget (device, device + host tier, the unbounded cache)
  plot.py bench BENCH.csv -o FILE [--column warm_gbps]            kvhal-bench --csv: one bar per record

Exit status: 0 written, 1 an input could not be read or held no rows, 2 usage error."""
import argparse
import csv
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
except ImportError:  # the message names the Debian package
    sys.exit("plot.py: error: matplotlib is not installed (Debian: apt install python3-matplotlib)")


def rows_of(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        sys.exit(f"plot.py: error: {path}: {e.strerror}")
    if not rows:
        sys.exit(f"plot.py: error: {path}: no rows")
    return rows


def num(v):
    return float(v) if v not in ("", None) else float("nan")


def labelled(specs):
    """LABEL=FILE or FILE (labelled by its name) pairs."""
    out = []
    for s in specs:
        label, sep, path = s.partition("=")
        if not sep:
            label, path = os.path.splitext(os.path.basename(s))[0], s
        out.append((label, path))
    return out


def timeline(args):
    runs = [(label, rows_of(path)) for label, path in labelled(args.inputs)]
    fig, (ax, ev) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for label, rows in runs:
        x = [int(r["requests"]) for r in rows]
        dev = [100 * num(r["hit_rate"]) for r in rows]
        host = [100 * num(r["host_hit_rate"]) for r in rows]
        ax.plot(x, dev, label=f"{label}: device hits")
        if any(h > 0 for h in host):
            ax.plot(x, [d + h for d, h in zip(dev, host)], linestyle="--", label=f"{label}: device + host tier")
        ev.plot(x, [int(r["pages_evicted"]) for r in rows], label=f"{label}: device pages evicted")
        if any(int(r["host_pages_evicted"]) for r in rows):
            ev.plot(x, [int(r["host_pages_evicted"]) for r in rows], linestyle="--",
                    label=f"{label}: host pages evicted")
    ax.set_ylabel("prompt tokens hit (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(args.title or "kvhal-replay: hit rate over time (per window of finished requests)")
    ev.set_xlabel("requests finished")
    ev.set_ylabel("pages evicted")
    ev.grid(alpha=0.3)
    ev.legend(fontsize=8)
    return fig


def sweep(args):
    rows = sorted(rows_of(args.inputs[0]), key=lambda r: num(r["kv_budget"]))
    x = [num(r["kv_budget"]) / 2**20 for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(x, [100 * num(r["hit_rate"]) for r in rows], marker="o", label="device")
    if any(num(r["host_hit_rate"]) > 0 for r in rows):
        ax.plot(x, [100 * (num(r["hit_rate"]) + num(r["host_hit_rate"])) for r in rows], marker="s",
                label="device + host tier")
    ax.plot(x, [100 * num(r["unbounded_hit_rate"]) for r in rows], linestyle=":", color="gray",
            label="unbounded cache (same schedule)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.set_xlabel("device KV budget (MiB)")
    ax.set_ylabel("prompt tokens hit (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(args.title or "kvhal-replay: hit rate against the device budget")
    return fig


def bench(args):
    rows = [r for r in rows_of(args.inputs[0]) if r.get(args.column, "") != ""]
    if not rows:
        sys.exit(f"plot.py: error: {args.inputs[0]}: no row has {args.column}")
    def label(r):
        parts = [r["op"], r["preset"], r["tokens"] if r["tokens"] != "0" else "",
                 r["layout"] if r["layout"] != "-" else "", r["cache_dtype"],
                 f"scale {r['scale']}" if r.get("scale") else ""]
        return " ".join(x for x in parts if x)

    labels = [label(r) for r in rows]
    fig, ax = plt.subplots(figsize=(8, max(3, 0.28 * len(rows) + 1)))
    ax.barh(range(len(rows)), [num(r[args.column]) for r in rows])
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(args.column)
    ax.grid(alpha=0.3, axis="x")
    ax.set_title(args.title or f"kvhal-bench: {args.column}")
    return fig


def main():
    p = argparse.ArgumentParser(prog="plot.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("kind", choices=("timeline", "sweep", "bench"))
    p.add_argument("inputs", nargs="+", help="CSV files (timeline: LABEL=FILE to name a run)")
    p.add_argument("-o", "--output", required=True, help="FILE.png or FILE.svg")
    p.add_argument("--column", default="warm_gbps", help="bench: the CSV column drawn (warm_gbps)")
    p.add_argument("--title", help="the figure's title")
    args = p.parse_args()
    if os.path.splitext(args.output)[1].lower() not in (".png", ".svg"):
        p.error(f"--output: '{args.output}' is neither .png nor .svg")
    if args.kind != "timeline" and len(args.inputs) != 1:
        p.error(f"{args.kind} takes one CSV")
    fig = {"timeline": timeline, "sweep": sweep, "bench": bench}[args.kind](args)
    fig.tight_layout()
    # SVGs without the run's date or random ids, so that a figure made again from the same data is the same file
    matplotlib.rcParams["svg.hashsalt"] = "kvhal"
    fig.savefig(args.output, dpi=110, metadata={"Date": None} if args.output.endswith(".svg") else None)
    print(f"plot.py: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
