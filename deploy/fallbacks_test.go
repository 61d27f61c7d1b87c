package deploy

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// checkFallbacks enforces what each data plane can parse in
// x-gateway-destination-endpoint: Envoy's ORIGINAL_DST cluster (Istio's
// gateway, or an Envoy given envoy/original-dst.yaml) reads one ip:port and
// answers a list with 503, while Gateway API data planes and our Envoy's
// override_host cluster (the base's xds bootstrap) walk the list, so they get
// fallbacks. An Envoy that takes its clusters over ADS needs kvroute's xDS
// server on.
func checkFallbacks(objs []Object) error {
	data, err := kvrouteConfig(objs)
	if err != nil {
		return err
	}
	v, set := data["KVROUTE_FALLBACKS"]
	n := 2 // kvroute's default
	if set {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 {
			return fmt.Errorf("KVROUTE_FALLBACKS=%q is not a count", v)
		}
	}
	originalDst, ads := false, false
	if _, ownEnvoy := find(objs, "Deployment", "envoy"); ownEnvoy {
		boot, ok := findPrefix(objs, "ConfigMap", "envoy-bootstrap")
		if !ok {
			return fmt.Errorf("an Envoy Deployment without its envoy-bootstrap ConfigMap")
		}
		originalDst = strings.Contains(string(boot.JSON), "ORIGINAL_DST")
		ads = strings.Contains(string(boot.JSON), "ads_config")
	}
	_, istio := find(objs, "EnvoyFilter", "kvroute-ext-proc")
	_, pool := find(objs, "InferencePool", "vllm")
	switch {
	case (originalDst || istio) && n != 0:
		return fmt.Errorf("an ORIGINAL_DST data plane with KVROUTE_FALLBACKS=%d: every request would get 503", n)
	case (pool || ads) && n == 0:
		return fmt.Errorf("a data plane that retries on the next endpoint without fallbacks: set KVROUTE_FALLBACKS > 0")
	case ads && data["KVROUTE_XDS_ADDR"] == "":
		return fmt.Errorf("an Envoy that takes its clusters over ADS, but KVROUTE_XDS_ADDR is not set")
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
		"base without a list":      replaceIn(render(t, "base"), "ConfigMap", `"KVROUTE_XDS_ADDR":":18000"`, `"KVROUTE_XDS_ADDR":":18000","KVROUTE_FALLBACKS":"0"`),
		"base without xds":         replaceIn(render(t, "base"), "ConfigMap", `"KVROUTE_XDS_ADDR":":18000"`, `"KVROUTE_XDS_ADDR":""`),
		"istio with a list":        replaceIn(render(t, "overlays/istio"), "ConfigMap", `"KVROUTE_FALLBACKS":"0"`, `"KVROUTE_FALLBACKS":"1"`),
		"gateway-api without list": replaceIn(render(t, "overlays/gateway-api"), "ConfigMap", `"KVROUTE_FALLBACKS":"2"`, `"KVROUTE_FALLBACKS":"0"`),
	}
	for name, bad := range broken {
		if err := checkFallbacks(bad); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}
