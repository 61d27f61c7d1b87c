package tokenizer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// This file holds the pieces of the template environment that make gonja
// behave as Python's Jinja2 does for the constructs real chat templates use.

// pyList is a list as templates see it. It exists to give negative indexing
// Python's meaning (gonja's own lookup refuses x[-1] on a one-element list).
type pyList []any

// GetItem implements gonja's ItemGetter.
func (l pyList) GetItem(key any) (*exec.Value, bool) {
	i, ok := key.(int)
	if !ok {
		return exec.AsValue(nil), false
	}
	if i < 0 {
		i += len(l)
	}
	if i < 0 || i >= len(l) {
		return exec.AsValue(nil), false
	}
	return exec.ToValue(l[i]), true
}

// toTemplateValue converts request values to the engine's: Objects become
// ordered gonja dicts, lists become pyLists. Other values pass unchanged.
func toTemplateValue(v any) any {
	switch t := v.(type) {
	case Object:
		d := &exec.Dict{Pairs: make([]*exec.Pair, len(t))}
		for i, f := range t {
			d.Pairs[i] = &exec.Pair{Key: exec.AsValue(f.Key), Value: exec.AsValue(toTemplateValue(f.Value))}
		}
		return d
	case []any:
		l := make(pyList, len(t))
		for i, e := range t {
			l[i] = toTemplateValue(e)
		}
		return l
	case []Object:
		l := make(pyList, len(t))
		for i, e := range t {
			l[i] = toTemplateValue(e)
		}
		return l
	case []string:
		l := make(pyList, len(t))
		for i, e := range t {
			l[i] = e
		}
		return l
	}
	return v
}

// filterToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False).
func filterToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	p := defaultPyJSON
	for k, v := range params.KwArgs {
		switch k {
		case "indent":
			if err := p.setIndent(v); err != nil {
				return exec.AsValue(err)
			}
		case "ensure_ascii":
			p.ensureASCII = v.IsTrue()
		case "sort_keys":
			p.sortKeys = v.IsTrue()
		case "separators":
			if v.IsNil() {
				continue
			}
			if !v.IsList() || v.Len() != 2 {
				return exec.AsValue(errors.New("tojson: separators must be a pair of strings"))
			}
			p.itemSep, p.keySep = v.Index(0).String(), v.Index(1).String()
		default:
			return exec.AsValue(fmt.Errorf("tojson: unexpected keyword argument %q", k))
		}
	}
	if len(params.Args) > 0 {
		if err := p.setIndent(params.Args[0]); err != nil {
			return exec.AsValue(err)
		}
	}
	if _, ok := params.KwArgs["separators"]; !ok && p.hasIndent {
		p.itemSep = "," // Python's default item separator once indent is set
	}
	s, err := p.dumps(in)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(s)
}

func (p *pyJSON) setIndent(v *exec.Value) error {
	switch {
	case v.IsNil():
		p.hasIndent = false
	case v.IsInteger():
		p.hasIndent, p.indent = true, strings.Repeat(" ", max(v.Integer(), 0))
	case v.IsString():
		p.hasIndent, p.indent = true, v.String()
	default:
		return fmt.Errorf("tojson: indent must be an int or a string, not %s", v.String())
	}
	return nil
}

// dictPairs lists a dict's keys and values in order (insertion order for
// request objects; gonja's own maps have none, so they come sorted).
func dictPairs(v *exec.Value) (keys, vals []*exec.Value) {
	v.Iterate(func(_, _ int, k, val *exec.Value) bool {
		keys = append(keys, k)
		vals = append(vals, val)
		return true
	}, func() {})
	return keys, vals
}

// filterItems is Jinja2's items filter, in the dict's own order.
func filterItems(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	if in.IsNil() {
		return exec.AsValue(pyList{})
	}
	if !in.IsDict() {
		return exec.AsValue(fmt.Errorf("items: %s is not a mapping", in.String()))
	}
	keys, vals := dictPairs(in)
	out := make(pyList, len(keys))
	for i := range keys {
		out[i] = pyList{keys[i], vals[i]}
	}
	return exec.AsValue(out)
}

// filterTrim is Jinja2's trim: str.strip(chars).
func filterTrim(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	s := in.String()
	chars := params.GetKeywordArgument("chars", nil)
	if len(params.Args) > 0 {
		chars = params.Args[0]
	}
	if chars.IsNil() {
		return exec.AsValue(strings.TrimFunc(s, pyWhitespace))
	}
	return exec.AsValue(strings.Trim(s, chars.String()))
}

// Jinja2's "x is false" / "x is true" test identity with the booleans.
func testFalse(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	return in.IsBool() && !in.Bool(), nil
}

func testTrue(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	return in.IsBool() && in.Bool(), nil
}

// testSequence: strings and dicts are sequences for Jinja2 too.
func testSequence(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	return in.IsList() || in.IsString() || in.IsDict(), nil
}

// orderedDictMethods are the dict methods templates call (items, keys,
// values, get), answering in the dict's own order.
var orderedDictMethods = exec.NewMethodSet[map[string]any](map[string]exec.Method[map[string]any]{
	"items": func(_ map[string]any, self *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args)+len(args.KwArgs) > 0 {
			return nil, exec.ErrInvalidCall(errors.New("items() takes no arguments"))
		}
		keys, vals := dictPairs(self)
		out := make(pyList, len(keys))
		for i := range keys {
			out[i] = pyList{keys[i], vals[i]}
		}
		return out, nil
	},
	"keys": func(_ map[string]any, self *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args)+len(args.KwArgs) > 0 {
			return nil, exec.ErrInvalidCall(errors.New("keys() takes no arguments"))
		}
		keys, _ := dictPairs(self)
		out := make(pyList, len(keys))
		for i, k := range keys {
			out[i] = k
		}
		return out, nil
	},
	"values": func(_ map[string]any, self *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args)+len(args.KwArgs) > 0 {
			return nil, exec.ErrInvalidCall(errors.New("values() takes no arguments"))
		}
		_, vals := dictPairs(self)
		out := make(pyList, len(vals))
		for i, v := range vals {
			out[i] = v
		}
		return out, nil
	},
	"get": func(_ map[string]any, self *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args) < 1 || len(args.Args) > 2 {
			return nil, exec.ErrInvalidCall(errors.New("get() takes 1 or 2 positional arguments"))
		}
		keys, vals := dictPairs(self)
		for i, k := range keys {
			if k.EqualValueTo(args.Args[0]) {
				return vals[i].Interface(), nil
			}
		}
		if len(args.Args) == 2 {
			return args.Args[1].Interface(), nil
		}
		return nil, nil
	},
})
