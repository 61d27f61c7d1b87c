package flagfile

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Source says where a setting's value came from.
type Source struct {
	Kind SourceKind
	// Detail is the file and line, or the environment variable.
	Detail string
}

// SourceKind orders the sources: a later one wins over an earlier one.
type SourceKind int

// The sources of a setting, lowest precedence first.
const (
	Default SourceKind = iota
	File
	Env
	Flag
)

func (k SourceKind) String() string {
	switch k {
	case File:
		return "file"
	case Env:
		return "env"
	case Flag:
		return "flag"
	}
	return "default"
}

func (s Source) String() string {
	if s.Detail == "" {
		return s.Kind.String()
	}
	return s.Kind.String() + " " + s.Detail
}

// Redacted stands in for a secret's value in Print.
const Redacted = "[redacted]"

// Print writes the effective configuration of fs as YAML, every setting
// under its key with its source as a trailing comment ("# default",
// "# file kvroute.yaml:12", "# env KVROUTE_X", "# flag"). Settings for
// which secret returns true print Redacted when they are set.
func (s *Schema) Print(w io.Writer, fs *flag.FlagSet, src map[string]Source, secret func(flagName string) bool) error {
	root := &yaml.Node{Kind: yaml.MappingNode}
	for _, name := range s.flags {
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		parent := root
		p := s.path[name]
		for _, sec := range p[:len(p)-1] {
			parent = child(parent, sec)
		}
		v := valueNode(f)
		if secret != nil && secret(name) && f.Value.String() != "" {
			v = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: Redacted}
		}
		v.LineComment = src[name].String()
		parent.Content = append(parent.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: p[len(p)-1]}, v)
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return fmt.Errorf("print configuration: %w", err)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// child returns the section name under parent, adding it if new.
func child(parent *yaml.Node, name string) *yaml.Node {
	for i := 0; i+1 < len(parent.Content); i += 2 {
		if parent.Content[i].Value == name {
			return parent.Content[i+1]
		}
	}
	n := &yaml.Node{Kind: yaml.MappingNode}
	parent.Content = append(parent.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: name}, n)
	return n
}

// valueNode is a flag's current value as YAML: numbers and booleans plain,
// strings quoted where YAML would read them otherwise, lists as sequences.
func valueNode(f *flag.Flag) *yaml.Node {
	if _, ok := f.Value.(Repeatable); ok {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		for _, item := range strings.Split(f.Value.String(), ",") {
			if item != "" {
				seq.Content = append(seq.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: item})
			}
		}
		return seq
	}
	tag := "!!str"
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case bool, int, int64, uint, uint64, float64:
			tag = "" // plain: YAML reads it back as the number or boolean it is
		}
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: f.Value.String()}
}
