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
            # cmocka prints one line per test case on stdout ([ RUN ], [ OK ], [ SKIPPED ] name); its summary
            # lines go to stderr, which the JSON log does not keep.
            run = len(re.findall(r"^\[ RUN      \] ", out, re.M))
            ok = len(re.findall(r"^\[       OK \] ", out, re.M))
            sk = len(re.findall(r"^\[  SKIPPED \] (?!\d+ test)", out, re.M))
            res = t.get("result", "")
            if run:
                fl = run - ok - sk
                if res not in ("OK", "EXPECTEDFAIL", "SKIP") and fl == 0:
                    fl = 1  # crashed or timed out outside a test case
                passed += ok; failed += fl; skipped += sk
            elif res in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif res == "SKIP":
                skipped += 1
            else:
                failed += 1
print(f"kvhal: {passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
