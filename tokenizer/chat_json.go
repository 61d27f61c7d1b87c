package tokenizer

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// pyJSON holds the options of Python's json.dumps that chat templates use
// through transformers' tojson filter.
type pyJSON struct {
	indent      string // "" with hasIndent=false means single-line output
	hasIndent   bool
	itemSep     string
	keySep      string
	sortKeys    bool
	ensureASCII bool
}

// defaultPyJSON is json.dumps(x, ensure_ascii=False) with default separators.
var defaultPyJSON = pyJSON{itemSep: ", ", keySep: ": "}

// dumps renders v exactly as Python's json.dumps would with these options.
// v may hold the request values (Object, []any, scalars) as well as values
// created inside a template (gonja dicts, lists and *exec.Value wrappers).
func (p *pyJSON) dumps(v any) (string, error) {
	var b strings.Builder
	if err := p.write(&b, v, 0, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func (p *pyJSON) newline(b *strings.Builder, level int) {
	b.WriteByte('\n')
	for range level {
		b.WriteString(p.indent)
	}
}

func (p *pyJSON) write(b *strings.Builder, v any, level, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("tojson: nesting deeper than %d levels", maxJSONDepth)
	}
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if t {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case string:
		p.writeString(b, t)
	case int:
		b.WriteString(strconv.Itoa(t))
	case int64:
		b.WriteString(strconv.FormatInt(t, 10))
	case float64:
		b.WriteString(pyFloatRepr(t, true))
	case Object:
		keys := make([]string, len(t))
		vals := make([]any, len(t))
		for i, f := range t {
			keys[i], vals[i] = f.Key, f.Value
		}
		return p.writeObject(b, keys, vals, level, depth)
	case *Object:
		return p.write(b, *t, level, depth)
	case []any:
		return p.writeList(b, len(t), func(i int) any { return t[i] }, level, depth)
	case *exec.Value:
		return p.writeGonja(b, t, level, depth)
	default:
		return p.writeGonja(b, exec.ToValue(v), level, depth)
	}
	return nil
}

// writeGonja handles values a template built itself or that gonja wrapped.
func (p *pyJSON) writeGonja(b *strings.Builder, v *exec.Value, level, depth int) error {
	if v == nil || v.IsNil() {
		b.WriteString("null")
		return nil
	}
	if v.IsError() {
		return fmt.Errorf("tojson: %s", v.Error())
	}
	raw := v.Interface()
	switch raw.(type) {
	case Object, *Object, []any, string, bool, int, int64, float64:
		return p.write(b, raw, level, depth)
	}
	switch {
	case v.IsBool():
		return p.write(b, v.Bool(), level, depth)
	case v.IsInteger():
		return p.write(b, int64(v.Integer()), level, depth)
	case v.IsFloat():
		return p.write(b, v.Float(), level, depth)
	case v.IsString():
		return p.write(b, v.String(), level, depth)
	case v.IsList():
		n := v.Len()
		return p.writeList(b, n, func(i int) any { return v.Index(i) }, level, depth)
	case v.IsDict():
		var keys []string
		var vals []any
		var err error
		v.Iterate(func(_, _ int, key, value *exec.Value) bool {
			if !key.IsString() {
				err = fmt.Errorf("tojson: dict key %s is not a string", key.String())
				return false
			}
			keys = append(keys, key.String())
			vals = append(vals, value)
			return true
		}, func() {})
		if err != nil {
			return err
		}
		return p.writeObject(b, keys, vals, level, depth)
	}
	return fmt.Errorf("tojson: object of type %s is not JSON serializable", reflect.TypeOf(raw))
}

func (p *pyJSON) writeList(b *strings.Builder, n int, at func(int) any, level, depth int) error {
	if n == 0 {
		b.WriteString("[]")
		return nil
	}
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteString(p.itemSep)
		}
		if p.hasIndent {
			p.newline(b, level+1)
		}
		if err := p.write(b, at(i), level+1, depth+1); err != nil {
			return err
		}
	}
	if p.hasIndent {
		p.newline(b, level)
	}
	b.WriteByte(']')
	return nil
}

func (p *pyJSON) writeObject(b *strings.Builder, keys []string, vals []any, level, depth int) error {
	if len(keys) == 0 {
		b.WriteString("{}")
		return nil
	}
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	if p.sortKeys {
		sort.SliceStable(order, func(i, j int) bool { return keys[order[i]] < keys[order[j]] })
	}
	b.WriteByte('{')
	for n, i := range order {
		if n > 0 {
			b.WriteString(p.itemSep)
		}
		if p.hasIndent {
			p.newline(b, level+1)
		}
		p.writeString(b, keys[i])
		b.WriteString(p.keySep)
		if err := p.write(b, vals[i], level+1, depth+1); err != nil {
			return err
		}
	}
	if p.hasIndent {
		p.newline(b, level)
	}
	b.WriteByte('}')
	return nil
}

const hexDigits = "0123456789abcdef"

// writeString quotes s as Python's json encoder does: only '"', '\\' and
// control characters are escaped unless ensure_ascii is set.
func (p *pyJSON) writeString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				writeU4(b, r)
			case p.ensureASCII && r > 0x7e:
				if r > 0xffff {
					r -= 0x10000
					writeU4(b, 0xd800|(r>>10)&0x3ff)
					writeU4(b, 0xdc00|r&0x3ff)
				} else {
					writeU4(b, r)
				}
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

func writeU4(b *strings.Builder, r rune) {
	b.WriteString(`\u`)
	b.WriteByte(hexDigits[r>>12&0xf])
	b.WriteByte(hexDigits[r>>8&0xf])
	b.WriteByte(hexDigits[r>>4&0xf])
	b.WriteByte(hexDigits[r&0xf])
}

// pyFloatRepr formats f as Python's repr(float) does; forJSON selects
// json.dumps' spelling of the non-finite values.
func pyFloatRepr(f float64, forJSON bool) string {
	switch {
	case math.IsNaN(f):
		if forJSON {
			return "NaN"
		}
		return "nan"
	case math.IsInf(f, 1):
		if forJSON {
			return "Infinity"
		}
		return "inf"
	case math.IsInf(f, -1):
		if forJSON {
			return "-Infinity"
		}
		return "-inf"
	}
	// Shortest round-trip digits, then Python's choice between fixed and
	// scientific notation: scientific when the exponent is < -4 or >= 16.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	digits := strings.Replace(mant, ".", "", 1)
	sign := ""
	if neg {
		sign = "-"
	}
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es = "-"
			exp = -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	var s string
	switch point := exp + 1; {
	case point <= 0:
		s = "0." + strings.Repeat("0", -point) + digits
	case point >= len(digits):
		s = digits + strings.Repeat("0", point-len(digits)) + ".0"
	default:
		s = digits[:point] + "." + digits[point:]
	}
	return sign + s
}
