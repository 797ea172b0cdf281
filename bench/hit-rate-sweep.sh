#!/bin/bash
# hit-rate-sweep.sh: hit rate against the device KV budget, one kvhal-replay run per budget (every prefix hit
# verified as in any run), as a CSV that bench/plot.py draws (plot.py sweep).
# Run (repository root): bash bench/hit-rate-sweep.sh > sweep.csv
#   R=the kvhal-replay to run (default build/tools/kvhal-replay), BUDGETS="1MiB 2MiB ..." (device budgets),
#   ARGS="..." (the workload and any other kvhal-replay options, e.g. --host-tier 16MiB; default: 24 groups x 8
#   prompts, zipf 1.0, 1024-token system prompts, the tiny model).
# Output: kv_budget,host_tier,hit_rate,host_hit_rate,unbounded_hit_rate,pages_evicted,requests_per_s,ok (a row per
#   budget; exit status 1 when a run failed, its row kept with ok false).
set -uo pipefail
R=${R:-build/tools/kvhal-replay}
BUDGETS=${BUDGETS:-1MiB 2MiB 4MiB 8MiB 16MiB 32MiB}
ARGS=${ARGS:---groups 24 --prompts 8 --system-len 1024 --question-len 64 --output-len 32 --zipf 1.0}
echo "kv_budget,host_tier,hit_rate,host_hit_rate,unbounded_hit_rate,pages_evicted,requests_per_s,ok"
rc=0
for b in $BUDGETS; do
  # shellcheck disable=SC2086
  out=$("$R" --json --quiet --kv-budget "$b" $ARGS) || rc=1
  python3 -c '
import json, sys
d = json.loads(sys.argv[1])
f = lambda k: "" if d.get(k) is None else d[k]
print(",".join(str(x) for x in (f("kv_budget"), f("host_tier"), f("hit_rate"), d.get("host_hit_rate") or 0,
                                  f("unbounded_hit_rate"), f("pages_evicted"), f("requests_per_s"),
                                  str(d["ok"]).lower())))' "$out" || { echo "hit-rate-sweep.sh: $b: no summary" >&2; rc=1; }
done
exit $rc
