//go:build llmdsim || vllm

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/internal/bench"
)

// Helpers shared by the third-party engine tests (llm-d-inference-sim and
// vLLM): chats through Envoy, with the router's prediction and the serving
// worker echoed back.

func freeTCPPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// turn is what one chat request measured through Envoy.
type turn struct {
	session, index int
	servedBy       string // the worker address Envoy sent it to
	cached         int    // the engine's usage.prompt_tokens_details.cached_tokens
	predicted      int    // kvroute's prediction; -1 when none
	prompt         int
	err            error
}

// chatTurn sends one non-streamed chat completion through Envoy.
func chatTurn(ctx context.Context, url string, messages []map[string]string) (turn, string) {
	body, _ := json.Marshal(map[string]any{"model": model, "messages": messages, "max_tokens": 8})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return turn{err: err}, ""
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	tr := turn{servedBy: resp.Header.Get(servedByHeader), predicted: -1}
	if v, err := strconv.Atoi(resp.Header.Get(extproc.PredictedCachedTokensHeader)); err == nil {
		tr.predicted = v
	}
	if resp.StatusCode != http.StatusOK {
		tr.err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(raw))
		return tr, ""
	}
	var out struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) == 0 {
		tr.err = fmt.Errorf("answer %s: %w", raw, err)
		return tr, ""
	}
	tr.cached, tr.prompt = out.Usage.PromptTokensDetails.CachedTokens, out.Usage.PromptTokens
	return tr, out.Choices[0].Message.Content
}

// runChats plays sessions of multi-turn chats, the sessions concurrently
// and each one's turns in order, every session with its own long system
// prompt.
func runChats(ctx context.Context, url string, sessions, turns int, tag string) []turn {
	var mu sync.Mutex
	var all []turn
	var wg sync.WaitGroup
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sys := fmt.Sprintf("Session %s-%d. You are a careful assistant for a team that ships a router for LLM fleets; "+
				"answer in short sentences, cite the file you read, and never invent a flag. ", tag, s)
			msgs := []map[string]string{{"role": "system", "content": strings.Repeat(sys, 4)}}
			for i := range turns {
				msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("Question %d of session %s-%d: what does the next step do, and why?", i, tag, s)})
				tr, answer := chatTurn(ctx, url, msgs)
				tr.session, tr.index = s, i
				mu.Lock()
				all = append(all, tr)
				mu.Unlock()
				if tr.err != nil {
					return
				}
				msgs = append(msgs, map[string]string{"role": "assistant", "content": answer})
			}
		}()
	}
	wg.Wait()
	return all
}

func waitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// servedByHeader names the worker address that served, set by Envoy.
const servedByHeader = "x-served-by"

// echoRouting makes Envoy answer every client with kvroute's prediction of
// the cached prompt tokens (the request header the router set) and the
// address of the worker that served, so the test can hold them against the
// engine's own usage.cached_tokens. kvsim echoes the prediction itself; a
// third-party engine does not.
var echoRouting = bench.EditHCM(func(hcm *hcmv3.HttpConnectionManager) error {
	if rc := hcm.GetRouteConfig(); rc != nil {
		rc.ResponseHeadersToAdd = append(rc.ResponseHeadersToAdd,
			&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: extproc.PredictedCachedTokensHeader,
				Value: "%REQ(" + extproc.PredictedCachedTokensHeader + ")%"}},
			&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: servedByHeader, Value: "%UPSTREAM_REMOTE_ADDRESS%"}})
	}
	return nil
})
