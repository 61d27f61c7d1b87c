"""Renders cases.json with Python's Jinja2, set up as transformers sets up its
chat-template environment, and prints one JSON line per case:
[name, template, vars, output or null, error or null].

    python3 render.py cases.json > expected.jsonl

kvroute's Go tests (chat_jinja_test.go) require gonja, as configured by the
tokenizer package, to give the same output.
"""
import json, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
from jinja2.exceptions import TemplateError

def raise_exception(m): raise TemplateError(m)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

cases = json.load(open(sys.argv[1]))
out = []
for name, src, vars in cases:
    try:
        r = env.from_string(src).render(**vars)
        out.append([name, src, vars, r, None])
    except Exception as e:
        out.append([name, src, vars, None, str(e)])
for o in out:
    print(json.dumps(o, ensure_ascii=False))
