package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// The model is named once, in the fleet-model ConfigMap: vLLM's argument,
// the tokenizer download, KVROUTE_TOKENIZERS and KVROUTE_POOL_MODEL all
// read it from there.
func TestModelIsNamedOnce(t *testing.T) {
	for _, dir := range []string{"overlays/vllm", "overlays/gateway-api", "overlays/istio", "overlays/inferencepool", existingFleet, myFleet} {
		objs := render(t, dir)
		cm, ok := findPrefix(objs, "ConfigMap", "fleet-model")
		if !ok {
			t.Errorf("%s has no fleet-model ConfigMap", dir)
			continue
		}
		var c corev1.ConfigMap
		if err := json.Unmarshal(cm.JSON, &c); err != nil {
			t.Fatal(err)
		}
		model := c.Data["MODEL"]
		if model == "" {
			t.Fatalf("%s: fleet-model has no MODEL", dir)
		}
		for _, o := range objs {
			if o.Kind != "ConfigMap" && strings.Contains(string(o.JSON), model) {
				t.Errorf("%s: %s names %s itself instead of reading fleet-model", dir, o, model)
			}
		}
		if err := checkEnvRefs(objs); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
	}
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// checkEnvRefs wants every $(VAR) in a container's args, command and env
// values to name an env entry above it (Kubernetes leaves others as they
// are, so vLLM would be asked to serve a model called "$(MODEL)").
func checkEnvRefs(objs []Object) error {
	for _, o := range objs {
		if o.Kind != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		if err := json.Unmarshal(o.JSON, &d); err != nil {
			return err
		}
		cs := append(append([]corev1.Container{}, d.Spec.Template.Spec.InitContainers...), d.Spec.Template.Spec.Containers...)
		for _, c := range cs {
			defined := map[string]bool{}
			check := func(where, s string) error {
				for _, m := range envRef.FindAllStringSubmatch(s, -1) {
					if !defined[m[1]] {
						return &envRefError{o.Name, c.Name, where, m[1]}
					}
				}
				return nil
			}
			for _, e := range c.Env {
				if err := check("env "+e.Name, e.Value); err != nil {
					return err
				}
				defined[e.Name] = true
			}
			for _, a := range append(append([]string{}, c.Command...), c.Args...) {
				if err := check("args", a); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

type envRefError struct{ deploy, container, where, name string }

func (e *envRefError) Error() string {
	return e.deploy + "/" + e.container + " " + e.where + " uses $(" + e.name + ") with no env entry " + e.name + " above it"
}

func TestEnvRefCheckCatchesMistakes(t *testing.T) {
	objs := render(t, "overlays/vllm")
	bad := replaceIn(objs, "Deployment", `"value":"$(MODEL)=/tokenizers/model"`, `"value":"$(MODLE)=/tokenizers/model"`)
	if err := checkEnvRefs(bad); err == nil {
		t.Error("a misspelled $(MODLE) passed")
	}
}

// The manifests run the image the README builds.
func TestManifestImageIsTheREADMEBuild(t *testing.T) {
	readme := readRepoFile(t, "README.md")
	if !strings.Contains(readme, "docker build -t "+kvrouteImage+" .") {
		t.Errorf("the README does not build %s, the image the manifests run", kvrouteImage)
	}
	for _, dir := range overlays {
		for _, o := range render(t, dir) {
			if strings.Contains(string(o.JSON), "ghcr.io/kvroute") || dir != myFleet && strings.Contains(string(o.JSON), "registry.example.com") {
				t.Errorf("%s: %s runs a ghcr.io image, not %s", dir, o, kvrouteImage)
			}
		}
	}
}

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docs/deploy.md's example overlay renames the image and the model
// everywhere, and its YAML is the file the tests render.
func TestDeployDocsExampleOverlay(t *testing.T) {
	example := readRepoFile(t, "deploy/testdata/my-fleet/kustomization.yaml")
	body := example[strings.Index(example, "apiVersion:"):]
	if !strings.Contains(readRepoFile(t, "docs/deploy.md"), body) {
		t.Error("docs/deploy.md's example differs from deploy/testdata/my-fleet/kustomization.yaml")
	}
	objs := render(t, myFleet)
	for _, want := range []string{"registry.example.com/kvroute:v1", "meta-llama/Llama-3.1-8B-Instruct"} {
		found := false
		for _, o := range objs {
			found = found || strings.Contains(string(o.JSON), want)
		}
		if !found {
			t.Errorf("the example overlay renders no %s", want)
		}
	}
	for _, o := range objs {
		if strings.Contains(string(o.JSON), `"image":"kvroute:dev"`) {
			t.Errorf("%s still runs kvroute:dev", o)
		}
	}
	if _, ok := find(objs, "ServiceMonitor", "kvroute"); !ok {
		t.Error("the example overlay has no ServiceMonitor")
	}
}
