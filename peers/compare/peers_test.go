//go:build compare

// This file: what the Python peers (SGLang's router, aiperf) share: the
// interpreter of their virtual environment, their versions, running them
// as child processes with their output kept, and the report directory.
package compare

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/envoy/proxy"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/server"
)

// The peers' fleet: the same for every router and client under test.
const (
	peerModel     = "Qwen/Qwen3-8B"
	peerTokenizer = "../../tokenizer/testdata/qwen3"
	peerWorkers   = 4
	peerBlockSize = 16
)

var peerCost = flag.String("peers-kvroute-cost", "", "kvroute's --cost-model in the peer comparisons (empty: its default)")

func init() {
	// The report directory flag is shared with the other comparisons of
	// this package; whichever file is built first defines it.
	if flag.Lookup("out") == nil {
		flag.String("out", "", "directory for the Markdown and JSON fragments")
	}
}

// reportDir is -out ("" for none).
func reportDir() string { return flag.Lookup("out").Value.String() }

// peersPython is the interpreter of the peers' virtual environment.
func peersPython(t *testing.T) string {
	t.Helper()
	testenv.Quiet()
	py := os.Getenv("KVROUTE_PEERS_PY")
	if py == "" {
		t.Fatal("KVROUTE_PEERS_PY (the python of the virtual environment with sglang-router and aiperf) must be set; make compare sets it")
	}
	if _, err := proxy.Find(); err != nil {
		t.Fatal(err)
	}
	return py
}

// distVersion is an installed Python distribution's version.
func distVersion(t *testing.T, py, dist string) string {
	t.Helper()
	out, err := exec.Command(py, "-c", "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))", dist).Output()
	if err != nil {
		t.Fatalf("%s: version of %s: %v", py, dist, err)
	}
	return strings.TrimSpace(string(out))
}

// envoyVersion is Envoy's release number, from `envoy --version`.
func envoyVersion() string {
	bin, err := proxy.Find()
	if err != nil {
		return ""
	}
	out, _ := exec.Command(bin, "--version").Output()
	if m := regexp.MustCompile(`/(\d+\.\d+\.\d+)/`).FindSubmatch(out); m != nil {
		return string(m[1])
	}
	return strings.TrimSpace(string(out))
}

// peerProc is a peer running as a child process in its own process group,
// its output in a log file.
type peerProc struct {
	cmd *exec.Cmd
	log string
	// done is closed when the process has exited; err is then its exit.
	done chan struct{}
	err  error
}

// startPeer runs args in dir with extra environment variables; the test's
// cleanup stops it (and its children) if it is still running.
func startPeer(t *testing.T, ctx context.Context, name, dir string, env []string, args ...string) *peerProc {
	t.Helper()
	logf, err := os.CreateTemp("", name+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	p := &peerProc{cmd: cmd, log: logf.Name(), done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		os.Remove(p.log)
	})
	return p
}

// stop ends the process group (SIGTERM, then SIGKILL after 5 s) and waits.
func (p *peerProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// output is the log so far.
func (p *peerProc) output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// logTail is the end of the log, for failure messages.
func (p *peerProc) logTail() string {
	s := p.output()
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

// writeFragment writes name.md and name.json into the report directory.
func writeFragment(t *testing.T, name, md string, v any) {
	t.Helper()
	dir := reportDir()
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	for file, data := range map[string][]byte{name + ".json": append(b, '\n'), name + ".md": []byte(md)} {
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %s.md and %s.json in %s", name, name, dir)
}

// shellLine renders a command for a report, quoting what needs it.
func shellLine(args []string) string {
	var b strings.Builder
	for i, a := range args {
		if i > 0 {
			b.WriteByte(' ')
		}
		if a == "" || strings.ContainsAny(a, " \t\"'$*?|&;<>(){}") {
			fmt.Fprintf(&b, "'%s'", strings.ReplaceAll(a, "'", `'\''`))
		} else {
			b.WriteString(a)
		}
	}
	return b.String()
}

// startFleet starts the all-in-one environment the peers share: embedded
// NATS and etcd, the kvsim fleet, kvroute (mode kv) and a real Envoy.
func startFleet(t *testing.T, ctx context.Context, gpuBlocks int, speedup float64) *bench.Env {
	t.Helper()
	env, err := bench.StartEnv(ctx, bench.EnvConfig{
		Workers: peerWorkers, Model: peerModel, TokenizerDir: peerTokenizer, Speedup: speedup,
		Engine: sim.EngineConfig{NumGPUBlocks: gpuBlocks, BlockSize: peerBlockSize},
		Router: func(c *server.Config) {
			if *peerCost != "" {
				c.Scoring.CostModel = *peerCost
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	return env
}

// fleetURLs are the workers' base URLs.
func fleetURLs(env *bench.Env) []string {
	var urls []string
	for _, w := range env.Fleet.Workers() {
		urls = append(urls, w.URL())
	}
	return urls
}

// loadEncoder is the fleet's tokenizer and chat template, as the workers
// apply them.
func loadEncoder() (*sim.ChatEncoder, error) { return sim.LoadChatEncoder(peerTokenizer, "") }

// fleetLine describes the fleet for the reports.
func fleetLine(gpuBlocks int, speedup float64) string {
	return fmt.Sprintf("%d kvsim workers (simulated vLLM, Dynamo mocker timing, speedup %g), %d-token blocks, %d KV blocks each, Qwen3 tokenizer and chat template",
		peerWorkers, speedup, peerBlockSize, gpuBlocks)
}

// runCapture runs a command to the end and returns its combined output.
func runCapture(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	return string(out), err
}

// costSuffix names a non-default kvroute cost model in row labels.
func costSuffix() string {
	if *peerCost == "" {
		return ""
	}
	return ", cost " + *peerCost
}

// lagCell renders a worker's clock lag for a table, marking a run whose
// times the lag stretched.
func lagCell(secs float64, stretched bool) string {
	if stretched {
		return fmt.Sprintf("%.2f (stretched)", secs)
	}
	return fmt.Sprintf("%.2f", secs)
}
