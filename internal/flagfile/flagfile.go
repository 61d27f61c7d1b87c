// Package flagfile reads a YAML configuration file into a command's flag
// set. A Schema gives every flag one key, a path of mapping keys such as
// routing.cost.model; a file's values are set through the flags' own
// parsers, so a file accepts exactly what the command line accepts, with
// the same defaults. Errors name the file, the line and the key. Keys are
// derived from the flag set, so a flag added later has a key without
// anyone writing one.
package flagfile

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Repeatable is implemented by flag values that take a list (a YAML
// sequence in the file, each item Set in turn).
type Repeatable interface {
	flag.Value
	Repeatable() bool
}

// Schema maps the keys of a configuration file to the flags of a flag set.
// Build it with New; it is read-only afterwards.
type Schema struct {
	byKey  map[string]string   // "routing.cost.model" -> "cost-model"
	path   map[string][]string // flag -> its key's path
	flags  []string            // flags with a key, in key order
	fs     *flag.FlagSet
	prefix map[string]bool // keys that are sections
}

// New derives the schema of fs: key returns a flag's key path, or nil to
// leave the flag out of the file (hidden flags, the flag that names the
// file). Keys are listed (Flags, Print) in the order of order, a list of
// keys and sections ("routing", "routing.mode"); the rest of a section
// follows its listed keys, alphabetically. Two flags with one key, or a
// key that is also another's section, are an error.
func New(fs *flag.FlagSet, key func(*flag.Flag) []string, order ...string) (*Schema, error) {
	s := &Schema{byKey: map[string]string{}, path: map[string][]string{}, fs: fs, prefix: map[string]bool{}}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		p := key(f)
		if len(p) == 0 {
			return
		}
		k := strings.Join(p, ".")
		if prev, ok := s.byKey[k]; ok {
			errs = append(errs, fmt.Errorf("flags --%s and --%s share the key %s", prev, f.Name, k))
			return
		}
		s.byKey[k], s.path[f.Name] = f.Name, p
		s.flags = append(s.flags, f.Name)
		for i := 1; i < len(p); i++ {
			s.prefix[strings.Join(p[:i], ".")] = true
		}
	})
	for k := range s.byKey {
		if s.prefix[k] {
			errs = append(errs, fmt.Errorf("key %s is both a setting and a section", k))
		}
	}
	rank := map[string]int{}
	for i, k := range order {
		rank[k] = i - len(order) // listed first
	}
	slices.SortStableFunc(s.flags, func(a, b string) int {
		pa, pb := s.path[a], s.path[b]
		for i := 0; i < len(pa) && i < len(pb); i++ {
			if pa[i] == pb[i] {
				continue
			}
			ra, rb := rank[strings.Join(pa[:i+1], ".")], rank[strings.Join(pb[:i+1], ".")]
			if ra != rb {
				return ra - rb
			}
			return strings.Compare(pa[i], pb[i])
		}
		return len(pa) - len(pb)
	})
	return s, errors.Join(errs...)
}

// Key returns the flag's key ("routing.cost.model"), or "" if it has none.
func (s *Schema) Key(flagName string) string { return strings.Join(s.path[flagName], ".") }

// Flag returns the flag a key sets, or "" if the key is not a setting.
func (s *Schema) Flag(key string) string { return s.byKey[key] }

// Flags lists the flags that have a key, in key order.
func (s *Schema) Flags() []string { return slices.Clone(s.flags) }

// Value is one setting read from a file.
type Value struct {
	Flag string
	Key  string
	// Items are the value's text: one item, or a sequence's items for a
	// Repeatable flag.
	Items []string
	// Line is the line of the value in the file (1-based).
	Line int
}

// Error is one problem of a file, at a line (0: the file as a whole).
type Error struct {
	File string
	Line int
	Key  string
	Err  error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Decode parses a file's bytes (file names it in errors) into its values,
// in file order. Unknown keys, a section given a value, a setting given a
// section, a list for a flag that takes one value, and duplicate keys are
// errors; every error found is returned, joined, with the values that
// were good (so that Apply can report their errors too). A key set to null (or
// nothing) counts as absent. Values are not checked here: Apply does that
// with the flags' own parsers.
func (s *Schema) Decode(file string, data []byte) ([]Value, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &Error{File: file, Err: fmt.Errorf("not YAML: %w", err)}
	}
	if len(doc.Content) == 0 {
		return nil, nil // an empty file sets nothing
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil
	}
	d := decoder{s: s, file: file}
	d.section(root, nil)
	return d.out, errors.Join(d.errs...)
}

type decoder struct {
	s    *Schema
	file string
	out  []Value
	errs []error
}

func (d *decoder) fail(n *yaml.Node, key string, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Line: n.Line, Key: key, Err: fmt.Errorf(format, args...)})
}

func (d *decoder) section(n *yaml.Node, path []string) {
	key := strings.Join(path, ".")
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		if len(path) == 0 {
			d.fail(n, "", "want a mapping of sections (%s)", strings.Join(d.children(""), ", "))
		} else {
			d.fail(n, key, "is a section: want a mapping of %s", strings.Join(d.children(key), ", "))
		}
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		if kn.Kind != yaml.ScalarNode {
			d.fail(kn, key, "a key must be a plain name")
			continue
		}
		name := kn.Value
		if name == "<<" {
			d.fail(kn, key, "merge keys (<<) are not supported")
			continue
		}
		sub := append(slices.Clone(path), name)
		full := strings.Join(sub, ".")
		if seen[name] {
			d.fail(kn, full, "given twice")
			continue
		}
		seen[name] = true
		if vn.Kind == yaml.ScalarNode && vn.Tag == "!!null" {
			continue
		}
		switch {
		case d.s.prefix[full]:
			d.section(vn, sub)
		case d.s.byKey[full] != "":
			d.value(vn, full, d.s.byKey[full])
		default:
			msg := "unknown key"
			if near := d.closest(key, name); near != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", near)
			} else if c := d.children(key); len(c) > 0 {
				msg += fmt.Sprintf(" (here: %s)", strings.Join(c, ", "))
			}
			d.fail(kn, full, "%s", msg)
		}
	}
}

func (d *decoder) value(n *yaml.Node, key, flagName string) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	v := Value{Flag: flagName, Key: key, Line: n.Line}
	switch n.Kind {
	case yaml.ScalarNode:
		v.Items = []string{n.Value}
	case yaml.SequenceNode:
		if _, ok := d.s.fs.Lookup(flagName).Value.(Repeatable); !ok {
			d.fail(n, key, "takes one value, not a list")
			return
		}
		for _, item := range n.Content {
			if item.Kind != yaml.ScalarNode {
				d.fail(item, key, "list items must be plain values")
				return
			}
			v.Items = append(v.Items, item.Value)
		}
	default:
		d.fail(n, key, "is a setting: want a value, not a mapping")
		return
	}
	d.out = append(d.out, v)
}

// children lists the names directly under section key ("" for the top).
func (d *decoder) children(key string) []string {
	var out []string
	seen := map[string]bool{}
	for _, f := range d.s.flags {
		p := d.s.path[f]
		if !strings.HasPrefix(strings.Join(p, ".")+".", key+".") && key != "" {
			continue
		}
		depth := 0
		if key != "" {
			depth = strings.Count(key, ".") + 1
		}
		if depth < len(p) && !seen[p[depth]] {
			seen[p[depth]] = true
			out = append(out, p[depth])
		}
	}
	return out
}

// closest suggests a key for a misspelt name under section: the nearest
// name in the section, or the full key of a setting with that name
// elsewhere.
func (d *decoder) closest(section, name string) string {
	for _, f := range d.s.flags {
		p := d.s.path[f]
		if p[len(p)-1] == name || f == name {
			return d.s.Key(f)
		}
	}
	best, bestD := "", 3
	for _, c := range d.children(section) {
		if dist := editDistance(c, name); dist < bestD {
			best, bestD = c, dist
		}
	}
	if best == "" || section == "" {
		return best
	}
	return section + "." + best
}

// want says what a flag's type accepts, for an error message.
func want(f *flag.Flag) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case bool:
		return " (want true or false)"
	case int, int64:
		return " (want a whole number)"
	case uint, uint64:
		return " (want a whole number ≥ 0)"
	case float64:
		return " (want a number)"
	case time.Duration:
		return " (want a duration such as 250ms, 30s or 1h)"
	}
	return ""
}

// editDistance is Levenshtein's distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Apply sets the flags of vals on fs (the flag set the schema was built
// from, or a fresh one like it) through their parsers, except the flags
// in skip (set by the command line or the environment, which win). A
// value a flag refuses is an error naming the file, line and key; every
// error is returned, joined. It returns the flags it set.
func (s *Schema) Apply(fs *flag.FlagSet, file string, vals []Value, skip map[string]bool) (set []string, err error) {
	var errs []error
	for _, v := range vals {
		if skip[v.Flag] {
			continue
		}
		for _, item := range v.Items {
			if e := fs.Set(v.Flag, item); e != nil {
				errs = append(errs, &Error{File: file, Line: v.Line, Key: v.Key, Err: fmt.Errorf("%q: %w%s", item, e, want(fs.Lookup(v.Flag)))})
				break
			}
		}
		set = append(set, v.Flag)
	}
	return set, errors.Join(errs...)
}
