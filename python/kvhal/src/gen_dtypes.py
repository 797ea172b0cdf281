"""Writes the binding's dtype table (kvpy_dtypes.h) from the kvhal_dtype enum of api/kvhal.h.

usage: gen_dtypes.py <api/kvhal.h> <out.h>

Every enumerator KVHAL_<NAME> = <value> becomes one row X(enumerator, "name", item size, DLPack code, DLPack bits):
the name is the enumerator's lower-cased tail (what kvhal_dtype_name() returns), the size and the DLPack type follow
from the name by the rules below. A dtype no rule covers stops the build: the binding must decide how it crosses
DLPack. The module checks the names and sizes against kvhal_dtype_name() and kvhal_dtype_size() when it loads."""
import re
import sys

# kvhal's fp8 formats by DLPack's names: kvhal's e4m3 is the OCP format without infinities (DLPack's e4m3fn).
FP8_DLPACK = {
    "e4m3": "KVHAL_PY_DL_FLOAT8_E4M3FN",
    "e5m2": "KVHAL_PY_DL_FLOAT8_E5M2",
    "e4m3fnuz": "KVHAL_PY_DL_FLOAT8_E4M3FNUZ",
    "e5m2fnuz": "KVHAL_PY_DL_FLOAT8_E5M2FNUZ",
}
# name pattern -> DLPack type code of an integer or float of <bits> bits
SCALAR_DLPACK = [(r"f(\d+)", "kDLFloat"), (r"bf(\d+)", "kDLBfloat"), (r"i(\d+)", "kDLInt"), (r"u(\d+)", "kDLUInt")]
# name pattern -> the names NumPy, PyTorch and ml_dtypes give the same type (str(torch.float16) is 'torch.float16';
# the binding drops the 'torch.' prefix): f16 is also 'float16' and 'half', fp8_e4m3 'float8_e4m3fn'
SCALAR_ALIASES = [(r"f(\d+)", ["float{0}"]), (r"bf(\d+)", ["bfloat{0}"]), (r"i(\d+)", ["int{0}"]),
                  (r"u(\d+)", ["uint{0}"])]
EXTRA_ALIASES = {"f16": ["half"], "fp8_e4m3": ["float8_e4m3fn", "fp8_e4m3fn"],
                 "fp8_e5m2": ["float8_e5m2"], "fp8_e4m3fnuz": ["float8_e4m3fnuz"], "fp8_e5m2fnuz": ["float8_e5m2fnuz"]}


def dlpack_type(name):
    """(DLPack code, bits) of a kvhal dtype name."""
    if name.startswith("fp8_") and name[4:] in FP8_DLPACK:
        return FP8_DLPACK[name[4:]], 8
    for pattern, code in SCALAR_DLPACK:
        m = re.fullmatch(pattern, name)
        if m and int(m.group(1)) in (8, 16, 32, 64):
            return code, int(m.group(1))
    sys.exit(f"gen_dtypes.py: the kvhal dtype '{name}' has no DLPack type here: add a rule for it")


def aliases(name):
    """The other names of a kvhal dtype name (NumPy's, PyTorch's), never one of kvhal's own."""
    out = []
    for pattern, forms in SCALAR_ALIASES:
        m = re.fullmatch(pattern, name)
        if m:
            out += [f.format(m.group(1)) for f in forms]
    return out + EXTRA_ALIASES.get(name, [])


def enum_rows(header_text):
    """[(enumerator, value)] of the kvhal_dtype enum."""
    m = re.search(r"typedef\s+enum\s+kvhal_dtype\s*\{(.*?)\}\s*kvhal_dtype\s*;", header_text, re.S)
    if not m:
        sys.exit("gen_dtypes.py: no 'typedef enum kvhal_dtype { ... } kvhal_dtype;' in the header")
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    body = re.sub(r"//[^\n]*", "", body)
    rows = [(e, int(v, 0)) for e, v in re.findall(r"\b(KVHAL_\w+)\s*=\s*(0[xX][0-9a-fA-F]+|\d+)", body)]
    if not rows:
        sys.exit("gen_dtypes.py: the kvhal_dtype enum has no enumerators with values")
    if sorted(v for _, v in rows) != list(range(len(rows))):
        sys.exit("gen_dtypes.py: the kvhal_dtype values are not 0 .. n-1")
    return sorted(rows, key=lambda r: r[1])


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        rows = enum_rows(f.read())
    lines = [
        "/* kvpy_dtypes.h: written by python/kvhal/src/gen_dtypes.py from the kvhal_dtype enum of api/kvhal.h at",
        " * build time; do not edit. KVPY_DTYPES(X): X(enumerator, name, item size, DLPack code, DLPack bits);",
        " * KVPY_DTYPE_ALIASES(X): X(enumerator, other name). */",
        "#ifndef KVPY_DTYPES_H",
        "#define KVPY_DTYPES_H",
        "",
        f"#define KVPY_DTYPE_COUNT {len(rows)}",
        "",
        "#define KVPY_DTYPES(X) \\",
    ]
    names, alias_rows = [], []
    for enum, _ in rows:
        name = enum[len("KVHAL_"):].lower()
        code, bits = dlpack_type(name)
        names.append(name)
        lines.append(f'    X({enum}, "{name}", {bits // 8}, {code}, {bits}) \\')
        alias_rows += [(enum, a) for a in aliases(name)]
    lines[-1] = lines[-1][:-2]
    taken = set(names)
    for enum, a in alias_rows:
        if a in taken:
            sys.exit(f"gen_dtypes.py: the name '{a}' would name two dtypes")
        taken.add(a)
    lines += ["", "#define KVPY_DTYPE_ALIASES(X) \\"] + [f'    X({e}, "{a}") \\' for e, a in alias_rows]
    lines[-1] = lines[-1][:-2]
    lines += ["", "/* the names, for messages */", f'#define KVPY_DTYPE_NAMES "{", ".join(names)}"', "", "#endif", ""]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
