package flagfile

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }
func (l *list) Repeatable() bool   { return true }

// testFlags is a small flag set; the key of a flag is its section (from
// the usage's first word) and its name.
func testFlags() (*flag.FlagSet, *Schema) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("addr", ":9002", "server: listen address")
	fs.Int("max", 4, "server: a count")
	fs.Bool("debug", false, "server: a switch")
	fs.Duration("wait", time.Second, "routing: a duration")
	fs.Float64("weight", 1, "routing.cost: a weight")
	fs.String("config", "", "the file itself, no key")
	var l list
	fs.Var(&l, "tokenizer", "server: a list")
	s, err := New(fs, func(f *flag.Flag) []string {
		sec, _, ok := strings.Cut(f.Usage, ":")
		if !ok {
			return nil
		}
		return append(strings.Split(sec, "."), f.Name)
	})
	if err != nil {
		panic(err)
	}
	return fs, s
}

func TestDecodeAndApply(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		want    map[string]string // flag -> value after Apply
		wantErr []string          // substrings of the error
	}{
		{name: "empty file", file: "", want: map[string]string{"addr": ":9002"}},
		{name: "comments only", file: "# nothing\n", want: map[string]string{"max": "4"}},
		{name: "values", file: "server:\n  addr: :1\n  max: 7\n  debug: true\nrouting:\n  wait: 3s\n  cost:\n    weight: 0.5\n",
			want: map[string]string{"addr": ":1", "max": "7", "debug": "true", "wait": "3s", "weight": "0.5"}},
		{name: "list", file: "server:\n  tokenizer: [a=1, b=2]\n", want: map[string]string{"tokenizer": "a=1,b=2"}},
		{name: "list as one value", file: "server:\n  tokenizer: a=1\n", want: map[string]string{"tokenizer": "a=1"}},
		{name: "null is absent", file: "server:\n  max:\n", want: map[string]string{"max": "4"}},
		{name: "unknown key with line", file: "server:\n  adr: x\n", wantErr: []string{"f.yaml:2: server.adr: unknown key (did you mean server.addr?)"}},
		{name: "unknown section", file: "nope:\n  x: 1\n", wantErr: []string{"f.yaml:1: nope: unknown key (here: routing, server)"}},
		{name: "key in the wrong section", file: "server:\n  weight: 1\n", wantErr: []string{"server.weight: unknown key (did you mean routing.cost.weight?)"}},
		{name: "wrong type", file: "server:\n  max: many\n", wantErr: []string{"f.yaml:2: server.max: \"many\": "}},
		{name: "bad duration", file: "routing:\n  wait: 3\n", wantErr: []string{"f.yaml:2: routing.wait: \"3\""}},
		{name: "section given a value", file: "routing: 3\n", wantErr: []string{"f.yaml:1: routing: is a section"}},
		{name: "setting given a mapping", file: "server:\n  addr:\n    x: 1\n", wantErr: []string{"f.yaml:3: server.addr: is a setting"}},
		{name: "list for one value", file: "server:\n  addr: [a, b]\n", wantErr: []string{"server.addr: takes one value"}},
		{name: "duplicate key", file: "server:\n  max: 1\n  max: 2\n", wantErr: []string{"server.max: given twice"}},
		{name: "top level not a mapping", file: "- a\n", wantErr: []string{"want a mapping of sections"}},
		{name: "not YAML", file: "server: [\n", wantErr: []string{"f.yaml: not YAML"}},
		{name: "every error at once", file: "server:\n  adr: 1\n  max: x\n", wantErr: []string{"server.adr", "server.max"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs, s := testFlags()
			vals, err := s.Decode("f.yaml", []byte(tt.file))
			_, err2 := s.Apply(fs, "f.yaml", vals, nil)
			err = errors.Join(err, err2)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error, want %q", tt.wantErr)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				var fe *Error
				if !errors.As(err, &fe) {
					t.Errorf("error %T is not a *flagfile.Error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for f, want := range tt.want {
				if got := fs.Lookup(f).Value.String(); got != want {
					t.Errorf("--%s = %q, want %q", f, got, want)
				}
			}
		})
	}
}

// Flags set by the command line or the environment are skipped.
func TestApplySkipsGiven(t *testing.T) {
	fs, s := testFlags()
	vals, err := s.Decode("f.yaml", []byte("server:\n  max: 7\n  addr: :1\n"))
	if err != nil {
		t.Fatal(err)
	}
	_ = fs.Set("max", "9")
	set, err := s.Apply(fs, "f.yaml", vals, map[string]bool{"max": true})
	if err != nil {
		t.Fatal(err)
	}
	if got := fs.Lookup("max").Value.String(); got != "9" {
		t.Errorf("max = %s, want the given 9", got)
	}
	if len(set) != 1 || set[0] != "addr" {
		t.Errorf("set %v, want [addr]", set)
	}
}

func TestSchemaRefusesClashes(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("a", "", "")
	fs.String("b", "", "")
	fs.String("c", "", "")
	_, err := New(fs, func(f *flag.Flag) []string {
		switch f.Name {
		case "a", "b":
			return []string{"x", "y"}
		}
		return []string{"x", "y", "z"}
	})
	if err == nil || !strings.Contains(err.Error(), "share the key x.y") || !strings.Contains(err.Error(), "both a setting and a section") {
		t.Errorf("error %v, want both clashes", err)
	}
}

func TestPrintRoundTrips(t *testing.T) {
	fs, s := testFlags()
	vals, err := s.Decode("f.yaml", []byte("server:\n  addr: \"123\"\n  tokenizer: [a=1, b=2]\nrouting:\n  cost:\n    weight: 0.25\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(fs, "f.yaml", vals, nil); err != nil {
		t.Fatal(err)
	}
	_ = fs.Set("max", "8")
	src := map[string]Source{"addr": {File, "f.yaml:2"}, "tokenizer": {File, "f.yaml:3"}, "weight": {File, "f.yaml:6"}, "max": {Kind: Flag}}
	var out bytes.Buffer
	if err := s.Print(&out, fs, src, func(f string) bool { return f == "addr" }); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"addr: '[redacted]' # file f.yaml:2",
		"max: 8 # flag",
		"debug: false # default",
		"tokenizer: [a=1, b=2] # file f.yaml:3",
		"  cost:\n    weight: 0.25 # file f.yaml:6",
		"wait: 1s # default",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("print lacks %q:\n%s", want, got)
		}
	}
	// What Print writes (without secrets) reads back to the same values.
	var plain bytes.Buffer
	_ = s.Print(&plain, fs, src, nil)
	fs2, s2 := testFlags()
	vals, err = s2.Decode("print", plain.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Apply(fs2, "print", vals, nil); err != nil {
		t.Fatal(err)
	}
	fs.VisitAll(func(f *flag.Flag) {
		if got := fs2.Lookup(f.Name).Value.String(); got != f.Value.String() {
			t.Errorf("--%s read back as %q, want %q", f.Name, got, f.Value.String())
		}
	})
}

// The decoder never panics and reports errors as *Error.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{"", "server:\n  addr: x\n", "routing: {cost: {weight: 1}}", "- 1", "a: &x {b: 1}\nc: *x", "server:\n  tokenizer: [a, {b: 1}]"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fs, s := testFlags()
		vals, err := s.Decode("fuzz", data)
		if err != nil {
			var fe *Error
			if !errors.As(err, &fe) {
				t.Fatalf("error %T %v is not a *flagfile.Error", err, err)
			}
			return
		}
		_, _ = s.Apply(fs, "fuzz", vals, nil)
	})
}
