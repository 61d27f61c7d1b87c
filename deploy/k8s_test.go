package deploy

import (
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// builtin maps apiVersion/kind of the built-in objects we ship to their Go type.
var builtin = map[string]func() any{
	"v1/ConfigMap":                             func() any { return new(corev1.ConfigMap) },
	"v1/Namespace":                             func() any { return new(corev1.Namespace) },
	"v1/Service":                               func() any { return new(corev1.Service) },
	"v1/ServiceAccount":                        func() any { return new(corev1.ServiceAccount) },
	"apps/v1/Deployment":                       func() any { return new(appsv1.Deployment) },
	"apps/v1/StatefulSet":                      func() any { return new(appsv1.StatefulSet) },
	"v1/Secret":                                func() any { return new(corev1.Secret) },
	"v1/PersistentVolumeClaim":                 func() any { return new(corev1.PersistentVolumeClaim) },
	"rbac.authorization.k8s.io/v1/Role":        func() any { return new(rbacv1.Role) },
	"rbac.authorization.k8s.io/v1/RoleBinding": func() any { return new(rbacv1.RoleBinding) },
}

// checkObject strictly decodes a built-in object into its k8s.io/api type, or
// a custom resource against its published type or schema (crd_test.go).
// Any other kind is an error, so nothing ships unchecked.
func checkObject(o Object) error {
	key := o.APIVersion + "/" + o.Kind
	if mk, ok := builtin[key]; ok {
		if err := decodeStrict(o.JSON, mk()); err != nil {
			return fmt.Errorf("%s (%s): %w", o, key, err)
		}
		return nil
	}
	if chk, ok := customChecks[key]; ok {
		if err := chk(o.JSON); err != nil {
			return fmt.Errorf("%s (%s): %w", o, key, err)
		}
		return nil
	}
	return fmt.Errorf("%s: no check for %s", o, key)
}

func TestEveryObjectDecodesStrictly(t *testing.T) {
	for _, dir := range overlays {
		for _, o := range render(t, dir) {
			if err := checkObject(o); err != nil {
				t.Errorf("%s: %v", dir, err)
			}
		}
	}
}

func TestStrictDecodingCatchesMistakes(t *testing.T) {
	bad := []struct{ name, json string }{
		{"misspelled field", `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"},"spec":{"replica":2}}`},
		{"probe field at the wrong level", `{"apiVersion":"v1","kind":"Service","metadata":{"name":"x"},"spec":{"ports":[{"port":1,"grpc":{}}]}}`},
		{"wrong type", `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"},"spec":{"replicas":"two"}}`},
		{"unknown kind", `{"apiVersion":"v1","kind":"Pod2","metadata":{"name":"x"}}`},
	}
	for _, b := range bad {
		o := Object{APIVersion: field(b.json, "apiVersion"), Kind: field(b.json, "kind"), Name: "x", JSON: []byte(b.json)}
		if err := checkObject(o); err == nil {
			t.Errorf("%s: accepted %s", b.name, b.json)
		}
	}
}

// field pulls a top-level string out of small test JSON.
func field(js, name string) string {
	i := strings.Index(js, `"`+name+`":"`)
	if i < 0 {
		return ""
	}
	rest := js[i+len(name)+4:]
	return rest[:strings.IndexByte(rest, '"')]
}

func deployments(t *testing.T, objs []Object) map[string]*appsv1.Deployment {
	t.Helper()
	out := map[string]*appsv1.Deployment{}
	for _, o := range objs {
		if o.Kind != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		if err := decodeStrict(o.JSON, &d); err != nil {
			t.Fatal(err)
		}
		out[d.Name] = &d
	}
	return out
}

func TestKvrouteDeploymentIsHardened(t *testing.T) {
	for _, dir := range overlays {
		d := deployments(t, render(t, dir))["kvroute"]
		if d == nil {
			t.Fatalf("%s: no kvroute Deployment", dir)
		}
		if err := checkKvroute(d, dir != "overlays/dev"); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
	}
}

func checkKvroute(d *appsv1.Deployment, production bool) error {
	if production && (d.Spec.Replicas == nil || *d.Spec.Replicas < 2) {
		return fmt.Errorf("kvroute needs at least 2 replicas, has %v", d.Spec.Replicas)
	}
	ps := d.Spec.Template.Spec
	if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
		return fmt.Errorf("pod does not set runAsNonRoot")
	}
	var c *corev1.Container
	for i := range ps.Containers {
		if ps.Containers[i].Name == "kvroute" {
			c = &ps.Containers[i]
		}
	}
	if c == nil {
		return fmt.Errorf("no kvroute container")
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		return fmt.Errorf("kvroute container root filesystem is writable")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		return fmt.Errorf("kvroute container allows privilege escalation")
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
		if p == nil || p.GRPC == nil || p.GRPC.Port != 9002 {
			return fmt.Errorf("probes must be gRPC health checks on 9002")
		}
	}
	// Liveness must not follow readiness: a pod that cannot route for a
	// while (no workers yet) is not dead, and a restart loses its index.
	if s := c.LivenessProbe.GRPC.Service; s == nil || *s != "liveness" {
		return fmt.Errorf("the liveness probe must ask the gRPC health service \"liveness\"")
	}
	if s := c.ReadinessProbe.GRPC.Service; s != nil && *s != "" && *s != "readiness" {
		return fmt.Errorf("the readiness probe asks service %q; want \"\" or \"readiness\"", *s)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		return fmt.Errorf("kvroute container lacks cpu/memory requests or a memory limit")
	}
	ports := map[int32]string{}
	for _, p := range c.Ports {
		ports[p.ContainerPort] = p.Name
	}
	if ports[9002] != "grpc" || ports[9090] != "metrics" {
		return fmt.Errorf("container ports %v, want grpc 9002 and metrics 9090", ports)
	}
	return nil
}

func TestHardeningCheckCatchesMistakes(t *testing.T) {
	d := deployments(t, render(t, "overlays/vllm"))["kvroute"]
	if err := checkKvroute(d, true); err != nil {
		t.Fatal(err)
	}
	breakers := map[string]func(d *appsv1.Deployment){
		"one replica": func(d *appsv1.Deployment) { one := int32(1); d.Spec.Replicas = &one },
		"writable root": func(d *appsv1.Deployment) {
			f := false
			d.Spec.Template.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem = &f
		},
		"root allowed":     func(d *appsv1.Deployment) { f := false; d.Spec.Template.Spec.SecurityContext.RunAsNonRoot = &f },
		"http probe":       func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].ReadinessProbe.GRPC = nil },
		"probe on metrics": func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].LivenessProbe.GRPC.Port = 9090 },
		"liveness probes readiness": func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].LivenessProbe.GRPC.Service = nil
		},
		"no memory limit": func(d *appsv1.Deployment) {
			delete(d.Spec.Template.Spec.Containers[0].Resources.Limits, corev1.ResourceMemory)
		},
		"metrics port gone": func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].Ports = d.Spec.Template.Spec.Containers[0].Ports[:1]
		},
	}
	for name, brk := range breakers {
		c := d.DeepCopy()
		brk(c)
		if err := checkKvroute(c, true); err == nil {
			t.Errorf("%s: passed the hardening check", name)
		}
	}
}

// References between objects must resolve: ConfigMaps and Secrets a pod
// reads (unless optional), and Services' selectors and named target ports.
func TestReferencesResolve(t *testing.T) {
	for _, dir := range overlays {
		objs := render(t, dir)
		if err := checkReferences(t, objs); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
	}
}

func checkReferences(t *testing.T, objs []Object) error {
	deps := deployments(t, objs)
	have := func(kind, name string) bool { _, ok := find(objs, kind, name); return ok }
	for _, d := range deps {
		ps := d.Spec.Template.Spec
		for _, v := range ps.Volumes {
			if v.ConfigMap != nil && !have("ConfigMap", v.ConfigMap.Name) {
				return fmt.Errorf("deployment %s mounts missing ConfigMap %s", d.Name, v.ConfigMap.Name)
			}
		}
		for _, c := range append(append([]corev1.Container{}, ps.InitContainers...), ps.Containers...) {
			for _, ef := range c.EnvFrom {
				if ef.ConfigMapRef != nil && !have("ConfigMap", ef.ConfigMapRef.Name) {
					return fmt.Errorf("%s/%s reads missing ConfigMap %s", d.Name, c.Name, ef.ConfigMapRef.Name)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					continue
				}
				if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
					o, ok := find(objs, "ConfigMap", r.Name)
					if !ok {
						return fmt.Errorf("%s/%s env %s: missing ConfigMap %s", d.Name, c.Name, e.Name, r.Name)
					}
					var cm corev1.ConfigMap
					if err := decodeStrict(o.JSON, &cm); err != nil {
						return err
					}
					if _, ok := cm.Data[r.Key]; !ok {
						return fmt.Errorf("%s/%s env %s: ConfigMap %s has no key %s", d.Name, c.Name, e.Name, r.Name, r.Key)
					}
				}
				if r := e.ValueFrom.SecretKeyRef; r != nil && (r.Optional == nil || !*r.Optional) && !have("Secret", r.Name) {
					return fmt.Errorf("%s/%s env %s: missing Secret %s", d.Name, c.Name, e.Name, r.Name)
				}
			}
		}
	}
	for _, o := range objs {
		if o.Kind != "Service" {
			continue
		}
		var s corev1.Service
		if err := decodeStrict(o.JSON, &s); err != nil {
			return err
		}
		d := selected(deps, s.Spec.Selector)
		if d == nil {
			return fmt.Errorf("service %s selects no Deployment (%v)", s.Name, s.Spec.Selector)
		}
		for _, p := range s.Spec.Ports {
			if p.TargetPort.Type == intstr.String && !hasPort(d, p.TargetPort.StrVal) {
				return fmt.Errorf("service %s targets port %q that deployment %s does not name", s.Name, p.TargetPort.StrVal, d.Name)
			}
		}
	}
	return nil
}

func selected(deps map[string]*appsv1.Deployment, sel map[string]string) *appsv1.Deployment {
	if len(sel) == 0 {
		return nil
	}
	for _, d := range deps {
		ok := true
		for k, v := range sel {
			if d.Spec.Template.Labels[k] != v {
				ok = false
			}
		}
		if ok {
			return d
		}
	}
	return nil
}

func hasPort(d *appsv1.Deployment, name string) bool {
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

func TestReferenceCheckCatchesMistakes(t *testing.T) {
	objs := render(t, "base")
	if err := checkReferences(t, objs); err != nil {
		t.Fatal(err)
	}
	swap := func(kind, name, old, new string) []Object {
		out := append([]Object(nil), objs...)
		for i, o := range out {
			if o.Kind == kind && o.Name == name {
				out[i].JSON = []byte(strings.Replace(string(o.JSON), old, new, 1))
			}
		}
		return out
	}
	broken := map[string][]Object{
		"service targets an unnamed port": swap("Service", "kvroute", `"targetPort":"metrics"`, `"targetPort":"metric"`),
		"service selects nothing":         swap("Service", "envoy", `"app.kubernetes.io/name":"envoy"}`, `"app.kubernetes.io/name":"envoy-x"}`),
		"bootstrap ConfigMap missing":     swap("Deployment", "envoy", `"name":"envoy-bootstrap-`, `"name":"envoy-bootstrap-x`),
	}
	for name, bad := range broken {
		if err := checkReferences(t, bad); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}
