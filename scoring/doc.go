// Package scoring decides which worker serves a request.
//
// The KV index (package kvindex) says where the cache is; scoring weighs that
// against each worker's live load. It holds:
//
//   - the Pool: the fleet's workers grouped by model (LoRA adapters
//     included), each with its static facts (fleet.Worker) and its live load:
//     active requests, active KV blocks counted once per unique block,
//     prefill tokens in flight and the latest fleet.LoadReport;
//   - the request lifecycle on the Pool: Add, PrefillDone, ResponseStarted,
//     Progress, Free and Move, idempotent and safe in any order, with requests
//     older than Options.MaxRequestAge force-freed by Sweep; a request's first
//     token also comes from its worker's KV events (first_token.go);
//   - router modes (Mode), each a type: kv, which prices every candidate
//     with a cost model (latency, the default: the predicted time to first
//     token, cost_latency.go; default: Dynamo's block cost, cost_dynamo.go;
//     weighted, cost_weighted.go) and picks the lowest, or samples by
//     temperature; at temperature 0 over many candidates it prices only
//     those that can win (prune.go); kv_without_events, round_robin,
//     random, least_loaded, power_of_two and weighted;
//   - the Explanation of a decision, which renders the seeds' log line and
//     marshals to JSON for the explain endpoint;
//   - the Scheduler, which ties a Pool, a Mode and the admission queue together:
//     Route waits while every eligible worker is saturated with prefill work,
//     orders waiters by policy (fcfs, wspt, lcfs) and sheds past the queue's
//     limits with a *ShedError;
//   - the pool's side of what the NATS edges carry: workers' load reports
//     (fleet.LoadReport) and peer replicas' lifecycle events
//     (fleet.SyncEvent, Pool.Apply). The types live in package fleet, the
//     adapters that move them (LoadReports, Sync) in bus.
//
// Everything here is pure logic: no I/O, an injectable clock and random
// source, so every behaviour is a table-driven test.
//
// Overlap is plain data: the caller (the ext_proc layer) asks the KV index
// for each candidate's matched leading blocks and cached-block total and
// passes them in as Candidates. Scoring never imports kvindex on that path.
// For the kv_without_events mode the Scheduler records each routing decision
// on a PrefixRecorder (the approximate index satisfies it) so later
// requests see the predicted cache. In the kv mode the Pool itself keeps
// what it has just sent where, the pending overlay (pending.go), which the
// KV index reconciles through Pool.BlocksStored and Pool.CacheReset.
package scoring
