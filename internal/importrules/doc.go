// Package importrules holds no code: its test checks the import rules of
// docs/architecture.md §2 against `go list`, so a package that starts
// importing what the map forbids fails `make test` instead of drifting.
package importrules
