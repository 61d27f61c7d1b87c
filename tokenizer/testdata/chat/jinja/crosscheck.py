"""Cross-check: renders every case of ../*.jsonl (written by gen/chat.mjs with
@huggingface/jinja) again with Python's Jinja2, set up as transformers does, after
the same vLLM message normalization, and reports any difference.

    python3 crosscheck.py   # prints "<n> cases 0 differ"
"""
import json, glob, os, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
from jinja2.exceptions import TemplateError
def raise_exception(m): raise TemplateError(m)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
td = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
templates = json.load(open(td + "/chat_templates.json"))
def text(c):
    if c is None: return ""
    if isinstance(c, str): return c
    return "\n".join(p if isinstance(p, str) else p["text"] for p in c if isinstance(p, str) or p.get("text") is not None)
def parts(c):
    if c is None: return []
    if isinstance(c, str): return [{"type": "text", "text": c}]
    return [{"type": "text", "text": p if isinstance(p, str) else p["text"]} for p in c if isinstance(p, str) or p.get("text") is not None]
def norm(ms, as_parts=False):
    out = []
    for m in ms:
        r = {"role": m["role"], "content": parts(m.get("content")) if as_parts and m["role"] != "tool" else text(m.get("content"))}
        if m["role"] == "assistant":
            if m.get("tool_calls"):
                tcs = []
                for tc in m["tool_calls"]:
                    tc = dict(tc); fn = dict(tc["function"]); a = fn.get("arguments")
                    if a:
                        if isinstance(a, str):
                            try: a = json.loads(a)
                            except Exception: a = {}
                        if not isinstance(a, dict): a = {}
                    else: a = {}
                    fn["arguments"] = a; tc["function"] = fn; tcs.append(tc)
                r["tool_calls"] = tcs
        elif m["role"] == "tool" and "tool_call_id" in m:
            r["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str): r["name"] = m["name"]
        out.append(r)
    return out
bad = 0; n = 0
for f in sorted(glob.glob(td + "/chat/*.jsonl")):
    if f.endswith("probe.jsonl"): continue
    for line in open(f):
        g = json.loads(line)
        cfg = json.load(open(f"{td}/{g['tokenizer']}/tokenizer_config.json"))
        st = {}
        for k in ["bos_token","eos_token","unk_token","sep_token","pad_token","cls_token","mask_token"]:
            v = cfg.get(k); v = v["content"] if isinstance(v, dict) else v
            if v: st[k] = v
        if cfg.get("additional_special_tokens"): st["additional_special_tokens"] = cfg["additional_special_tokens"]
        req = g["request"]
        as_parts = os.path.basename(f) == "gemma3-parts.jsonl"
        kw = dict(st); kw.update(messages=norm(req["messages"], as_parts), tools=req.get("tools"), documents=None,
            add_generation_prompt=req.get("add_generation_prompt", True) if req.get("add_generation_prompt") is not None else True)
        kw.update(req.get("chat_template_kwargs") or {})
        try:
            out = env.from_string(g.get("template_source") or templates[g["template"]]).render(**kw); err = None
            if req.get("continue_final_message"):
                final = kw["messages"][-1]["content"]
                if isinstance(final, list):
                    final = [p for p in final if "text" in p][-1]["text"]
                loc = out.rindex(final.strip())
                if out[loc:loc + len(final.lstrip())] == final:
                    out = out[:loc + len(final.lstrip())]
                else:
                    out = out[:loc + len(final.strip())]
        except Exception as e:
            out = None; err = str(e)
        n += 1
        if g.get("error"):
            if err != g["error"]: bad += 1; print("ERRDIFF", f, g["case"], err, "|", g["error"])
        elif out != g.get("text"):
            bad += 1; print("DIFF", f, g["case"], repr(out)[:200], "|", repr(g.get("text"))[:200])
print(n, "cases", bad, "differ")
