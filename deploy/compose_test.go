package deploy

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/kvroute/kvroute/envoy"
	"sigs.k8s.io/yaml"
)

// compose is the part of the Compose specification docker-compose.yaml
// uses, one form per field (lists for command, entrypoint and ports, maps for
// environment and depends_on). Decoding is strict, so a misspelled key or a
// second form is an error rather than something Compose would silently
// read differently.
type compose struct {
	Name     string              `json:"name"`
	Services map[string]*service `json:"services"`
	Volumes  map[string]struct{} `json:"volumes"`
}

type service struct {
	Image       string                    `json:"image"`
	Build       *struct{ Context string } `json:"build"`
	Entrypoint  []string                  `json:"entrypoint"`
	Command     []string                  `json:"command"`
	Environment map[string]string         `json:"environment"`
	Ports       []string                  `json:"ports"`
	Volumes     []string                  `json:"volumes"`
	DependsOn   map[string]struct {
		Condition string `json:"condition"`
	} `json:"depends_on"`
	Healthcheck *struct {
		Test        []string `json:"test"`
		Interval    string   `json:"interval"`
		Retries     int      `json:"retries"`
		StartPeriod string   `json:"start_period"`
	} `json:"healthcheck"`
	Deploy *struct {
		Resources struct {
			Reservations struct {
				Devices []struct {
					Driver       string   `json:"driver"`
					Count        int      `json:"count"`
					Capabilities []string `json:"capabilities"`
				} `json:"devices"`
			} `json:"reservations"`
		} `json:"resources"`
	} `json:"deploy"`
	NetworkMode string `json:"network_mode"`
	IPC         string `json:"ipc"`
	ReadOnly    bool   `json:"read_only"`
	User        string `json:"user"`
	Restart     string `json:"restart"`
}

func parseCompose(data []byte) (*compose, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	var c compose
	if err := decodeStrict(js, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

var pinnedImage = regexp.MustCompile(`^[a-z0-9./_-]+:[A-Za-z0-9._-]+$`)

// checkCompose checks docker-compose.yaml as Compose and the programs in it
// would: references between services, images, ports, environment variables
// named after real flags, and the Envoy bootstrap it mounts.
func checkCompose(t *testing.T, c *compose, dir string) error {
	for _, s := range []string{"envoy", "nats", "etcd", "kvroute", "vllm", "kvbridge"} {
		if c.Services[s] == nil {
			return fmt.Errorf("no %s service", s)
		}
	}
	hostPorts := map[string]string{}
	for name, s := range c.Services {
		if s.Image == "" && s.Build == nil {
			return fmt.Errorf("%s: neither image nor build", name)
		}
		if s.Build == nil && (!pinnedImage.MatchString(s.Image) || strings.HasSuffix(s.Image, ":latest")) {
			return fmt.Errorf("%s: image %q is not pinned to a tag", name, s.Image)
		}
		for dep, d := range s.DependsOn {
			target := c.Services[dep]
			if target == nil {
				return fmt.Errorf("%s depends on missing service %s", name, dep)
			}
			switch d.Condition {
			case "service_started", "service_completed_successfully":
			case "service_healthy":
				if target.Healthcheck == nil {
					return fmt.Errorf("%s waits for %s to be healthy, which has no healthcheck", name, dep)
				}
			default:
				return fmt.Errorf("%s depends on %s with condition %q", name, dep, d.Condition)
			}
		}
		for _, p := range s.Ports {
			h, ctr, ok := strings.Cut(p, ":")
			hp, err1 := strconv.Atoi(h)
			cp, err2 := strconv.Atoi(ctr)
			if !ok || err1 != nil || err2 != nil || hp < 1 || hp > 65535 || cp < 1 || cp > 65535 {
				return fmt.Errorf("%s: port %q is not host:container", name, p)
			}
			if other, dup := hostPorts[h]; dup {
				return fmt.Errorf("host port %s published by %s and %s", h, other, name)
			}
			hostPorts[h] = name
		}
		for _, v := range s.Volumes {
			src, _, ok := strings.Cut(v, ":")
			if !ok {
				return fmt.Errorf("%s: volume %q has no target", name, v)
			}
			if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
				if _, err := os.Stat(filepath.Join(dir, src)); err != nil {
					return fmt.Errorf("%s: bind mount %s: %w", name, src, err)
				}
			} else if _, ok := c.Volumes[src]; !ok {
				return fmt.Errorf("%s: named volume %s is not declared", name, src)
			}
		}
		if m, ok := strings.CutPrefix(s.NetworkMode, "service:"); ok && c.Services[m] == nil {
			return fmt.Errorf("%s shares the network of missing service %s", name, m)
		}
		if bin := binaryOf(s); bin != "" {
			known := flagEnvNames(t, bin, helpArgs[bin]...)
			for k, v := range s.Environment {
				if strings.HasPrefix(k, "KVROUTE_") && !known[k] {
					return fmt.Errorf("%s: %s is not a %s flag", name, k, bin)
				}
				if err := checkServiceURL(c, k, v); err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
			}
		}
	}
	if err := checkComposeGPU(c); err != nil {
		return err
	}
	if err := checkComposeAdmin(c.Services["kvroute"]); err != nil {
		return err
	}
	return checkComposeEnvoy(c, dir)
}

// checkComposeAdmin keeps kvroute's admin listener (/debug/*, /admin/*) off
// the network: on the container's loopback (the default when unset) and
// not published.
func checkComposeAdmin(s *service) error {
	addr, set := s.Environment["KVROUTE_ADMIN_LISTEN"]
	if !set {
		addr = "127.0.0.1:9091"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("kvroute: KVROUTE_ADMIN_LISTEN %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("kvroute: the admin listener %q is not on loopback", addr)
	}
	for _, p := range s.Ports {
		if _, ctr, _ := strings.Cut(p, ":"); ctr == port {
			return fmt.Errorf("kvroute: the admin port %s is published (%q)", port, p)
		}
	}
	return nil
}

// binaryOf names the kvroute-image binary a service runs ("" for other images).
func binaryOf(s *service) string {
	if s.Build == nil {
		return ""
	}
	if len(s.Entrypoint) == 0 {
		return "kvroute"
	}
	return filepath.Base(s.Entrypoint[0])
}

// checkServiceURL makes sure NATS and etcd addresses name a service of this
// file on the port it listens on.
func checkServiceURL(c *compose, key, value string) error {
	want := map[string]struct{ svc, port string }{
		"KVROUTE_NATS_URL":       {"nats", "4222"},
		"KVROUTE_ETCD_ENDPOINTS": {"etcd", "2379"},
	}[key]
	if want.svc == "" {
		return nil
	}
	u, err := url.Parse(value)
	if err != nil || u.Hostname() != want.svc || u.Port() != want.port {
		return fmt.Errorf("%s=%s, want the %s service on port %s", key, value, want.svc, want.port)
	}
	return nil
}

func checkComposeGPU(c *compose) error {
	v := c.Services["vllm"]
	gpu := false
	if v.Deploy != nil {
		for _, d := range v.Deploy.Resources.Reservations.Devices {
			gpu = gpu || d.Driver == "nvidia" && slices.Contains(d.Capabilities, "gpu") && d.Count >= 1
		}
	}
	if !gpu {
		return fmt.Errorf("vllm reserves no NVIDIA GPU")
	}
	args := strings.Join(v.Command, " ")
	if !strings.Contains(args, "--enable-prefix-caching") {
		return fmt.Errorf("vllm runs without --enable-prefix-caching")
	}
	var cfg struct {
		Enable   bool   `json:"enable_kv_cache_events"`
		Pub      string `json:"publisher"`
		Endpoint string `json:"endpoint"`
		Replay   string `json:"replay_endpoint"`
		Topic    string `json:"topic"`
	}
	found := false
	for _, a := range v.Command {
		if js, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
			if err := decodeStrict([]byte(js), &cfg); err != nil {
				return fmt.Errorf("vllm --kv-events-config: %w", err)
			}
			found = true
		}
	}
	if !found || !cfg.Enable || cfg.Pub != "zmq" {
		return fmt.Errorf("vllm does not publish KV events over ZMQ")
	}
	b := c.Services["kvbridge"]
	if b.NetworkMode != "service:vllm" {
		return fmt.Errorf("kvbridge must share vllm's network (network_mode service:vllm) to reach its ZMQ sockets on 127.0.0.1")
	}
	port := func(ep string) string { return ep[strings.LastIndexByte(ep, ':')+1:] }
	if port(b.Environment["KVROUTE_EVENTS_ENDPOINT"]) != port(cfg.Endpoint) || port(b.Environment["KVROUTE_REPLAY_ENDPOINT"]) != port(cfg.Replay) {
		return fmt.Errorf("kvbridge listens for events on %s/%s, vLLM publishes on %s/%s",
			b.Environment["KVROUTE_EVENTS_ENDPOINT"], b.Environment["KVROUTE_REPLAY_ENDPOINT"], cfg.Endpoint, cfg.Replay)
	}
	if t := b.Environment["KVROUTE_TOPIC"]; t != "" && t != cfg.Topic {
		return fmt.Errorf("kvbridge topic %q, vLLM topic %q", t, cfg.Topic)
	}
	return nil
}

// checkComposeEnvoy validates the bootstrap Envoy mounts and checks it
// reaches kvroute and the worker kvbridge registers.
func checkComposeEnvoy(c *compose, dir string) error {
	e := c.Services["envoy"]
	ci := slices.Index(e.Command, "-c")
	if ci < 0 || ci+1 >= len(e.Command) {
		return fmt.Errorf("envoy runs without -c <bootstrap>")
	}
	path := ""
	for _, v := range e.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == e.Command[ci+1] {
			path = filepath.Join(dir, parts[0])
		}
	}
	if path == "" {
		return fmt.Errorf("envoy's bootstrap %s is not mounted", e.Command[ci+1])
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	b, err := envoy.Validate(data)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, cl := range b.GetStaticResources().GetClusters() {
		clusters[cl.GetName()] = cl
	}
	addr := func(name string) string {
		sa := clusters[name].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		return net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	}
	if clusters[envoy.ExtProcClusterName] == nil {
		return fmt.Errorf("bootstrap has no %s cluster", envoy.ExtProcClusterName)
	}
	grpcPort := strings.TrimPrefix(c.Services["kvroute"].Environment["KVROUTE_GRPC_ADDR"], ":")
	if grpcPort == "" {
		grpcPort = "9002"
	}
	if got := addr(envoy.ExtProcClusterName); got != "kvroute:"+grpcPort {
		return fmt.Errorf("envoy dials kvroute at %s, kvroute listens at kvroute:%s", got, grpcPort)
	}
	br := c.Services["kvbridge"].Environment
	worker := br["KVROUTE_CLUSTER"]
	if worker == "" {
		worker = br["KVROUTE_WORKER_ID"]
	}
	if clusters[worker] == nil {
		return fmt.Errorf("kvbridge registers cluster %q, which the bootstrap lacks", worker)
	}
	if got := addr(worker); got != br["KVROUTE_ADVERTISE_ADDRESS"] {
		return fmt.Errorf("bootstrap sends %s to %s, kvbridge advertises %s", worker, got, br["KVROUTE_ADVERTISE_ADDRESS"])
	}
	return nil
}

func TestDockerCompose(t *testing.T) {
	data, err := os.ReadFile("../docker-compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseCompose(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkCompose(t, c, ".."); err != nil {
		t.Fatal(err)
	}
	broken := map[string][2]string{
		"misspelled key":           {"depends_on:\n      nats:", "depend_on:\n      nats:"},
		"unknown dependency":       {"kvroute: {condition: service_started}", "router: {condition: service_started}"},
		"healthy without check":    {"kvroute: {condition: service_started}", "kvroute: {condition: service_healthy}"},
		"bad condition":            {"vllm: {condition: service_started}", "vllm: {condition: started}"},
		"unpinned image":           {"image: nats:2.12.1-alpine", "image: nats"},
		"duplicate host port":      {`"9090:9090"`, `"8080:9090"`},
		"bad port":                 {`"8080:8080"`, `"8080"`},
		"not a kvroute flag":       {"KVROUTE_ROUTER_MODE: kv", "KVROUTE_MODE: kv"},
		"tokenize's variable":      {"KVROUTE_TOKENIZERS: Qwen", "KVROUTE_TOKENIZER: Qwen"},
		"not a kvbridge flag":      {"KVROUTE_WORKER_ID: vllm-0", "KVROUTE_WORKER: vllm-0"},
		"nats on the wrong port":   {"KVROUTE_NATS_URL: nats://nats:4222\n      KVROUTE_ETCD_ENDPOINTS: http://etcd:2379\n      KVROUTE_NAMESPACE: default\n      KVROUTE_WORKER_ID", "KVROUTE_NATS_URL: nats://nats:4223\n      KVROUTE_ETCD_ENDPOINTS: http://etcd:2379\n      KVROUTE_NAMESPACE: default\n      KVROUTE_WORKER_ID"},
		"etcd not a service":       {"KVROUTE_ETCD_ENDPOINTS: http://etcd:2379\n      KVROUTE_NAMESPACE: default\n      KVROUTE_ROUTER_MODE", "KVROUTE_ETCD_ENDPOINTS: http://127.0.0.1:2379\n      KVROUTE_NAMESPACE: default\n      KVROUTE_ROUTER_MODE"},
		"no GPU":                   {"capabilities: [gpu]", "capabilities: [compute]"},
		"no prefix caching":        {"- --enable-prefix-caching\n", ""},
		"events on another port":   {"KVROUTE_EVENTS_ENDPOINT: tcp://127.0.0.1:5557", "KVROUTE_EVENTS_ENDPOINT: tcp://127.0.0.1:5559"},
		"bridge off vllm's net":    {`network_mode: "service:vllm"`, `network_mode: "bridge"`},
		"worker not in bootstrap":  {"KVROUTE_WORKER_ID: vllm-0", "KVROUTE_WORKER_ID: vllm-1"},
		"worker address differs":   {"KVROUTE_ADVERTISE_ADDRESS: vllm:8000", "KVROUTE_ADVERTISE_ADDRESS: vllm:8001"},
		"kvroute on another port":  {`KVROUTE_GRPC_ADDR: ":9002"`, `KVROUTE_GRPC_ADDR: ":9003"`},
		"bootstrap not mounted":    {"./deploy/compose/envoy.yaml:/etc/envoy/envoy.yaml:ro", "./deploy/compose/envoy.yaml:/etc/envoy.yaml:ro"},
		"bootstrap missing":        {"./deploy/compose/envoy.yaml:", "./deploy/compose/envoi.yaml:"},
		"undeclared volume":        {"- hf-cache:/root", "- hf:/root"},
		"admin on every interface": {`KVROUTE_ADMIN_LISTEN: "127.0.0.1:9091"`, `KVROUTE_ADMIN_LISTEN: ":9091"`},
		"admin port published":     {`"9090:9090"`, `"9090:9090"` + "\n      - \"9091:9091\""},
	}
	for name, r := range broken {
		if !strings.Contains(string(data), r[0]) {
			t.Errorf("%s: docker-compose.yaml no longer contains %q", name, r[0])
			continue
		}
		c, err := parseCompose([]byte(strings.Replace(string(data), r[0], r[1], 1)))
		if err == nil {
			err = checkCompose(t, c, "..")
		}
		if err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}

// The bootstrap check must also catch a bootstrap Envoy would refuse.
func TestComposeBootstrapCheckCatchesInvalidBootstrap(t *testing.T) {
	data, err := os.ReadFile("compose/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "deploy/compose"), 0o755)
	bad := strings.Replace(string(data), "request_body_mode: BUFFERED", "request_body_mode: BUFFERD", 1)
	if bad == string(data) {
		t.Fatal("bootstrap has no BUFFERED body mode to break")
	}
	if err := os.WriteFile(filepath.Join(dir, "deploy/compose/envoy.yaml"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../docker-compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseCompose(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkComposeEnvoy(c, dir); err == nil {
		t.Error("an invalid bootstrap passed")
	}
}
