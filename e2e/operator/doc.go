// Package operator runs the four built binaries (kvroute, kvsim, kvbridge,
// kvbench) as an operator would: it checks that they share one command-line
// convention (help layout, --version, error form), runs the README's
// "Run it yourself" recipe exactly as written, and checks the docs against
// the code: relative links resolve, commands name existing packages, and
// docs/operating.md lists exactly the flags of kvroute serve. It holds tests
// only.
package operator
