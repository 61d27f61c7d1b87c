package tokenizer

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// This file gives templates Python's string behaviour where gonja's differs.

// pyWhitespace is what Python's str.strip() removes when given no argument.
func pyWhitespace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\v', '\f', '\r', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0,
		0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

// builtinStrMethods are gonja's string methods, copied by name because a
// method set cannot be listed.
var builtinStrMethods = []string{"capitalize", "capwords", "casefold", "center", "count", "encode", "endswith",
	"expandtabs", "find", "format", "format_map", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit",
	"islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip",
	"partition", "removeprefix", "removesuffix", "replace", "rfind", "rjust", "rpartition", "rsplit", "rstrip",
	"split", "splitlines", "startswith", "strip", "swapcase", "title", "upper", "zfill"}

// newStrMethods is gonja's string method set with split and rsplit given
// Python's meaning: no separator splits on runs of whitespace, and the
// result indexes from the end like a Python list.
func newStrMethods(base *exec.MethodSet[string]) *exec.MethodSet[string] {
	m := map[string]exec.Method[string]{}
	for _, name := range builtinStrMethods {
		if f, ok := base.Get(name); ok {
			m[name] = f
		}
	}
	for _, name := range []string{"split", "rsplit"} {
		fromRight := name == "rsplit"
		m[name] = func(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
			sep := args.GetKeywordArgument("sep", nil)
			if len(args.Args) > 0 {
				sep = args.Args[0]
			}
			maxsplit := args.GetKeywordArgument("maxsplit", -1)
			if len(args.Args) > 1 {
				maxsplit = args.Args[1]
			}
			if sep.IsNil() {
				return splitWhitespace(self, maxsplit.Integer(), fromRight), nil
			}
			if !sep.IsString() || sep.String() == "" {
				return nil, exec.ErrInvalidCall(errors.New("split() separator must be a non-empty string"))
			}
			return splitSep(self, sep.String(), maxsplit.Integer(), fromRight), nil
		}
	}
	// gonja's replace insists on a count; Python's defaults to all.
	m["replace"] = func(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args) < 2 || len(args.Args) > 3 || !args.Args[0].IsString() || !args.Args[1].IsString() {
			return nil, exec.ErrInvalidCall(errors.New("replace() takes an old and a new string and an optional count"))
		}
		count := -1
		if len(args.Args) == 3 {
			count = args.Args[2].Integer()
		}
		return strings.Replace(self, args.Args[0].String(), args.Args[1].String(), count), nil
	}
	return exec.NewMethodSet(m)
}

// splitSep is Python's str.split(sep, maxsplit) / str.rsplit(sep, maxsplit).
func splitSep(s, sep string, maxsplit int, fromRight bool) pyList {
	var parts []string
	switch {
	case maxsplit < 0:
		parts = strings.Split(s, sep)
	case !fromRight:
		parts = strings.SplitN(s, sep, maxsplit+1)
	default:
		for range maxsplit {
			i := strings.LastIndex(s, sep)
			if i < 0 {
				break
			}
			parts = append(parts, s[i+len(sep):])
			s = s[:i]
		}
		parts = append(parts, s)
		slices.Reverse(parts)
	}
	return toTemplateValue(parts).(pyList)
}

// splitWhitespace is Python's str.split() / str.rsplit() without a separator.
func splitWhitespace(s string, maxsplit int, fromRight bool) pyList {
	fields := strings.FieldsFunc(s, pyWhitespace)
	if maxsplit < 0 || len(fields) <= maxsplit+1 {
		return toTemplateValue(fields).(pyList)
	}
	if !fromRight {
		// Keep the first maxsplit fields; the rest is the remainder of s
		// after them, with its leading whitespace removed.
		rest := s
		for range maxsplit {
			rest = strings.TrimLeftFunc(rest, pyWhitespace)
			i := strings.IndexFunc(rest, pyWhitespace)
			rest = rest[i:]
		}
		out := toTemplateValue(fields[:maxsplit]).(pyList)
		return append(out, strings.TrimLeftFunc(rest, pyWhitespace))
	}
	rest := s
	for range maxsplit {
		rest = strings.TrimRightFunc(rest, pyWhitespace)
		i := strings.LastIndexFunc(rest, pyWhitespace)
		rest = rest[:i+1]
	}
	out := pyList{strings.TrimRightFunc(rest, pyWhitespace)}
	return append(out, toTemplateValue(fields[len(fields)-maxsplit:]).(pyList)...)
}

// pyStrftime formats t with Python's strftime directives (C locale).
func pyStrftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&b, "%02d", h)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'f':
			fmt.Fprintf(&b, "%06d", t.Nanosecond()/1000)
		case 'z':
			b.WriteString(t.Format("-0700"))
		case 'Z':
			b.WriteString(t.Format("MST"))
		case 'w':
			b.WriteString(strconv.Itoa(int(t.Weekday())))
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
