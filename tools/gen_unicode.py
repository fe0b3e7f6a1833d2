#!/usr/bin/env python3
"""gen_unicode.py - generate the >>unicode section of qsa_runtime.h (the generated block between
the `>>unicode-generated-begin` and `>>unicode-generated-end` markers).

The tokenizer must reproduce the Hugging Face `tokenizers` library bit for bit, and that library
mixes two Unicode versions (measured on tokenizers 0.23.3 by probing every code point, see
--verify):
  * the pre-tokenizer regex runs on Oniguruma, whose \\p{L}, \\p{N}, \\p{M} and \\s follow
    Unicode 16.0;
  * the NFC normalizer (crate unicode-normalization-alignments) carries Unicode 9.0 data:
    characters assigned after 9.0 have combining class 0 and no decomposition there.
So the category tables come from `unicodedata2` 16.0.0 (the PyPI backport of Python's
unicodedata) and the NFC tables come from the same module restricted to code points whose
DerivedAge is <= 9.0 (normalization data of an assigned character never changes: Unicode
stability policy).  Decomposition/composition stability makes this exactly Unicode 9.0 NFC.

    pip install unicodedata2==16.0.0          # category + normalization data
    apt-get install unicode-data              # /usr/share/unicode/DerivedAge.txt
    python3 tools/gen_unicode.py --splice qsa_runtime.h   # rewrite the block in the header
    python3 tools/gen_unicode.py > unicode.h              # or print it
    python3 tools/gen_unicode.py --verify     # compare with the installed `tokenizers`

Without unicodedata2 the script falls back to the standard library's unicodedata (Unicode 14.0
on Python 3.11) and says so in the output header; the conformance fixture will then disagree on
characters assigned in Unicode 15 and 16.

Output tables (ranges, not per-code-point arrays):
  qsa__uni_cls[]    {lo | flags << 24, hi}: L=1 N=2 M=4 WS=8 (White_Space = regex \\s)
  qsa__uni_ccc[]    {lo | ccc << 24, hi}: canonical combining class (Unicode 9.0), non-zero only
  qsa__uni_dec[]    {cp | comp << 31, d0, d1}: one level of canonical decomposition (d1 = 0
                    for singletons); comp = 1 when (d0, d1) recomposes to cp in NFC (primary
                    composite).  Hangul syllables are algorithmic and not listed.
  qsa__uni_comp[]   indices of the primary composites in qsa__uni_dec, sorted by (d0, d1).
"""
import argparse
import sys

WHITE_SPACE = [0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680] + list(range(0x2000, 0x200B)) + \
              [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]  # PropList.txt White_Space (stable)
CAT_VERSION = "16.0.0"
NFC_MAX_AGE = (9, 0)


def load_ucd(allow_mismatch):
    try:
        import unicodedata2 as ud
    except ImportError:
        import unicodedata as ud
        sys.stderr.write("gen_unicode: unicodedata2 not installed, using the standard library's "
                         "unicodedata %s\n" % ud.unidata_version)
        return ud, "Python unicodedata"
    if ud.unidata_version != CAT_VERSION and not allow_mismatch:
        sys.exit("gen_unicode: unicodedata2 is %s, want %s (pip install unicodedata2==%s) or pass "
                 "--allow-version-mismatch" % (ud.unidata_version, CAT_VERSION, CAT_VERSION))
    return ud, "unicodedata2"


def load_ages(path):
    ages = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line:
                continue
            rng, age = [x.strip() for x in line.split(";")]
            lo, _, hi = rng.partition("..")
            lo = int(lo, 16)
            hi = int(hi, 16) if hi else lo
            a = tuple(int(x) for x in age.split("."))
            for c in range(lo, hi + 1):
                ages[c] = a
    return ages


def code_points():
    return [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]


def class_flags(ud, c):
    cat = ud.category(chr(c))
    f = 0
    if cat[0] == "L":
        f |= 1
    if cat[0] == "N":
        f |= 2
    if cat[0] == "M":
        f |= 4
    if c in WHITE_SPACE:
        f |= 8
    return f


def ranges(values):
    """values: dict cp -> nonzero value; returns [(lo, hi, v)] of maximal runs."""
    out = []
    for c in sorted(values):
        v = values[c]
        if out and out[-1][1] == c - 1 and out[-1][2] == v:
            out[-1][1] = c
        else:
            out.append([c, c, v])
    return out


def build(ud, ages):
    cls = {}
    for c in code_points():
        f = class_flags(ud, c)
        if f:
            cls[c] = f
    old = [c for c in code_points() if ages.get(c, (99,)) <= NFC_MAX_AGE]
    oldset = set(old)
    ccc = {}
    dec = []
    for c in old:
        k = ud.combining(chr(c))
        if k:
            ccc[c] = k
        if 0xAC00 <= c <= 0xD7A3:
            continue
        d = ud.decomposition(chr(c))
        if not d or d.startswith("<"):
            continue
        parts = [int(x, 16) for x in d.split()]
        assert len(parts) in (1, 2) and all(p in oldset for p in parts), hex(c)
        comp = 0
        if len(parts) == 2 and ud.normalize("NFC", chr(parts[0]) + chr(parts[1])) == chr(c):
            comp = 1
        dec.append((c, parts[0], parts[1] if len(parts) == 2 else 0, comp))
    return ranges(cls), ranges(ccc), dec


def emit(out, ud, src, cls, ccc, dec):
    w = out.write
    w("/* ============================================================================================== */\n")
    w("/* >>unicode  Unicode tables for the tokenizer: regex classes (Unicode %s) and NFC (Unicode %d.%d) */\n"
      % (ud.unidata_version, NFC_MAX_AGE[0], NFC_MAX_AGE[1]))
    w("/* GENERATED by tools/gen_unicode.py from %s %s; do not edit.                           */\n"
      % (src, ud.unidata_version))
    w("/* ============================================================================================== */\n\n")
    w("#define QSA__UNI_L 1u  /* \\p{L} */\n#define QSA__UNI_N 2u  /* \\p{N} */\n"
      "#define QSA__UNI_M 4u  /* \\p{M} */\n#define QSA__UNI_WS 8u /* \\s (White_Space) */\n")
    w("#define QSA__UNI_CLASS_VERSION \"%s\"\n#define QSA__UNI_NFC_VERSION \"%d.%d.0\"\n\n"
      % (ud.unidata_version, NFC_MAX_AGE[0], NFC_MAX_AGE[1]))

    def table(name, rows, per_line, fmt, ctype, ncol):
        w("static const %s %s[][%d] = {\n" % (ctype, name, ncol))
        line = []
        for r in rows:
            line.append(fmt(r))
            if len(line) == per_line:
                w("    " + ",".join(line) + ",\n")
                line = []
        if line:
            w("    " + ",".join(line) + ",\n")
        w("};\n")

    w("/* {lo | flags << 24, hi}, sorted */\n")
    table("qsa__uni_cls", cls, 8, lambda r: "{0x%x,0x%x}" % (r[0] | r[2] << 24, r[1]), "uint32_t", 2)
    w("#define QSA__UNI_CLS_N %d\n\n" % len(cls))
    w("/* {lo | ccc << 24, hi}, sorted; code points not listed have class 0 */\n")
    table("qsa__uni_ccc", ccc, 8, lambda r: "{0x%x,0x%x}" % (r[0] | r[2] << 24, r[1]), "uint32_t", 2)
    w("#define QSA__UNI_CCC_N %d\n\n" % len(ccc))
    w("/* {cp | primary_composite << 31, first, second (0 for a singleton)}, sorted by cp */\n")
    table("qsa__uni_dec", dec, 6, lambda r: "{0x%x,0x%x,0x%x}" % (r[0] | r[3] << 31, r[1], r[2]), "uint32_t", 3)
    w("#define QSA__UNI_DEC_N %d\n\n" % len(dec))
    comp = sorted((i for i, r in enumerate(dec) if r[3]), key=lambda i: (dec[i][1], dec[i][2]))
    w("/* indices into qsa__uni_dec of the primary composites, sorted by (first, second) */\n")
    w("static const uint16_t qsa__uni_comp[] = {\n")
    for k in range(0, len(comp), 16):
        w("    " + ",".join(str(i) for i in comp[k:k + 16]) + ",\n")
    w("};\n#define QSA__UNI_COMP_N %d\n\n" % len(comp))
    w(RUNTIME)


RUNTIME = r"""/* value (top 8 bits of the first word) of the range {lo | value << 24, hi} holding c, or 0:
   binary search over a sorted range table */
QSA_PRIV unsigned qsa__uni_range_value(const uint32_t (*t)[2], size_t n, uint32_t c) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((t[mid][0] & 0xffffffu) > c) hi = mid;
        else if (t[mid][1] < c) lo = mid + 1;
        else return t[mid][0] >> 24;
    }
    return 0;
}

/* class flags of a code point */
QSA_PRIV unsigned qsa__uni_class(uint32_t c) { return qsa__uni_range_value(qsa__uni_cls, QSA__UNI_CLS_N, c); }

/* canonical combining class (Unicode 9.0 data, like the tokenizers library's NFC) */
QSA_PRIV unsigned qsa__uni_ccc_of(uint32_t c) {
    return c < 0x300 ? 0 : qsa__uni_range_value(qsa__uni_ccc, QSA__UNI_CCC_N, c);
}

/* index of c in qsa__uni_dec or -1 */
QSA_PRIV int qsa__uni_dec_find(uint32_t c) {
    size_t lo = 0, hi = QSA__UNI_DEC_N;
    if (c < 0xc0) return -1;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t m = qsa__uni_dec[mid][0] & 0x7fffffffu;
        if (m > c) hi = mid;
        else if (m < c) lo = mid + 1;
        else return (int)mid;
    }
    return -1;
}

/* primary composite of (a, b) from the table (Hangul is handled by the caller), or 0 */
QSA_PRIV uint32_t qsa__uni_compose(uint32_t a, uint32_t b) {
    size_t lo = 0, hi = QSA__UNI_COMP_N;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = qsa__uni_dec[qsa__uni_comp[mid]];
        if (e[1] > a || (e[1] == a && e[2] > b)) hi = mid;
        else if (e[1] < a || e[2] < b) lo = mid + 1;
        else return e[0] & 0x7fffffffu;
    }
    return 0;
}
"""


def verify(ud, cls, ccc, dec):
    """Compare the generated tables' meaning with the installed tokenizers library."""
    import unicodedata
    from tokenizers import normalizers, pre_tokenizers, Regex
    flags = {}
    for lo, hi, f in cls:
        for c in range(lo, hi + 1):
            flags[c] = f
    pat2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    pat35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
             r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    sp2 = pre_tokenizers.Split(Regex(pat2), "isolated")
    sp35 = pre_tokenizers.Split(Regex(pat35), "isolated")

    def n(s, sp=sp2):
        return len(sp.pre_tokenize_str(s))

    bad = 0
    for c in code_points():
        ch = chr(c)
        f = flags.get(c, 0)
        if c in (10, 13):
            continue
        # what Oniguruma thinks: letter / mark / number / other / space
        if n("x" + ch) == 1:
            got = "L"
        elif n("x" + ch, sp35) == 1:
            got = "M"
        elif n(ch + ch) == 2:
            got = "N"
        elif n("!" + ch) == 1:
            got = "P"
        else:
            got = "W"
        want = "L" if f & 1 else "M" if f & 4 else "N" if f & 2 else "W" if f & 8 else "P"
        if got != want:
            bad += 1
            if bad < 20:
                print("class mismatch U+%04X: tokenizers %s, table flags %d" % (c, got, f))
    print("regex classes: %d mismatches" % bad)
    # NFC: emulate the tables in Python (decompose, reorder, compose) and compare
    cccmap = {}
    for lo, hi, k in ccc:
        for c in range(lo, hi + 1):
            cccmap[c] = k
    decmap = {c: (a, b) for c, a, b, comp in dec}
    compmap = {(a, b): c for c, a, b, comp in dec if comp}
    N = normalizers.NFC()
    SB, LB, VB, TB, LC, VC, TC = 0xAC00, 0x1100, 0x1161, 0x11A7, 19, 21, 28

    def decomp(c, out):
        if SB <= c < SB + LC * VC * TC:
            s = c - SB
            out += [LB + s // (VC * TC), VB + (s % (VC * TC)) // TC]
            if s % TC:
                out.append(TB + s % TC)
            return
        if c in decmap:
            a, b = decmap[c]
            decomp(a, out)
            if b:
                decomp(b, out)
            return
        out.append(c)

    def nfc(s):
        d = []
        for ch in s:
            decomp(ord(ch), d)
        i = 0
        while i < len(d):  # canonical order (stable sort of non-starter runs)
            if cccmap.get(d[i], 0):
                j = i
                while j < len(d) and cccmap.get(d[j], 0):
                    j += 1
                d[i:j] = sorted(d[i:j], key=lambda x: cccmap[x])
                i = j
            else:
                i += 1
        out = []
        starter = -1
        last_ccc = -1
        for c in d:
            k = cccmap.get(c, 0)
            if starter >= 0 and (last_ccc < k or (last_ccc == 0 and out and len(out) - 1 == starter)):
                s0 = out[starter]
                comp = None
                if LB <= s0 < LB + LC and VB <= c < VB + VC:
                    comp = SB + ((s0 - LB) * VC + (c - VB)) * TC
                elif SB <= s0 < SB + LC * VC * TC and (s0 - SB) % TC == 0 and TB < c < TB + TC:
                    comp = s0 + c - TB
                elif (s0, c) in compmap:
                    comp = compmap[(s0, c)]
                if comp is not None:
                    out[starter] = comp
                    continue
            if k == 0:
                starter = len(out)
            last_ccc = k
            out.append(c)
        return "".join(chr(c) for c in out)

    bad = 0
    tests = [chr(c) for c in code_points()]
    tests += ["a" + chr(c) + m for c in list(cccmap) + [0x7FD, 0x1DF6] for m in ("\u0334", "\u0301", "\u05b0")]
    tests += ["".join(chr(x) for x in (a, b)) for c, a, b, comp in dec if b]
    for s in tests:
        if nfc(s) != N.normalize_str(s):
            bad += 1
            if bad < 20:
                print("NFC mismatch %s: tokenizers %s, tables %s" % ([hex(ord(x)) for x in s],
                      [hex(ord(x)) for x in N.normalize_str(s)], [hex(ord(x)) for x in nfc(s)]))
    print("NFC: %d mismatches over %d strings" % (bad, len(tests)))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--derived-age", default="/usr/share/unicode/DerivedAge.txt")
    ap.add_argument("--allow-version-mismatch", action="store_true")
    ap.add_argument("--verify", action="store_true", help="compare with the tokenizers library instead of printing")
    ap.add_argument("--splice", metavar="HEADER", help="replace the generated block of HEADER instead of printing")
    a = ap.parse_args()
    ud, src = load_ucd(a.allow_version_mismatch)
    ages = load_ages(a.derived_age)
    cls, ccc, dec = build(ud, ages)
    if a.verify:
        sys.exit(1 if verify(ud, cls, ccc, dec) else 0)
    if not a.splice:
        emit(sys.stdout, ud, src, cls, ccc, dec)
        return
    import io
    buf = io.StringIO()
    emit(buf, ud, src, cls, ccc, dec)
    text = open(a.splice, encoding="utf-8").read()
    begin, end = "/* >>unicode-generated-begin", "/* >>unicode-generated-end */"
    i, j = text.index(begin), text.index(end)
    i = text.index("\n", i) + 1
    open(a.splice, "w", encoding="utf-8").write(text[:i] + buf.getvalue() + text[j:])


if __name__ == "__main__":
    main()
