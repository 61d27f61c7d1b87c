package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
)

func TestDecodeIndexQuery(t *testing.T) {
	for _, tc := range []struct {
		name   string
		byHash bool
		body   string
		status int    // the error's status; 0 for none
		code   string // the error's code
		want   indexQuery
	}{
		{name: "tokens", body: `{"model_name":"m","token_ids":[1,2,3]}`, want: indexQuery{Model: "m", Tokens: []uint32{1, 2, 3}}},
		{name: "tokens, default tenant, lora and salt", body: `{"model_name":"m","tenant_id":"default","lora_name":"a","cache_salt":"s","token_ids":[7]}`,
			want: indexQuery{Model: "m", LoRA: "a", CacheSalt: "s", Tokens: []uint32{7}}},
		{name: "unknown fields ignored", body: `{"model_name":"m","token_ids":[7],"x":{"y":1}}`, want: indexQuery{Model: "m", Tokens: []uint32{7}}},
		{name: "hashes, unsigned and signed", byHash: true, body: `{"model_name":"m","block_hashes":[18446744073709551615,-1,5],"block_size":16}`,
			want: indexQuery{Model: "m", Hashes: []uint64{^uint64(0), ^uint64(0), 5}, BlockSize: 16}},
		{name: "no model", body: `{"token_ids":[1]}`, status: 400, code: "invalid_model_name"},
		{name: "empty model", body: `{"model_name":"","token_ids":[1]}`, status: 400, code: "invalid_model_name"},
		{name: "model a number", body: `{"model_name":7,"token_ids":[1]}`, status: 400, code: "invalid_model_name"},
		{name: "another tenant", body: `{"model_name":"m","tenant_id":"acme","token_ids":[1]}`, status: 404, code: "no_indexer"},
		{name: "another routing group", body: `{"model_name":"m","routing_group":"g","token_ids":[1]}`, status: 404, code: "no_indexer"},
		{name: "no tokens", body: `{"model_name":"m"}`, status: 400, code: "invalid_token_ids"},
		{name: "empty tokens", body: `{"model_name":"m","token_ids":[]}`, status: 400, code: "invalid_token_ids"},
		{name: "negative token", body: `{"model_name":"m","token_ids":[1,-2]}`, status: 400, code: "invalid_token_ids"},
		{name: "token past uint32", body: `{"model_name":"m","token_ids":[4294967296]}`, status: 400, code: "invalid_token_ids"},
		{name: "tokens a string", body: `{"model_name":"m","token_ids":"1 2"}`, status: 400, code: "invalid_token_ids"},
		{name: "hashes on the token path", body: `{"model_name":"m","block_hashes":[1]}`, status: 400, code: "invalid_token_ids"},
		{name: "no hashes", byHash: true, body: `{"model_name":"m","token_ids":[1]}`, status: 400, code: "invalid_block_hashes"},
		{name: "empty hashes", byHash: true, body: `{"model_name":"m","block_hashes":[]}`, status: 400, code: "invalid_block_hashes"},
		{name: "hash past uint64", byHash: true, body: `{"model_name":"m","block_hashes":[18446744073709551616]}`, status: 400, code: "invalid_block_hashes"},
		{name: "hash below int64", byHash: true, body: `{"model_name":"m","block_hashes":[-9223372036854775809]}`, status: 400, code: "invalid_block_hashes"},
		{name: "hash a float", byHash: true, body: `{"model_name":"m","block_hashes":[1.5]}`, status: 400, code: "invalid_block_hashes"},
		{name: "hash a string", byHash: true, body: `{"model_name":"m","block_hashes":["1"]}`, status: 400, code: "invalid_block_hashes"},
		{name: "zero block size", byHash: true, body: `{"model_name":"m","block_hashes":[1],"block_size":0}`, status: 400, code: "invalid_block_size"},
		{name: "not JSON", body: `{"model_name":`, status: 400, code: "invalid_json"},
		{name: "not an object", body: `[1]`, status: 400, code: "invalid_json"},
		{name: "two values", body: `{"model_name":"m","token_ids":[1]} {}`, status: 400, code: "invalid_json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, herr := decodeIndexQuery(tc.byHash, []byte(tc.body))
			if tc.code != "" {
				if herr == nil || herr.Code != tc.code || herr.Status != tc.status {
					t.Fatalf("got %+v, %v; want a %d %s", q, herr, tc.status, tc.code)
				}
				return
			}
			if herr != nil {
				t.Fatalf("unexpected error %v", herr)
			}
			if !reflect.DeepEqual(q, tc.want) {
				t.Fatalf("got %+v, want %+v", q, tc.want)
			}
		})
	}
}

func TestDecodeIndexQueryLimits(t *testing.T) {
	body := func(field string, n int) []byte {
		return []byte(fmt.Sprintf(`{"model_name":"m",%q:[%s0]}`, field, strings.Repeat("0,", n-1)))
	}
	if _, herr := decodeIndexQuery(false, body("token_ids", MaxIndexQueryTokens)); herr != nil {
		t.Fatalf("%d tokens refused: %v", MaxIndexQueryTokens, herr)
	}
	if _, herr := decodeIndexQuery(false, body("token_ids", MaxIndexQueryTokens+1)); herr == nil || herr.Code != "too_many_tokens" {
		t.Fatalf("%d tokens: %v, want too_many_tokens", MaxIndexQueryTokens+1, herr)
	}
	if _, herr := decodeIndexQuery(true, body("block_hashes", MaxIndexQueryHashes+1)); herr == nil || herr.Code != "too_many_hashes" {
		t.Fatalf("%d hashes: %v, want too_many_hashes", MaxIndexQueryHashes+1, herr)
	}
}

func FuzzDecodeIndexQuery(f *testing.F) {
	for _, s := range []string{
		`{"model_name":"m","token_ids":[1,2,3]}`,
		`{"model_name":"m","tenant_id":"default","lora_name":"a","cache_salt":"s","token_ids":[7]}`,
		`{"model_name":"m","block_hashes":[18446744073709551615,-1,5],"block_size":16}`,
		`{"model_name":"m","block_hashes":[1e3]}`,
		`{"model_name":"m","token_ids":[4294967296]}`,
		`[`, `null`, `{}`,
	} {
		f.Add(false, []byte(s))
		f.Add(true, []byte(s))
	}
	f.Fuzz(func(t *testing.T, byHash bool, body []byte) {
		q, herr := decodeIndexQuery(byHash, body)
		if herr != nil {
			if herr.Status != http.StatusBadRequest && herr.Status != http.StatusNotFound {
				t.Fatalf("status %d", herr.Status)
			}
			if !json.Valid(herr.Body()) {
				t.Fatalf("error body not JSON: %s", herr.Body())
			}
			return
		}
		if q.Model == "" {
			t.Fatal("accepted without a model")
		}
		if byHash && (len(q.Hashes) == 0 || len(q.Hashes) > MaxIndexQueryHashes || q.Tokens != nil) {
			t.Fatalf("hash query with %d hashes, %d tokens", len(q.Hashes), len(q.Tokens))
		}
		if !byHash && (len(q.Tokens) == 0 || len(q.Tokens) > MaxIndexQueryTokens || q.Hashes != nil) {
			t.Fatalf("token query with %d tokens, %d hashes", len(q.Tokens), len(q.Hashes))
		}
	})
}

// postIndex posts body to the admin listener's path.
func postIndex(t *testing.T, r *Server, path, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post("http://"+r.AdminAddr()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", path, ct)
	}
	return resp.StatusCode, b
}

// The index service answers from the live index fed by vLLM KV events:
// w1 holds the prompt's first four blocks on the device, w2 the first two
// on the device and the next two in host memory, w0 nothing. By tokens
// and by router block hashes (unsigned or as Dynamo's i64), the answer
// lists w1 and w2 with their leading tokens per tier and leaves w0 out.
func TestIndexQueryAnswersFromTheLiveIndex(t *testing.T) {
	testenv.Quiet()
	r, _ := startReady(t, 3)
	nc, err := nats.Connect(r.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const bs = 16
	tokens := make([]uint32, 6*bs+5) // six full blocks and a partial one
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	engine := func(worker string, i int) vllmwire.EngineHash {
		return vllmwire.HashInt(int64(1000*len(worker) + 100*int(worker[1]) + i))
	}
	store := func(worker string, seq uint64, from, to int, medium string) {
		t.Helper()
		hs := make([]vllmwire.EngineHash, 0, to-from)
		for i := from; i < to; i++ {
			hs = append(hs, engine(worker, i))
		}
		ev := vllmwire.BlockStored{BlockHashes: hs, TokenIDs: tokens[from*bs : to*bs], BlockSize: bs}
		if from > 0 {
			p := engine(worker, from-1)
			ev.ParentBlockHash = &p
		}
		if medium != "" {
			ev.Medium = &medium
		}
		if err := bus.PublishEvents(nc, r.cfg.Namespace, worker, seq, vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{ev}}); err != nil {
			t.Fatal(err)
		}
	}
	store("w1", 0, 0, 4, "")
	store("w2", 0, 0, 2, "")
	store("w2", 1, 2, 4, vllmwire.MediumCPU)
	eventually(t, "index holds the blocks", func() bool {
		st := r.Index().Stats()
		off := 0
		for _, w := range st.PerWorker {
			off += w.OffDeviceBlocks
		}
		return st.Entries == 6 && off == 2
	})

	want := indexScores{
		Scores:      map[string]map[string]int{"w1": {"0": 64}, "w2": {"0": 32}},
		Frequencies: []int{2, 2, 1, 1},
		Instances: map[string]instanceTiers{
			"w1": {LongestMatched: 64, GPU: 64, DP: map[string]int{"0": 64}, CPU: 64, Disk: 64},
			"w2": {LongestMatched: 64, GPU: 32, DP: map[string]int{"0": 32}, CPU: 64, Disk: 64},
		},
	}
	check := func(t *testing.T, path, body string) {
		t.Helper()
		status, b := postIndex(t, r, path, body)
		if status != 200 {
			t.Fatalf("%s: %d %s", path, status, b)
		}
		var got indexScores
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s answered\n%s\nwant %+v", path, b, want)
		}
	}
	ids, _ := json.Marshal(tokens)
	hashes := kvindex.HashBlocks(kvindex.Seed(model, "", ""), tokens, bs, nil)
	unsigned, _ := json.Marshal(hashes)
	signed := make([]int64, len(hashes))
	for i, h := range hashes {
		signed[i] = int64(h)
	}
	i64, _ := json.Marshal(signed)

	t.Run("by tokens", func(t *testing.T) {
		check(t, IndexQueryPath, fmt.Sprintf(`{"model_name":%q,"token_ids":%s}`, model, ids))
	})
	t.Run("by router block hashes", func(t *testing.T) {
		check(t, IndexQueryByHashPath, fmt.Sprintf(`{"model_name":%q,"tenant_id":"default","block_hashes":%s}`, model, unsigned))
	})
	t.Run("by router block hashes as Dynamo's i64", func(t *testing.T) {
		check(t, IndexQueryByHashPath, fmt.Sprintf(`{"model_name":%q,"block_hashes":%s}`, model, i64))
	})
	t.Run("a salted prompt matches nothing", func(t *testing.T) {
		status, b := postIndex(t, r, IndexQueryPath, fmt.Sprintf(`{"model_name":%q,"cache_salt":"other","token_ids":%s}`, model, ids))
		if status != 200 || !strings.Contains(string(b), `"scores": {}`) || !strings.Contains(string(b), `"instances": {}`) {
			t.Fatalf("%d %s", status, b)
		}
	})
	t.Run("errors", func(t *testing.T) {
		for _, tc := range []struct {
			path, body string
			status     int
			code       string
		}{
			{IndexQueryPath, fmt.Sprintf(`{"model_name":"nope","token_ids":%s}`, ids), 404, "model_not_found"},
			{IndexQueryPath, fmt.Sprintf(`{"model_name":%q,"lora_name":"nope","token_ids":%s}`, model, ids), 404, "model_not_found"},
			{IndexQueryPath, fmt.Sprintf(`{"model_name":%q,"tenant_id":"acme","token_ids":%s}`, model, ids), 404, "no_indexer"},
			{IndexQueryPath, fmt.Sprintf(`{"model_name":%q,"token_ids":[]}`, model), 400, "invalid_token_ids"},
			{IndexQueryPath, fmt.Sprintf(`{"model_name":%q,"token_ids":[%s0]}`, model, strings.Repeat("0,", MaxIndexQueryTokens)), 400, "too_many_tokens"},
			{IndexQueryByHashPath, fmt.Sprintf(`{"model_name":%q,"block_hashes":%s,"block_size":32}`, model, unsigned), 404, "model_not_found"},
			{IndexQueryByHashPath, `{"model_name":`, 400, "invalid_json"},
		} {
			status, b := postIndex(t, r, tc.path, tc.body)
			var e struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal(b, &e); err != nil || status != tc.status || e.Error.Code != tc.code || e.Error.Message == "" {
				t.Errorf("%s %.80s: %d %s; want %d %s", tc.path, tc.body, status, b, tc.status, tc.code)
			}
		}
		if got := get(t, "http://"+r.AdminAddr()+IndexQueryPath, 405); !strings.Contains(got, "method_not_allowed") {
			t.Errorf("GET %s: %s", IndexQueryPath, got)
		}
		if got := get(t, "http://"+r.HTTPAddr()+IndexQueryPath, 404); !strings.Contains(got, "admin listener") {
			t.Errorf("the query on the HTTP port: %s", got)
		}
	})
	t.Run("workers", func(t *testing.T) {
		var ws []indexWorker
		if err := json.Unmarshal([]byte(get(t, "http://"+r.AdminAddr()+IndexWorkersPath+"?model_name="+model, 200)), &ws); err != nil {
			t.Fatal(err)
		}
		if len(ws) != 3 || ws[1].InstanceID != "w1" || ws[1].CachedBlocks != 4 || ws[1].BlockSize != bs || ws[1].ModelName != model || ws[1].TenantID != "default" {
			t.Fatalf("workers %+v", ws)
		}
		if got := get(t, "http://"+r.AdminAddr()+IndexWorkersPath+"?model_name=nope", 200); strings.TrimSpace(got) != "[]" {
			t.Fatalf("workers of an unknown model: %s", got)
		}
	})
	t.Run("read-only", func(t *testing.T) {
		if n := activeRequests(r); n != 0 {
			t.Fatalf("%d requests active after the queries", n)
		}
		if st := r.Index().Stats(); st.Entries != 6 {
			t.Fatalf("index entries %d after the queries, want 6", st.Entries)
		}
	})
}

// A worker whose view is stale gets no credit and is named apart; a
// worker the index does not know is left out; workers of two block sizes
// are each matched in their own.
func TestAnswerIndexQueryStaleAndBlockSizes(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(i + 7)
	}
	feed := func(id string, bs int) indexTarget {
		ix.AddWorker(id, "m", bs)
		n := len(tokens) / bs
		hs := make([]vllmwire.EngineHash, n)
		for i := range hs {
			hs[i] = vllmwire.HashInt(int64(100*bs + i + 1))
		}
		ix.Apply(id, vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: hs, TokenIDs: tokens[:n*bs], BlockSize: bs}}})
		return indexTarget{spec: fleet.Worker{ID: id, Model: "m", BlockSize: bs}, blockSize: bs, seed: kvindex.Seed("m", "", "")}
	}
	targets := []indexTarget{feed("a", 16), feed("b", 32), feed("s", 16),
		{spec: fleet.Worker{ID: "ghost", Model: "m", BlockSize: 16}, blockSize: 16, seed: kvindex.Seed("m", "", "")}}
	ix.MarkStale("s")
	got := answerIndexQuery(ix, targets, indexQuery{Model: "m", Tokens: tokens[:60]})
	want := indexScores{
		Scores:      map[string]map[string]int{"a": {"0": 48}, "b": {"0": 32}},
		Frequencies: []int{2, 1, 1},
		Instances: map[string]instanceTiers{
			"a": {LongestMatched: 48, GPU: 48, DP: map[string]int{"0": 48}, CPU: 48, Disk: 48},
			"b": {LongestMatched: 32, GPU: 32, DP: map[string]int{"0": 32}, CPU: 32, Disk: 32},
		},
		StaleWorkers: []string{"s"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}
