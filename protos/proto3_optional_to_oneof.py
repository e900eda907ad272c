#!/usr/bin/env python3
"""protos/proto3_optional_to_oneof.py IN OUT - rewrites every proto3 `optional` field of IN as
the one-field oneof that it is on the wire (`optional float t = 2;` -> `oneof _t { float t = 2; }`)
and writes the result to OUT, for protoc-c 1.4, which refuses proto3 optional. The wire format
and the field names are unchanged: protoc itself represents a proto3 optional field as a
"synthetic" oneof named `_<field>`. In the generated C a field `t` becomes `m->t` with
`m->_t_case == ..._T_T` when it was set.
Only the protoc-c input is rewritten; the descriptors served by reflection and the Python stubs
come from the original files. Used by protos/CMakeLists.txt; no test of its own (every server
test reads fields that went through it)."""
import re
import sys

FIELD = re.compile(r"^(\s*)optional\s+([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*(\[[^\]]*\])?\s*;(.*)$")


def main():
    src, dst = sys.argv[1], sys.argv[2]
    out = []
    with open(src, encoding="utf-8") as f:
        for line in f:
            m = FIELD.match(line.rstrip("\n"))
            if m:
                ind, typ, name, num, opts, rest = m.groups()
                opts = " " + opts if opts else ""
                line = f"{ind}oneof _{name} {{ {typ} {name} = {num}{opts}; }}{rest}\n"
            out.append(line)
    with open(dst, "w", encoding="utf-8") as f:
        f.writelines(out)


if __name__ == "__main__":
    main()
