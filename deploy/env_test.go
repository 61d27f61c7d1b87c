package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// checkEnvNames makes sure every KVROUTE_* variable the manifests set is a
// flag of the binary that reads it: kvroute through the kvroute-config
// ConfigMap and its own env, kvbridge and kvsim through their containers' env.
func checkEnvNames(t *testing.T, objs []Object) error {
	known := map[string]map[string]bool{}
	for bin, args := range helpArgs {
		known[bin] = flagEnvNames(t, bin, args...)
	}
	for _, d := range deployments(t, objs) {
		for _, c := range d.Spec.Template.Spec.Containers {
			bin := containerBinary(c)
			if bin == "" {
				continue
			}
			names := map[string]bool{}
			for _, e := range c.Env {
				names[e.Name] = true
			}
			for _, ef := range c.EnvFrom {
				if ef.ConfigMapRef == nil {
					continue
				}
				o, ok := find(objs, "ConfigMap", ef.ConfigMapRef.Name)
				if !ok {
					return fmt.Errorf("%s/%s: missing ConfigMap %s", d.Name, c.Name, ef.ConfigMapRef.Name)
				}
				var cm corev1.ConfigMap
				if err := decodeStrict(o.JSON, &cm); err != nil {
					return err
				}
				for k := range cm.Data {
					names[k] = true
				}
			}
			for n := range names {
				if strings.HasPrefix(n, "KVROUTE_") && !known[bin][n] {
					return fmt.Errorf("%s/%s sets %s, which is not a %s flag", d.Name, c.Name, n, bin)
				}
			}
		}
	}
	return nil
}

// kvrouteImage is the image the manifests run, as the README builds it
// (docker build -t kvroute:dev .); an overlay's images entry renames it.
const kvrouteImage = "kvroute:dev"

// containerBinary names the kvroute-image binary a container runs.
func containerBinary(c corev1.Container) string {
	if c.Image != kvrouteImage {
		return ""
	}
	if len(c.Command) == 0 {
		return "kvroute"
	}
	return filepath.Base(c.Command[0])
}

func TestManifestEnvNamesAreRealFlags(t *testing.T) {
	for _, dir := range overlays {
		if err := checkEnvNames(t, render(t, dir)); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
	}
	vllm := render(t, "overlays/vllm")
	for name, bad := range map[string][]Object{
		"kvroute config":  replaceIn(vllm, "ConfigMap", `"KVROUTE_REPLICA_SYNC"`, `"KVROUTE_REPLICA_SYNCH"`),
		"kvbridge env":    replaceIn(vllm, "Deployment", `"KVROUTE_EVENTS_ENDPOINT"`, `"KVROUTE_EVENT_ENDPOINT"`),
		"kvroute own env": replaceIn(vllm, "Deployment", `"KVROUTE_ROUTER_ID"`, `"KVROUTE_REPLICA_ID"`),
	} {
		if err := checkEnvNames(t, bad); err == nil {
			t.Errorf("%s: misspelled variable passed", name)
		}
	}
	if err := checkEnvNames(t, replaceIn(render(t, "overlays/dev"), "Deployment", `"KVROUTE_SPEEDUP"`, `"KVROUTE_SPEED"`)); err == nil {
		t.Error("kvsim env: misspelled variable passed")
	}
}

// checkVLLMWorker checks the worker pod: vLLM with prefix caching and ZMQ KV
// events, and a kvbridge beside it that listens where vLLM publishes, knows
// its pod, and is probed on its health port.
func checkVLLMWorker(d *appsv1.Deployment) error {
	var vllm, bridge *corev1.Container
	for i, c := range d.Spec.Template.Spec.Containers {
		switch c.Name {
		case "vllm":
			vllm = &d.Spec.Template.Spec.Containers[i]
		case "kvbridge":
			bridge = &d.Spec.Template.Spec.Containers[i]
		}
	}
	if vllm == nil || bridge == nil {
		return fmt.Errorf("worker pod needs vllm and kvbridge containers")
	}
	args := strings.Join(vllm.Args, " ")
	if !strings.Contains(args, "--enable-prefix-caching") {
		return fmt.Errorf("vllm runs without --enable-prefix-caching")
	}
	m := regexp.MustCompile(`--kv-events-config=(\{.*?\})( |$)`).FindStringSubmatch(args)
	if m == nil {
		return fmt.Errorf("vllm runs without --kv-events-config")
	}
	var cfg struct {
		Enable   bool   `json:"enable_kv_cache_events"`
		Pub      string `json:"publisher"`
		Endpoint string `json:"endpoint"`
		Replay   string `json:"replay_endpoint"`
		Topic    string `json:"topic"`
	}
	if err := decodeStrict([]byte(m[1]), &cfg); err != nil {
		return fmt.Errorf("--kv-events-config: %w", err)
	}
	if !cfg.Enable || cfg.Pub != "zmq" {
		return fmt.Errorf("vllm does not publish KV events over ZMQ: %s", m[1])
	}
	if _, ok := vllm.Resources.Limits["nvidia.com/gpu"]; !ok {
		return fmt.Errorf("vllm asks for no GPU")
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range bridge.Env {
		env[e.Name] = e
	}
	port := func(ep string) string { return ep[strings.LastIndexByte(ep, ':')+1:] }
	if port(env["KVROUTE_EVENTS_ENDPOINT"].Value) != port(cfg.Endpoint) || port(env["KVROUTE_REPLAY_ENDPOINT"].Value) != port(cfg.Replay) {
		return fmt.Errorf("kvbridge reads events from %s/%s, vLLM publishes on %s/%s",
			env["KVROUTE_EVENTS_ENDPOINT"].Value, env["KVROUTE_REPLAY_ENDPOINT"].Value, cfg.Endpoint, cfg.Replay)
	}
	for name, path := range map[string]string{"POD_NAME": "metadata.name", "POD_IP": "status.podIP"} {
		e := env[name]
		if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path {
			return fmt.Errorf("kvbridge needs %s from %s", name, path)
		}
	}
	for _, k := range []string{"KVROUTE_NATS_URL", "KVROUTE_ETCD_ENDPOINTS"} {
		if _, ok := env[k]; !ok {
			return fmt.Errorf("kvbridge lacks %s", k)
		}
	}
	for _, p := range []*corev1.Probe{bridge.ReadinessProbe, bridge.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.StrVal != "bridge" {
			return fmt.Errorf("kvbridge probes must be HTTP on its port 9091")
		}
	}
	if bridge.ReadinessProbe.HTTPGet.Path != "/readyz" || bridge.LivenessProbe.HTTPGet.Path != "/healthz" {
		return fmt.Errorf("kvbridge probes: readiness /readyz and liveness /healthz")
	}
	for _, cp := range bridge.Ports {
		if cp.Name == "bridge" && cp.ContainerPort != 9091 {
			return fmt.Errorf("kvbridge port is %d, kvbridge serves on 9091", cp.ContainerPort)
		}
	}
	return nil
}

func TestVLLMWorkerPod(t *testing.T) {
	objs := render(t, "overlays/vllm")
	d := deployments(t, objs)["vllm"]
	if err := checkVLLMWorker(d); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string][]Object{
		"no prefix caching":      replaceIn(objs, "Deployment", `"--enable-prefix-caching",`, ``),
		"events not zmq":         replaceIn(objs, "Deployment", `\"publisher\":\"zmq\"`, `\"publisher\":\"null\"`),
		"bridge on another port": replaceIn(objs, "Deployment", `"tcp://127.0.0.1:5557"`, `"tcp://127.0.0.1:5556"`),
		"no pod ip":              replaceIn(objs, "Deployment", `"status.podIP"`, `"status.hostIP"`),
		"probe path":             replaceIn(objs, "Deployment", `"/readyz"`, `"/ready"`),
	} {
		if err := checkVLLMWorker(deployments(t, bad)["vllm"]); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}

// kvrouteMetrics reads the metric names kvroute registers from its source.
func kvrouteMetrics(t *testing.T) map[string]bool {
	t.Helper()
	src, err := os.ReadFile("../server/metrics.go")
	if err != nil {
		t.Fatalf("kvroute's metrics: %v", err)
	}
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`Name: "(kvroute_[a-z0-9_]+)"`).FindAllStringSubmatch(string(src), -1) {
		names[m[1]] = true
		// Histograms expose these series.
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			names[m[1]+s] = true
		}
	}
	for _, m := range regexp.MustCompile(`NewDesc\("(kvroute_[a-z0-9_]+)"`).FindAllStringSubmatch(string(src), -1) {
		names[m[1]] = true
	}
	if len(names) < 20 {
		t.Fatalf("found only %d kvroute metrics in server/metrics.go", len(names))
	}
	return names
}

func checkDashboard(data []byte, known map[string]bool) error {
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	// Grafana's schema is large: read only the fields checked here.
	if err := json.Unmarshal(data, &d); err != nil {
		return err
	}
	if d.UID == "" || len(d.Panels) < 10 {
		return fmt.Errorf("dashboard needs a uid and its panels (has %d)", len(d.Panels))
	}
	used := map[string]bool{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			return fmt.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			ms := regexp.MustCompile(`kvroute_[a-z0-9_]+`).FindAllString(tg.Expr, -1)
			if len(ms) == 0 {
				return fmt.Errorf("panel %q: %q uses no kvroute metric", p.Title, tg.Expr)
			}
			for _, m := range ms {
				if !known[m] {
					return fmt.Errorf("panel %q uses %s, which kvroute does not export", p.Title, m)
				}
				used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")] = true
			}
		}
	}
	for _, core := range []string{"kvroute_requests_total", "kvroute_decision_duration_seconds", "kvroute_overlap_ratio", "kvroute_worker_active_requests", "kvroute_queue_depth"} {
		if !used[core] {
			return fmt.Errorf("dashboard does not show %s", core)
		}
	}
	return nil
}

func TestGrafanaDashboardUsesRealMetrics(t *testing.T) {
	known := kvrouteMetrics(t)
	data, err := os.ReadFile("k8s/components/monitoring/kvroute-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := checkDashboard(data, known); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]string{
		"renamed metric": strings.Replace(string(data), "kvroute_requests_total", "kvroute_request_total", 1),
		"truncated file": string(data[:len(data)/2]),
		"no overlap":     strings.ReplaceAll(string(data), "kvroute_overlap_ratio", "kvroute_cached_tokens"),
	} {
		if err := checkDashboard([]byte(bad), known); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}
