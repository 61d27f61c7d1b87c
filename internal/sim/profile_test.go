package sim

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The measurements the profiles were fitted to, as tools/gpu's scripts
// write them (internal/sim/testdata/gpu).
type flashCalib struct {
	Prefill []prefillPoint `json:"prefill"`
	Decode  []decodeRow    `json:"decode"`
}

type prefillPoint struct {
	Backend string  `json:"backend"`
	Cached  int     `json:"cached"`
	New     int     `json:"new"`
	Ms      float64 `json:"ms"`
}

type decodeRow struct {
	Batch int     `json:"batch"`
	Ctx   int     `json:"ctx"`
	Ms    float64 `json:"ms"`
}

type decodeMixCalib struct {
	Decode []decodeRow `json:"decode"`
	Mix    []struct {
		Reqs       [][2]int `json:"reqs"` // [cached, new]
		TogetherMs float64  `json:"together_ms"`
	} `json:"mix"`
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// passResult runs one engine pass over requests of (cached, new) tokens,
// as the measurements did: each request's cached prefix is computed and
// cached first by a request of its own, then every request comes at once
// and the engine prefills them in one step. It returns a copy of that
// step's result.
func passResult(t *testing.T, reqs [][2]int) StepResult {
	t.Helper()
	total := 0
	for _, r := range reqs {
		total += r[1]
	}
	e, _ := newTestEngine(t, EngineConfig{MaxNumBatchedTokens: total})
	for i, r := range reqs {
		if r[0] == 0 {
			continue
		}
		if err := e.Add(uint64(1000+i), seq(10_000_000*(i+1), r[0]), 1); err != nil {
			t.Fatal(err)
		}
		drain(t, e)
	}
	for i, r := range reqs {
		prompt := append(seq(10_000_000*(i+1), r[0]), seq(10_000_000*(i+1)+5_000_000, r[1])...)
		if err := e.Add(uint64(i), prompt, 1); err != nil {
			t.Fatal(err)
		}
	}
	res := *e.Step()
	if res.Scheduled != len(reqs) || res.PrefillTokens != total || res.DecodeTokens != 0 {
		t.Fatalf("pass %v: scheduled %d, prefill %d, decode %d: want all %d requests prefilled in one step",
			reqs, res.Scheduled, res.PrefillTokens, res.DecodeTokens, len(reqs))
	}
	return res
}

// decodeResult runs batch requests of ctx prompt tokens to their first
// token in one step, and returns a copy of the decode step that follows.
func decodeResult(t *testing.T, batch, ctx int) StepResult {
	t.Helper()
	e, _ := newTestEngine(t, EngineConfig{MaxNumBatchedTokens: batch * ctx, NumGPUBlocks: 2 * batch * ctx / DefaultBlockSize})
	for i := range batch {
		if err := e.Add(uint64(i), seq(10_000_000*(i+1), ctx), 2); err != nil {
			t.Fatal(err)
		}
	}
	if res := e.Step(); res.PrefillTokens != batch*ctx {
		t.Fatalf("%d × %d: first step prefilled %d tokens", batch, ctx, res.PrefillTokens)
	}
	res := *e.Step()
	if res.DecodeTokens != batch || res.PrefillTokens != 0 {
		t.Fatalf("%d × %d: decode step decoded %d, prefilled %d", batch, ctx, res.DecodeTokens, res.PrefillTokens)
	}
	return res
}

// checkWithin fails when the model is more than tol off the measurement.
func checkWithin(t *testing.T, what string, model, measured, tol float64) float64 {
	t.Helper()
	rel := model/measured - 1
	if math.Abs(rel) > tol {
		t.Errorf("%s: profile %.2f ms, measured %.2f ms: %+.1f %%, more than %.0f %%", what, model, measured, 100*rel, 100*tol)
	}
	return math.Abs(rel)
}

// TestProfileMatchesMeasurements checks the built-in H100 profile, through
// the engine's own step accounting, against every point measured on the
// GPU: 16 FlashAttention prefill passes, 5 passes holding several
// requests, 8 decode steps.
func TestProfileMatchesMeasurements(t *testing.T) {
	tm, err := ParseTiming(TimingH100Llama3_8B)
	if err != nil {
		t.Fatal(err)
	}
	var flash flashCalib
	var mix decodeMixCalib
	readJSON(t, "testdata/gpu/flash_calib.json", &flash)
	readJSON(t, "testdata/gpu/decode_mix_calib.json", &mix)
	if len(flash.Prefill) != 16 || len(mix.Mix) != 5 || len(mix.Decode) != 8 {
		t.Fatalf("testdata holds %d prefill points, %d mixed passes, %d decode rows; want 16, 5, 8",
			len(flash.Prefill), len(mix.Mix), len(mix.Decode))
	}
	const tol = 0.15
	worst := 0.0
	for _, p := range flash.Prefill {
		res := passResult(t, [][2]int{{p.Cached, p.New}})
		if want := float64(p.New) * (float64(p.Cached) + float64(p.New)/2); res.PrefillContext != p.Cached || res.PrefillAttention != want {
			t.Errorf("C %d, N %d: step reports context %d, attention %g; want %d, %g", p.Cached, p.New, res.PrefillContext, res.PrefillAttention, p.Cached, want)
		}
		worst = max(worst, checkWithin(t, "prefill C "+itoa(p.Cached)+" N "+itoa(p.New), tm.StepMillis(&res, 0), p.Ms, tol))
	}
	for _, m := range mix.Mix {
		res := passResult(t, m.Reqs)
		worst = max(worst, checkWithin(t, "mixed pass "+jsonString(m.Reqs), tm.StepMillis(&res, 0), m.TogetherMs, tol))
	}
	for _, d := range mix.Decode {
		res := decodeResult(t, d.Batch, d.Ctx)
		if res.DecodeKVTokens != d.Batch*d.Ctx {
			t.Errorf("%d × %d: step reports %d KV tokens read, want %d", d.Batch, d.Ctx, res.DecodeKVTokens, d.Batch*d.Ctx)
		}
		worst = max(worst, checkWithin(t, "decode "+itoa(d.Batch)+" × "+itoa(d.Ctx), tm.StepMillis(&res, 0), d.Ms, tol))
	}
	t.Logf("largest error %.1f %%", 100*worst)
}

// TestExample32BProfileMatchesMeasurements checks the 32B-shape example
// profile against its measurements (16 of 64 layers, times 4).
func TestExample32BProfileMatchesMeasurements(t *testing.T) {
	tm, err := ParseTiming(filepath.Join("..", "..", "tools", "gpu", "profiles", "h100-32b-shape.json"))
	if err != nil {
		t.Fatal(err)
	}
	var flash flashCalib
	readJSON(t, "testdata/gpu/flash_32b_16of64layers.json", &flash)
	if len(flash.Prefill) != 16 || len(flash.Decode) != 5 {
		t.Fatalf("testdata holds %d prefill points and %d decode rows, want 16 and 5", len(flash.Prefill), len(flash.Decode))
	}
	const layers = 4
	for _, p := range flash.Prefill {
		res := passResult(t, [][2]int{{p.Cached, p.New}})
		checkWithin(t, "prefill C "+itoa(p.Cached)+" N "+itoa(p.New), tm.StepMillis(&res, 0), layers*p.Ms, 0.15)
	}
	for _, d := range flash.Decode {
		res := decodeResult(t, d.Batch, d.Ctx)
		checkWithin(t, "decode "+itoa(d.Batch)+" × "+itoa(d.Ctx), tm.StepMillis(&res, 0), layers*d.Ms, 0.15)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestChunkedPrefillCountsEarlierChunks: a prompt longer than the step's
// token budget is prefilled in chunks, and each chunk attends to the
// chunks before it, which count as its context.
func TestChunkedPrefillCountsEarlierChunks(t *testing.T) {
	e, _ := newTestEngine(t, EngineConfig{MaxNumBatchedTokens: 4096})
	if err := e.Add(1, seq(1, 10000), 1); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct{ n, c int }{{4096, 0}, {4096, 4096}, {1808, 8192}} {
		res := e.Step()
		if res.PrefillTokens != want.n || res.PrefillContext != want.c ||
			res.PrefillAttention != float64(want.n)*(float64(want.c)+float64(want.n)/2) {
			t.Fatalf("chunk: N %d, C %d, attention %g; want N %d, C %d", res.PrefillTokens, res.PrefillContext, res.PrefillAttention, want.n, want.c)
		}
	}
	if e.HasWork() {
		t.Fatal("the request should have finished with its last chunk")
	}
}

// TestProfileStepMillis pins the profile's form: the pass constant once,
// per-request terms summed, a mixed step paying the larger constant once.
func TestProfileStepMillis(t *testing.T) {
	p := &Profile{ProfileName: "t",
		Prefill: PrefillCoefficients{PassMillis: 5, PerTokenMillis: 0.01, AttentionMillis: 1e-6, ContextMillis: 1e-3},
		Decode:  DecodeCoefficients{StepMillis: 6, KVReadMillis: 1e-4}}
	tests := []struct {
		name string
		res  StepResult
		want float64
	}{
		{"nothing scheduled", StepResult{}, 0},
		{"prefill only", StepResult{Scheduled: 2, PrefillTokens: 1000, PrefillAttention: 2e6, PrefillContext: 3000},
			5 + 0.01*1000 + 1e-6*2e6 + 1e-3*3000},
		{"decode only", StepResult{Scheduled: 10, DecodeTokens: 10, DecodeKVTokens: 50000}, 6 + 1e-4*50000},
		{"mixed pays max(pass, step) once", StepResult{Scheduled: 11, PrefillTokens: 100, PrefillAttention: 5000, DecodeTokens: 10, DecodeKVTokens: 50000},
			6 + 0.01*100 + 1e-6*5000 + 1e-4*50000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.StepMillis(&tt.res, 1<<20); math.Abs(got-tt.want) > 1e-9 {
				t.Fatalf("StepMillis = %g, want %g", got, tt.want)
			}
		})
	}
	// Context makes a pass dearer; the polynomial does not see it.
	cold := StepResult{Scheduled: 1, PrefillTokens: 512, PrefillAttention: 512 * 256}
	warm := StepResult{Scheduled: 1, PrefillTokens: 512, PrefillAttention: 512 * (32768 + 256), PrefillContext: 32768}
	if !(p.StepMillis(&warm, 0) > 2*p.StepMillis(&cold, 0)) {
		t.Fatalf("512 tokens over 32k cached cost %g ms, not more than twice the cold %g ms", p.StepMillis(&warm, 0), p.StepMillis(&cold, 0))
	}
	if StepMillis(&warm, 1<<20) != StepMillis(&cold, 1<<20) {
		t.Fatal("the polynomial should charge cached context nothing")
	}
}

// TestPolynomialIsTheDefault: the nil timing, the Polynomial type and the
// name "polynomial" all give the package's StepMillis, bit for bit.
func TestPolynomialIsTheDefault(t *testing.T) {
	tm, err := ParseTiming("")
	if err != nil {
		t.Fatal(err)
	}
	named, err := ParseTiming("polynomial")
	if err != nil {
		t.Fatal(err)
	}
	res := &StepResult{Scheduled: 3, PrefillTokens: 3000, PrefillAttention: 1e7, PrefillContext: 9000, DecodeTokens: 2, DecodeKVTokens: 7000}
	want := StepMillis(res, 1<<20)
	for _, got := range []float64{tm.StepMillis(res, 1<<20), named.StepMillis(res, 1<<20)} {
		if got != want {
			t.Fatalf("StepMillis %v, want %v", got, want)
		}
	}
	a, b := NewTimingModel(nil, 3, 0.1, 9), NewTimingModel(Polynomial{}, 3, 0.1, 9)
	for range 10 {
		if x, y := a.StepDuration(res, 1<<20), b.StepDuration(res, 1<<20); x != y {
			t.Fatalf("nil timing %v, Polynomial %v", x, y)
		}
	}
	if tm.Name() != "polynomial" {
		t.Fatalf("Name = %q", tm.Name())
	}
}

func TestParseTiming(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const good = `{"name": "mine", "prefill": {"pass_ms": 5, "per_token_ms": 0.02, "attention_ms": 1.5e-6, "context_ms": 0},
		"decode": {"step_ms": 6, "kv_read_ms": 5e-5}, "fit": {"method": "by hand"}, "notes": ["a note"]}`
	tests := []struct {
		name    string
		arg     string
		want    string // the timing's name
		wantErr string
	}{
		{"default", "", "polynomial", ""},
		{"polynomial", "polynomial", "polynomial", ""},
		{"built-in", "h100-llama3-8b", "h100-llama3-8b", ""},
		{"file", write("good.json", good), "mine", ""},
		{"unknown name", "a100-nothing", "", "neither a known name (polynomial, h100-llama3-8b) nor a profile file"},
		{"missing coefficient", write("missing.json", strings.Replace(good, `"context_ms": 0`, `"contxt": 0`, 1)), "", `unknown field "contxt"`},
		{"absent coefficient", write("absent.json", strings.Replace(good, `, "context_ms": 0`, ``, 1)), "", `"prefill.context_ms" is missing`},
		{"negative coefficient", write("neg.json", strings.Replace(good, `"kv_read_ms": 5e-5`, `"kv_read_ms": -5e-5`, 1)), "", `"decode.kv_read_ms" -5e-05 must not be negative`},
		{"zero pass", write("zero.json", strings.Replace(good, `"pass_ms": 5`, `"pass_ms": 0`, 1)), "", `"prefill.pass_ms" must be positive`},
		{"no name", write("noname.json", strings.Replace(good, `"name": "mine"`, `"name": ""`, 1)), "", `"name" is missing`},
		{"not JSON", write("bad.json", `pass_ms: 5`), "", "timing profile: invalid character"},
		{"trailing data", write("trail.json", good+` {}`), "", "data after the JSON object"},
		{"directory", dir, "", "timing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tm, err := ParseTiming(tt.arg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tm.Name() != tt.want {
				t.Fatalf("Name = %q, want %q", tm.Name(), tt.want)
			}
		})
	}
}

// TestProfileJSONRoundTrip: what a report writes as the profile is a
// profile file again.
func TestProfileJSONRoundTrip(t *testing.T) {
	tm, err := ParseTiming(TimingH100Llama3_8B)
	if err != nil {
		t.Fatal(err)
	}
	p := tm.(*Profile)
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	q, err := ParseProfile(b)
	if err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if *q != *p {
		t.Fatalf("round trip: %+v, want %+v", *q, *p)
	}
	if p.Prefill.PassMillis != 4.94 || p.Decode.KVReadMillis != 5.49e-5 {
		t.Fatalf("built-in coefficients %+v", *p)
	}
}

func BenchmarkProfileStepMillis(b *testing.B) {
	tm, err := ParseTiming(TimingH100Llama3_8B)
	if err != nil {
		b.Fatal(err)
	}
	res := &StepResult{Scheduled: 40, PrefillTokens: 3000, PrefillAttention: 1e7, PrefillContext: 9000, DecodeTokens: 39, DecodeKVTokens: 200000}
	b.ReportAllocs()
	var sink float64
	for b.Loop() {
		sink += tm.StepMillis(res, 1<<20)
	}
	_ = sink
}

// TestStepAndProfileAllocateNothing: once warm, a step of running requests
// and its pricing by a profile allocate nothing: the accounting the
// profile reads lives in the engine's reused StepResult.
func TestStepAndProfileAllocateNothing(t *testing.T) {
	tm, err := ParseTiming(TimingH100Llama3_8B)
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(EngineConfig{MaxNumBatchedTokens: 512}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const reqs, out = 8, 2000
	for i := range reqs {
		prompt := make([]int32, 0, 300+out)
		prompt = append(prompt, seq(1_000_000*(i+1), 300)...)
		if err := e.Add(uint64(i), prompt, out); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		e.Step()
	}
	var ms float64
	allocs := testing.AllocsPerRun(200, func() {
		res := e.Step()
		ms += tm.StepMillis(res, 0)
	})
	if allocs != 0 {
		t.Fatalf("a decode step and its pricing allocate %.1f times", allocs)
	}
	if !(ms > 0) || !e.HasWork() {
		t.Fatalf("steps priced at %g ms in all; engine busy %v", ms, e.HasWork())
	}
}
