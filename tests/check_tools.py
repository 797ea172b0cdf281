#!/usr/bin/env python3
"""The tool conventions (README, "Tools") on kvhal-info and kvhal-replay: --help (usage on stdout, exit 0),
--version ("<tool> <kvhal version>", exit 0), usage errors ("<tool>: error: ..." on stderr, exit 2), --opt=value and
--opt value alike, JSON with "version" and "ok", null for what was not measured, percentiles, and the failure object
(exit 1). Usage: check_tools.py <kvhal-info> <kvhal-replay> <version>."""
import json
import os
import subprocess
import sys

info, replay, version = sys.argv[1:4]
failures = []


def run(args, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


small = ["--groups=4", "--prompts", "4", "--system-len=128", "--question-len", "16", "--output-len=8", "--quiet"]
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
    check(d.get("ok") is False and d.get("version") == version and d.get("error", {}).get("status") ==
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

print("tool conventions:", "FAIL" if failures else "OK")
sys.exit(1 if failures else 0)
