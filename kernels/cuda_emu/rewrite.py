#!/usr/bin/env python3
"""kernels/cuda_emu/rewrite.py - turns one kernels/cuda/*.cu file into host C++ for the CUDA
emulator (libshardlm_cuda_emu.so, kernels/cuda_emu/README.md): the two pieces of CUDA syntax a
C++ compiler cannot read are rewritten, everything else is left to emu.h's definitions.

  kernel<T, N><<<grid, block, smem, stream>>>(a, b)
      -> emu::launch(emu::cfg(grid, block, smem, stream), kernel<T, N>, a, b)
  extern __shared__ __align__(128) unsigned char smem[];
      -> unsigned char *smem = (unsigned char *)emu::dynamic_shared();

A launch's arguments are converted to the kernel's parameter types when it is launched, as CUDA
does (a captured graph keeps those values). Line numbers are kept (a launch's newlines stay in
it), so compiler messages and the emulator's reports name the .cu file's own lines.

Usage: rewrite.py IN.cu OUT.cc
"""
import re
import sys


def match_back(text, end, open_ch, close_ch):
    """Index of the open_ch matching the close_ch at text[end]."""
    depth = 0
    for i in range(end, -1, -1):
        if text[i] == close_ch:
            depth += 1
        elif text[i] == open_ch:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced %s%s before offset %d" % (open_ch, close_ch, end))


def match_forward(text, start, open_ch, close_ch):
    """Index of the close_ch matching the open_ch at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced %s%s after offset %d" % (open_ch, close_ch, start))


def rewrite_launches(text, path):
    out = []
    pos = 0
    while True:
        at = text.find("<<<", pos)
        if at < 0:
            out.append(text[pos:])
            return "".join(out)
        # the kernel expression: an identifier, maybe with template arguments, ending before <<<
        k_end = at
        while text[k_end - 1].isspace():
            k_end -= 1
        k_start = k_end
        if text[k_end - 1] == ">":
            k_start = match_back(text, k_end - 1, "<", ">")
        m = re.search(r"[A-Za-z_][A-Za-z_0-9:]*\s*$", text[:k_start])
        if not m:
            raise ValueError("%s: no kernel name before <<< at offset %d" % (path, at))
        k_start = m.start()
        kernel = text[k_start:k_end]
        cfg_end = text.find(">>>", at)
        cfg = text[at + 3:cfg_end]
        p_open = cfg_end + 3
        while text[p_open].isspace():
            p_open += 1
        if text[p_open] != "(":
            raise ValueError("%s: no argument list after >>> at offset %d" % (path, cfg_end))
        p_close = match_forward(text, p_open, "(", ")")
        args = text[p_open + 1:p_close]
        between = text[k_end:at] + text[cfg_end + 3:p_open]  # whitespace (newlines kept)
        call = "emu::launch(emu::cfg(%s), %s%s" % (cfg, kernel, between)
        call += (", " + args if args.strip() else args) + ")"
        out.append(text[pos:k_start])
        out.append(call)
        pos = p_close + 1


SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w\s]*?)\s+(\w+)\s*\[\s*\]\s*;")


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    text = SHARED.sub(lambda m: "%s *%s = (%s *)emu::dynamic_shared();" % (m.group(1), m.group(2), m.group(1)), text)
    text = rewrite_launches(text, src)
    with open(dst + ".tmp", "w") as f:
        f.write('#line 1 "%s"\n' % src)
        f.write(text)
    import os
    os.replace(dst + ".tmp", dst)


if __name__ == "__main__":
    main()
