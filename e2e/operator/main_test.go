package operator

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// bin is the folder holding the binaries TestMain built.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvroute-clitest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// A plain `go build` shares the test build cache; -buildvcs=auto (over
	// a GOFLAGS=-buildvcs=false) stamps the revision --version prints.
	cmd := exec.Command("go", "build", "-buildvcs=auto", "-o", dir+string(filepath.Separator), "./cmd/...")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/...: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	bin = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is one run of a binary.
type result struct {
	code           int
	stdout, stderr string
}

// runBin runs a built binary with args and an empty KVROUTE_* environment.
func runBin(t *testing.T, name string, args ...string) result {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, name), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return r
}
