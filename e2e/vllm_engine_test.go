//go:build vllm

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// vLLM's CPU build (scripts/vllm.sh) runs a tiny random-weight Qwen3 model
// (tools/vllm/tiny_model.py) that this file builds once per content hash
// into the user cache. Its answers are noise; its prompt tokens, KV blocks,
// events and cache hits are vLLM's own.

// vllmBlockSize is the block size the engines run with: vLLM's CPU
// attention backend takes only multiples of 32.
const vllmBlockSize = 32

// vllmBlocks is each engine's KV capacity in blocks, small so that a few
// long prompts evict.
const vllmBlocks = 64

// vllmTopic is the engines' kv-events-config topic.
const vllmTopic = "kv-events"

// vllmEngine is one vLLM server process group.
type vllmEngine struct {
	id, ip             string
	port               int
	eventsPort, replay int
	cmd                *exec.Cmd
	done               chan struct{}
	log                string
}

func (e *vllmEngine) addr() string { return fmt.Sprintf("%s:%d", e.ip, e.port) }
func (e *vllmEngine) url() string  { return "http://" + e.addr() }

// eventsEndpoint and replayEndpoint are where a subscriber on this host
// reaches the engine's sockets (they are bound on every interface).
func (e *vllmEngine) eventsEndpoint() string { return fmt.Sprintf("tcp://%s:%d", e.ip, e.eventsPort) }
func (e *vllmEngine) replayEndpoint() string { return fmt.Sprintf("tcp://%s:%d", e.ip, e.replay) }

// logTail is the end of the engine's output without the lines that say
// nothing about a failure (its route table, health checks), so that
// several engines' tails fit in what CI keeps of a failing run.
func (e *vllmEngine) logTail() string {
	b, _ := os.ReadFile(e.log)
	var kept []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "launcher.py") && strings.Contains(l, "Route:") || strings.Contains(l, "GET /health") {
			continue
		}
		kept = append(kept, l)
	}
	out := strings.Join(kept, "\n")
	if len(out) > 3000 {
		out = out[len(out)-3000:]
	}
	return out
}

// startVLLMs starts one engine per spec at once and waits until all
// answer /health. An engine that exits during start-up is started once
// more with fresh ports, its first log tail logged: with two engines
// compiling at once on two cores, vLLM's CPU build has been seen to exit
// before it served (the cause is in the log); a second exit fails the test.
func startVLLMs(t *testing.T, ctx context.Context, py, modelDir string, specs ...vllmSpec) []*vllmEngine {
	t.Helper()
	engines := make([]*vllmEngine, len(specs))
	for i, s := range specs {
		engines[i] = startVLLM(t, py, modelDir, s.id, s.ip, s.cpu)
	}
	for i, s := range specs {
		err := engines[i].waitReady(ctx)
		if errors.Is(err, errEngineExited) {
			t.Logf("%s exited before it served (%v); starting it once more. Its log tail:\n%s", s.id, engines[i].cmd.ProcessState, engines[i].logTail())
			engines[i] = startVLLM(t, py, modelDir, s.id, s.ip, s.cpu)
			err = engines[i].waitReady(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return engines
}

// vllmSpec names one engine of startVLLMs: its worker id, the loopback
// address it serves on and the CPU its OpenMP threads bind to.
type vllmSpec struct {
	id, ip string
	cpu    int
}

var errEngineExited = errors.New("engine exited before it served")

// kill ends the engine and its engine-core child (a process group of
// their own).
func (e *vllmEngine) kill() {
	if e.cmd.Process != nil {
		_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-e.done
}

// tinyModel returns the folder of the test model, writing it first when
// the cache has none for this script and tokenizer.
func tinyModel(t *testing.T, py string) string {
	t.Helper()
	script := filepath.Join("..", "tools", "vllm", "tiny_model.py")
	h := sha256.New()
	for _, f := range []string{script, filepath.Join(qwenDir, "tokenizer.json"), filepath.Join(qwenDir, "tokenizer_config.json")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cache, "kvroute", "vllm-model-"+hex.EncodeToString(h.Sum(nil))[:12])
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err == nil {
		return dir
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, script, qwenDir, dir).CombinedOutput()
	if err != nil {
		t.Fatalf("writing the tiny model: %v\n%s", err, out)
	}
	return dir
}

// startVLLM starts one engine: prefix caching, the prompt tokens' cache
// hits in usage, KV events on a PUB socket and a replay socket of its own.
func startVLLM(t *testing.T, py, modelDir, id, ip string, cpu int) *vllmEngine {
	t.Helper()
	e := &vllmEngine{id: id, ip: ip, port: freeTCPPort(t), eventsPort: freeTCPPort(t), replay: freeTCPPort(t), done: make(chan struct{})}
	kvEvents, _ := json.Marshal(map[string]any{
		"enable_kv_cache_events": true, "publisher": "zmq", "topic": vllmTopic,
		"endpoint":        fmt.Sprintf("tcp://*:%d", e.eventsPort),
		"replay_endpoint": fmt.Sprintf("tcp://*:%d", e.replay),
	})
	e.cmd = exec.Command(py, "-m", "vllm.entrypoints.openai.api_server",
		"--model", modelDir, "--served-model-name", model, "--host", ip, "--port", fmt.Sprint(e.port),
		"--block-size", fmt.Sprint(vllmBlockSize), "--num-gpu-blocks-override", fmt.Sprint(vllmBlocks), "--max-model-len", "1024",
		"--enable-prefix-caching", "--enable-prompt-tokens-details", "--kv-events-config", string(kvEvents))
	e.cmd.Env = append(os.Environ(), "VLLM_CPU_KVCACHE_SPACE=1", "HF_HUB_OFFLINE=1", "VLLM_NO_USAGE_STATS=1",
		"VLLM_CPU_OMP_THREADS_BIND="+fmt.Sprint(cpu), "OMP_NUM_THREADS=1")
	// A group of its own, so kill reaches the engine core too; and killed
	// with the test binary, should it die without running its cleanups
	// (go test's -timeout).
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(filepath.Join(t.TempDir(), id+".log"))
	if err != nil {
		t.Fatal(err)
	}
	e.log = logf.Name()
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.cmd.Wait(); _ = logf.Close(); close(e.done) }()
	t.Cleanup(func() {
		e.kill()
		if t.Failed() {
			t.Logf("%s log tail:\n%s", id, e.logTail())
		}
	})
	return e
}

// waitReady polls the engine's /health until it answers.
func (e *vllmEngine) waitReady(ctx context.Context) error {
	for {
		resp, err := http.Get(e.url() + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w\n%s", e.id, ctx.Err(), e.logTail())
		case <-e.done:
			return fmt.Errorf("%s: %w (%v); log tail:\n%s", e.id, errEngineExited, e.cmd.ProcessState, e.logTail())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// tokenize asks the engine for a chat body's prompt token ids.
func (e *vllmEngine) tokenize(t *testing.T, body []byte) []uint32 {
	t.Helper()
	resp, err := http.Post(e.url()+"/tokenize", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil {
		t.Fatalf("%s /tokenize: HTTP %d %s", e.id, resp.StatusCode, raw)
	}
	return out.Tokens
}

// metric is the first line of the engine's /metrics that starts with name.
func (e *vllmEngine) metric(t *testing.T, name string) string {
	t.Helper()
	resp, err := http.Get(e.url() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, name) {
			return l
		}
	}
	return ""
}
