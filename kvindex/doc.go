// Package kvindex knows which GPU worker holds which KV-cache blocks.
//
// It owns the router's block hashing (Seed, HashBlocks: one function for
// requests and for events), keeps a concurrent prefix index fed by vLLM KV
// events (Index; the events and their codec are package
// kvevents/vllmwire) and offers an approximate index for fleets that
// publish no events (Approx). The event core that feeds the Index lives in
// kvevents.
//
// The router never matches on engine hashes: every stored block is re-hashed
// from its token ids, and each worker keeps a map from its engine hashes to
// its blocks (their router hashes, in the Index's chains) so that removals
// and parent hashes resolve.
package kvindex
