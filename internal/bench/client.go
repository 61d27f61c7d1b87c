package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
)

// Result is what one request measured.
type Result struct {
	// Start is when the request was sent.
	Start time.Time
	// TTFT is the time to the first generated token; E2E to the end of
	// the stream.
	TTFT, E2E time.Duration
	// FirstEmit is when the worker wrote the first token (its "kvsim_t"
	// stamp; zero when the chunk carried none). Start.Add(TTFT) minus
	// FirstEmit is how long that token took to reach the client, which
	// tells delay in the path or the client apart from the worker's.
	FirstEmit time.Time
	// ITL holds the gaps between consecutive token events, in ms: from the
	// worker's emit stamps ("kvsim_t") when both events carry one, else
	// from when each event was parsed. Stamps matter because events the
	// worker wrote together, or that a proxy coalesced, arrive in one read
	// and would otherwise look simultaneous.
	ITL []float32
	// Worker is who served the request, read from the response id that
	// kvsim writes as "cmpl-<worker>-<n>" ("" when unknown).
	Worker string
	// PromptTokens and CachedTokens come from usage; OutputTokens counts
	// the token chunks.
	PromptTokens, CachedTokens, OutputTokens int
	// PredictedCached is the router's prediction of CachedTokens, echoed
	// by kvsim (header x-kvroute-predicted-cached-tokens or the usage
	// chunk's kvroute_predicted_cached_tokens); nil when there was none.
	PredictedCached *int
	// Ref is the request's place in the workload and Follows the request
	// whose prefix it continues (nil for none); Run fills both in.
	Ref     ItemRef
	Follows *ItemRef
	// Status is the HTTP status; Err is set for any failed request.
	Status int
	Err    error
}

// Client sends OpenAI streaming requests and measures them.
type Client struct {
	// BaseURL is the gateway's (or any OpenAI server's) base URL.
	BaseURL string
	// HTTP is the client used; nil makes one with keep-alive sized for
	// many concurrent streams.
	HTTP *http.Client
}

// NewClient returns a client for baseURL with a transport tuned for
// hundreds of concurrent streams to one host.
func NewClient(baseURL string) *Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        2048,
		MaxIdleConnsPerHost: 2048,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &Client{BaseURL: baseURL, HTTP: &http.Client{Transport: tr}}
}

// Close releases idle connections.
func (c *Client) Close() {
	if c.HTTP != nil {
		c.HTTP.CloseIdleConnections()
	}
}

var (
	dataPrefix  = []byte("data: ")
	doneMarker  = []byte("[DONE]")
	usageKey    = []byte(`"usage":{`)
	errorKey    = []byte(`"error":`)
	textKey     = []byte(`"text":"`)
	contentKey  = []byte(`"content":"`)
	idKey       = []byte(`"id":"`)
	stampKey    = []byte(`"kvsim_t":`)
	errNoTokens = errors.New("stream ended without [DONE]")
)

// usageChunk is the part of the last SSE chunk that carries usage.
type usageChunk struct {
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Predicted *int `json:"kvroute_predicted_cached_tokens"`
}

// Do sends one item and reads its stream to the end. It never returns an
// error: failures are in Result.Err.
func (c *Client) Do(ctx context.Context, it *Item) Result {
	res := Result{Start: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+it.Path, bytes.NewReader(it.Body))
	if err != nil {
		res.Err = err
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		res.Err = fmt.Errorf("send: %w", err)
		res.E2E = time.Since(res.Start)
		return res
	}
	defer func() { _ = resp.Body.Close() }()
	res.Status = resp.StatusCode
	if v := resp.Header.Get(sim.PredictedCachedTokensHeader); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			res.PredictedCached = &n
		}
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		res.Err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		res.E2E = time.Since(res.Start)
		return res
	}
	res.Err = readStream(resp.Body, &res, it.OutputLen)
	res.E2E = time.Since(res.Start)
	return res
}

// readStream parses the SSE body, timing each token event. Token chunks are
// recognized by scanning for a non-empty "text" or "content" value instead
// of decoding every chunk, which keeps the client's cost per token small;
// only the usage chunk is decoded.
func readStream(body io.Reader, res *Result, expect int) error {
	br := bufio.NewReaderSize(body, 16<<10)
	var last time.Time
	var lastStamp int64 // the previous token's worker stamp, 0 for none
	if expect > 0 {
		res.ITL = make([]float32, 0, expect)
	}
	for {
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) {
				return errNoTokens
			}
			return fmt.Errorf("read stream: %w", err)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			// A chunk longer than the buffer: copy what was read before
			// the buffer is reused, then read the rest of the line.
			head := append([]byte(nil), line...)
			rest, err2 := br.ReadBytes('\n')
			if err2 != nil && !errors.Is(err2, io.EOF) {
				return fmt.Errorf("read stream: %w", err2)
			}
			line = append(head, rest...)
		}
		data, ok := bytes.CutPrefix(line, dataPrefix)
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if bytes.Equal(data, doneMarker) {
			return nil
		}
		now := time.Now()
		if res.Worker == "" {
			res.Worker = WorkerFromID(data)
		}
		if bytes.Contains(data, usageKey) {
			var u usageChunk
			if err := json.Unmarshal(data, &u); err != nil {
				return fmt.Errorf("usage chunk: %w", err)
			}
			if u.Usage != nil {
				res.PromptTokens = u.Usage.PromptTokens
				if d := u.Usage.PromptTokensDetails; d != nil {
					res.CachedTokens = d.CachedTokens
				}
			}
			if u.Predicted != nil && *u.Predicted >= 0 {
				res.PredictedCached = u.Predicted
			}
			continue
		}
		if hasToken(data) {
			stamp := emitStamp(data)
			switch {
			case res.OutputTokens == 0:
				// TTFT stays client-side: the worker's clock need not be ours.
				res.TTFT = now.Sub(res.Start)
				if stamp > 0 {
					res.FirstEmit = time.Unix(0, stamp)
				}
			case stamp > 0 && lastStamp > 0 && stamp >= lastStamp:
				res.ITL = append(res.ITL, float32(float64(stamp-lastStamp)/1e6))
			default:
				res.ITL = append(res.ITL, float32(now.Sub(last).Seconds()*1000))
			}
			res.OutputTokens++
			last, lastStamp = now, stamp
			continue
		}
		if bytes.Contains(data, errorKey) {
			return fmt.Errorf("stream error: %s", data)
		}
	}
}

// emitStamp reads a chunk's "kvsim_t" (the worker's emit time in Unix
// nanoseconds); 0 when absent or malformed.
func emitStamp(data []byte) int64 {
	i := bytes.Index(data, stampKey)
	if i < 0 {
		return 0
	}
	rest := bytes.TrimLeft(data[i+len(stampKey):], " ")
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	n, err := strconv.ParseInt(string(rest[:end]), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// hasToken reports whether a chunk carries generated text: a "text" or
// "content" string that is not empty.
func hasToken(data []byte) bool {
	for _, key := range [][]byte{textKey, contentKey} {
		if i := bytes.Index(data, key); i >= 0 && i+len(key) < len(data) && data[i+len(key)] != '"' {
			return true
		}
	}
	return false
}

// WorkerFromID extracts <worker> from a kvsim response id "cmpl-<worker>-<n>" or
// "chatcmpl-<worker>-<n>".
func WorkerFromID(data []byte) string {
	i := bytes.Index(data, idKey)
	if i < 0 {
		return ""
	}
	id := data[i+len(idKey):]
	end := bytes.IndexByte(id, '"')
	if end < 0 {
		return ""
	}
	id = id[:end]
	first := bytes.IndexByte(id, '-')
	lastDash := bytes.LastIndexByte(id, '-')
	if first < 0 || lastDash <= first {
		return ""
	}
	return string(id[first+1 : lastDash])
}
