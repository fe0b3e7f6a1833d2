#!/bin/sh
# embed_kernels.sh - turns kernels.cu into kernels.cu.inc: the body of a C array of strings, one
# string literal per source line, the first being `#line 1 "kernels.cu"` so that NVRTC errors name
# lines of kernels.cu.  Needs only a POSIX shell and awk.  `make` runs it; CI checks that the
# committed .inc matches (make check-kernels).
#
#   sh tools/embed_kernels.sh kernels.cu > kernels.cu.inc
#
# Escapes: backslash, double quote and '?' (so no trigraph can form in C99/C++ modes).  Carriage
# returns are dropped.  Each literal stays far below the 4095 characters C99 guarantees.
set -eu
src=${1:-kernels.cu}
name=$(basename "$src")
LC_ALL=C awk -v name="$name" '
function esc(s,    out, i, c) {
    out = ""
    for (i = 1; i <= length(s); i++) {
        c = substr(s, i, 1)
        if (c == "\\") out = out "\\\\"
        else if (c == "\"") out = out "\\\""
        else if (c == "?") out = out "\\?"
        else if (c == "\r") continue
        else out = out c
    }
    return out
}
BEGIN { printf "\"#line 1 \\\"%s\\\"\\n\",\n", esc(name) }
{ printf "\"%s\\n\",\n", esc($0) }
END { printf "/* generated from %s by tools/embed_kernels.sh: edit %s and run make */\n", name, name }
' "$src"
