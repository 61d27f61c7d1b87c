// Package cli gives the four kvroute binaries one command-line convention:
// the same help layout (GNU-style --flag, the environment variable and the
// default under each flag), errors printed first with a one-line pointer to
// --help, --version, and the --log-format/--log-level pair. Flags are read
// from the environment through package envflag; the command line wins.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strings"

	"github.com/kvroute/kvroute/internal/envflag"
)

// Hidden starts the usage of a flag that works but is not shown in --help
// (a deprecated spelling kept for old scripts).
const Hidden = "\x00"

// ErrVersion is returned by Parse after it printed the version.
var ErrVersion = errors.New("version printed")

// UsageError is a command line the binary refused: main prints it with a
// pointer to --help and exits 2.
type UsageError struct {
	Err error
	// Cmd is the command that refused it ("kvroute tokenize"); empty: the
	// binary's name.
	Cmd string
}

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef builds a UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// Usagef builds a UsageError of this command.
func (c *Command) Usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...), Cmd: c.Name}
}

// Command is one command's help text and flags.
type Command struct {
	// Name as typed, e.g. "kvroute envoy-config"; the help pointer uses it.
	Name string
	// Summary is printed first by --help: what the command does and its usage line.
	Summary string
	// Footer follows the flags (extra sections), may be empty.
	Footer string
	// Flags of the command.
	Flags *flag.FlagSet
	// Env names a flag's environment variable (nil: envflag.Name); a flag
	// for which it returns "" is not read from the environment.
	Env func(flag string) string
	// Groups, when set, split the help's flags under headings, in order;
	// flags in no group follow under "Other".
	Groups []Group
	// Brief, when set, is what --help shows instead of every group (the
	// flags most runs need), followed by BriefFooter; --help-all then
	// shows Groups, all of them.
	Brief       []Group
	BriefFooter string
}

// Group is a heading in --help and the flags under it, in the order shown.
type Group struct {
	Title string
	Flags []string
}

// Ungrouped lists the visible flags that no group names, for tests that
// keep every flag in a group.
func (c *Command) Ungrouped() []string {
	named := map[string]bool{}
	for _, g := range c.Groups {
		for _, f := range g.Flags {
			named[f] = true
		}
	}
	var out []string
	c.Flags.VisitAll(func(f *flag.Flag) {
		if !named[f.Name] && !strings.HasPrefix(f.Usage, Hidden) {
			out = append(out, f.Name)
		}
	})
	return out
}

// NewCommand returns a Command with a fresh, silent flag set.
func NewCommand(name, summary string) *Command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &Command{Name: name, Summary: summary, Flags: fs}
}

func (c *Command) envName(name string) string {
	if c.Env == nil {
		return envflag.Name(name)
	}
	return c.Env(name)
}

// Usage writes the help: the summary, the flags (under their group
// headings, " Title:", a blank line between groups), the footer. With
// Brief set it shows the Brief groups only; UsageAll shows every flag.
func (c *Command) Usage(w io.Writer) {
	if len(c.Brief) == 0 {
		c.UsageAll(w)
		return
	}
	c.usage(w, c.Brief, c.BriefFooter)
}

// UsageAll writes the help with every flag (--help-all).
func (c *Command) UsageAll(w io.Writer) {
	groups := c.Groups
	if len(groups) > 0 {
		if rest := c.Ungrouped(); len(rest) > 0 {
			groups = append(groups[:len(groups):len(groups)], Group{Title: "Other", Flags: rest})
		}
	}
	c.usage(w, groups, c.Footer)
}

func (c *Command) usage(w io.Writer, groups []Group, footer string) {
	fmt.Fprint(w, strings.TrimRight(c.Summary, "\n")+"\n\nFlags:\n")
	if len(groups) == 0 {
		PrintFlags(w, c.Flags, c.envName)
	} else {
		for i, g := range groups {
			if i > 0 {
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, " %s:\n", g.Title)
			for _, name := range g.Flags {
				if f := c.Flags.Lookup(name); f != nil && !strings.HasPrefix(f.Usage, Hidden) {
					printFlag(w, f, c.envName)
				}
			}
		}
	}
	if footer != "" {
		fmt.Fprint(w, "\n"+strings.TrimRight(footer, "\n")+"\n")
	}
}

// PrintFlags writes every visible flag of fs in the shared layout:
//
//	--name VALUE
//	    what it does
//	    env KVROUTE_NAME, default "x"
func PrintFlags(w io.Writer, fs *flag.FlagSet, env func(string) string) {
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.HasPrefix(f.Usage, Hidden) {
			printFlag(w, f, env)
		}
	})
}

func printFlag(w io.Writer, f *flag.Flag, env func(string) string) {
	name, usage := flag.UnquoteUsage(f)
	if isBool(f) {
		name = "" // --x or --x=false
	}
	fmt.Fprintf(w, "  --%s", f.Name)
	if name != "" {
		fmt.Fprintf(w, " %s", name)
	}
	fmt.Fprintf(w, "\n      %s\n", usage)
	var tail []string
	if e := env(f.Name); e != "" {
		tail = append(tail, "env "+e)
	}
	if d := defaultText(f); d != "" {
		tail = append(tail, "default "+d)
	}
	if len(tail) > 0 {
		fmt.Fprintf(w, "      %s\n", strings.Join(tail, ", "))
	}
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// defaultText is a flag's default as help shows it: nothing for zero
// values, strings quoted (so a default named "default" reads as one).
func defaultText(f *flag.Flag) string {
	switch f.DefValue {
	case "", "0", "0s", "[]", "false":
		return ""
	}
	if reflect.TypeOf(f.Value).String() == "*flag.stringValue" {
		return fmt.Sprintf("%q", f.DefValue)
	}
	return f.DefValue
}

var goFlagName = regexp.MustCompile(`(flag|for|defined:|argument:) -([A-Za-z0-9])`)

// gnu rewrites the flag package's one-dash flag names in its errors.
func gnu(err error) error {
	return errors.New(goFlagName.ReplaceAllString(err.Error(), "$1 --$2"))
}

// Parse reads args, then the environment for every flag the command line
// did not set (lookup: e.g. os.LookupEnv). --help and -h print the usage on
// stdout and return flag.ErrHelp (--help-all: every flag, where Brief is
// set); --version prints Version and returns
// ErrVersion; a bad command line is a *UsageError. Positional arguments
// are refused unless positional is true.
func (c *Command) Parse(args []string, lookup func(string) (string, bool), stdout io.Writer, positional bool) error {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "--version" || a == "-version" {
			fmt.Fprintln(stdout, Version(c.Name))
			return ErrVersion
		}
		if (a == "--help-all" || a == "-help-all") && len(c.Brief) > 0 {
			c.UsageAll(stdout)
			return flag.ErrHelp
		}
	}
	if err := c.Flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.Usage(stdout)
			return err
		}
		return &UsageError{Err: didYouMean(gnu(err), c.Flags), Cmd: c.Name}
	}
	if !positional && c.Flags.NArg() > 0 {
		return c.Usagef("unexpected argument %s", List(quoteAll(c.Flags.Args()), "and"))
	}
	if lookup != nil {
		name := func(f string) string {
			if n := c.envName(f); n != "" {
				return n
			}
			return "\x00unset"
		}
		if err := envflag.Apply(c.Flags, lookup, name); err != nil {
			return &UsageError{Err: gnu(err), Cmd: c.Name}
		}
	}
	return nil
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}

// List joins items for a person to read: "a", "a or b", "a, b or c".
func List(items []string, conj string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " " + conj + " " + items[len(items)-1]
}

// Exit reports err the shared way on stderr and returns the exit code:
// 0 for nil, --help and --version; 2 for a usage error, printed as
// "NAME: ERROR" and a pointer to --help; 1 for anything else.
func Exit(name string, err error, stderr io.Writer) int {
	var ue *UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp), errors.Is(err, ErrVersion):
		return 0
	case errors.As(err, &ue):
		if ue.Cmd != "" {
			name = ue.Cmd
		}
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", name, err, name)
		return 2
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return 1
}
