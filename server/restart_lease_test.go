package server

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/kvindex"
)

// A worker killed and started again under the same id registers under a
// new lease while the old one still holds its key: the router stops
// crediting the old process's blocks at once, before the new process sends
// a load report or an event.
func TestWorkerRegisteredUnderANewLeaseLosesItsCredit(t *testing.T) {
	rig := startFlapRig(t, time.Minute)
	r := rig.r
	prompt := promptTokens(t, chatBody(100))
	credit := func() int {
		res := r.Index().Match(kvindex.HashBlocks(kvindex.Seed(model, "", ""), prompt, 16, nil), []string{"w9"}, nil)
		if res[0].Stale {
			return 0
		}
		return int(res[0].Blocks)
	}
	if got := credit(); got != rig.blocks {
		t.Fatalf("w9 credited with %d blocks before the restart, want %d", got, rig.blocks)
	}
	// kill -9: the old lease keeps the key for its TTL; the new process
	// registers at once under a lease of its own.
	rig.reg.Abandon()
	reg, err := etcd.Register(context.Background(), rig.cli, r.cfg.Namespace, rig.spec, etcd.RegisterOptions{TTL: 10 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Abandon)
	eventually(t, "w9's old blocks no longer credited", func() bool { return credit() == 0 })
	if !r.index.NeedsResync("w9") {
		t.Error("w9 is not waiting for a resync after its restart")
	}
	if r.fleet.len() != 1 {
		t.Errorf("fleet holds %d workers, want w9 kept", r.fleet.len())
	}
}
