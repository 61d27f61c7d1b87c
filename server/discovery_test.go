package server

import (
	"strings"
	"testing"
)

// Each configuration chooses its row of the source table, which names its
// metric label and the dependency Degraded reports; two sources are an
// error naming both.
func TestConfigChoosesOneWorkerSource(t *testing.T) {
	cases := []struct {
		name       string
		set        func(*Config)
		label, dep string
		err        []string
	}{
		{"etcd", func(c *Config) { c.EtcdEndpoints = []string{"http://e:2379"} }, "etcd", depEtcd, nil},
		{"file", func(c *Config) { c.WorkersFile = "w.yaml" }, "file", "", nil},
		{"pool", func(c *Config) { c.PoolName = "vllm" }, "inferencepool", depKube, nil},
		{"none", func(*Config) {}, "", "", []string{"no worker discovery: give etcd endpoints, a workers file or an InferencePool name"}},
		{"file and pool", func(c *Config) { c.WorkersFile, c.PoolName = "w.yaml", "vllm" }, "", "",
			[]string{"worker discovery sources are exclusive", "[a workers file an InferencePool name]"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.set(&c)
			ws, err := c.workerSource()
			if tc.err != nil {
				for _, want := range tc.err {
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Errorf("err = %v, want one containing %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ws.label != tc.label || ws.dep != tc.dep {
				t.Errorf("chose label %q dep %q, want %q %q", ws.label, ws.dep, tc.label, tc.dep)
			}
			r := &Server{cfg: c}
			deps := r.dependenciesInUse()
			if got := strings.Join(deps, ","); tc.dep != "" && got != depNATS+","+tc.dep || tc.dep == "" && got != depNATS {
				t.Errorf("dependencies in use %v, want nats and %q", deps, tc.dep)
			}
		})
	}
}
