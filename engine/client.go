package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// maxBody bounds what is read from any engine endpoint.
const maxBody = 8 << 20

// Client talks to one engine's HTTP server: /health, /v1/models,
// /metrics and SGLang's /get_server_info.
type Client struct {
	base   string // e.g. "http://127.0.0.1:8000"
	engine Engine
	http   *http.Client
}

// NewClient returns a client for the engine at base (e.g.
// "http://127.0.0.1:8000") whose metrics speak engine's dialect; each
// request is bounded by timeout.
func NewClient(base string, engine Engine, timeout time.Duration) *Client {
	return &Client{
		base:   strings.TrimRight(base, "/"),
		engine: engine,
		http:   &http.Client{Timeout: timeout},
	}
}

func (c *Client) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	// Ask for the classic text format; prometheus_client would otherwise
	// honour an OpenMetrics or protobuf preference.
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("GET %s: read body: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", path, resp.StatusCode)
	}
	return body, nil
}

// Health reports whether /health answers 200.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.get(ctx, "/health")
	return err
}

// Models is what /v1/models says the engine serves.
type Models struct {
	// Base is the served model name (the first entry that is not a LoRA
	// adapter).
	Base string
	// Adapters are the LoRA adapters loaded on top of Base.
	Adapters []string
}

// ParseModels reads an OpenAI-style /v1/models answer as vLLM and SGLang
// produce it: entries whose "parent" is set are LoRA adapters of that
// parent; the first entry without a parent is the served base model.
// Further parentless entries (extra --served-model-name aliases) are
// ignored: the router would hash their prompts under a different seed.
func ParseModels(data []byte) (Models, error) {
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return Models{}, fmt.Errorf("/v1/models: %w", err)
	}
	var m Models
	for _, e := range list.Data {
		if e.ID == "" {
			continue
		}
		if e.Parent != nil && *e.Parent != "" {
			m.Adapters = append(m.Adapters, e.ID)
			continue
		}
		if m.Base == "" {
			m.Base = e.ID
		}
	}
	if m.Base == "" {
		return Models{}, errors.New("/v1/models lists no base model")
	}
	return m, nil
}

// Models reads /v1/models.
func (c *Client) Models(ctx context.Context) (Models, error) {
	body, err := c.get(ctx, "/v1/models")
	if err != nil {
		return Models{}, err
	}
	return ParseModels(body)
}

// Metrics scrapes and parses /metrics.
func (c *Client) Metrics(ctx context.Context) (EngineMetrics, error) {
	body, err := c.get(ctx, "/metrics")
	if err != nil {
		return EngineMetrics{}, err
	}
	return ParseMetrics(c.engine, bytes.NewReader(body))
}

// SGLangPageSize asks SGLang's /get_server_info for its KV page size, the
// block size of its KV events. Zero means the server did not say.
func (c *Client) SGLangPageSize(ctx context.Context) int {
	body, err := c.get(ctx, "/get_server_info")
	if err != nil {
		return 0
	}
	var info struct {
		PageSize int `json:"page_size"`
	}
	if json.Unmarshal(body, &info) != nil || info.PageSize < 0 {
		return 0
	}
	return info.PageSize
}
