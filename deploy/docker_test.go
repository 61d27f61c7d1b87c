package deploy

import (
	"bufio"
	"bytes"
	"debug/elf"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// No Docker engine runs where these tests run, so the Dockerfile is checked
// in parts: its shape (stages, base images, user, entrypoint), and its
// builder command, run here as written, must give static binaries of every
// command; .dockerignore must keep every file that command reads.

type instruction struct{ op, args string }

// parseDockerfile returns the instructions, continuation lines joined and
// comments dropped.
func parseDockerfile(data []byte) ([]instruction, error) {
	var out []instruction
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cur.WriteString(strings.TrimSuffix(line, `\`) + " ")
			continue
		}
		cur.WriteString(line)
		op, args, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		op = strings.ToUpper(op)
		switch op {
		case "FROM", "RUN", "COPY", "WORKDIR", "ARG", "ENV", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "LABEL":
		default:
			return nil, fmt.Errorf("unknown instruction %q", op)
		}
		out = append(out, instruction{op, strings.Join(strings.Fields(args), " ")})
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("dangling line continuation")
	}
	return out, sc.Err()
}

var goBuildRe = regexp.MustCompile(`^(CGO_ENABLED=0) .*?(go build .*)$`)

// checkDockerfile returns the builder's go build command line.
func checkDockerfile(ins []instruction) (string, error) {
	var froms []string
	var user, entry, build string
	copiedOut := false
	for _, in := range ins {
		switch in.op {
		case "FROM":
			froms = append(froms, in.args)
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entry = in.args
		case "RUN":
			if m := goBuildRe.FindStringSubmatch(in.args); m != nil {
				build = m[2]
			}
		case "COPY":
			copiedOut = copiedOut || strings.HasPrefix(in.args, "--from=build /out/ ")
		}
	}
	if len(froms) != 2 || !strings.HasPrefix(froms[0], "golang:1.26 ") || !strings.HasSuffix(froms[0], " AS build") {
		return "", fmt.Errorf("want a golang:1.26 builder stage named build and one final stage, have %q", froms)
	}
	if !regexp.MustCompile(`^gcr\.io/distroless/static(-debian\d+)?:nonroot$`).MatchString(froms[1]) {
		return "", fmt.Errorf("final stage %q is not distroless static nonroot", froms[1])
	}
	if !strings.HasPrefix(user, "nonroot") && !strings.HasPrefix(user, "65532") {
		return "", fmt.Errorf("USER %q is not the non-root user", user)
	}
	if entry != `["/usr/local/bin/kvroute"]` {
		return "", fmt.Errorf("ENTRYPOINT %s, want the kvroute binary in exec form", entry)
	}
	if build == "" || !strings.Contains(build, "-o /out/ ./cmd/...") {
		return "", fmt.Errorf("no `CGO_ENABLED=0 ... go build -o /out/ ./cmd/...` in the builder")
	}
	if !copiedOut {
		return "", fmt.Errorf("the final stage does not copy /out/ from the builder")
	}
	return build, nil
}

func TestDockerfileShape(t *testing.T) {
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	ins, err := parseDockerfile(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkDockerfile(ins); err != nil {
		t.Fatal(err)
	}
	broken := map[string]func(string) string{
		"root user": func(s string) string { return strings.Replace(s, "USER nonroot:nonroot", "USER root", 1) },
		"cgo on":    func(s string) string { return strings.Replace(s, "CGO_ENABLED=0", "CGO_ENABLED=1", 1) },
		"full base image": func(s string) string {
			return strings.Replace(s, "distroless/static-debian12:nonroot", "distroless/base-debian12", 1)
		},
		"shell entrypoint": func(s string) string { return strings.Replace(s, `["/usr/local/bin/kvroute"]`, `kvroute`, 1) },
		"old go":           func(s string) string { return strings.Replace(s, "golang:1.26", "golang:1.22", 1) },
		"unknown op":       func(s string) string { return s + "\nRUNN true\n" },
	}
	for name, brk := range broken {
		ins, err := parseDockerfile([]byte(brk(string(data))))
		if err == nil {
			_, err = checkDockerfile(ins)
		}
		if err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// builtBinaries runs the Dockerfile's builder command with /out/ replaced by
// a temporary directory, from the repository root, and returns that directory.
func builtBinaries(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		data, err := os.ReadFile("../Dockerfile")
		if err != nil {
			binErr = err
			return
		}
		ins, err := parseDockerfile(data)
		if err != nil {
			binErr = err
			return
		}
		build, err := checkDockerfile(ins)
		if err != nil {
			binErr = err
			return
		}
		binDir, binErr = os.MkdirTemp("", "kvroute-docker-out-")
		if binErr != nil {
			return
		}
		args, err := shellWords(strings.Replace(build, "/out/", binDir+"/", 1))
		if err != nil {
			binErr = err
			return
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binDir
}

// shellWords splits a command line as sh would for the quoting the
// Dockerfile uses: words, and double-quoted parts within a word.
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '$' || r == '\'' || r == '`':
			return nil, fmt.Errorf("shell syntax %q in %q not supported by the test", r, s)
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unbalanced quote in %q", s)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// staticELF reports why an executable would not run on distroless/static:
// an interpreter (the dynamic loader) or needed shared libraries.
func staticELF(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s has an ELF interpreter (dynamically linked)", filepath.Base(path))
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return fmt.Errorf("%s needs shared libraries %v", filepath.Base(path), libs)
	}
	return nil
}

func TestDockerBuilderGivesStaticBinaries(t *testing.T) {
	dir := builtBinaries(t)
	var want []string
	cmds, err := os.ReadDir("../cmd")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if c.IsDir() {
			want = append(want, c.Name())
		}
	}
	for _, must := range []string{"kvroute", "kvsim", "kvbridge"} {
		if !slices.Contains(want, must) {
			t.Errorf("cmd/%s is missing", must)
		}
	}
	got, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range got {
		names = append(names, g.Name())
		if err := staticELF(filepath.Join(dir, g.Name())); err != nil {
			t.Error(err)
		}
	}
	if !slices.Equal(names, want) {
		t.Errorf("builder produced %v, want one binary per cmd/ directory %v", names, want)
	}
	// The check itself must be able to fail: a cgo binary asks for the loader.
	if _, err := exec.LookPath("gcc"); err == nil {
		src := filepath.Join(t.TempDir(), "main.go")
		os.WriteFile(src, []byte("package main\n/*\n#include <stdio.h>\n*/\nimport \"C\"\nfunc main() { C.puts(C.CString(\"x\")) }\n"), 0o644)
		out := filepath.Join(t.TempDir(), "dyn")
		cmd := exec.Command("go", "build", "-o", out, src)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS=-buildvcs=false")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Logf("cannot build the cgo counter-example: %v\n%s", err, b)
		} else if staticELF(out) == nil {
			t.Error("staticELF passed a cgo binary")
		}
	}
}

// flagEnvNames runs a built command's help and returns every KVROUTE_*
// variable it documents: the names its flags can be set with.
func flagEnvNames(t *testing.T, cmd string, args ...string) map[string]bool {
	t.Helper()
	out, _ := exec.Command(filepath.Join(builtBinaries(t), cmd), args...).CombinedOutput()
	names := map[string]bool{}
	// Only the names printed beside a flag ("env KVROUTE_X" or "[KVROUTE_X]"),
	// not names mentioned in prose (old or subcommand-only ones).
	for _, m := range regexp.MustCompile(`(?:env |\[)(KVROUTE_[A-Z0-9_]+)`).FindAllStringSubmatch(string(out), -1) {
		names[m[1]] = true
	}
	if len(names) < 5 {
		t.Fatalf("%s %v documents only %d KVROUTE_* variables:\n%s", cmd, args, len(names), out)
	}
	return names
}

var helpArgs = map[string][]string{"kvroute": {"help"}, "kvbridge": {"--help"}, "kvsim": {"--help"}}

func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	f, err := os.Open("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	patterns, err := ignorefile.ReadAll(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Every Go and embedded file of every package the builder compiles.
	cmd := exec.Command("go", "list", "-deps", "-f", `{{if .Module}}{{if eq .Module.Path "github.com/kvroute/kvroute"}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}
{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}
{{end}}{{end}}{{end}}`, "./cmd/...")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		rel, err := filepath.Rel(root, l)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	files = append(files, "go.mod", "go.sum")
	check := func(patterns []string) error {
		pm, err := patternmatcher.New(patterns)
		if err != nil {
			return err
		}
		for _, f := range files {
			if ex, err := pm.MatchesOrParentMatches(f); err != nil || ex {
				return fmt.Errorf("%s is excluded from the build context (err %v)", f, err)
			}
		}
		return nil
	}
	if err := check(patterns); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(files, func(f string) bool { return strings.Contains(f, "/testdata/") }) {
		t.Fatal("no embedded testdata file among the build inputs; the check below would prove nothing")
	}
	if err := check(append(patterns, "**/testdata")); err == nil {
		t.Error("excluding every testdata directory passed, but an embedded file lives in one")
	}
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}
