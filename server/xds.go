package server

import (
	"fmt"
	"net"
	"slices"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/fleet"
)

// startXDS serves the discovered workers to Envoy over ADS (the xds
// bootstrap style: one cluster per worker, picked by x-target-worker).
// Membership changes reach it through xdsChanged; one goroutine turns them
// into snapshots, so a burst of etcd events costs one push.
func (r *Server) startXDS() error {
	lis, err := net.Listen("tcp", r.cfg.XDSAddr)
	if err != nil {
		return fmt.Errorf("xds listen: %w", err)
	}
	r.xdsLis = lis
	r.xds = envoy.NewXDSServer(r.cfg.XDSNodeID, r.log)
	r.xdsChanged = make(chan struct{}, 1)
	r.goRun(func() error { return r.xds.Serve(r.ctx, lis) })
	r.goRun(func() error { r.pushXDS(); return nil })
	r.notifyXDS()
	return nil
}

// notifyXDS marks the worker set changed; it never blocks.
func (r *Server) notifyXDS() {
	if r.xdsChanged == nil {
		return
	}
	select {
	case r.xdsChanged <- struct{}{}:
	default:
	}
}

// pushXDS hands each changed worker set to the ADS server until shutdown.
func (r *Server) pushXDS() {
	var last []envoy.Worker
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-r.xdsChanged:
		}
		ws := xdsWorkers(r.fleet.snapshot(), r.log.Warn)
		if len(ws) == 0 && !r.synced.Load() {
			// Discovery has not answered: an empty cluster would take
			// every host from an Envoy that still has the fleet (a
			// restarted router). markSynced notifies again.
			continue
		}
		if last != nil && slices.Equal(ws, last) {
			continue // a file reload or a record update that moved nothing
		}
		if err := r.xds.SetWorkers(ws); err != nil {
			r.log.Warn("xds: worker set refused; Envoy keeps the previous clusters", "err", err)
			continue
		}
		last = ws
		r.log.Info("xds: clusters updated", "clusters", len(ws), "version", r.xds.Version())
	}
}

// xdsWorkers maps records (sorted by id) to one cluster each. Records that
// share a cluster (data-parallel ranks behind one address) become one
// cluster; a cluster name claimed with two addresses keeps the first and
// warns, since Envoy can only route a cluster name one way.
func xdsWorkers(recs []fleet.Worker, warn func(string, ...any)) []envoy.Worker {
	out := make([]envoy.Worker, 0, len(recs))
	byCluster := make(map[string]string, len(recs))
	for _, rec := range recs {
		name := rec.ClusterName()
		if addr, ok := byCluster[name]; ok {
			if addr != rec.Address {
				warn("xds: cluster claimed by two addresses; keeping the first", "cluster", name, "kept", addr, "ignored", rec.Address, "worker", rec.ID)
			}
			continue
		}
		byCluster[name] = rec.Address
		out = append(out, envoy.Worker{Cluster: name, Address: rec.Address})
	}
	return out
}

// XDSAddr is the bound ADS address, or "" when xDS is off.
func (r *Server) XDSAddr() string {
	if r.xdsLis == nil {
		return ""
	}
	return r.xdsLis.Addr().String()
}
