#!/usr/bin/env python3
"""The tool conventions (README, "Tools") on kvhal-info, kvhal-replay, kvhal-bench and kvhal-xfer: -h/--help (usage
on stdout, exit 0), -V/--version ("<tool> <kvhal version>", exit 0), usage errors ("<tool>: error: ..." on stderr,
exit 2), --opt=value and --opt value alike, JSON opening with "ok", "tool" and "version", null for what was not
measured, percentiles, the failure object (exit 1); output that was lost (a full disk, a closed stdout, a full
--events, --timeline or --csv file) is exit 1, never 0; dropped KV events fail the run unless --events-drop-ok; the
host tier on a trace whose prompts end on a page boundary; --timeline rows. Usage: check_tools.py <kvhal-info>
<kvhal-replay> <version> <kvhal-bench> [<kvhal-xfer>]."""
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

info, replay, version, bench = sys.argv[1:5]
xfer = sys.argv[5] if len(sys.argv) > 5 else None
failures = []


def run(args, env_extra=None, stdout=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    if stdout is not None:  # a file object, or -1: stdout closed
        p = subprocess.run(args, stdout=None if stdout == -1 else stdout, stderr=subprocess.PIPE, text=True, env=env,
                           timeout=120, close_fds=True, pass_fds=(),
                           preexec_fn=(lambda: os.close(1)) if stdout == -1 else None)
        return p.returncode, "", p.stderr
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


small = ["--groups=4", "--prompts", "4", "--system-len=128", "--question-len", "16", "--output-len=8", "--quiet"]
for exe in [info, replay, bench] + ([xfer] if xfer else []):
    name = os.path.basename(exe)
    for h in ("-h", "--help"):
        rc, out, err = run([exe, h])
        check(rc == 0 and out.startswith("usage: " + name) and err == "", f"{name} {h}: rc {rc}, stdout usage")
    rc, out, err = run([exe, "--no-such-option"])
    check(rc == 2 and err.startswith(f"{name}: error: ") and out == "", f"{name} bad option: rc {rc}, stderr {err!r}")
    # output that was lost: exit 1 with the reason on stderr
    with open("/dev/full", "w") as full:
        rc, _, err = run([exe, "--version"], stdout=full)
    check(rc == 1 and "lost" in err, f"{name} --version > /dev/full: rc {rc}, {err!r}")
    rc, _, err = run([exe, "-V"], stdout=-1)
    check(rc == 1 and "closed" in err, f"{name} -V with stdout closed: rc {rc}, {err!r}")
for exe in (info, replay):
    name = os.path.basename(exe)
    rc, out, err = run([exe, "--help"])
    check(rc == 0 and out.startswith("usage: " + name) and err == "", f"{name} --help: rc {rc}, stdout usage")
    rc, out, err = run([exe, "--version"])
    check(rc == 0 and out == f"{name} {version}\n", f"{name} --version printed {out!r} (rc {rc})")
    rc, out, err = run([exe, "-V"])
    check(rc == 0 and out == f"{name} {version}\n", f"{name} -V printed {out!r}")
    rc, out, err = run([exe, "--no-such-option"])
    check(rc == 2 and err.startswith(f"{name}: error: ") and out == "", f"{name} bad option: rc {rc}, stderr {err!r}")
    rc, out, err = run([exe, "stray"])
    check(rc == 2 and err.startswith(f"{name}: error: "), f"{name} stray argument: rc {rc}, stderr {err!r}")
    # the failure object: an invalid KVHAL_DEVICE
    args = [exe, "--json"] + (small if exe == replay else [])
    rc, out, err = run(args, {"KVHAL_DEVICE": "no_such_type:0"})
    try:
        d = json.loads(out)
    except ValueError:
        d = {}
    check(rc == 1, f"{name} with a bad KVHAL_DEVICE: rc {rc}")
    check(d.get("ok") is False and d.get("version") == version and d.get("tool") == name and
          d.get("error", {}).get("status") ==
          "KVHAL_PARSE_ERROR" and "no_such_type" in d.get("error", {}).get("message", ""),
          f"{name} failure object: {out!r}")
    check(err.startswith(f"{name}: error: "), f"{name} failure on stderr: {err!r}")

# kvhal-info: JSON, and -l one line per present device
rc, out, err = run([info, "--json"])
d = json.loads(out)
check(rc == 0 and d["ok"] is True and d["version"] == version, f"kvhal-info --json: {out[:200]!r}")
check(all(dev["free_memory"] is None or dev["free_memory"] > 0 for dev in d["devices"]), "free_memory 0 instead of null")
rc, out, err = run([info, "-l"])
lines = out.splitlines()
check(rc == 0 and [ln.split("\t")[0] for ln in lines] == [dev["device"] for dev in d["devices"]],
      f"kvhal-info -l {lines} against --json devices")
rc, out, err = run([info, "-l", "--json"])
check(rc == 2, "kvhal-info -l --json must be a usage error")
rc, out, err = run([info, "-l"], {"KVHAL_DEVICE": "no_such_type:0"})
check(rc == 1 and "KVHAL_DEVICE" in err, f"kvhal-info -l with a bad KVHAL_DEVICE: rc {rc}, {err!r}")
rc, out, err = run([info])
check(rc == 0 and " 0.0 GiB free" not in out, f"kvhal-info: free memory the runtime cannot tell shows as 0: {out!r}")

# kvhal-replay: --opt=value and --opt value give the same run; percentiles; null for what --no-kv does not measure
rc, out, err = run([replay, "--json"] + small)
d = json.loads(out)
check(rc == 0 and d["ok"] is True and d["version"] == version and d["requests"] == 16, f"replay --json: {out[:200]!r}")
lat = d["latency_us"]
for k in ("match", "finish"):
    p = lat[k]
    check(p["n"] == 16 and 0 < p["p50"] <= p["p90"] <= p["p99"] <= p["max"], f"replay latency {k}: {p}")
check(lat["evict_4096"]["p50"] is None and d["evict_4096_us"] is None, "evict not measured: null expected")
rc, out, err = run([replay, "--json", "--no-kv"] + small)
d = json.loads(out)
check(rc == 0 and d["device"] is None and d["write_gb_per_s"] is None and d["bytes_written"] is None,
      f"--no-kv: device/write null expected: {out[:300]!r}")
rc, out, err = run([replay, "--groups", "0"])
check(rc == 2 and "--groups" in err, f"--groups 0: rc {rc}, {err!r}")
rc, out, err = run([replay, "--zipf"])
check(rc == 2 and "needs a value" in err, f"--zipf without value: rc {rc}, {err!r}")

# kvhal-replay: every output checked
tmp = tempfile.mkdtemp(prefix="kvhal-tools-")
with open("/dev/full", "w") as full:
    rc, _, err = run([replay, "--json"] + small, stdout=full)
check(rc == 1 and "lost" in err, f"replay --json > /dev/full: rc {rc}, {err!r}")
rc, _, err = run([replay, "--json"] + small, stdout=-1)
check(rc == 1 and "closed" in err, f"replay --json with stdout closed: rc {rc}, {err!r}")
for flag in ("--events", "--timeline"):
    rc, out, err = run([replay, "--json", flag, "/dev/full"] + small)
    d = json.loads(out) if out.startswith("{") else {}
    check(rc == 1 and d.get("ok") is False and "lost" in err, f"replay {flag} /dev/full: rc {rc}, {out[:200]!r}")
# dropped KV events: an error unless --events-drop-ok, never "ok": true; the default ring drops nothing
ev = os.path.join(tmp, "events.jsonl")
rc, out, err = run([replay, "--json", "--events", ev, "--event-ring", "4"] + small)
d = json.loads(out)
check(rc == 1 and d["ok"] is False and d["events_dropped"] > 0 and d["error"]["status"] == "EVENTS_DROPPED",
      f"replay with a 4-event ring: rc {rc}, {out[:300]!r}")
rc, out, err = run([replay, "--json", "--events", ev, "--event-ring", "4", "--events-drop-ok"] + small)
d = json.loads(out)
check(rc == 0 and d["ok"] is True and d["events_dropped"] > 0, f"--events-drop-ok: rc {rc}, {out[:300]!r}")
rc, out, err = run([replay, "--json", "--events", ev, "--host-tier", "4MiB", "--kv-budget", "256KiB"] + small)
d = json.loads(out)
check(rc == 0 and d["ok"] is True and d["events_dropped"] == 0 and d["events_written"] > 0,
      f"replay --events: rc {rc}, {out[:300]!r}")
# a host tier that holds no page is refused before the run, naming the option
rc, out, err = run([replay, "--host-tier", "100"] + small)
check(rc == 2 and "--host-tier" in err, f"--host-tier 100: rc {rc}, {err!r}")
# the host tier on a trace whose prompts end on page (and block) boundaries: the match stops one token short of
# the prompt, so a host page holding the last token must not be loaded back; device + host hits never exceed the
# unbounded cache
trace = os.path.join(tmp, "aligned.jsonl")
with open(trace, "w") as f:
    for i in range(60):
        g, n = i % 6, 1 + i % 3
        f.write(json.dumps({"timestamp": i, "input_length": 64 * n, "output_length": 1 + i % 5,
                            "hash_ids": [100 * g + k for k in range(n)]}) + "\n")
for ps in ("16", "64"):
    rc, out, err = run([replay, "--json", "--quiet", "--trace", trace, "--trace-block", "64", "--page-size", ps,
                        "--kv-budget", "160KiB", "--host-tier", "4MiB", "--check-every", "4"])
    d = json.loads(out) if out.startswith("{") else {}
    check(rc == 0 and d.get("ok") is True and (d.get("host_hit_rate") or 0) > 0 and
          d["hit_rate"] + d["host_hit_rate"] <= d["unbounded_hit_rate"] + 1e-9,
          f"host tier on a page-aligned trace (page size {ps}): rc {rc}, {out[:400]!r} {err[-300:]!r}")
# --lazy-tokens: each request's tokens generated once, however often it waits for room (match_calls > requests)
rc, out, err = run([replay, "--json", "--quiet", "--groups", "8", "--prompts", "8", "--system-len", "256",
                    "--question-len", "32", "--output-len", "24", "--zipf", "1.0", "--kv-budget", "512KiB",
                    "--page-size", "4", "--batch", "32", "--lazy-tokens", "--verify-samples", "16"])
d = json.loads(out) if out.startswith("{") else {}
check(rc == 0 and d.get("ok") is True and d["requests_generated"] == d["requests"] == 64 and
      d["match_calls"] > d["requests"], f"--lazy-tokens: rc {rc}, {out[:300]!r}")
rc, out, err = run([replay, "--json", "--no-kv", "--lazy-tokens", "--repeat", "2", "--page-size", "1",
                    "--kv-budget", "1MiB"] + small)
d = json.loads(out) if out.startswith("{") else {}
check(rc == 0 and d.get("ok") is True and d["requests"] == 32 and d["unbounded_hit_rate"] >= d["hit_rate"] > 0,
      f"--no-kv --lazy-tokens: rc {rc}, {out[:300]!r}")
# --timeline: a header and one row per window, the windows' requests adding up to the run's
tl = os.path.join(tmp, "timeline.csv")
rc, out, err = run([replay, "--json", "--timeline", tl, "--timeline-window", "3", "--repeat", "2"] + small)
rows = list(csv.DictReader(open(tl))) if rc == 0 else []
check(rc == 0 and len(rows) == 12 and rows[-1]["requests"] == "32" and
      sum(int(r["prompt_tokens"]) for r in rows) == 32 * 144 and
      all(0 <= float(r["hit_rate"]) <= 1 for r in rows), f"--timeline: rc {rc}, {len(rows)} rows")
# kvhal-bench --csv: a header and a row per record; a lost CSV is exit 1
bc = os.path.join(tmp, "bench.csv")
rc, out, err = run([bench, "--quick", "--op", "desc_cache", "--csv", bc, "--json"])
d = json.loads(out) if out.startswith("{") else {}
rows = list(csv.DictReader(open(bc))) if rc == 0 else []
check(rc == 0 and d.get("tool") == "kvhal-bench" and d.get("version") == version and
      len(rows) == len(d.get("records", [])) > 0 and all(r["ns"] for r in rows), f"kvhal-bench --csv: rc {rc}")
rc, out, err = run([bench, "--quick", "--op", "desc_cache", "--csv", "/dev/full", "-q"])
check(rc == 1 and "--csv" in err, f"kvhal-bench --csv /dev/full: rc {rc}, {err!r}")
rc, out, err = run([bench, "--quick", "--op", "desc_cache"])
check(rc == 0 and "ETA" in err or "steps (100%)" in err, f"kvhal-bench progress on stderr: {err!r}")
shutil.rmtree(tmp)

print("tool conventions:", "FAIL" if failures else "OK")
sys.exit(1 if failures else 0)
