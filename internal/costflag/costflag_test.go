package costflag

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/scoring"
)

func parse(t *testing.T, args ...string) (scoring.Options, string, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := scoring.DefaultOptions()
	f := Register(fs, &o)
	if err := fs.Parse(args); err != nil {
		return o, "", err
	}
	var note bytes.Buffer
	err := f.Finish(&note)
	return o, note.String(), err
}

func TestFlagsSetTheOptions(t *testing.T) {
	o, note, err := parse(t, "--cost-model", "default", "--kv-overlap-score-credit", "2", "--prefill-load-scale", "4",
		"--decode-active-request-weight", "16", "--prefill-backlog-decay=false", "--learn-prefill-rate=false",
		"--prefill-rate", "30000", "--prefill-overhead", "40ms", "--host-cache-hit-weight", "0.5")
	if err != nil || note != "" {
		t.Fatalf("err %v, note %q", err, note)
	}
	if o.CostModel != scoring.CostDefault || o.OverlapCredit != 2 || o.PrefillLoadScale != 4 || o.DecodeActiveRequestWeight != 16 ||
		!o.NoPrefillDecay || !o.NoLearnRates || o.PrefillRate != 30000 || o.PrefillOverhead.Milliseconds() != 40 || o.HostCacheHitWeight != 0.5 {
		t.Fatalf("options %+v", o)
	}
}

func TestPendingOverlayTTLFlag(t *testing.T) {
	if o, _, err := parse(t); err != nil || o.PendingTTL != scoring.DefaultPendingTTL {
		t.Fatalf("default pending TTL %s (err %v), want %s", o.PendingTTL, err, scoring.DefaultPendingTTL)
	}
	if o, _, err := parse(t, "--pending-overlay-ttl", "0"); err != nil || o.PendingTTL != 0 {
		t.Fatalf("--pending-overlay-ttl 0 gave %s (err %v), want 0: off", o.PendingTTL, err)
	}
	if o, _, err := parse(t, "--pending-overlay-ttl", "750ms"); err != nil || o.PendingTTL.Milliseconds() != 750 {
		t.Fatalf("--pending-overlay-ttl 750ms gave %s (err %v)", o.PendingTTL, err)
	}
}

func TestDefaultsAreTheScoringDefaults(t *testing.T) {
	o, note, err := parse(t)
	d := scoring.DefaultOptions()
	if err != nil || note != "" || o.CostModel != d.CostModel || o.OverlapCredit != d.OverlapCredit ||
		o.NoPrefillDecay || o.NoLearnRates || o.DecodeSlowdownWeight != d.DecodeSlowdownWeight {
		t.Fatalf("no flags changed the defaults: %+v (err %v, note %q)", o, err, note)
	}
}

func TestDeprecatedWeightMapsAsDynamoDoes(t *testing.T) {
	o, note, err := parse(t, "--kv-overlap-score-credit", "3", "--kv-overlap-score-weight", "2.5")
	if err != nil {
		t.Fatal(err)
	}
	if o.PrefillLoadScale != 2.5 || o.OverlapCredit != 1 || o.OverlapWeight != 0 {
		t.Fatalf("weight 2.5 gave scale %g credit %g weight %g, want 2.5, 1, 0", o.PrefillLoadScale, o.OverlapCredit, o.OverlapWeight)
	}
	if !strings.Contains(note, "deprecated") {
		t.Fatalf("no deprecation note: %q", note)
	}
	if o, _, err := parse(t, "--kv-overlap-score-weight", "0"); err != nil || o.PrefillLoadScale != 0 {
		t.Fatalf("weight 0 must mean scale 0 (ignore the cache): %g, %v", o.PrefillLoadScale, err)
	}
}

func TestBadValuesAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--kv-overlap-score-weight", "-2"},
		{"--cost-model", "fastest"},
		{"--kv-overlap-score-credit", "-1"},
		{"--router-queue-policy", "random"},
		{"--prefill-overhead", "-1s"},
		{"--pending-overlay-ttl", "-1s"},
	} {
		if _, _, err := parse(t, args...); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
