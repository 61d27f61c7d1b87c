package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// routingFile is what every overlay's kvroute runs with: the routing
// section in a ConfigMap mounted as a directory (so the kubelet's updates
// reach the file and kvroute reloads them), named without a hash suffix
// (so an edit updates it in place instead of rolling the Deployment), and
// no variable pinning the mode over it.
func routingFile(t *testing.T, objs []Object) (file string, env map[string]string, err error) {
	kv := deployments(t, objs)["kvroute"]
	if kv == nil {
		return "", nil, fmt.Errorf("no kvroute Deployment")
	}
	cmObj, ok := findPrefix(objs, "ConfigMap", "kvroute-config")
	if !ok {
		return "", nil, fmt.Errorf("no kvroute-config ConfigMap")
	}
	var cm corev1.ConfigMap
	if err := json.Unmarshal(cmObj.JSON, &cm); err != nil {
		return "", nil, err
	}
	env = cm.Data
	p := env["KVROUTE_CONFIG"]
	if p == "" {
		return "", nil, fmt.Errorf("kvroute-config sets no KVROUTE_CONFIG")
	}
	if v, ok := env["KVROUTE_ROUTER_MODE"]; ok {
		return "", nil, fmt.Errorf("KVROUTE_ROUTER_MODE=%q pins the mode over the reloadable file", v)
	}
	ctr := kv.Spec.Template.Spec.Containers[0]
	for _, m := range ctr.VolumeMounts {
		if m.MountPath != path.Dir(p) {
			continue
		}
		if m.SubPath != "" || m.SubPathExpr != "" {
			return "", nil, fmt.Errorf("%s is mounted with a subPath: ConfigMap updates never reach it", p)
		}
		for _, v := range kv.Spec.Template.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.ConfigMap == nil {
				return "", nil, fmt.Errorf("volume %s is not a ConfigMap", v.Name)
			}
			o, ok := find(objs, "ConfigMap", v.ConfigMap.Name)
			if !ok {
				return "", nil, fmt.Errorf("ConfigMap %s (no hash suffix) not found", v.ConfigMap.Name)
			}
			var data corev1.ConfigMap
			if err := json.Unmarshal(o.JSON, &data); err != nil {
				return "", nil, err
			}
			f, ok := data.Data[path.Base(p)]
			if !ok {
				return "", nil, fmt.Errorf("ConfigMap %s has no %s", v.ConfigMap.Name, path.Base(p))
			}
			return f, env, nil
		}
		return "", nil, fmt.Errorf("no volume %s", m.Name)
	}
	return "", nil, fmt.Errorf("nothing is mounted at %s", path.Dir(p))
}

// validate runs `kvroute config validate` on the file with the overlay's
// KVROUTE_* variables, as the pod would start.
func validate(t *testing.T, file string, env map[string]string) error {
	p := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(p, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(builtBinaries(t), "kvroute"), "config", "validate", p)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		if k != "KVROUTE_CONFIG" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

func TestRoutingConfigFileReloadsAndIsValid(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			file, env, err := routingFile(t, objs)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(file, "routing:") {
				t.Errorf("the file has no routing section:\n%s", file)
			}
			if err := validate(t, file, env); err != nil {
				t.Errorf("kvroute config validate: %v", err)
			}
		})
	}
	base := render(t, "base")
	file, env, err := routingFile(t, base)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate(t, strings.Replace(file, "mode: kv", "mode: kvv", 1), env); err == nil {
		t.Error("a misspelt mode passed kvroute config validate")
	}
	for name, bad := range map[string][]Object{
		"subPath mount":  replaceIn(base, "Deployment", `"mountPath":"/etc/kvroute"`, `"mountPath":"/etc/kvroute","subPath":"kvroute.yaml"`),
		"mode pinned":    replaceIn(base, "ConfigMap", `"KVROUTE_CONFIG"`, `"KVROUTE_ROUTER_MODE":"kv","KVROUTE_CONFIG"`),
		"hashed name":    replaceIn(base, "Deployment", `"name":"kvroute-routing"`, `"name":"kvroute-routing-5f7c8"`),
		"no config path": replaceIn(base, "ConfigMap", `"KVROUTE_CONFIG"`, `"KVROUTE_CONFIG_PATH"`),
		"another mount":  replaceIn(base, "Deployment", `"mountPath":"/etc/kvroute"`, `"mountPath":"/etc/kvroute.d"`),
	} {
		if _, _, err := routingFile(t, bad); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}
