package deploy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// checkInferencePoolOverlay checks that the overlay is the Kubernetes-native
// path: kvroute discovers the pool's pods itself, reads their engines'
// events and metrics directly, with read-only namespaced access, and
// nothing else runs beside vLLM.
func checkInferencePoolOverlay(t *testing.T, objs []Object) error {
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
	env := c.Data
	for _, k := range []string{"KVROUTE_NATS_URL", "KVROUTE_ETCD_ENDPOINTS", "KVROUTE_WORKERS_FILE"} {
		if env[k] != "" {
			return fmt.Errorf("%s=%q: the overlay runs without NATS, etcd or a workers file", k, env[k])
		}
	}
	if env["KVROUTE_REPLICA_SYNC"] == "true" {
		return fmt.Errorf("replica sync needs NATS, which the overlay does not run")
	}
	if env["KVROUTE_ENGINE_EVENTS"] != "zmq" || env["KVROUTE_ENGINE_LOAD"] != "scrape" {
		return fmt.Errorf("engine events %q and load %q, want zmq and scrape", env["KVROUTE_ENGINE_EVENTS"], env["KVROUTE_ENGINE_LOAD"])
	}
	pool, ok := find(objs, "InferencePool", env["KVROUTE_POOL_NAME"])
	if !ok {
		return fmt.Errorf("KVROUTE_POOL_NAME=%q names no InferencePool", env["KVROUTE_POOL_NAME"])
	}
	p, err := decodeInferencePool(pool.JSON)
	if err != nil {
		return err
	}
	deps := deployments(t, objs)
	vllm := selected(deps, p.Spec.Selector.MatchLabels)
	if vllm == nil {
		return fmt.Errorf("the pool selects no Deployment's pods")
	}
	var args string
	for _, ctr := range vllm.Spec.Template.Spec.Containers {
		if ctr.Name != "vllm" {
			return fmt.Errorf("container %q beside vLLM: the overlay needs no sidecar", ctr.Name)
		}
		args = strings.Join(append(ctr.Command, ctr.Args...), " ")
	}
	for _, want := range []string{
		`"enable_kv_cache_events":true`, `"publisher":"zmq"`,
		`"endpoint":"tcp://*:` + env["KVROUTE_ENGINE_EVENTS_PORT"] + `"`,
		`"replay_endpoint":"tcp://*:` + env["KVROUTE_ENGINE_REPLAY_PORT"] + `"`,
		`"topic":"` + env["KVROUTE_ENGINE_EVENTS_TOPIC"] + `"`,
	} {
		if !strings.Contains(args, want) {
			return fmt.Errorf("vLLM's --kv-events-config lacks %s (kvroute subscribes there)", want)
		}
	}
	for _, name := range []string{"nats", "etcd"} {
		if _, ok := find(objs, "Deployment", name); ok {
			return fmt.Errorf("a %s Deployment: the overlay runs without it", name)
		}
		if _, ok := find(objs, "StatefulSet", name); ok {
			return fmt.Errorf("a %s StatefulSet: the overlay runs without it", name)
		}
	}
	kv := deps["kvroute"]
	if kv == nil || kv.Spec.Template.Spec.AutomountServiceAccountToken == nil || !*kv.Spec.Template.Spec.AutomountServiceAccountToken {
		return fmt.Errorf("kvroute's pod does not mount its service account token: it cannot reach the API server")
	}
	return checkPoolRBAC(objs, kv.Spec.Template.Spec.ServiceAccountName)
}

// checkPoolRBAC wants a namespaced, read-only Role over pods and
// InferencePools bound to kvroute's service account, and no cluster-wide
// grant.
func checkPoolRBAC(objs []Object, sa string) error {
	for _, o := range objs {
		if strings.HasPrefix(o.Kind, "Cluster") {
			return fmt.Errorf("%s: kvroute needs no cluster-scoped access", o)
		}
	}
	roles := map[string]rbacv1.Role{}
	for _, o := range objs {
		if o.Kind == "Role" {
			var r rbacv1.Role
			if err := json.Unmarshal(o.JSON, &r); err != nil {
				return err
			}
			roles[r.Name] = r
		}
	}
	for _, o := range objs {
		if o.Kind != "RoleBinding" {
			continue
		}
		var b rbacv1.RoleBinding
		if err := json.Unmarshal(o.JSON, &b); err != nil {
			return err
		}
		if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool { return s.Kind == "ServiceAccount" && s.Name == sa }) {
			continue
		}
		r, ok := roles[b.RoleRef.Name]
		if b.RoleRef.Kind != "Role" || !ok {
			return fmt.Errorf("%s binds %s %q, not a Role of this overlay", o, b.RoleRef.Kind, b.RoleRef.Name)
		}
		can := map[string]bool{}
		for _, rule := range r.Rules {
			for _, v := range rule.Verbs {
				if v != "get" && v != "list" && v != "watch" {
					return fmt.Errorf("role %s grants %q: kvroute only reads", r.Name, v)
				}
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					if slices.Contains(rule.Verbs, "list") && slices.Contains(rule.Verbs, "watch") {
						can[g+"/"+res] = true
					}
				}
			}
		}
		if !can["/pods"] || !can["inference.networking.k8s.io/inferencepools"] {
			return fmt.Errorf("role %s cannot list and watch both pods and inferencepools: %v", r.Name, can)
		}
		return nil
	}
	return fmt.Errorf("no RoleBinding for service account %q", sa)
}

func TestInferencePoolOverlay(t *testing.T) {
	objs := render(t, "overlays/inferencepool")
	if err := checkInferencePoolOverlay(t, objs); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string][]Object{
		"events on another port": replaceIn(objs, "ConfigMap", `"KVROUTE_ENGINE_EVENTS_PORT":"5557"`, `"KVROUTE_ENGINE_EVENTS_PORT":"5559"`),
		"events over nats":       replaceIn(objs, "ConfigMap", `"KVROUTE_ENGINE_EVENTS":"zmq"`, `"KVROUTE_ENGINE_EVENTS":"nats"`),
		"other pool":             replaceIn(objs, "ConfigMap", `"KVROUTE_POOL_NAME":"vllm"`, `"KVROUTE_POOL_NAME":"sglang"`),
		"etcd left in":           replaceIn(objs, "ConfigMap", `"KVROUTE_ETCD_ENDPOINTS":""`, `"KVROUTE_ETCD_ENDPOINTS":"http://etcd:2379"`),
		"role writes":            replaceIn(objs, "Role", `"watch"`, `"update"`),
		"role misses pools":      replaceIn(objs, "Role", `"inferencepools"`, `"inferencemodels"`),
		"bound elsewhere":        replaceIn(objs, "RoleBinding", `"name":"kvroute"`, `"name":"default"`),
		"no token":               replaceIn(objs, "Deployment", `"automountServiceAccountToken":true`, `"automountServiceAccountToken":false`),
	} {
		if err := checkInferencePoolOverlay(t, bad); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}

// The existing-fleet overlay runs nothing but kvroute (and the base's
// Envoy) in front of vLLM pods the operator already runs: the patch
// docs/deploy.md gives for their Deployment makes them publish what kvroute
// subscribes to, and the tokenizer comes from a volume, never a download.
func TestExistingFleetOverlay(t *testing.T) {
	objs := render(t, existingFleet)
	kv := deployments(t, objs)["kvroute"]
	if kv == nil {
		t.Fatal("no kvroute Deployment")
	}
	if err := checkOfflineTokenizer(kv); err != nil {
		t.Error(err)
	}
	// The operator's own Deployment: vLLM with no KV events, labelled as
	// the pool selects, with the documented patch applied.
	pool, ok := find(objs, "InferencePool", "vllm")
	if !ok {
		t.Fatal("no InferencePool vllm")
	}
	p, err := decodeInferencePool(pool.JSON)
	if err != nil {
		t.Fatal(err)
	}
	theirs := deployments(t, render(t, "overlays/inferencepool"))["vllm"]
	ctr := &theirs.Spec.Template.Spec.Containers[0]
	ctr.Args = slices.DeleteFunc(ctr.Args, func(a string) bool {
		return strings.HasPrefix(a, "--kv-events-config") || a == "--enable-prefix-caching"
	})
	theirs.Spec.Template.Labels = p.Spec.Selector.MatchLabels
	if err := applyDocumentedPatch(t, ctr); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(theirs)
	if err != nil {
		t.Fatal(err)
	}
	fleet := append(append([]Object(nil), objs...), Object{Kind: "Deployment", Name: "vllm", JSON: js})
	if err := checkInferencePoolOverlay(t, fleet); err != nil {
		t.Error(err)
	}
	if !slices.Contains(ctr.Args, "--enable-prefix-caching") {
		t.Errorf("the documented patch leaves prefix caching off: %v", ctr.Args)
	}
	downloads := replaceIn(objs, "Deployment", `"containers":[`, `"initContainers":[{"name":"fetch-tokenizer","image":"curlimages/curl"}],"containers":[`)
	if err := checkOfflineTokenizer(deployments(t, downloads)["kvroute"]); err == nil {
		t.Error("a tokenizer download at pod start passed")
	}
}

// checkOfflineTokenizer wants kvroute's tokenizer read from a mounted
// volume, with no init container fetching anything.
func checkOfflineTokenizer(d *appsv1.Deployment) error {
	spec := d.Spec.Template.Spec
	if len(spec.InitContainers) > 0 {
		return fmt.Errorf("init container %q: nothing may download at pod start", spec.InitContainers[0].Name)
	}
	var tok string
	for _, e := range spec.Containers[0].Env {
		if e.Name == "KVROUTE_TOKENIZERS" {
			_, tok, _ = strings.Cut(e.Value, "=")
		}
	}
	if tok == "" {
		return fmt.Errorf("KVROUTE_TOKENIZERS names no directory")
	}
	for _, m := range spec.Containers[0].VolumeMounts {
		if m.MountPath != tok {
			continue
		}
		if !m.ReadOnly {
			return fmt.Errorf("the tokenizer volume is mounted writable")
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && (v.PersistentVolumeClaim != nil || v.ConfigMap != nil) {
				return nil
			}
		}
		return fmt.Errorf("volume %q is neither a claim nor a ConfigMap", m.Name)
	}
	return fmt.Errorf("nothing is mounted at %s, where KVROUTE_TOKENIZERS points", tok)
}

// applyDocumentedPatch applies the JSON patch of docs/deploy.md's
// `kubectl patch deployment ... --type=json -p '...'` line to a container:
// only appends to the first container's args, which is all it may do.
func applyDocumentedPatch(t *testing.T, ctr *corev1.Container) error {
	doc := readRepoFile(t, "docs/deploy.md")
	_, rest, ok := strings.Cut(doc, "--type=json -p '")
	if !ok {
		return fmt.Errorf("docs/deploy.md has no kubectl patch --type=json -p '...' line")
	}
	body, _, _ := strings.Cut(rest, "'")
	var ops []struct{ Op, Path, Value string }
	if err := json.Unmarshal([]byte(body), &ops); err != nil {
		return fmt.Errorf("docs/deploy.md's patch: %w", err)
	}
	for _, op := range ops {
		if op.Op != "add" || op.Path != "/spec/template/spec/containers/0/args/-" {
			return fmt.Errorf("docs/deploy.md's patch does %s %s: only appending to the args is expected", op.Op, op.Path)
		}
		ctr.Args = append(ctr.Args, op.Value)
	}
	return nil
}
