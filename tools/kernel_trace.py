#!/usr/bin/env python3
"""kernel_trace.py - where a CUDA graph's replays spend their time, from tools/libkernel_trace.so's CSV.

    python3 tools/kernel_trace.py TRACE.csv [--graph ID] [--timeline A:B]

For each captured graph (the runtime's decode steps: one graph per batch size) its replays are told
apart by node (the i-th run of every node belongs to replay i).  Per replay: the step (first start to
last end), the time no kernel ran, and each kernel's increment: its end minus the previous end, with the
kernels in order of their ends.  In a chain of dependent launches the increments add up to the step and
say what each launch adds to it; a kernel that ends while another still runs (the side stream) adds
only what it ends later.  The table is per kernel name and grid, over the median replay (by step time):
launches, the increments' sum, its share of the step, the mean increment and the mean duration
(start to end; with programmatic dependent launch a kernel starts before its predecessor ends and
waits, so the durations overlap).  --timeline A:B prints kernels A..B-1 of the median replay (start,
end, increment, name, grid) to read one layer's chain.
"""
import argparse
import collections
import csv
import sys


def replays_of(rows):
    """rows of one graph -> list of replays (each a list of rows), node occurrence order"""
    by_node = collections.defaultdict(list)
    for r in rows:
        by_node[r['graph_node']].append(r)
    runs = [sorted(v, key=lambda r: r['start']) for v in by_node.values()]
    n = min(len(v) for v in runs)
    return [sorted((v[i] for v in runs), key=lambda r: r['start']) for i in range(n)]


def analyse(rep):
    t0 = min(r['start'] for r in rep)
    t1 = max(r['end'] for r in rep)
    by_end = sorted(rep, key=lambda r: r['end'])
    prev = t0
    for r in by_end:
        r['inc'] = r['end'] - prev
        prev = r['end']
    idle, reach = 0, t0
    for r in rep:  # (sorted by start)
        if r['start'] > reach:
            idle += r['start'] - reach
        reach = max(reach, r['end'])
    return t0, t1, idle


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('trace')
    ap.add_argument('--graph', type=int, default=None, help='only this graph id (default: every graph)')
    ap.add_argument('--timeline', default=None, help='A:B, kernels A..B-1 of the median replay')
    ap.add_argument('--top', type=int, default=40, help='table rows (default 40)')
    a = ap.parse_args()
    graphs = collections.defaultdict(list)
    with open(a.trace) as f:
        for r in csv.DictReader(f):
            g = int(r['graph'])
            if g == 0 or (a.graph is not None and g != a.graph):
                continue
            graphs[g].append({'start': int(r['start_ns']), 'end': int(r['end_ns']), 'graph_node': r['graph_node'],
                              'stream': r['stream'], 'name': r['name'][6:] if r['name'].startswith('qsa_k_') else r['name'],
                              'grid': '%s,%s,%s x %s' % (r['grid_x'], r['grid_y'], r['grid_z'], r['block_x'])})
    if not graphs:
        sys.exit('kernel_trace.py: no graph-launched kernels in %s' % a.trace)
    for g, rows in sorted(graphs.items()):
        reps = replays_of(rows)
        stats = []
        for rep in reps:
            t0, t1, idle = analyse(rep)
            stats.append((t1 - t0, idle, rep))
        stats.sort(key=lambda s: s[0])
        step, idle, rep = stats[len(stats) // 2]
        print('graph %d: %d kernels per replay, %d replays; step %.1f us (median; %s), no kernel running %.1f us'
              % (g, len(rep), len(reps), step / 1e3, ', '.join('%.1f' % (s[0] / 1e3) for s in stats), idle / 1e3))
        agg = collections.OrderedDict()
        for r in rep:
            k = (r['name'], r['grid'])
            e = agg.setdefault(k, [0, 0, 0])
            e[0] += 1
            e[1] += r['inc']
            e[2] += r['end'] - r['start']
        print('| kernel | grid | launches | increments us | of the step | us / launch | duration us / launch |')
        print('|---|---|---:|---:|---:|---:|---:|')
        for (name, grid), (n, inc, dur) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:a.top]:
            print('| %s | %s | %d | %.1f | %.1f%% | %.2f | %.2f |' % (name, grid, n, inc / 1e3, 100.0 * inc / step,
                                                                   inc / 1e3 / n, dur / 1e3 / n))
        if a.timeline:
            lo, hi = (int(x) for x in a.timeline.split(':'))
            t0 = rep[0]['start']
            print('| # | start us | end us | increment us | kernel | grid | stream |')
            print('|---:|---:|---:|---:|---|---|---|')
            for i, r in enumerate(rep[lo:hi], lo):
                print('| %d | %.2f | %.2f | %.2f | %s | %s | %s |' % (i, (r['start'] - t0) / 1e3, (r['end'] - t0) / 1e3,
                                                                   r['inc'] / 1e3, r['name'], r['grid'], r['stream']))
        print()


if __name__ == '__main__':
    main()
