package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// The index service: kvroute's live KV index answered over HTTP in the
// shape of Dynamo's standalone KV indexer (python -m dynamo.indexer,
// ai-dynamo 1.6; its HTTP API follows the Mooncake KV Indexer RFC), so
// that a client written for that indexer can point at
// http://<admin listener>/index. Read-only: nothing here touches the
// pool's load, the pending overlay or the fleet.
const (
	// IndexQueryPath answers token ids: which workers hold how many
	// leading tokens of the prompt.
	IndexQueryPath = "/index/query"
	// IndexQueryByHashPath answers kvroute router block hashes.
	IndexQueryByHashPath = "/index/query_by_hash"
	// IndexWorkersPath lists the workers the index knows.
	IndexWorkersPath = "/index/workers"

	// MaxIndexQueryTokens bounds token_ids in one query.
	MaxIndexQueryTokens = 1 << 20
	// MaxIndexQueryHashes bounds block_hashes in one query (a
	// MaxIndexQueryTokens prompt at block size 16).
	MaxIndexQueryHashes = 1 << 16
	// maxIndexQueryBody bounds a query's body: a full MaxIndexQueryTokens
	// query written as JSON fits.
	maxIndexQueryBody = 16 << 20

	// defaultGroup is the one tenant (routing group) kvroute has: every
	// worker of a model shares one hash space.
	defaultGroup = "default"
)

// indexQuery is a validated /index/query or /index/query_by_hash body.
type indexQuery struct {
	Model string
	// LoRA is lora_name: the adapter whose blocks are asked for; "" is
	// the base model.
	LoRA string
	// CacheSalt is mixed into the hash chain of a token query as the
	// router does for a request's cache_salt. A hash query ignores it:
	// its hashes are already salted.
	CacheSalt string
	// Tokens (a token query) or Hashes (a hash query) is set, not both.
	Tokens []uint32
	Hashes []uint64
	// BlockSize, when > 0, keeps a hash query to the workers of that
	// block size (required when the model's workers use several).
	BlockSize int
}

// indexQueryWire is the JSON of a query. Unknown fields are ignored, as
// Dynamo's indexer does.
type indexQueryWire struct {
	ModelName    *string           `json:"model_name"`
	TenantID     *string           `json:"tenant_id"`
	RoutingGroup *string           `json:"routing_group"`
	LoraName     *string           `json:"lora_name"`
	CacheSalt    *string           `json:"cache_salt"`
	TokenIDs     []uint32          `json:"token_ids"`
	BlockHashes  []json.RawMessage `json:"block_hashes"`
	BlockSize    *int              `json:"block_size"`
}

// decodeIndexQuery validates a query body: byHash selects block_hashes
// over token_ids. Errors are 400s in the shared error shape, but for a
// tenant other than the one kvroute has, a 404 as Dynamo answers a
// (model, tenant) it has no indexer for.
func decodeIndexQuery(byHash bool, body []byte) (indexQuery, *extproc.HTTPError) {
	var in indexQueryWire
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&in); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return indexQuery{}, badRequest("invalid_"+fieldCode(te.Field), fmt.Sprintf("%s: want %s, got JSON %s", te.Field, wantOf(te.Field), te.Value))
		}
		return indexQuery{}, badRequest("invalid_json", "the body is not a JSON object: "+err.Error())
	}
	if _, err := dec.Token(); err != io.EOF {
		return indexQuery{}, badRequest("invalid_json", "the body holds more than one JSON value")
	}
	if in.ModelName == nil || *in.ModelName == "" {
		return indexQuery{}, badRequest("invalid_model_name", "model_name is required")
	}
	q := indexQuery{Model: *in.ModelName}
	for _, g := range []*string{in.TenantID, in.RoutingGroup} {
		if g != nil && *g != "" && *g != defaultGroup {
			return indexQuery{}, &extproc.HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "no_indexer",
				Message: fmt.Sprintf("no indexer for model=%s tenant=%s: kvroute has one tenant per model, %q", q.Model, *g, defaultGroup)}
		}
	}
	if in.LoraName != nil {
		q.LoRA = *in.LoraName
	}
	if in.CacheSalt != nil {
		q.CacheSalt = *in.CacheSalt
	}
	if in.BlockSize != nil {
		if *in.BlockSize < 1 {
			return indexQuery{}, badRequest("invalid_block_size", "block_size must be at least 1")
		}
		q.BlockSize = *in.BlockSize
	}
	if !byHash {
		switch {
		case in.TokenIDs == nil:
			return indexQuery{}, badRequest("invalid_token_ids", "token_ids is required: a list of token ids (for router block hashes use "+IndexQueryByHashPath+")")
		case len(in.TokenIDs) == 0:
			return indexQuery{}, badRequest("invalid_token_ids", "token_ids is empty")
		case len(in.TokenIDs) > MaxIndexQueryTokens:
			return indexQuery{}, badRequest("too_many_tokens", fmt.Sprintf("%d token ids, at most %d", len(in.TokenIDs), MaxIndexQueryTokens))
		}
		q.Tokens = in.TokenIDs
		return q, nil
	}
	switch {
	case in.BlockHashes == nil:
		return indexQuery{}, badRequest("invalid_block_hashes", "block_hashes is required: a list of kvroute router block hashes (for token ids use "+IndexQueryPath+")")
	case len(in.BlockHashes) == 0:
		return indexQuery{}, badRequest("invalid_block_hashes", "block_hashes is empty")
	case len(in.BlockHashes) > MaxIndexQueryHashes:
		return indexQuery{}, badRequest("too_many_hashes", fmt.Sprintf("%d block hashes, at most %d", len(in.BlockHashes), MaxIndexQueryHashes))
	}
	q.Hashes = make([]uint64, len(in.BlockHashes))
	for i, raw := range in.BlockHashes {
		h, ok := parseBlockHash(raw)
		if !ok {
			return indexQuery{}, badRequest("invalid_block_hashes", fmt.Sprintf("block_hashes[%d] is %.40s: want an integer, signed 64-bit (as Dynamo sends) or unsigned 64-bit", i, raw))
		}
		q.Hashes[i] = h
	}
	return q, nil
}

// parseBlockHash reads one hash: a JSON integer in [-2^63, 2^64). A
// negative one is the two's-complement form of the same 64 bits, as
// Dynamo serializes its u64 hashes as i64.
func parseBlockHash(raw json.RawMessage) (uint64, bool) {
	s := string(raw)
	if len(s) > 0 && s[0] == '-' {
		v, err := strconv.ParseInt(s, 10, 64)
		return uint64(v), err == nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

func fieldCode(field string) string {
	switch field {
	case "model_name", "tenant_id", "routing_group", "lora_name", "cache_salt", "block_size":
		return field
	}
	if len(field) >= 9 && field[:9] == "token_ids" {
		return "token_ids"
	}
	if len(field) >= 12 && field[:12] == "block_hashes" {
		return "block_hashes"
	}
	return "json"
}

func wantOf(field string) string {
	switch fieldCode(field) {
	case "token_ids":
		return "a list of token ids (integers from 0 to 4294967295)"
	case "block_hashes":
		return "a list of integers"
	case "block_size":
		return "an integer"
	}
	return "a string"
}

// indexScores is the answer to a query, in Dynamo's ScoreResponse shape.
// Every count is in tokens (blocks times the worker's block size).
type indexScores struct {
	// Scores: worker -> data-parallel rank -> device-tier matched tokens,
	// for the workers holding at least one leading block on the device.
	Scores map[string]map[string]int `json:"scores"`
	// Frequencies[i] is how many listed workers hold block i of the
	// prompt on the device tier (each worker in its own block size).
	Frequencies []int `json:"frequencies"`
	// Instances: worker -> per-tier breakdown, for the workers holding at
	// least one leading block in any tier.
	Instances map[string]instanceTiers `json:"instances"`
	// StaleWorkers (kvroute's addition) are workers of the model whose
	// view is stale (a gap in their events, awaiting resync): the router
	// gives them no overlap credit, and neither does this answer.
	StaleWorkers []string `json:"stale_workers,omitempty"`
}

// instanceTiers is one worker's match, cumulative through the tiers as in
// Dynamo (Mooncake RFC): GPU <= CPU <= Disk.
type instanceTiers struct {
	LongestMatched int            `json:"longest_matched"`
	GPU            int            `json:"gpu"`
	DP             map[string]int `json:"dp"`
	CPU            int            `json:"cpu"`
	Disk           int            `json:"disk"`
}

// indexTarget is one worker a query asks about.
type indexTarget struct {
	spec      fleet.Worker
	blockSize int
	seed      uint64
}

// indexTargets returns the workers serving q's model (and adapter), with
// the block size and hash seed the picker would use for them.
func (r *Server) indexTargets(pool *scoring.Pool, q indexQuery) []indexTarget {
	name := q.Model
	if q.LoRA != "" {
		name = q.LoRA
	}
	var out []indexTarget
	for _, c := range pool.AppendCandidates(nil, name) {
		spec, ok := pool.Spec(c.Worker)
		if !ok || (q.LoRA != "" && spec.Model != q.Model) {
			continue
		}
		bs := spec.BlockSize
		if r.cfg.BlockSize > 0 {
			bs = r.cfg.BlockSize
		}
		lora := ""
		if name != spec.Model {
			lora = name
		}
		out = append(out, indexTarget{spec: spec, blockSize: bs, seed: kvindex.Seed(spec.Model, lora, q.CacheSalt)})
	}
	return out
}

// answerIndexQuery matches q against the index for the given workers.
// Workers sharing a block size and seed are matched together, as the
// picker does.
func answerIndexQuery(ix kvindex.Matcher, targets []indexTarget, q indexQuery) indexScores {
	out := indexScores{Scores: map[string]map[string]int{}, Frequencies: []int{}, Instances: map[string]instanceTiers{}}
	done := make([]bool, len(targets))
	var ids []string
	var group []int
	var res []kvindex.MatchResult
	var hashes []uint64
	for i := range targets {
		if done[i] {
			continue
		}
		ids, group = ids[:0], group[:0]
		for j := i; j < len(targets); j++ {
			if !done[j] && targets[j].blockSize == targets[i].blockSize && targets[j].seed == targets[i].seed {
				done[j] = true
				ids = append(ids, targets[j].spec.ID)
				group = append(group, j)
			}
		}
		if q.Hashes != nil {
			hashes = q.Hashes
		} else {
			hashes = kvindex.HashBlocks(targets[i].seed, q.Tokens, targets[i].blockSize, hashes[:0])
		}
		if len(hashes) == 0 {
			continue
		}
		res = ix.Match(hashes, ids, res)
		for k, j := range group {
			m, t, id := res[k], targets[j], ids[k]
			if !m.Known {
				continue
			}
			if m.Stale {
				out.StaleWorkers = append(out.StaleWorkers, id)
				continue
			}
			blocks, host, disk := int(m.Blocks), int(m.HostBlocks), int(m.DiskBlocks)
			for len(out.Frequencies) < blocks {
				out.Frequencies = append(out.Frequencies, 0)
			}
			for b := range blocks {
				out.Frequencies[b]++
			}
			if blocks+host+disk == 0 {
				continue
			}
			dp := strconv.Itoa(t.spec.DPRank)
			gpu := blocks * t.blockSize
			cpu := gpu + host*t.blockSize
			dsk := cpu + disk*t.blockSize
			if gpu > 0 {
				out.Scores[id] = map[string]int{dp: gpu}
			}
			out.Instances[id] = instanceTiers{LongestMatched: dsk, GPU: gpu, DP: map[string]int{dp: gpu}, CPU: cpu, Disk: dsk}
		}
	}
	sort.Strings(out.StaleWorkers)
	return out
}

// handleIndexQuery serves IndexQueryPath (byHash false) and
// IndexQueryByHashPath.
func (r *Server) handleIndexQuery(byHash bool) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxIndexQueryBody))
		if err != nil {
			writeError(w, &extproc.HTTPError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "body_too_large",
				Message: fmt.Sprintf("the body passes %d bytes", maxIndexQueryBody)})
			return
		}
		q, herr := decodeIndexQuery(byHash, body)
		if herr != nil {
			writeError(w, herr)
			return
		}
		targets := r.indexTargets(r.sched.Load().Pool(), q)
		if len(targets) == 0 {
			what := "model_name " + strconv.Quote(q.Model)
			if q.LoRA != "" {
				what += " with lora_name " + strconv.Quote(q.LoRA)
			}
			writeError(w, &extproc.HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found",
				Message: "no worker serves " + what + "; GET " + IndexWorkersPath + " lists the workers"})
			return
		}
		if byHash {
			kept := targets[:0]
			sizes := map[int]bool{}
			for _, t := range targets {
				sizes[t.blockSize] = true
				if q.BlockSize == 0 || t.blockSize == q.BlockSize {
					kept = append(kept, t)
				}
			}
			switch {
			case q.BlockSize == 0 && len(sizes) > 1:
				writeError(w, badRequest("ambiguous_block_size", fmt.Sprintf("the workers of %q use %d block sizes: say which the hashes are of with block_size", q.Model, len(sizes))))
				return
			case len(kept) == 0:
				writeError(w, &extproc.HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found",
					Message: fmt.Sprintf("no worker of %q has block size %d", q.Model, q.BlockSize)})
				return
			}
			targets = kept
		}
		writeJSON(w, http.StatusOK, answerIndexQuery(r.index, targets, q))
	}
}

// indexWorker is one worker on IndexWorkersPath: Dynamo's
// {instance_id, endpoints} and what kvroute knows besides.
type indexWorker struct {
	InstanceID string `json:"instance_id"`
	// Endpoints: data-parallel rank -> the KV events endpoint of the
	// worker's record; empty when the fleet-wide events port applies.
	Endpoints    map[string]string `json:"endpoints"`
	ModelName    string            `json:"model_name"`
	TenantID     string            `json:"tenant_id"`
	BlockSize    int               `json:"block_size"`
	LoRAAdapters []string          `json:"lora_adapters,omitempty"`
	// CachedBlocks and Stale are the index's view of the worker.
	CachedBlocks int  `json:"cached_blocks"`
	Stale        bool `json:"stale"`
}

// handleIndexWorkers lists the fleet as the index sees it; ?model_name=
// and ?tenant_id= filter as in Dynamo.
func (r *Server) handleIndexWorkers(w http.ResponseWriter, req *http.Request) {
	model, tenant := req.URL.Query().Get("model_name"), req.URL.Query().Get("tenant_id")
	out := []indexWorker{}
	if tenant != "" && tenant != defaultGroup {
		writeJSON(w, http.StatusOK, out)
		return
	}
	st := r.index.Stats()
	byID := map[string]kvindex.WorkerStats{}
	for _, ws := range st.PerWorker {
		byID[ws.ID] = ws
	}
	pool := r.sched.Load().Pool()
	for _, rec := range r.fleet.snapshot() {
		spec, ok := pool.Spec(rec.ID)
		if !ok {
			spec = rec
		}
		if model != "" && spec.Model != model {
			continue
		}
		bs := spec.BlockSize
		if r.cfg.BlockSize > 0 {
			bs = r.cfg.BlockSize
		}
		eps := map[string]string{}
		if spec.EventsEndpoint != "" {
			eps[strconv.Itoa(spec.DPRank)] = spec.EventsEndpoint
		}
		ws := byID[rec.ID]
		out = append(out, indexWorker{InstanceID: rec.ID, Endpoints: eps, ModelName: spec.Model, TenantID: defaultGroup,
			BlockSize: bs, LoRAAdapters: spec.LoRAAdapters, CachedBlocks: ws.Blocks, Stale: ws.Stale})
	}
	writeJSON(w, http.StatusOK, out)
}
