#!/usr/bin/env python3
"""ncu_stalls.py - where a kernel's warps wait, from Nsight Compute's per-instruction source page.

On the GPU machine, after a profile with the SourceCounters section exported to a report:

    ncu --import b32.ncu-rep -k regex:moe_down_xwn --launch-count 1 --page source --csv \\
        --print-source sass > down.csv

then, anywhere (no GPU, no ncu):

    python3 tools/ncu_stalls.py down.csv [more.csv ...] [--top 20] [--schedulers 528 --ghz 1.98]

prints for each file: the warp instructions executed and what they take at one instruction per scheduler
per cycle (the issue floor), the sampled warp states over the whole kernel (stall reasons as fractions of
the samples), the code regions (runs of instructions executed equally often: a loop body, a prologue)
with their share of the samples, and the instructions with the most samples and their three main states.
"""
import argparse
import collections
import csv
import sys


def load(path):
    rows = list(csv.reader(open(path, newline='')))
    # the first row names the kernel, the second the columns
    hdr = rows[1]
    col = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
    data = []
    for r in rows[2:]:
        if len(r) < len(hdr):
            continue

        def num(name):
            v = r[col[name]] if name in col else ''
            return int(v) if v.strip().lstrip('-').isdigit() else 0
        data.append({
            'addr': int(r[col['Address']], 16),
            'sass': r[col['Source']].strip(),
            'samples': num('# Samples'),
            'executed': num('Instructions Executed'),
            'stalls': {s[len('stall_'):]: num(s) for s in stalls},
        })
    return rows[0][1] if len(rows[0]) > 1 else path, data


def report(path, top, schedulers, ghz):
    name, data = load(path)
    if not data:
        print('%s: no instructions' % path)
        return
    base = data[0]['addr']
    samples = sum(d['samples'] for d in data) or 1
    executed = sum(d['executed'] for d in data)
    print('%s (%s): %d instructions, %.1f M warp instructions executed = %.1f us at one per scheduler per cycle '
          '(%d schedulers, %.2f GHz), %d samples' % (name, path, len(data), executed / 1e6,
                                                     executed / schedulers / (ghz * 1e3), schedulers, ghz, samples))
    states = collections.Counter()
    for d in data:
        states.update(d['stalls'])
    print('  warp states: ' + ', '.join('%s %.1f%%' % (k, 100.0 * v / samples) for k, v in states.most_common(10) if v))
    print('  regions (instructions executed equally often):')
    regions = []
    for d in data:
        if regions and regions[-1]['executed'] == d['executed']:
            regions[-1]['end'] = d['addr']
            regions[-1]['n'] += 1
            regions[-1]['samples'] += d['samples']
        else:
            regions.append({'start': d['addr'], 'end': d['addr'], 'executed': d['executed'], 'n': 1,
                            'samples': d['samples']})
    for g in regions:
        if g['samples'] >= 0.01 * samples:
            print('    %6x-%6x  %4d instructions  executed %9d  samples %5.1f%%' %
                  (g['start'] - base, g['end'] - base, g['n'], g['executed'], 100.0 * g['samples'] / samples))
    print('  instructions with the most samples:')
    for d in sorted(data, key=lambda d: -d['samples'])[:top]:
        main = sorted(((v, k) for k, v in d['stalls'].items() if v), reverse=True)[:3]
        print('    %6x  %5.1f%%  %-56s %s' % (d['addr'] - base, 100.0 * d['samples'] / samples, d['sass'][:56],
                                             ', '.join('%s %d' % (k, v) for v, k in main)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('csv', nargs='+', help="ncu --page source --csv --print-source sass output")
    ap.add_argument('--top', type=int, default=20, help='instructions to list (20)')
    ap.add_argument('--schedulers', type=int, default=528, help='warp schedulers of the GPU (H200: 132 SMs x 4)')
    ap.add_argument('--ghz', type=float, default=1.98, help='SM clock for the issue floor (H200 boost: 1.98)')
    a = ap.parse_args()
    for p in a.csv:
        try:
            report(p, a.top, a.schedulers, a.ghz)
        except (OSError, KeyError, IndexError, ValueError) as e:
            print('%s: not an ncu source page (%s)' % (p, e), file=sys.stderr)
            return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
