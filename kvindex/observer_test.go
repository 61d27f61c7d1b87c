package kvindex

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

// recordingObserver writes what it hears as lines: "stored w [hashes]" and
// "reset w".
type recordingObserver struct{ got []string }

func (o *recordingObserver) BlocksStored(worker string, hashes []uint64) {
	o.got = append(o.got, fmt.Sprintf("stored %s %v", worker, hashes))
}

func (o *recordingObserver) CacheReset(worker string) {
	o.got = append(o.got, "reset "+worker)
}

func (o *recordingObserver) lines() []string { return o.got }

// checkHeard runs do on an index of w0 that obs observes, and checks
// that obs heard want.
func checkHeard(t *testing.T, obs interface {
	Observer
	lines() []string
}, do func(ix *Index), want []string) {
	t.Helper()
	ix := New(Config{})
	ix.AddWorker("w0", testModel, testBS)
	ix.SetObserver(obs)
	do(ix)
	if got := obs.lines(); !slices.Equal(got, want) {
		t.Fatalf("observer heard\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestObserverHearsWhatTheIndexLearns(t *testing.T) {
	stored := func(hs []uint64) string { return fmt.Sprintf("stored w0 %v", hs) }
	for _, tc := range []struct {
		name string
		do   func(ix *Index)
		want []string
	}{
		{"a batch's device blocks, once, as router hashes", func(ix *Index) {
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 2), storeEv(1, 2, 3)}})
		}, []string{stored(promptHashes(1, 3))}},
		{"blocks stored off the device are not held on it", func(ix *Index) {
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{withMedium(storeEv(1, 0, 2), vllmwire.MediumCPU)}})
		}, nil},
		{"removals say nothing", func(ix *Index) {
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{removeEv(1, 0)}})
		}, nil},
		{"a clear resets, and only blocks stored after it are reported", func(ix *Index) {
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 2), vllmwire.AllBlocksCleared{}, storeEv(2, 0, 1)}})
		}, []string{"reset w0", stored(promptHashes(2, 1))}},
		{"an unknown parent makes the worker stale", func(ix *Index) {
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(3, 1, 2)}})
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(3, 1, 2)}}) // already stale: no second reset
		}, []string{"reset w0"}},
		{"marked stale", func(ix *Index) { ix.MarkStale("w0") }, []string{"reset w0"}},
		{"reset", func(ix *Index) { ix.Reset("w0") }, []string{"reset w0"}},
		{"removed", func(ix *Index) { ix.RemoveWorker("w0") }, []string{"reset w0"}},
		{"re-added with another block size", func(ix *Index) { ix.AddWorker("w0", testModel, 2*testBS) }, []string{"reset w0"}},
		{"re-added unchanged", func(ix *Index) { ix.AddWorker("w0", testModel, testBS) }, nil},
		{"an unknown worker's batch", func(ix *Index) {
			ix.Apply("nobody", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 2)}})
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) { checkHeard(t, &recordingObserver{}, tc.do, tc.want) })
	}
}

func TestNoObserverNoRecording(t *testing.T) {
	ix := New(Config{})
	ix.AddWorker("w0", testModel, testBS)
	obs := &recordingObserver{}
	ix.SetObserver(obs)
	ix.SetObserver(nil)
	ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 2)}})
	if len(obs.got) != 0 || len(ix.stored) != 0 {
		t.Fatalf("a removed observer heard %v; %d hashes gathered for nobody", obs.got, len(ix.stored))
	}
}

// afterObserver calls the index back from AfterApply, which would
// deadlock were the index's lock still held.
type afterObserver struct {
	recordingObserver
	ix *Index
}

func (o *afterObserver) AfterApply() {
	o.got = append(o.got, fmt.Sprintf("after, %d blocks", o.ix.Stats().Blocks))
}

func TestAfterApplyRunsWithTheLockReleased(t *testing.T) {
	ix := New(Config{})
	ix.AddWorker("w0", testModel, testBS)
	obs := &afterObserver{ix: ix}
	ix.SetObserver(obs)
	ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 2)}})
	ix.Apply("nobody", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 2)}})
	want := []string{fmt.Sprintf("stored w0 %v", promptHashes(1, 2)), "after, 2 blocks"}
	if !slices.Equal(obs.got, want) {
		t.Fatalf("observer heard %q, want %q", obs.got, want)
	}
}

// removalObserver also records "removed w [hashes]".
type removalObserver struct{ recordingObserver }

func (o *removalObserver) BlocksRemoved(worker string, hashes []uint64) {
	o.got = append(o.got, fmt.Sprintf("removed %s %v", worker, hashes))
}

func TestRemovalObserverHearsDeviceBlocksTheWorkerNoLongerHolds(t *testing.T) {
	hs := promptHashes(1, 3)
	for _, tc := range []struct {
		name string
		do   func(ix *Index)
		want []string
	}{
		{"device removals, after the batch's stores, as router hashes", func(ix *Index) {
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 3), removeEv(1, 2, 1), storeEv(2, 0, 1)}})
		}, []string{fmt.Sprintf("stored w0 %v", append(slices.Clone(hs), promptHashes(2, 1)...)), fmt.Sprintf("removed w0 %v", []uint64{hs[2], hs[1]})}},
		{"unknown and off-device removals say nothing", func(ix *Index) {
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{withMedium(storeEv(1, 0, 2), vllmwire.MediumCPU)}})
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{withMedium(removeEv(1, 0, 1), vllmwire.MediumCPU), removeEv(3, 0)}})
		}, nil},
		{"a block held under a second engine key stays held", func(ix *Index) {
			dup := storeEv(1, 0, 1)
			dup.BlockHashes = []vllmwire.EngineHash{vllmwire.HashInt(999)}
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 1), dup}})
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{removeEv(1, 0)}})
			ix.obs.(*removalObserver).got = append(ix.obs.(*removalObserver).got, "first key removed")
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{vllmwire.BlockRemoved{BlockHashes: []vllmwire.EngineHash{vllmwire.HashInt(999)}}}})
		}, []string{fmt.Sprintf("stored w0 %v", []uint64{hs[0], hs[0]}), "first key removed", fmt.Sprintf("removed w0 %v", hs[:1])}},
		{"removals before a clear are not reported", func(ix *Index) {
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{storeEv(1, 0, 3)}})
			ix.Apply("w0", vllmwire.EventBatch{Events: []vllmwire.Event{removeEv(1, 2), vllmwire.AllBlocksCleared{}}})
		}, []string{fmt.Sprintf("stored w0 %v", hs), "reset w0"}},
	} {
		t.Run(tc.name, func(t *testing.T) { checkHeard(t, &removalObserver{}, tc.do, tc.want) })
	}
}
