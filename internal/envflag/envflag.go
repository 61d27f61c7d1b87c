// Package envflag lets every kvroute binary take each of its flags from an
// environment variable, KVROUTE_<FLAG> (dashes become underscores), as
// docs/architecture.md §3.8 promises operators. The command line wins over the environment.
package envflag

import (
	"flag"
	"fmt"
	"strings"
)

// Name is the environment variable that sets the flag: KVROUTE_<FLAG>.
func Name(flagName string) string {
	return "KVROUTE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Apply sets every flag of fs that the command line did not set (call it
// after fs.Parse, or before it and let Parse override) from its variable.
// name maps a flag to its variable (nil: Name); lookup reads the environment
// (e.g. os.LookupEnv). An empty value counts as unset. A value the flag
// refuses is an error naming the variable.
func Apply(fs *flag.FlagSet, lookup func(string) (string, bool), name func(string) string) error {
	if name == nil {
		name = Name
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		v, ok := lookup(name(f.Name))
		if !ok || v == "" {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("%s=%q: %w", name(f.Name), v, e)
		}
	})
	return err
}

// Parse sets fs from the environment, then from args (so the command line
// wins), and refuses positional arguments: the whole flag handling of a
// command that takes flags only.
func Parse(fs *flag.FlagSet, args []string, lookup func(string) (string, bool)) error {
	if err := Apply(fs, lookup, nil); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return nil
}

// Getenv adapts a getenv-style function (empty means unset) to Apply's lookup.
func Getenv(getenv func(string) string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v := getenv(k)
		return v, v != ""
	}
}
