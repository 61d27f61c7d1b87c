"""Regenerates the two tables of docs/sim/h100/README.md from the reports in docs/sim and docs/sim/h100."""
import json, sys
root = sys.argv[1] if len(sys.argv) > 1 else '.'
def load(t, w):
    d = f'{root}/docs/sim' + ('/h100' if t == 'h' else '')
    return json.load(open(f'{d}/{w}.json'))
def ms(v):
    return f'{v:.0f} ms' if v < 999.5 else f'{v/1000:.1f} s'
def row(j, m, L):
    return [r for r in j['sweep'][m] if r['load'] == L][0]
def g(x): return f'{x:g}'
hi = {'agent': 8, 'shared_prefix': 8, 'synthetic': 4, 'no_reuse': 8, 'burst': 4, 'conversation': 2}
out = ['| workload | timing | kv hit rate, load 1 | goodput kv / round_robin / least_loaded | TTFT p90 kv / round_robin / least_loaded, lowest load | the same at a higher load |',
       '|---|---|---|---|---|---|']
for w in ['agent', 'shared_prefix', 'synthetic', 'no_reuse', 'burst', 'conversation', 'conv-fine']:
    for t, tn in [('p', 'polynomial'), ('h', 'h100-llama3-8b')]:
        j = load(t, w)
        loads = [r['load'] for r in j['sweep']['kv']]
        lo = loads[0]
        h = 3 if w == 'conv-fine' else hi[w]
        hit = '–' if w == 'conv-fine' else f"{row(j, 'kv', 1)['hit_rate']*100:.1f} %"
        gp = ' / '.join(g(j['goodput'][m]) for m in ['kv', 'round_robin', 'least_loaded'])
        def p90s(L): return ' / '.join(ms(row(j, m, L)['ttft_ms']['p90']) for m in ['kv', 'round_robin', 'least_loaded']) + f' ({g(L)})'
        out.append(f'| {w} | {tn} | {hit} | {gp} | {p90s(lo)} | {p90s(h)} |')
print('\n'.join(out))
print()
out = ['| workload | load | polynomial: order by TTFT p90 (kv\'s p90 / p99) | h100-llama3-8b: order (kv\'s p90 / p99) | kv\'s place |', '|---|---|---|---|---|']
short = {'kv': 'kv', 'round_robin': 'rr', 'least_loaded': 'll'}
for w in ['agent', 'shared_prefix', 'burst', 'synthetic', 'conversation', 'no_reuse']:
    jp, jh = load('p', w), load('h', w)
    for L in [r['load'] for r in jp['sweep']['kv']]:
        cells, places = [], []
        for j in (jp, jh):
            p = {m: row(j, m, L)['ttft_ms']['p90'] for m in short}
            order = ' < '.join(short[m] for m in sorted(p, key=lambda m: p[m]))
            kv = row(j, 'kv', L)['ttft_ms']
            cells.append(f"{order} ({ms(kv['p90'])} / {ms(kv['p99'])})")
            places.append(1 + sum(1 for m in p if m != 'kv' and p[m] < 0.99 * p['kv']))
        if places[0] == places[1]:
            place = 'holds' if places[0] == 1 else f'holds (kv place {places[0]} → place {places[1]})'
        else:
            place = f'**{places[0]} → {places[1]}**'
        out.append(f'| {w} | {g(L)} | {cells[0]} | {cells[1]} | {place} |')
print('\n'.join(out))
