#!/usr/bin/env python3
"""Sums the test cases of one or more meson test logs (testlog.json): cmocka's own counts where a test printed
them, otherwise the meson result of the test. Prints 'kvhal: N passed, N failed, N skipped' and exits 1 when
anything failed."""
import json, re, sys

passed = failed = skipped = 0
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            t = json.loads(line)
            out = t.get("stdout") or ""
            p = sum(int(n) for n in re.findall(r"\[  PASSED  \] (\d+) test", out))
            fl = sum(int(n) for n in re.findall(r"\[  FAILED  \] (\d+) test", out))
            s = sum(int(n) for n in re.findall(r"\[  SKIPPED \] (\d+) test", out))
            res = t.get("result", "")
            if p or fl or s:
                passed += p; failed += fl; skipped += s
                if res not in ("OK", "EXPECTEDFAIL", "SKIP") and fl == 0:
                    failed += 1  # crashed or timed out after its counts
            elif res in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif res == "SKIP":
                skipped += 1
            else:
                failed += 1
print(f"kvhal: {passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
