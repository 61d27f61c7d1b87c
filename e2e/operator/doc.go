// Package operator runs the four built binaries (kvroute, kvsim, kvbridge,
// kvbench) as an operator would: it checks that they share one command-line
// convention (help layout, --version, error form) and runs the README's
// "Run it yourself" recipe exactly as written. It holds tests only.
package operator
