package deploy

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/yaml"
)

// KustomizeEnv names the kustomize binaries the version test runs, one
// "version path" pair a line, as scripts/kustomize.sh prints them. Unset,
// the test runs that script itself (it builds each release once into the
// user cache).
const KustomizeEnv = "KVROUTE_KUSTOMIZE"

type kustomizeBin struct{ version, path string }

// kustomizeBins returns the kustomize releases that kubectl's recent minors
// bundle, built by scripts/kustomize.sh.
func kustomizeBins(t *testing.T) []kustomizeBin {
	t.Helper()
	out := []byte(os.Getenv(KustomizeEnv))
	if len(bytes.TrimSpace(out)) == 0 {
		cmd := exec.Command("../scripts/kustomize.sh")
		cmd.Stderr = os.Stderr
		var err error
		if out, err = cmd.Output(); err != nil {
			t.Fatalf("scripts/kustomize.sh: %v", err)
		}
	}
	var bins []kustomizeBin
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("%s: want \"version path\" lines, got %q", KustomizeEnv, line)
		}
		bins = append(bins, kustomizeBin{f[0], f[1]})
	}
	return bins
}

// parseRendered splits `kustomize build` output into objects keyed by
// kind/namespace/name, each as decoded JSON.
func parseRendered(out []byte) (map[string]any, error) {
	nodes, err := kio.FromBytes(out)
	if err != nil {
		return nil, err
	}
	objs := map[string]any{}
	for _, n := range nodes {
		js, err := n.MarshalJSON()
		if err != nil {
			return nil, err
		}
		var v any
		if err := json.Unmarshal(js, &v); err != nil {
			return nil, err
		}
		objs[n.GetKind()+"/"+n.GetNamespace()+"/"+n.GetName()] = v
	}
	return objs, nil
}

// TestOverlaysRenderWithEveryKubectlKustomize builds every overlay with the
// kustomize of each recent kubectl minor (and the newest standalone one) and
// wants exactly what the tests' own kustomize API renders: users run
// `kubectl apply -k` with whatever kubectl they have.
func TestOverlaysRenderWithEveryKubectlKustomize(t *testing.T) {
	bins := kustomizeBins(t)
	for _, dir := range overlays {
		want := map[string]any{}
		for _, o := range render(t, dir) {
			var v any
			if err := json.Unmarshal(o.JSON, &v); err != nil {
				t.Fatal(err)
			}
			want[o.Kind+"/"+o.Namespace+"/"+o.Name] = v
		}
		for _, b := range bins {
			t.Run(dir+"/"+b.version, func(t *testing.T) {
				cmd := exec.Command(b.path, "build", filepath.Join("k8s", dir))
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				if err != nil {
					msg := stderr.String()
					if i := strings.Index(msg, "\n\n"); i > 0 && strings.HasPrefix(msg, "panic") {
						msg = msg[:i] // the panic line, not the whole trace
					}
					t.Fatalf("kustomize %s build %s: %v\n%s", b.version, dir, err, firstLines(msg, 12))
				}
				have, err := parseRendered(out)
				if err != nil {
					t.Fatalf("kustomize %s output: %v", b.version, err)
				}
				if !reflect.DeepEqual(keys(have), keys(want)) {
					t.Fatalf("kustomize %s renders %v, the kustomize API %v", b.version, keys(have), keys(want))
				}
				for k, w := range want {
					if !reflect.DeepEqual(have[k], w) {
						hj, _ := json.Marshal(have[k])
						wj, _ := json.Marshal(w)
						t.Errorf("kustomize %s renders %s differently:\n%s\nwant\n%s", b.version, k, hj, wj)
					}
				}
			})
		}
	}
}

// TestNoPatchDeletesSeveralObjects keeps the shape that crashed kustomize
// before v5.7 (kubectl 1.32 and 1.33) out of the tree even when only the
// tests' own, newer kustomize runs: one patch (a file or an inline patch)
// holding more than one `$patch: delete` document.
func TestNoPatchDeletesSeveralObjects(t *testing.T) {
	err := filepath.WalkDir("k8s", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if n, err := deletePatches(data); err != nil {
			t.Errorf("%s: %v", path, err)
		} else if n > 1 {
			t.Errorf("%s deletes %d objects in one patch: kustomize before v5.7 panics on it; give each its own patches entry with a target", path, n)
		}
		if filepath.Base(path) != "kustomization.yaml" {
			return nil
		}
		var k struct {
			Patches []struct{ Patch string } `json:"patches"`
		}
		if err := yaml.Unmarshal(data, &k); err != nil {
			t.Errorf("%s: %v", path, err)
		}
		for i, p := range k.Patches {
			if n, err := deletePatches([]byte(p.Patch)); err == nil && n > 1 {
				t.Errorf("%s: patches[%d] deletes %d objects: kustomize before v5.7 panics on it", path, i, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// deletePatches counts the documents of data that are `$patch: delete`.
func deletePatches(data []byte) (int, error) {
	nodes, err := kio.FromBytes(data)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, d := range nodes {
		if v, err := d.GetString("$patch"); err == nil && v == "delete" {
			n++
		}
	}
	return n, nil
}

func TestDeletePatchCountCatchesTheCrashingShape(t *testing.T) {
	crashing := "$patch: delete\napiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\n$patch: delete\napiVersion: v1\nkind: Service\nmetadata: {name: b}\n"
	if n, err := deletePatches([]byte(crashing)); err != nil || n != 2 {
		t.Fatalf("two delete documents counted as %d (%v)", n, err)
	}
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
