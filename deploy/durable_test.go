package deploy

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// checkDurableEvents enforces what KVROUTE_DURABLE_EVENTS needs: not
// together with KVROUTE_WARM_FROM (kvroute refuses to start), and a NATS
// server the overlay ships itself must run JetStream with its store on a
// mounted volume (a read-only root filesystem has nowhere else to write).
// An overlay that uses an external NATS cannot be checked here.
func checkDurableEvents(objs []Object, deps map[string]*appsv1.Deployment) error {
	data, err := kvrouteConfig(objs)
	if err != nil {
		return err
	}
	if data["KVROUTE_DURABLE_EVENTS"] != "true" {
		return nil
	}
	if data["KVROUTE_WARM_FROM"] != "" {
		return fmt.Errorf("KVROUTE_DURABLE_EVENTS with KVROUTE_WARM_FROM: kvroute refuses to start")
	}
	nats, ok := deps["nats"]
	if !ok {
		return nil
	}
	for _, ct := range nats.Spec.Template.Spec.Containers {
		if ct.Name != "nats" {
			continue
		}
		args := append(slices.Clone(ct.Command), ct.Args...)
		if !slices.Contains(args, "--jetstream") && !slices.Contains(args, "-js") {
			return fmt.Errorf("KVROUTE_DURABLE_EVENTS with a NATS server that does not run JetStream (%v)", args)
		}
		i := slices.Index(args, "--store_dir")
		if i < 0 || i+1 >= len(args) {
			return fmt.Errorf("the JetStream NATS server has no --store_dir")
		}
		for _, m := range ct.VolumeMounts {
			if m.MountPath == args[i+1] {
				return nil
			}
		}
		return fmt.Errorf("the JetStream store %s is not a mounted volume", args[i+1])
	}
	return fmt.Errorf("the nats Deployment has no nats container")
}

func TestDurableEventsHaveJetStream(t *testing.T) {
	on := 0
	for _, dir := range overlays {
		objs := render(t, dir)
		if err := checkDurableEvents(objs, deployments(t, objs)); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
		if data, err := kvrouteConfig(objs); err == nil && data["KVROUTE_DURABLE_EVENTS"] == "true" {
			on++
		}
	}
	if on == 0 {
		t.Fatal("no overlay turns on durable events; the component is untested")
	}
	dev := render(t, "overlays/dev")
	for name, bad := range map[string][]Object{
		"nats without JetStream": replaceIn(dev, "Deployment", `"--jetstream",`, ``),
		"store not mounted":      replaceIn(dev, "Deployment", `"mountPath":"/data"`, `"mountPath":"/elsewhere"`),
		"with warm-from":         replaceIn(dev, "ConfigMap", `"KVROUTE_DURABLE_EVENTS":"true"`, `"KVROUTE_DURABLE_EVENTS":"true","KVROUTE_WARM_FROM":"http://kvroute:8080"`),
	} {
		if err := checkDurableEvents(bad, deployments(t, bad)); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}

// kvrouteConfig returns the data of the kvroute-config ConfigMap (its
// generated name carries a hash suffix).
func kvrouteConfig(objs []Object) (map[string]string, error) {
	cm, ok := findPrefix(objs, "ConfigMap", "kvroute-config")
	if !ok {
		return nil, fmt.Errorf("no kvroute-config ConfigMap")
	}
	var c struct {
		Data map[string]string `json:"data"`
	}
	if err := json.Unmarshal(cm.JSON, &c); err != nil {
		return nil, err
	}
	return c.Data, nil
}
