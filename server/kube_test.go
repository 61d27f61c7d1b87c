package server

import (
	"strings"
	"testing"
)

func TestDiscoverySourcesAreExclusive(t *testing.T) {
	cases := []struct {
		name string
		set  func(*Config)
		err  string
	}{
		{"etcd", func(c *Config) { c.EtcdEndpoints = []string{"http://e:2379"} }, ""},
		{"file", func(c *Config) { c.WorkersFile = "w.yaml" }, ""},
		{"pool", func(c *Config) { c.PoolName = "vllm" }, ""},
		{"none", func(*Config) {}, "no worker discovery"},
		{"etcd and pool", func(c *Config) { c.EtcdEndpoints = []string{"http://e:2379"}; c.PoolName = "vllm" }, "exclusive"},
		{"file and pool", func(c *Config) { c.WorkersFile = "w.yaml"; c.PoolName = "vllm" }, "exclusive"},
		{"etcd and file", func(c *Config) { c.EtcdEndpoints = []string{"http://e:2379"}; c.WorkersFile = "w.yaml" }, "exclusive"},
		{"bad engine events", func(c *Config) { c.PoolName = "vllm"; c.EngineEvents = "kafka" }, "want nats or zmq"},
		{"bad engine load", func(c *Config) { c.PoolName = "vllm"; c.EngineLoad = "push" }, "want nats or scrape"},
		{"bad engine", func(c *Config) { c.PoolName = "vllm"; c.Engine = "tgi" }, "unknown engine"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.set(&c)
			err := c.Validate()
			if tc.err == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err = %v, want one containing %q", err, tc.err)
			}
		})
	}
}

func TestNATSOnlyWhenSomethingUsesIt(t *testing.T) {
	cases := []struct {
		name string
		set  func(*Config)
		want bool
	}{
		{"defaults: events and load over NATS", func(*Config) {}, true},
		{"engines followed directly", func(c *Config) { c.EngineEvents, c.EngineLoad = EngineEventsZMQ, EngineLoadScrape }, false},
		{"events direct, load over NATS", func(c *Config) { c.EngineEvents = EngineEventsZMQ }, true},
		{"replica sync", func(c *Config) {
			c.EngineEvents, c.EngineLoad, c.ReplicaSync = EngineEventsZMQ, EngineLoadScrape, true
		}, true},
		{"no events, load scraped", func(c *Config) { c.KVEvents, c.EngineLoad = false, EngineLoadScrape }, false},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		tc.set(&c)
		if got := c.needsNATS(); got != tc.want {
			t.Errorf("%s: needsNATS = %v, want %v", tc.name, got, tc.want)
		}
	}
}
