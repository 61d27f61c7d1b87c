#!/usr/bin/env python3
# Compare kvbench sim with NVIDIA Dynamo's own offline trace replay.
#
# Run it with the Python that has ai-dynamo and ai-dynamo-runtime installed:
#
#     $PEERS_PY peers/compare/dynamo.py --out DIR --kvbench PATH
#
# For each workload (the first requests of the two bundled Mooncake traces,
# and the first sessions of kvbench's agent workload exported as a Mooncake
# trace with sessions) it writes the trace once, replays it in Dynamo
# (round robin, the KV router at its defaults, the KV router with the
# agentic settings) and in kvbench sim (round_robin, kv) at every load, and
# writes DIR/dynamo.md (a Markdown section) and DIR/dynamo.json.
#
# It uses only dynamo.replay.run_trace_replay and dynamo.llm.KvRouterConfig,
# the published API; nothing of Dynamo's is copied or patched.

import argparse
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import time

# This file is named dynamo.py: drop its own directory from the path so that
# "dynamo" is NVIDIA's package, not this script.
_here = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("DYN_LOG", "warn")  # the KV router logs every decision at info
sys.path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from dynamo.llm import KvRouterConfig  # noqa: E402
from dynamo.replay import run_trace_replay  # noqa: E402

# The fleet of docs/sim: 8 workers of 5,632 blocks of 64 tokens, 8,192
# batched tokens, Dynamo's mocker timing (the polynomial both use).
WORKERS, BLOCK, KV_BLOCKS, BATCHED = 8, 64, 5632, 8192
SLO_MS = 2000.0
EVENT_LAG_MS = 5.0  # kvbench sim's default --event-lag

# name, kvbench workload, tokens per hash id in the exported trace
WORKLOADS = [
    ("conversation", "conversation", 512),
    ("synthetic", "synthetic", 512),
    ("agent", "agent", BLOCK),
]

# Dynamo's modes: label, router_mode, router_config keyword arguments.
DYNAMO_MODES = [
    ("round_robin", "round_robin", None),
    ("kv_router", "kv_router", {}),
    # Block-equivalent settings for long shared histories: twice the credit
    # for cached blocks, prompt load weighed 4x, 16 blocks per active request.
    ("kv_router agentic", "kv_router",
     {"overlap_score_credit": 2.0, "prefill_load_scale": 4.0, "decode_active_request_weight": 16.0}),
]
KVBENCH_MODES = ["round_robin", "kv"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("+", " ".join(shlex.quote(c) for c in cmd))
    return subprocess.run(cmd, check=True, **kw)


def export_trace(kvbench, workload, block, requests, outdir):
    """Exports the workload and keeps its first whole sessions until they
    hold at least requests requests."""
    full = os.path.join(outdir, f"{workload}-full.jsonl")
    cmd = [kvbench, "sim", "--workload", workload, "--export-trace", full, "--export-block-size", str(block)]
    run(cmd, stdout=subprocess.DEVNULL)
    path = os.path.join(outdir, f"{workload}.jsonl")
    kept, sessions, last = 0, 0, None
    with open(full) as src, open(path, "w") as dst:
        for line in src:
            sid = json.loads(line)["session_id"]
            if sid != last:
                # Rows come session by session: whole sessions are kept
                # until the limit is reached.
                if kept >= requests:
                    break
                sessions, last = sessions + 1, sid
            dst.write(line)
            kept += 1
    os.remove(full)
    return path, kept, sessions, " ".join(shlex.quote(c) for c in cmd)


def dynamo_median(trace, block, router_mode, router_kw, load, runs):
    """Dynamo's replay of one cell, run `runs` times (its KV router is not
    deterministic; round robin is, and runs once): each figure is the median
    over the runs, and "runs" keeps every run's hit rate and TTFT."""
    n = 1 if router_mode == "round_robin" else max(runs, 1)
    pts = [dynamo_point(trace, block, router_mode, router_kw, load) for _ in range(n)]
    med = median
    out = dict(pts[0])
    for k in ("hit_rate", "hit_rate_all_admissions", "itl_ms_p50"):
        out[k] = med([p[k] for p in pts])
    out["ttft_ms"] = {q: med([p["ttft_ms"][q] for p in pts]) for q in ("p50", "p90", "p99")}
    out["wall_s"] = round(sum(p["wall_s"] for p in pts), 3)
    out["runs"] = [{"hit_rate": p["hit_rate"], "ttft_ms": p["ttft_ms"]} for p in pts]
    return out


def dynamo_point(trace, block, router_mode, router_kw, load):
    kw = {}
    if router_mode == "kv_router":
        kw["router_config"] = KvRouterConfig(**router_kw)
        kw["kv_event_lag_ms"] = EVENT_LAG_MS
    t = time.time()
    r = run_trace_replay(
        [trace],
        extra_engine_args={"engine": {"num_gpu_blocks": KV_BLOCKS, "block_size": BLOCK,
                                      "max_num_batched_tokens": BATCHED}},
        num_workers=WORKERS, replay_mode="offline", router_mode=router_mode,
        arrival_speedup_ratio=load, trace_block_size=block, trace_format="mooncake",
        sla_ttft_ms=SLO_MS, **kw)
    s = r.summary
    return {
        "load": load,
        "requests": s["num_requests"], "completed": s["completed_requests"],
        # Cached tokens at a request's first admission over its prompt: what
        # kvbench sim's hit rate counts (re-admissions after a preemption
        # are not counted again).
        "hit_rate": s["first_admission_prefix_cache_reused_ratio"],
        "hit_rate_all_admissions": s["prefix_cache_reused_ratio"],
        "ttft_ms": {"p50": s["median_ttft_ms"], "p90": s["p90_ttft_ms"], "p99": s["p99_ttft_ms"]},
        "itl_ms_p50": s["median_itl_ms"],
        "wall_s": round(time.time() - t, 3),
    }


def kvbench_points(kvbench, trace, block, loads, outdir, name, seeds):
    """kvbench sim's replay of the trace once per router seed. kvbench sim is
    deterministic for one seed, but the seed moves its tie-breaks, and with
    them a cell's tail, much as Dynamo's runs differ: each figure is the
    median over the seeds, as Dynamo's are over its runs, and "runs" keeps
    every seed's hit rate and TTFT."""
    reps, cmd = [], None
    for seed in seeds:
        out = os.path.join(outdir, f"kvbench-{name}-seed{seed}.json")
        cmd = [kvbench, "sim", "--trace", trace, "--trace-block-size", str(block),
               "--workers", str(WORKERS), "--block-size", str(BLOCK), "--kv-blocks", str(KV_BLOCKS),
               "--max-num-batched-tokens", str(BATCHED), "--event-lag", f"{int(EVENT_LAG_MS)}ms",
               "--modes", ",".join(KVBENCH_MODES), "--load", ",".join(fmt(l) for l in loads),
               "--seed", str(seed), "--json", out]
        run(cmd, stdout=subprocess.DEVNULL)
        with open(out) as f:
            reps.append(json.load(f))
    pts = {}
    for mode in reps[0]["sweep"]:
        pts[mode] = []
        for i, p in enumerate(reps[0]["sweep"][mode]):
            runs = [{
                "load": r["sweep"][mode][i]["load"], "requests": r["sweep"][mode][i]["requests"],
                "errors": r["sweep"][mode][i]["errors"], "hit_rate": r["sweep"][mode][i]["hit_rate"],
                "ttft_ms": {k: r["sweep"][mode][i]["ttft_ms"][k] for k in ("p50", "p90", "p99")},
                "itl_ms_p50": r["sweep"][mode][i]["itl_ms"]["p50"],
            } for r in reps]
            pt = dict(runs[0])
            for k in ("hit_rate", "itl_ms_p50", "errors"):
                pt[k] = median([x[k] for x in runs])
            pt["ttft_ms"] = {q: median([x["ttft_ms"][q] for x in runs]) for q in ("p50", "p90", "p99")}
            pt["runs"] = [{"seed": s, "hit_rate": x["hit_rate"], "ttft_ms": x["ttft_ms"]} for s, x in zip(seeds, runs)]
            pts[mode].append(pt)
    shown = " ".join(shlex.quote(c) for c in cmd).replace(f"--seed {seeds[-1]}", "--seed S").replace(
        f"seed{seeds[-1]}.json", "seedS.json")
    return pts, shown, reps[0].get("ideal_hit_rate")


def median(xs):
    return sorted(xs)[len(xs) // 2]


def fmt(x):
    return f"{x:g}"


def ms(x):
    return f"{x / 1000:.1f} s" if x >= 10000 else (f"{x / 1000:.2f} s" if x >= 1000 else f"{x:.0f} ms")


def goodput(points):
    """The highest load whose TTFT p90 meets the SLO with nothing failed."""
    best = None
    for p in points:
        failed = p.get("errors", 0) or (p.get("requests", 0) - p.get("completed", p.get("requests", 0)))
        if p["ttft_ms"]["p90"] <= SLO_MS and not failed:
            best = p["load"]
    return best


def knee(points):
    """The first load whose TTFT p90 passes the SLO."""
    return next((p["load"] for p in points if p["ttft_ms"]["p90"] > SLO_MS), None)


def agreement_rows(name, ours, theirs):
    rows, ok = [], True
    k_ours, k_theirs = knee(ours), knee(theirs)
    for a, b in zip(ours, theirs):
        below = k_ours is None or a["load"] < k_ours
        d50 = a["ttft_ms"]["p50"] / b["ttft_ms"]["p50"] - 1
        d90 = a["ttft_ms"]["p90"] / b["ttft_ms"]["p90"] - 1
        dhit = (a["hit_rate"] - b["hit_rate"]) * 100
        good = abs(dhit) <= 2 and (not below or (abs(d50) <= 0.15 and abs(d90) <= 0.15))
        ok &= good
        rows.append(f"| {name} | {fmt(a['load'])} | {ms(a['ttft_ms']['p50'])} / {ms(b['ttft_ms']['p50'])} ({d50:+.0%}) | "
                    f"{ms(a['ttft_ms']['p90'])} / {ms(b['ttft_ms']['p90'])} ({d90:+.0%}) | "
                    f"{a['hit_rate']:.1%} / {b['hit_rate']:.1%} ({dhit:+.1f}) | "
                    f"{a['itl_ms_p50']:.0f} / {b['itl_ms_p50']:.0f} ms | {'yes' if good else '**no**'}{'' if below else ' (past the knee)'} |")
    ok &= k_ours == k_theirs
    return rows, ok, k_ours, k_theirs


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--kvbench", required=True, help="path to the kvbench binary")
    ap.add_argument("--requests", type=int, default=2000, help="requests per workload (whole sessions)")
    ap.add_argument("--loads", default="0.5,1,2,4,8", help="arrival-rate multipliers for the Mooncake traces")
    ap.add_argument("--agent-loads", default="0.5,1,2,4,8,16", help="arrival-rate multipliers for the agent workload")
    ap.add_argument("--dynamo-runs", type=int, default=5,
                    help="runs of each Dynamo KV-router cell, reported as medians (its replay is not deterministic)")
    ap.add_argument("--kvbench-seeds", default="1,2,3,4,5",
                    help="kvbench sim router seeds of every cell, reported as medians (a seed moves its tie-breaks)")
    args = ap.parse_args()
    seeds = [int(x) for x in args.kvbench_seeds.split(",")]
    os.makedirs(args.out, exist_ok=True)
    start = time.time()

    versions = {
        "ai-dynamo": importlib.metadata.version("ai-dynamo"),
        "ai-dynamo-runtime": importlib.metadata.version("ai-dynamo-runtime"),
        "kvbench": subprocess.run([args.kvbench, "--version"], capture_output=True, text=True).stdout.strip(),
        "python": sys.version.split()[0],
    }
    result = {"versions": versions, "fleet": {"workers": WORKERS, "block_size": BLOCK, "kv_blocks": KV_BLOCKS,
              "max_num_batched_tokens": BATCHED, "event_lag_ms": EVENT_LAG_MS}, "slo_ttft_p90_ms": SLO_MS,
              "dynamo_modes": {label: kw for label, _, kw in DYNAMO_MODES}, "dynamo_runs": args.dynamo_runs, "kvbench_seeds": seeds, "workloads": {}}
    for name, workload, block in WORKLOADS:
        loads = [float(x) for x in (args.agent_loads if name == "agent" else args.loads).split(",")]
        trace, n, sessions, export_cmd = export_trace(args.kvbench, workload, block, args.requests, args.out)
        log(f"{name}: {n} requests in {sessions} sessions")
        ours, sim_cmd, ideal = kvbench_points(args.kvbench, trace, block, loads, args.out, name, seeds)
        theirs = {}
        for label, mode, kw in DYNAMO_MODES:
            theirs[label] = [dynamo_median(trace, block, mode, kw, l, args.dynamo_runs) for l in loads]
            log(f"{name}: dynamo {label} done")
        result["workloads"][name] = {
            "trace": os.path.basename(trace), "requests": n, "sessions": sessions, "trace_block_size": block,
            "loads": loads, "ideal_hit_rate": ideal, "export_command": export_cmd, "kvbench_command": sim_cmd,
            "kvbench": ours, "dynamo": theirs,
        }
    result["wall_seconds"] = round(time.time() - start, 1)
    with open(os.path.join(args.out, "dynamo.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "dynamo.md"), "w") as f:
        f.write(markdown(result))
    log(f"wrote {args.out}/dynamo.md and dynamo.json in {result['wall_seconds']} s")


def markdown(res):
    v, fl = res["versions"], res["fleet"]
    out = [
        "### kvbench sim against NVIDIA Dynamo's offline replay",
        "",
        f"ai-dynamo {v['ai-dynamo']} and ai-dynamo-runtime {v['ai-dynamo-runtime']} "
        f"(`dynamo.replay.run_trace_replay`, offline, mocker engines in virtual time), {v['kvbench']}. "
        f"Both: {fl['workers']} workers × {fl['kv_blocks']} blocks of {fl['block_size']} tokens, "
        f"{fl['max_num_batched_tokens']} batched tokens, Dynamo's polynomial step timing, KV events "
        f"{fl['event_lag_ms']:g} ms late; both replay the same trace file. "
        f"Load multiplies the arrival rate (trace timestamps and think times divided by it). "
        f"Goodput: the highest load whose TTFT p90 ≤ {res['slo_ttft_p90_ms'] / 1000:g} s with nothing failed.",
        "",
        "Commands (per workload; Dynamo's runs are Python calls, shown in dynamo.json's settings):",
        "",
        "```sh",
    ]
    for name, w in res["workloads"].items():
        out += [w["export_command"] + f"   # then the first {w['requests']} requests", w["kvbench_command"]]
    out += ["```", "", "#### Agreement: round robin in both simulators", "",
            "kvbench / Dynamo. Agreement means TTFT p50 and p90 within 15 % below the knee "
            "(the first load whose TTFT p90 passes the SLO), the same knee, and hit rates within 2 points.", "",
            "| workload | load | TTFT p50 | TTFT p90 | hit rate | ITL p50 | agrees |", "|---|---|---|---|---|---|---|"]
    knees = []
    for name, w in res["workloads"].items():
        rows, ok, ko, kt = agreement_rows(name, w["kvbench"]["round_robin"], w["dynamo"]["round_robin"])
        out += rows
        knees.append(f"{name}: knee {fmt(ko) if ko else 'none'} / {fmt(kt) if kt else 'none'}{'' if ko == kt else ' (**differs**)'}")
        w["round_robin_agrees"] = ok
    out += ["", "Knees (kvbench / Dynamo): " + "; ".join(knees) + ".", "",
            "#### kvroute's kv against Dynamo's KV router", "",
            "The last two columns divide TTFT p90 and p99 by round robin's in the same simulator at the same load, "
            "which takes out the engines' own difference (the agreement table above).", "",
            "| workload | load | mode | hit rate | TTFT p50 / p90 / p99 | p90 ÷ own round robin | p99 ÷ own round robin |",
            "|---|---|---|---|---|---|---|"]
    for name, w in res["workloads"].items():
        rr_ours, rr_theirs = w["kvbench"]["round_robin"], w["dynamo"]["round_robin"]
        series = [("kvroute kv", w["kvbench"]["kv"], rr_ours)] + [
            ("Dynamo " + k, pts, rr_theirs) for k, pts in w["dynamo"].items() if k != "round_robin"]
        for i, l in enumerate(w["loads"]):
            for label, pts, rr in series:
                p = pts[i]
                t = p["ttft_ms"]
                rel = t["p90"] / rr[i]["ttft_ms"]["p90"]
                rel99 = t["p99"] / rr[i]["ttft_ms"]["p99"]
                out.append(f"| {name} | {fmt(l)} | {label} | {p['hit_rate']:.1%} | {ms(t['p50'])} / {ms(t['p90'])} / {ms(t['p99'])} | {rel:.2f} | {rel99:.2f} |")
    out += ["", "| workload | goodput: kvroute kv | Dynamo kv_router | Dynamo kv_router agentic | kvbench round_robin | Dynamo round_robin |",
            "|---|---|---|---|---|---|"]
    for name, w in res["workloads"].items():
        g = lambda pts: fmt(goodput(pts)) if goodput(pts) else "–"
        out.append(f"| {name} | {g(w['kvbench']['kv'])} | {g(w['dynamo']['kv_router'])} | {g(w['dynamo']['kv_router agentic'])} | "
                   f"{g(w['kvbench']['round_robin'])} | {g(w['dynamo']['round_robin'])} |")
    def spread(side, rr_side):
        s90 = s99 = 0.0
        for name, w in res["workloads"].items():
            rr = w[side][rr_side]
            for label, pts in w[side].items():
                for i, p in enumerate(pts):
                    if w["loads"][i] >= (knee(w["kvbench"]["round_robin"]) or float("inf")):
                        continue
                    for q in ("p90", "p99"):
                        xs = [r["ttft_ms"][q] / rr[i]["ttft_ms"][q] for r in p.get("runs", [])]
                        if len(xs) > 1:
                            if q == "p90":
                                s90 = max(s90, max(xs) - min(xs))
                            else:
                                s99 = max(s99, max(xs) - min(xs))
        return s90, s99

    runs, seeds = res.get("dynamo_runs", 1), res.get("kvbench_seeds", [1])
    if runs > 1 or len(seeds) > 1:
        d90, d99 = spread("dynamo", "round_robin")
        k90, k99 = spread("kvbench", "round_robin")
        out += ["", f"Neither replay of a KV router gives one answer: Dynamo's is not deterministic, and kvbench sim, "
                f"deterministic for one router seed, moves with the seed (its tie-breaks). Each of Dynamo's cells ran "
                f"{runs} times and each of kvbench's with {len(seeds)} seeds ({', '.join(map(str, seeds))}); every "
                f"figure above is the median. Below the knee, one cell's TTFT p90 ÷ round robin moved by up to "
                f"{d90:.2f} between Dynamo's runs and {k90:.2f} between kvbench's seeds, p99 ÷ round robin by up to "
                f"{d99:.2f} and {k99:.2f}."]
    out += ["", "Cells below the knee where Dynamo's KV router is ahead of kvroute's kv: a hit rate more than half "
            "a point higher, or TTFT p90 or p99 lower once each is divided by its own simulator's round robin "
            "(compared at two decimals):", ""]
    losses = []
    for name, w in res["workloads"].items():
        ours = w["kvbench"]["kv"]
        k_ours, k_theirs = knee(w["kvbench"]["round_robin"]), knee(w["dynamo"]["round_robin"])
        knee_load = min(k for k in (k_ours, k_theirs, float("inf")) if k)
        rr_ours, rr_theirs = w["kvbench"]["round_robin"], w["dynamo"]["round_robin"]
        for label in ("kv_router", "kv_router agentic"):
            for i, (a, b) in enumerate(zip(ours, w["dynamo"][label])):
                if a["load"] >= knee_load:
                    continue
                why = []
                if b["hit_rate"] > a["hit_rate"] + 0.005:
                    why.append(f"hit rate {b['hit_rate']:.1%} vs {a['hit_rate']:.1%}")
                for q in ("p90", "p99"):
                    ra = round(a["ttft_ms"][q] / rr_ours[i]["ttft_ms"][q], 2)
                    rb = round(b["ttft_ms"][q] / rr_theirs[i]["ttft_ms"][q], 2)
                    if rb < ra:
                        why.append(f"TTFT {q} ÷ round robin {rb:.2f} vs {ra:.2f}")
                if why:
                    losses.append(f"- {name}, load {fmt(a['load'])}, Dynamo {label}: " + "; ".join(why))
        if (goodput(w["dynamo"]["kv_router"]) or 0) > (goodput(ours) or 0):
            losses.append(f"- {name}: Dynamo kv_router's goodput is higher")
    out += losses or ["- none"]
    out += ["", f"Wall time of the whole comparison: {res['wall_seconds']} s.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
