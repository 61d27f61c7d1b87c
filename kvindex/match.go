package kvindex

// MatchResult is one worker's answer to a Match: how many leading blocks of
// the prompt it holds on the device tier, and how many it holds in all.
type MatchResult struct {
	// Worker is the worker id (the candidate at the same position).
	Worker string
	// Blocks is the number of consecutive leading prompt blocks held.
	Blocks int
	// Cached is the worker's total device blocks, for tie-breaks.
	Cached int
	// Known is false when the index has no such worker; Blocks and Cached
	// are then 0.
	Known bool
	// Stale is true while the worker's view may be out of date (a sequence
	// gap or restart, or an unknown parent) and it has not resynced.
	Stale bool
}

// Matcher is what the scorer needs from an index: Index (events) and
// Approx (the router's own decisions) both provide it.
type Matcher interface {
	// Match writes into out (resized to len(candidates), reusing its
	// storage) one result per candidate, aligned with candidates, and
	// returns it. A nil candidates slice means every known worker.
	Match(hashes []uint64, candidates []string, out []MatchResult) []MatchResult
}
