"""check_guide.py — the first steps of docs/guide.md, as a newcomer would type them: the C block (after the marker
`<!-- first-steps: c`) compiled against this build and run, and the Python block (`<!-- first-steps: python`) run
with the build's kvhal package. Usage: check_guide.py GUIDE c 'CC...' INCLUDE_DIR LIB_DIR [CFLAG...]
                                      check_guide.py GUIDE python PYTHONPATH
Exit status 0 when the block builds and runs and its own check passes, 1 otherwise."""
import os
import re
import shlex
import subprocess
import sys
import tempfile


def block(guide, lang):
    text = open(guide, encoding="utf-8").read()
    m = re.search(r"<!-- first-steps: %s\b[^\n]*-->\n```%s\n(.*?)```" % (lang, lang), text, re.S)
    if not m:
        sys.exit("check_guide: no first-steps %s block in %s" % (lang, guide))
    return m.group(1)


def main():
    guide, lang = sys.argv[1], sys.argv[2]
    code = block(guide, lang)
    env = dict(os.environ)
    env.pop("KVHAL_DEVICE", None)
    with tempfile.TemporaryDirectory() as tmp:
        if lang == "c":
            cc, inc, lib = sys.argv[3:6]
            flags = sys.argv[6:]  # the build's sanitizers, for a library built with them
            src, exe = os.path.join(tmp, "first.c"), os.path.join(tmp, "first")
            open(src, "w").write(code)
            subprocess.run(shlex.split(cc) + ["-std=c11", "-Wall", "-Wextra", "-Werror"] + flags + ["-I" + inc, src, "-L" + lib, "-lkvhal",
                            "-Wl,-rpath," + lib, "-o", exe], check=True)
            run = [exe]
        else:
            env["PYTHONPATH"] = sys.argv[3]
            src = os.path.join(tmp, "first.py")
            open(src, "w").write(code)
            run = [sys.executable, src]
        p = subprocess.run(run, env=env, capture_output=True, text=True)
        sys.stdout.write(p.stdout)
        sys.stderr.write(p.stderr)
        if p.returncode != 0 or "token 1, K:" not in p.stdout:
            sys.exit("check_guide: the %s block failed (exit status %d)" % (lang, p.returncode))
    print("check_guide: the guide's %s first steps build, run and read the tokens back" % lang)


main()
