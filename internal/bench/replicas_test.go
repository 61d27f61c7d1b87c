package bench

import (
	"context"
	"testing"
	"time"
)

// replicaOptions is a small two-replica system: 32 simulated workers,
// 48 sessions of 4 turns over 6 shared system prompts.
func replicaOptions(probes int) ReplicaOptions {
	return ReplicaOptions{
		Env:      EnvConfig{Workers: 32, Speedup: 4},
		Sessions: 48, Turns: 4, SystemPrompts: 6, SystemTokens: 1024, UserTokens: 128, OutputTokens: 16,
		Stagger: 20 * time.Millisecond, Think: 100 * time.Millisecond, Probes: probes, Seed: 1,
	}
}

// Two replicas that share a fleet through NATS must end with the same
// index: every prompt of the run matches the same blocks on every worker
// in both, and both routed with a cache hit rate near one replica's.
func TestTwoReplicasIndexesAgree(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS, etcd, 32 workers, two routers and two Envoys")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := RunReplicas(ctx, replicaOptions(3))
	if err != nil {
		t.Fatal(err)
	}
	if rep.EntriesA == 0 || rep.EntriesA != rep.EntriesB {
		t.Errorf("index entries: replica a %d, replica b %d; want equal and not zero", rep.EntriesA, rep.EntriesB)
	}
	if rep.Prompts == 0 || rep.Agree != rep.Prompts {
		t.Errorf("%d of %d prompts match the same blocks in both replicas' indexes, want all", rep.Agree, rep.Prompts)
	}
	for _, run := range []ReplicaRun{rep.One, rep.Two} {
		if run.Errors != 0 || run.Requests != 48*4 {
			t.Fatalf("run: %d requests, %d errors; want 192 and none", run.Requests, run.Errors)
		}
	}
	// Sessions are dealt alternately to the replicas and share six system
	// prompts, so a replica finds a system prompt the other placed only
	// through the shared KV events and replica sync; routing blind to the
	// other's traffic would place each prompt twice.
	if rep.Two.HitRate < rep.One.HitRate-0.05 {
		t.Errorf("hit rate with two replicas %.3f, with one %.3f: want within 5 points", rep.Two.HitRate, rep.One.HitRate)
	}
	if rep.SyncProbes != 3 {
		t.Errorf("replica b saw %d of 3 sync probes", rep.SyncProbes)
	}
	t.Logf("one replica: hit %.3f, TTFT p50 %.0f ms; two: hit %.3f, TTFT p50 %.0f ms, active gap %.2f; index agreement %d/%d (%d entries); sync lag p50 %.2f ms",
		rep.One.HitRate, rep.One.TTFT.P50, rep.Two.HitRate, rep.Two.TTFT.P50, rep.Two.ActiveGap, rep.Agree, rep.Prompts, rep.EntriesA, rep.SyncLag.P50)
}

// BenchmarkTwoReplicas reports the two-replica figures of
// docs/fleet-scale.md: 64 workers, 192 sessions of 4 turns, 50 sync
// probes. One iteration is one whole run (about a minute).
func BenchmarkTwoReplicas(b *testing.B) {
	o := replicaOptions(50)
	o.Env.Workers, o.Sessions, o.Stagger = 64, 192, 10*time.Millisecond
	for b.Loop() {
		rep, err := RunReplicas(context.Background(), o)
		if err != nil {
			b.Fatal(err)
		}
		if rep.Agree != rep.Prompts {
			b.Errorf("%d of %d prompts agree", rep.Agree, rep.Prompts)
		}
		b.ReportMetric(rep.One.HitRate, "hit-one")
		b.ReportMetric(rep.Two.HitRate, "hit-two")
		b.ReportMetric(rep.One.TTFT.P50, "ttft-p50-one-ms")
		b.ReportMetric(rep.Two.TTFT.P50, "ttft-p50-two-ms")
		b.ReportMetric(rep.Two.ActiveGap, "active-gap")
		b.ReportMetric(float64(rep.Agree)/float64(max(rep.Prompts, 1)), "index-agree")
		b.ReportMetric(float64(rep.EntriesA), "entries")
		b.ReportMetric(rep.SyncLag.P50, "sync-lag-p50-ms")
		b.ReportMetric(rep.SyncLag.P99, "sync-lag-p99-ms")
	}
}
