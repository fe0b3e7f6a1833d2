#!/usr/bin/env python3
"""sass_loops.py - the SASS of chosen kernels, counted: what a change does to a kernel's inner loops,
measured without a GPU (the instructions a warp issues per trip, which `ncu` showed binding the decode
expert kernels at batch 32).

    python3 tools/sass_loops.py qsa_k_moe_gate_up_xwn qsa_k_moe_down_xwn
    python3 tools/sass_loops.py --arch sm_80 --cubin build/k80.cubin qsa_k_gemv_nvfp4
    python3 tools/sass_loops.py --fetch            # cuobjdump and nvdisasm from PyPI into .dev/cuobjdump (once)
    make build/nvrtc_check && build/nvrtc_check sm_90 build/k90.cubin   # the runtime's own sm_90 image (NVRTC)
    python3 tools/sass_loops.py --no-build --cubin build/k90.cubin --divisions qsa_k_gdn_recurrent_batch

Compiles kernels.cu with nvcc (-cubin -O3, the --arch given, default sm_90) into the --cubin path
(default build/kernels-<arch>.cubin) unless --no-build, then disassembles each kernel with cuobjdump
($CUOBJDUMP, else on PATH, else .dev/cuobjdump's, which runs the nvdisasm beside it) and prints its
registers, static shared memory and SASS instruction count, and for every innermost loop that holds a
tensor-core instruction (HMMA) its addresses and length with the instruction mix: HMMA, LDS/LDSM
(shared loads), STS, LDG, LDGSTS (cp.async), and the warp syncs (WARPSYNC, BRA.DIV).  A loop is a
backward branch (not a BRA.DIV) whose body holds no EXIT (the divergence paths that branch back from a
kernel's tail are not loops) and no other such loop.  nvcc's SASS is what the driver builds from
NVRTC's PTX only approximately (another ptxas), so compare trees with the same tool, not with `ncu`; where
the runtime loads NVRTC's own machine code (sm_90 with NVRTC 13: docs/CUDA.md), build/nvrtc_check writes that
image, the SASS that runs.

--divisions: also each kernel's integer divisions by numbers known only at run time, counted by the reciprocal
each divisor's sequence starts with (I2F.RP then MUFU.RCP; each quotient or remainder taken with it adds ~8
instructions, and ptxas may share one reciprocal among them), and every innermost loop that holds any, with its
length: such divisions in each trip of two copy loops made the batch-32 GDN recurrence issue-bound (s70).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV = os.path.join(ROOT, '.dev', 'cuobjdump')


def find_cuobjdump():
    env = os.environ.get('CUOBJDUMP')
    if env:
        return env
    p = shutil.which('cuobjdump')
    if p:
        return p
    hits = glob.glob(os.path.join(DEV, 'nvidia', '*', 'bin', 'cuobjdump'))
    return hits[0] if hits else None


def fetch():
    os.makedirs(DEV, exist_ok=True)
    subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', 'nvidia-cuda-cuobjdump',
                    'nvidia-cuda-nvdisasm', '-d', DEV], check=True)
    for whl in glob.glob(os.path.join(DEV, '*.whl')):
        subprocess.run([sys.executable, '-m', 'zipfile', '-e', whl, DEV], check=True)
    for b in glob.glob(os.path.join(DEV, 'nvidia', '*', 'bin', '*')):
        os.chmod(b, 0o755)
    print('cuobjdump:', find_cuobjdump())


INS = re.compile(r'^\s+/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;')
BRA = re.compile(r'\bBRA\b(?:\.U)?\s+(?:`?\(?[!]?U?P\w+\)?,\s*)?0x([0-9a-f]+)')


def kernel_sass(cuobjdump, cubin, name):
    out = subprocess.run([cuobjdump, '-sass', '-fun', name, cubin], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit('cuobjdump failed for %s: %s' % (name, out.stderr.strip()))
    ins = []
    for line in out.stdout.splitlines():
        m = INS.match(line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    return ins


def registers(cuobjdump, cubin, name):
    out = subprocess.run([cuobjdump, '-res-usage', cubin], capture_output=True, text=True).stdout
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if re.search(r'Function %s:?\s*$' % re.escape(name), line) and i + 1 < len(lines):
            m = re.search(r'REG:(\d+)', lines[i + 1])
            s = re.search(r'SHARED:(\d+)', lines[i + 1])
            return (int(m.group(1)) if m else None, int(s.group(1)) if s else None)
    return (None, None)


def loops(ins):
    addr = [a for a, _ in ins]
    index = {a: i for i, a in enumerate(addr)}
    cands = []
    for i, (a, text) in enumerate(ins):
        if 'BRA.DIV' in text:
            continue
        m = BRA.search(text)
        if not m:
            continue
        t = int(m.group(1), 16)
        if t >= a or t not in index:
            continue
        j = index[t]
        if any('EXIT' in x for _, x in ins[j:i + 1]):
            continue
        cands.append((j, i))
    inner = [c for c in cands if not any(o != c and c[0] <= o[0] and o[1] <= c[1] for o in cands)]
    return sorted(set(inner))


def mix(body):
    def count(pred):
        return sum(1 for _, x in body if pred(x.split()[0] if not x.startswith('@') else x.split()[1]))
    return {
        'HMMA': count(lambda op: op.startswith('HMMA')),
        'LDS': count(lambda op: op.startswith('LDS')),
        'STS': count(lambda op: op.startswith('STS')),
        'LDG': count(lambda op: op.startswith('LDG.') or op == 'LDG'),
        'LDGSTS': count(lambda op: op.startswith('LDGSTS')),
        'sync': count(lambda op: op.startswith('WARPSYNC') or op.startswith('BRA.DIV')),
    }


def divisions(ins):
    """indices of the integer divisions' reciprocals (I2F.RP or I2F.U32.RP, before the MUFU.RCP)"""
    return [i for i, (_, x) in enumerate(ins) if re.search(r'\bI2F(?:\.U32)?\.RP\b', x)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('kernels', nargs='*')
    ap.add_argument('--arch', default='sm_90')
    ap.add_argument('--cubin')
    ap.add_argument('--no-build', action='store_true', help='use the cubin as it is')
    ap.add_argument('--divisions', action='store_true',
                    help='also the integer divisions by run-time numbers, and the innermost loops that hold any')
    ap.add_argument('--fetch', action='store_true',
                    help='download cuobjdump and nvdisasm from PyPI into .dev/cuobjdump')
    a = ap.parse_args()
    if a.fetch:
        fetch()
        if not a.kernels:
            return 0
    if not a.kernels:
        ap.error('name at least one kernel (qsa_k_...)')
    cuobjdump = find_cuobjdump()
    if not cuobjdump:
        raise SystemExit('no cuobjdump: set $CUOBJDUMP, put it on PATH, or run with --fetch')
    cubin = a.cubin or os.path.join(ROOT, 'build', 'kernels-%s.cubin' % a.arch)
    if not a.no_build:
        os.makedirs(os.path.dirname(cubin), exist_ok=True)
        subprocess.run(['nvcc', '-cubin', '-arch=' + a.arch, '-O3', '-o', cubin, os.path.join(ROOT, 'kernels.cu')],
                       check=True)
    for name in a.kernels:
        ins = kernel_sass(cuobjdump, cubin, name)
        if not ins:
            print('%s: not in %s' % (name, cubin))
            continue
        reg, smem = registers(cuobjdump, cubin, name)
        print('%s: %d instructions, %s registers, %s bytes of static shared memory' % (name, len(ins), reg, smem))
        if a.divisions:
            d = divisions(ins)
            inl = [(j, i, sum(1 for x in d if j <= x <= i)) for j, i in loops(ins)]
            inl = [t for t in inl if t[2]]
            print('  integer division reciprocals: %d, %d of them in %d innermost loops' % (len(d), sum(t[2] for t in inl), len(inl)))
            for j, i, n in inl:
                print('  loop %#06x-%#06x: %4d instructions  divisions %d' % (ins[j][0], ins[i][0], i - j + 1, n))
        for j, i in loops(ins):
            body = ins[j:i + 1]
            c = mix(body)
            if not c['HMMA']:
                continue
            print('  loop %#06x-%#06x: %4d instructions  ' % (ins[j][0], ins[i][0], len(body)) +
                  '  '.join('%s %d' % (k, v) for k, v in c.items()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
