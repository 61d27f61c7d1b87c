#!/usr/bin/env python3
"""Fit a kvroute timing profile (docs/timing.md) from GPU measurements.

Reads the JSON that tools/gpu/flash_calib.py and tools/gpu/decode_mix_calib.py
write and prints (or writes) a profile for `--timing FILE`:

  prefill step:  pass_ms + Σ per request [per_token_ms·N + attention_ms·N·(C + N/2) + context_ms·C]
  decode step:   step_ms + kv_read_ms · (KV tokens the decoding requests read)

The prefill terms are fitted over every FlashAttention prefill point of the
flash file (one request of N new tokens over C cached ones) and every mixed
pass of the decode-mix file (several requests in one pass, the constant once);
the decode terms over the decode-mix file's decode rows (separate K and V
caches, CUDA graph), or, without one, over the flash file's own decode rows
(one tensor for K and V: they overstate the KV read; the profile's notes say
so). The fit minimises the largest relative error (minimax, solved
exactly over the vertices of its linear program) or, with --least-squares, the sum of
squared relative errors; a coefficient that comes out negative is dropped
(set to 0) and the rest refitted. --scale multiplies every measured time first
(e.g. 4 for a model measured with a quarter of its layers).

  scripts/timing-profile.py --flash results/flash_calib.json \\
      --decode results/decode_mix_calib.json --name h100-llama3-8b \\
      --description "..." -o profile.json

numpy only.
"""
import argparse
import itertools
import json
import sys

import numpy as np

PREFILL = ["pass_ms", "per_token_ms", "attention_ms", "context_ms"]
DECODE = ["step_ms", "kv_read_ms"]


def prefill_row(reqs):
    """Design row for one pass over reqs = [(cached C, new N), ...]."""
    n = sum(r[1] for r in reqs)
    att = sum(r[1] * (r[0] + r[1] / 2) for r in reqs)
    ctx = sum(r[0] for r in reqs)
    return [1.0, float(n), float(att), float(ctx)]


def fit(rows, ys, minimax=True):
    """Non-negative fit of rows·x ≈ ys on relative error; returns x, max error.

    Minimax is exact: the optimum of min h s.t. |row·x/y − 1| ≤ h, x ≥ 0 is a
    vertex where, for the coefficients left free, as many points as free
    coefficients plus one sit at ±h. Every such vertex is solved (a few
    hundred thousand 5×5 systems for four coefficients and two dozen points)
    and the feasible one with the smallest largest error over all points
    wins.
    """
    a = np.asarray(rows, dtype=float)
    y = np.asarray(ys, dtype=float)
    m = a / y[:, None]  # relative error of point i is m[i]·x − 1
    # Columns at unit norm, so that the systems are well conditioned.
    scale = np.linalg.norm(m, axis=0)
    scale[scale == 0] = 1
    m = m / scale
    npts, ncols = m.shape
    best, best_err = None, np.inf
    for cols in itertools.chain.from_iterable(
            itertools.combinations(range(ncols), k) for k in range(1, ncols + 1)):
        sub = m[:, cols]
        if not minimax:
            x, *_ = np.linalg.lstsq(sub, np.ones(npts), rcond=None)
            cands = x[None, :]
        else:
            k = len(cols)
            if npts < k + 1:
                continue
            sets = np.array(list(itertools.combinations(range(npts), k + 1)))
            signs = np.array([(1,) + s for s in itertools.product((1, -1), repeat=k)], dtype=float)
            # Systems [sub[S] | −sign] · [x; h] = 1, one per (set, signs).
            lhs = np.concatenate([
                np.repeat(sub[sets], len(signs), axis=0),
                -np.tile(signs, (len(sets), 1))[:, :, None]], axis=2)
            ok = np.abs(np.linalg.det(lhs)) > 1e-12
            sol = np.linalg.solve(lhs[ok], np.ones((ok.sum(), k + 1, 1)))[:, :, 0]
            cands = sol[:, :k]
        cands = cands[(cands >= 0).all(axis=1)]
        if len(cands) == 0:
            continue
        errs = np.abs(cands @ sub.T - 1)
        score = errs.max(axis=1) if minimax else (errs ** 2).sum(axis=1)
        i = int(score.argmin())
        if score[i] < best_err:
            best_err = score[i]
            best = np.zeros(ncols)
            best[list(cols)] = cands[i]
    return best / scale, float(np.abs(m @ best - 1).max())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flash", required=True, help="flash_calib.py output: FlashAttention prefill points (and decode rows)")
    p.add_argument("--decode", help="decode_mix_calib.py output: decode rows and mixed passes")
    p.add_argument("--name", required=True, help="the profile's name")
    p.add_argument("--description", default="", help="what was measured: GPU, model shape, precision, kernel")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every measured time by this (default 1)")
    p.add_argument("--least-squares", action="store_true", help="minimise squared relative error instead of the largest")
    p.add_argument("--note", action="append", default=[], help="a note for the profile's readers (repeatable)")
    p.add_argument("-o", "--out", help="write the profile here (default: stdout)")
    a = p.parse_args()

    flash = json.load(open(a.flash))
    mix = json.load(open(a.decode)) if a.decode else {}
    rows, ys = [], []
    for pt in flash.get("prefill", []):
        if pt.get("backend", "FLASH_ATTENTION") != "FLASH_ATTENTION":
            continue
        rows.append(prefill_row([(pt["cached"], pt["new"])]))
        ys.append(pt["ms"] * a.scale)
    singles = len(rows)
    for pt in mix.get("mix", []):
        rows.append(prefill_row([tuple(r) for r in pt["reqs"]]))
        ys.append(pt["together_ms"] * a.scale)
    if len(rows) < len(PREFILL):
        sys.exit("timing-profile: too few prefill points to fit")
    px, perr = fit(rows, ys, minimax=not a.least_squares)

    notes = list(a.note)
    if mix.get("decode"):
        drows = mix["decode"]
        dsrc = a.decode
    else:
        drows = flash.get("decode", [])
        dsrc = a.flash
        notes.append("Decode rows from flash_calib.py, which shares one tensor for K and V: "
                     "superseded by decode_mix_calib.py; kv_read_ms is approximate")
    drows_xy = [([1.0, float(d.get("kv_tokens", d["batch"] * d["ctx"]))], d["ms"] * a.scale) for d in drows]
    if len(drows_xy) < len(DECODE):
        sys.exit("timing-profile: too few decode rows to fit")
    dx, derr = fit([r for r, _ in drows_xy], [y for _, y in drows_xy], minimax=not a.least_squares)

    def sig(v):
        return float(f"{v:.4g}")

    prof = {
        "name": a.name,
        "description": a.description,
        "prefill": {k: sig(v) for k, v in zip(PREFILL, px)},
        "decode": {k: sig(v) for k, v in zip(DECODE, dx)},
        "fit": {
            "method": "least squares on relative error" if a.least_squares else "minimax on relative error",
            "prefill_points": singles,
            "mixed_passes": len(rows) - singles,
            "prefill_max_error": round(perr, 4),
            "decode_rows": len(drows_xy),
            "decode_max_error": round(derr, 4),
            "scale": a.scale,
            "sources": [s for s in (a.flash, dsrc if dsrc != a.flash else None) if s],
            "device": flash.get("device", ""),
        },
    }
    if notes:
        prof["notes"] = notes
    out = json.dumps(prof, indent=2, ensure_ascii=False) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(out)
    else:
        sys.stdout.write(out)
    print(f"prefill: max error {100 * perr:.1f} % over {len(rows)} passes; decode: max error {100 * derr:.1f} % over {len(drows_xy)} rows",
          file=sys.stderr)


if __name__ == "__main__":
    main()
