package deploy

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
)

// checkFallbacks enforces what each data plane can parse in
// x-gateway-destination-endpoint: Envoy's ORIGINAL_DST cluster (our Envoy in
// the base, Istio's gateway) reads one ip:port and answers a list with 503,
// while Gateway API data planes walk the list, so they get fallbacks.
func checkFallbacks(objs []Object) error {
	cm, ok := findPrefix(objs, "ConfigMap", "kvroute-config")
	if !ok {
		return fmt.Errorf("no kvroute-config ConfigMap")
	}
	var c struct {
		Data map[string]string `json:"data"`
	}
	if err := json.Unmarshal(cm.JSON, &c); err != nil {
		return err
	}
	v, set := c.Data["KVROUTE_FALLBACKS"]
	n := 2 // kvroute's default
	if set {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 {
			return fmt.Errorf("KVROUTE_FALLBACKS=%q is not a count", v)
		}
	}
	_, ownEnvoy := find(objs, "Deployment", "envoy")
	_, istio := find(objs, "EnvoyFilter", "kvroute-ext-proc")
	_, pool := find(objs, "InferencePool", "vllm")
	switch {
	case (ownEnvoy || istio) && n != 0:
		return fmt.Errorf("an ORIGINAL_DST data plane with KVROUTE_FALLBACKS=%d: every request would get 503", n)
	case pool && n == 0:
		return fmt.Errorf("an InferencePool data plane without fallbacks: set KVROUTE_FALLBACKS > 0")
	}
	return nil
}

func TestFallbacksMatchTheDataPlane(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			if err := checkFallbacks(objs); err != nil {
				t.Fatal(err)
			}
		})
	}
	broken := map[string][]Object{
		"base with a list":         replaceIn(render(t, "base"), "ConfigMap", `"KVROUTE_FALLBACKS":"0"`, `"KVROUTE_FALLBACKS":"2"`),
		"istio with a list":        replaceIn(render(t, "overlays/istio"), "ConfigMap", `"KVROUTE_FALLBACKS":"0"`, `"KVROUTE_FALLBACKS":"1"`),
		"gateway-api without list": replaceIn(render(t, "overlays/gateway-api"), "ConfigMap", `"KVROUTE_FALLBACKS":"2"`, `"KVROUTE_FALLBACKS":"0"`),
	}
	for name, bad := range broken {
		if err := checkFallbacks(bad); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}
