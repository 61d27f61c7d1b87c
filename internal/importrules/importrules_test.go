package importrules

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/kvroute/kvroute"

// mayImport is the "may import" column of docs/architecture.md §2: for every
// package of the module, the module's packages it may import directly
// (non-test files). A package missing here fails the test, so a new package
// gets a row in the map and here at once.
var mayImport = map[string][]string{
	"cmd/kvroute": {"server", "extproc", "picker", "scoring", "tokenizer", "envoy", "multimodal",
		"fleet", "discovery", "discovery/file", "internal/cli", "internal/envflag", "internal/costflag", "internal/connflag", "internal/flagfile"},
	"cmd/kvsim":    {"internal/sim", "internal/cli", "internal/envflag", "fleet", "multimodal"},
	"cmd/kvbridge": {"bridge", "engine", "internal/cli", "internal/envflag", "internal/connflag"},
	"cmd/kvbench": {"internal/bench", "internal/vsim", "internal/sim", "internal/cli", "internal/costflag",
		"discovery/file", "scoring", "envoy/proxy"},

	"server": {"extproc", "picker", "scoring", "fleet", "kvindex", "tokenizer", "envoy",
		"kvevents", "bus", "discovery", "discovery/etcd", "discovery/file", "discovery/kubepool", "engine", "engine/feed"},
	"extproc":     {},
	"picker":      {"extproc", "scoring", "kvindex", "tokenizer", "multimodal"},
	"scoring":     {"fleet"},
	"fleet":       {},
	"multimodal":  {"kvindex", "tokenizer"},
	"kvindex":     {"kvevents/vllmwire"},
	"tokenizer":   {},
	"envoy":       {},
	"envoy/proxy": {},

	"kvevents":           {"kvindex", "kvevents/vllmwire", "internal/inbox"},
	"kvevents/vllmwire":  {},
	"bus":                {"fleet", "kvevents", "kvevents/vllmwire"},
	"discovery":          {"fleet"},
	"discovery/etcd":     {"fleet", "bus", "discovery"},
	"discovery/file":     {"fleet", "discovery"},
	"discovery/kubepool": {"fleet", "discovery"},
	"engine":             {"kvevents/vllmwire", "engine/vllmzmq"},
	"engine/vllmzmq":     {},
	"engine/feed":        {"fleet", "kvevents", "engine", "engine/vllmzmq"},
	"bridge":             {"fleet", "bus", "discovery", "discovery/etcd", "engine", "engine/vllmzmq"},

	"internal/sim":         {"fleet", "kvindex", "kvevents/vllmwire", "tokenizer", "multimodal", "bus", "discovery", "discovery/etcd", "engine/vllmzmq"},
	"internal/bench":       {"server", "internal/sim", "envoy", "envoy/proxy", "picker", "tokenizer", "multimodal", "kvindex"},
	"internal/vsim":        {"scoring", "fleet", "kvindex", "kvevents/vllmwire", "internal/sim", "internal/bench"},
	"internal/costflag":    {"scoring"},
	"internal/connflag":    {"bus"},
	"internal/flagfile":    {},
	"internal/cli":         {"internal/envflag"},
	"internal/envflag":     {},
	"internal/importrules": {},
	"internal/inbox":       {},

	// Test support: imported by tests, e2e and the peer harnesses only
	// (TestProductDoesNotCarryTestSupport).
	"internal/testenv":            {},
	"internal/testenv/kubetest":   {"discovery/kubepool", "internal/testenv"},
	"internal/testenv/sourcetest": {"fleet", "discovery"},

	// End-to-end tests and the peer harnesses may use anything.
	"e2e":             nil,
	"e2e/operator":    nil,
	"peers/compare":   nil,
	"peers/tokenizer": {"tokenizer"},
	"peers/kvindex":   {"kvindex", "kvevents/vllmwire", "internal/inbox"},
}

// testTooling lists the trees that only test or measure: the test helpers
// (embedded NATS, etcd and kube-apiserver, the worker-source contract), the
// end-to-end tests, the peer harnesses and this test. Every other package
// is product (or product tooling such as kvbench) and must not carry the
// test helpers (internal/testenv and below) in its dependencies.
var testTooling = []string{"internal/testenv", "e2e", "peers", "internal/importrules"}

// neverInDeps lists, per package, what must not appear anywhere in its
// transitive dependencies (go list -deps): the router binary carries no test
// or benchmark tooling and no sidecar code, the pure packages do no I/O, and
// vLLM's event codec stands on its own: no package of ours, so that every
// transport, tool and test can decode and encode events without the index.
var neverInDeps = map[string][]string{
	"cmd/kvroute": {module + "/envoy/proxy", module + "/internal/sim", module + "/internal/bench",
		module + "/internal/vsim", module + "/internal/testenv", module + "/bridge"},
	"scoring":    {"github.com/nats-io/", "go.etcd.io/", "google.golang.org/grpc", "k8s.io/", "net/http"},
	"kvindex":    {"github.com/nats-io/", "go.etcd.io/", "google.golang.org/grpc", "k8s.io/", "net/http"},
	"tokenizer":  {"github.com/nats-io/", "go.etcd.io/", "google.golang.org/grpc", "k8s.io/", "net/http"},
	"multimodal": {"github.com/nats-io/", "go.etcd.io/", "google.golang.org/grpc", "k8s.io/", "net/http"},
	"extproc":    {module + "/"},
	"fleet":      {module + "/", "github.com/nats-io/", "go.etcd.io/", "google.golang.org/grpc", "k8s.io/", "net/http"},

	"kvevents/vllmwire": {module + "/", "github.com/nats-io/", "go.etcd.io/", "google.golang.org/grpc", "k8s.io/", "net/http"},
	// The wire adapters drive the scheduler through bus's interfaces only.
	"bus": {module + "/scoring"},
}

// notScoring lists the packages fleet input comes through: worker sources,
// the wire adapters, the sidecar and the engine followers. They name
// workers, load reports and sync events through package fleet and must not
// import the scheduler (package scoring); bus drives scoring.Pool through
// its own interfaces (LoadSink, SyncPool), which the server wires.
var notScoring = []string{
	"bus", "discovery", "discovery/etcd", "discovery/file", "discovery/kubepool",
	"bridge", "engine", "engine/vllmzmq", "engine/feed",
	// and the sources' test helpers
	"internal/testenv/kubetest", "internal/testenv/sourcetest",
}

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func goList(t *testing.T, args ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Imports,Deps", "-tags", "compare kubeapiserver llmdsim"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func rel(path string) (string, bool) {
	if path == module {
		return "", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

func TestEveryPackageImportsOnlyWhatTheMapAllows(t *testing.T) {
	for _, p := range goList(t, module+"/...") {
		name, _ := rel(p.ImportPath)
		allowed, known := mayImport[name]
		if !known {
			t.Errorf("%s has no row in the import rules: add it to docs/architecture.md §2 and to mayImport", name)
			continue
		}
		if allowed == nil {
			continue
		}
		ok := map[string]bool{}
		for _, a := range allowed {
			ok[a] = true
		}
		for _, imp := range p.Imports {
			if r, ours := rel(imp); ours && !ok[r] {
				t.Errorf("%s imports %s, which docs/architecture.md §2 does not allow", name, r)
			}
		}
	}
}

func TestForbiddenDependenciesStayOut(t *testing.T) {
	var names []string
	for n := range neverInDeps {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, p := range goList(t, "-deps=false", module+"/"+name) {
			// -deps=false keeps one record per package; Deps is still the
			// whole transitive closure.
			for _, d := range p.Deps {
				for _, bad := range neverInDeps[name] {
					if d == strings.TrimSuffix(bad, "/") || strings.HasPrefix(d, bad) {
						t.Errorf("%s depends on %s (through its imports), which it must never carry", name, d)
					}
				}
			}
		}
	}
}

func TestInputPackagesDoNotImportScoring(t *testing.T) {
	for _, name := range notScoring {
		for _, p := range goList(t, module+"/"+name) {
			for _, imp := range p.Imports {
				if imp == module+"/scoring" {
					t.Errorf("%s imports scoring: name workers, load reports and sync events through package fleet", name)
				}
			}
		}
	}
}

func inTree(name, tree string) bool {
	return name == tree || strings.HasPrefix(name, tree+"/")
}

// Test helpers live under internal/testenv, and no package outside the
// test tooling carries them, even through another package.
func TestProductDoesNotCarryTestSupport(t *testing.T) {
	testenv := module + "/internal/testenv"
	for _, p := range goList(t, module+"/...") {
		name, _ := rel(p.ImportPath)
		tooling := false
		for _, tree := range testTooling {
			tooling = tooling || inTree(name, tree)
		}
		if tooling {
			continue
		}
		for _, d := range p.Deps {
			if d == testenv || strings.HasPrefix(d, testenv+"/") {
				t.Errorf("%s depends on %s: test helpers are for tests, e2e and the peer harnesses only", name, d)
			}
		}
	}
}

// The map is checked against reality in both directions: a row for a
// package that no longer exists is drift too.
func TestNoRuleForAMissingPackage(t *testing.T) {
	have := map[string]bool{}
	for _, p := range goList(t, module+"/...") {
		name, _ := rel(p.ImportPath)
		have[name] = true
	}
	for name := range mayImport {
		if !have[name] {
			t.Errorf("mayImport has a row for %s, which is not a package of the module", name)
		}
	}
}

// Every package with a rule has its row in docs/architecture.md §2, so the
// map a newcomer reads is the one this test enforces.
func TestEveryRuleHasARowInTheArchitectureMap(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "\n## 2.")
	end := strings.Index(text, "\n## 3.")
	if start < 0 || end < start {
		t.Fatal("docs/architecture.md has no section 2 followed by section 3")
	}
	section := text[start:end]
	for name := range mayImport {
		if !strings.Contains(section, "`"+name+"`") && !strings.Contains(section, "`"+name+"/`") {
			t.Errorf("docs/architecture.md §2 has no row naming `%s`", name)
		}
	}
}
