package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Streamed answers: the upstream sends HopStreamTokens SSE events
// HopStreamInterval apart, as a decoding engine would.
const (
	HopStreamTokens   = 64
	HopStreamInterval = 20 * time.Millisecond
)

// streamTiming is one streamed answer as the client saw it: time to its
// first body byte and the gaps between the reads that brought data.
type streamTiming struct {
	firstByte time.Duration
	gaps      []time.Duration
}

// offerStreamed is offer for streamed answers: it records each answer's
// time to first byte and the gaps between its chunks.
func offerStreamed(ctx context.Context, c *http.Client, url string, body func(int) []byte, dest func(int) string, rate float64, d time.Duration) (out []streamTiming, sent, errs int, took time.Duration) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if at.Sub(start) >= d || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Until(at))
		req, err := hopRequest(ctx, url, body(i), dest, i)
		if err != nil {
			return nil, sent, errs, time.Since(start)
		}
		sent++
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := readStreamed(c, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs++
				return
			}
			out = append(out, st)
		}()
	}
	wg.Wait()
	return out, sent, errs, time.Since(start)
}

func readStreamed(c *http.Client, req *http.Request) (streamTiming, error) {
	var st streamTiming
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return st, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return st, fmt.Errorf("status %d", resp.StatusCode)
	}
	buf := make([]byte, 4096)
	var last time.Time
	st.gaps = make([]time.Duration, 0, HopStreamTokens)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			now := time.Now()
			if last.IsZero() {
				st.firstByte = now.Sub(t0)
			} else {
				st.gaps = append(st.gaps, now.Sub(last))
			}
			last = now
		}
		if err == io.EOF {
			return st, nil
		}
		if err != nil {
			return st, err
		}
	}
}

// streamAnswer writes a streamed chat completion: HopStreamTokens events
// HopStreamInterval apart, then [DONE].
func streamAnswer(w http.ResponseWriter, model string) {
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	chunk := fmt.Appendf(nil, "data: {\"id\":\"chatcmpl-hop-1\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"},\"finish_reason\":null}]}\n\n", model)
	next := time.Now()
	for range HopStreamTokens {
		if _, err := w.Write(chunk); err != nil {
			return
		}
		if fl != nil {
			fl.Flush()
		}
		next = next.Add(HopStreamInterval)
		time.Sleep(time.Until(next))
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// cpuMeter reads the CPU time (user + system) a process has used so far.
type cpuMeter func() (time.Duration, error)

// selfCPU is this process's CPU time.
func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// procCPU reads another process's CPU time from /proc/<pid>/stat (Linux;
// utime and stime in clock ticks of 10 ms, the kernel's fixed USER_HZ).
func procCPU(pid int) cpuMeter {
	return func() (time.Duration, error) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return 0, fmt.Errorf("hop: CPU time of process %d: %w", pid, err)
		}
		return parseProcStatCPU(b)
	}
}

// parseProcStatCPU reads utime + stime from the text of /proc/<pid>/stat.
// The command name (field 2) is in parentheses and may hold spaces or
// parentheses itself, so fields are counted from the last ')'.
func parseProcStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("hop: /proc stat has no command field")
	}
	// After ") " come field 3 (state) onwards; utime and stime are fields 14 and 15.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("hop: /proc stat has %d fields after the command, want at least 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 || v > 1<<40 {
			return 0, fmt.Errorf("hop: /proc stat CPU field %q is not a tick count", s)
		}
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// exchangeCounts reads kvroute_extproc_exchanges_total from the router's
// /metrics: by phase, the messages Envoy waited on and those it did not.
func exchangeCounts(ctx context.Context, url string) (blocking, observed map[string]float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	blocking, observed = map[string]float64{}, map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		phase, isBlocking, v, ok := parseExchangeLine(sc.Text())
		if !ok {
			continue
		}
		if isBlocking {
			blocking[phase] += v
		} else {
			observed[phase] += v
		}
	}
	return blocking, observed, sc.Err()
}

// parseExchangeLine reads one kvroute_extproc_exchanges_total sample of the
// Prometheus text format; ok is false for any other line.
func parseExchangeLine(line string) (phase string, blocking bool, v float64, ok bool) {
	const name = "kvroute_extproc_exchanges_total{"
	if !strings.HasPrefix(line, name) {
		return "", false, 0, false
	}
	labels, val, found := strings.Cut(line[len(name):], "} ")
	if !found {
		return "", false, 0, false
	}
	v, err := strconv.ParseFloat(val, 64)
	if err != nil || !(v >= 0) { // NaN too
		return "", false, 0, false
	}
	return labelValue(labels, "phase"), labelValue(labels, "blocking") == "true", v, true
}

// labelValue finds name="value" in a Prometheus label list.
func labelValue(labels, name string) string {
	i := strings.Index(labels, name+`="`)
	if i < 0 {
		return ""
	}
	rest := labels[i+len(name)+2:]
	if j := strings.IndexByte(rest, '"'); j >= 0 {
		return rest[:j]
	}
	return ""
}
