package engine

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/engine/vllmzmq"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseMetrics(t *testing.T) {
	type want struct {
		rank                   int
		waiting, running       int
		used, total, blockSize int
	}
	tests := []struct {
		name      string
		engine    Engine
		file      string
		blockSize int // for KVBlocks
		start     float64
		want      []want
	}{
		{"vLLM V1 with kv_cache_usage_perc and cache_config_info", EngineVLLM, "vllm_metrics.txt", 16, 1.76379201224e+09,
			[]want{{0, 3, 5, 250, 1000, 16}}},
		{"older vLLM gpu_cache_usage_perc, two data-parallel engines", EngineVLLM, "vllm_metrics_dp2_old.txt", 32, 1.763792e+09,
			[]want{{0, 0, 2, 200, 2000, 32}, {1, 4, 7, 1000, 2000, 32}}},
		{"SGLang tokens converted to pages, tp ranks merged", EngineSGLang, "sglang_metrics.txt", 16, 1.76379e+09,
			[]want{{0, 2, 6, 2560, 10240, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseMetrics(tt.engine, bytes.NewReader(readTestdata(t, tt.file)))
			if err != nil {
				t.Fatal(err)
			}
			if m.ProcessStart != tt.start {
				t.Errorf("ProcessStart = %v, want %v", m.ProcessStart, tt.start)
			}
			if len(m.Ranks) != len(tt.want) {
				t.Errorf("got %d ranks, want %d", len(m.Ranks), len(tt.want))
			}
			for _, w := range tt.want {
				rm, ok := m.Rank(w.rank)
				if !ok {
					t.Fatalf("rank %d missing", w.rank)
				}
				used, total := rm.KVBlocks(tt.blockSize)
				got := want{w.rank, rm.Waiting, rm.Running, used, total, rm.BlockSize}
				if got != w {
					t.Errorf("rank %d = %+v, want %+v", w.rank, got, w)
				}
			}
		})
	}
}

func TestParseMetricsRejectsOtherEnginesText(t *testing.T) {
	_, err := ParseMetrics(EngineSGLang, bytes.NewReader(readTestdata(t, "vllm_metrics.txt")))
	if !errors.Is(err, ErrNoLoadMetrics) {
		t.Fatalf("SGLang parser on vLLM text: err = %v, want ErrNoLoadMetrics", err)
	}
	if _, err := ParseMetrics(EngineVLLM, strings.NewReader("vllm:num_requests_running{engine=\"0\"} 1 2 3 4\n")); err == nil {
		t.Fatal("garbage exposition parsed without error")
	}
}

func TestParseModels(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    string
		wantErr bool
	}{
		{"base and a LoRA adapter", string(readTestdata(t, "vllm_models.json")), "Qwen/Qwen3-8B [sql-lora]", false},
		{"extra aliases ignored", `{"data":[{"id":"a"},{"id":"b","parent":null}]}`, "a []", false},
		{"SGLang style without parent field", `{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","owned_by":"sglang","root":"meta-llama/Llama-3.1-8B-Instruct"}]}`, "meta-llama/Llama-3.1-8B-Instruct []", false},
		{"only adapters", `{"data":[{"id":"x","parent":"y"}]}`, "", true},
		{"empty list", `{"data":[]}`, "", true},
		{"not JSON", `<html>`, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseModels([]byte(tt.body))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil {
				if got := fmt.Sprintf("%s %v", m.Base, m.Adapters); got != tt.want {
					t.Errorf("got %q, want %q", got, tt.want)
				}
			}
		})
	}
}

func TestSequencer(t *testing.T) {
	type step struct {
		op   string // "live", "lost", "clear"
		seq  uint64
		want Action
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first batch resets even at 0", []step{{"live", 0, Reset}, {"live", 1, Forward}, {"live", 2, Forward}}},
		{"first batch late resets", []step{{"live", 7, Reset}, {"live", 8, Forward}}},
		{"gap heals", []step{{"live", 0, Reset}, {"live", 3, Heal}, {"live", 4, Forward}}},
		{"engine restart goes back", []step{{"live", 5, Reset}, {"live", 6, Forward}, {"live", 0, Reset}, {"live", 1, Forward}}},
		{"restart to the same number", []step{{"live", 5, Reset}, {"live", 5, Reset}}},
		{"after loss continuing needs verifying", []step{{"live", 2, Reset}, {"lost", 0, 0}, {"live", 3, Verify}, {"live", 4, Forward}}},
		{"after loss a jump needs verifying", []step{{"live", 2, Reset}, {"lost", 0, 0}, {"live", 9, Verify}}},
		{"after loss with nothing forwarded resets", []step{{"live", 2, Reset}, {"clear", 0, 0}, {"lost", 0, 0}, {"live", 3, Reset}}},
		{"after loss going back resets", []step{{"live", 2, Reset}, {"lost", 0, 0}, {"live", 0, Reset}}},
		{"after a clear with nothing forwarded, the next is a gap", []step{{"live", 2, Reset}, {"clear", 0, 0}, {"live", 3, Heal}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Sequencer
			for i, st := range tt.steps {
				switch st.op {
				case "lost":
					s.Lost()
					continue
				case "clear":
					s.Cleared()
					continue
				}
				got := s.Step(st.seq)
				s.Live(st.seq)
				if got != st.want {
					t.Fatalf("step %d seq %d: %v, want %v", i, st.seq, got, st.want)
				}
				if got != Drop {
					s.Forwarded(st.seq)
				}
			}
		})
	}
}

func TestSequencerDropsWhatReplayAlreadyForwarded(t *testing.T) {
	var s Sequencer
	s.Step(0)
	s.Live(0)
	s.Forwarded(0)
	if a := s.Step(4); a != Heal {
		t.Fatalf("seq 4 after 0: %v, want heal", a)
	}
	s.Live(4)
	// Replay returned 1..6 (the engine had moved on); all forwarded.
	for seq := uint64(1); seq <= 6; seq++ {
		s.Forwarded(seq)
	}
	for _, seq := range []uint64{5, 6} {
		if a := s.Step(seq); a != Drop {
			t.Errorf("live seq %d already replayed: %v, want drop", seq, a)
		}
		s.Live(seq)
	}
	if a := s.Step(7); a != Forward {
		t.Errorf("live seq 7: %v, want forward", a)
	}
}

func TestContiguousTail(t *testing.T) {
	seqs := func(ss ...uint64) []vllmzmq.Replayed {
		var out []vllmzmq.Replayed
		for _, s := range ss {
			out = append(out, vllmzmq.Replayed{Seq: s, Payload: []byte{1}})
		}
		return out
	}
	tests := []struct {
		name      string
		replayed  []vllmzmq.Replayed
		from, end uint64
		want      string
		complete  bool
	}{
		{"exact", seqs(3, 4, 5), 3, 6, "[3 4 5]", true},
		{"extra after end ignored", seqs(3, 4, 5, 6, 7), 3, 6, "[3 4 5]", true},
		{"buffer no longer reaches from", seqs(5, 6), 3, 7, "[5 6]", false},
		{"hole keeps only the tail", seqs(3, 5, 6), 3, 7, "[5 6]", false},
		{"does not reach end", seqs(3, 4), 3, 7, "[]", false},
		{"nothing", nil, 3, 7, "[]", false},
		{"nothing needed", nil, 3, 3, "[]", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tail, complete := ContiguousTail(tt.replayed, tt.from, tt.end)
			got := []uint64{}
			for _, r := range tail {
				got = append(got, r.Seq)
			}
			if fmt.Sprint(got) != tt.want || complete != tt.complete {
				t.Errorf("got %v complete=%v, want %s complete=%v", got, complete, tt.want, tt.complete)
			}
		})
	}
}

func FuzzParseMetrics(f *testing.F) {
	for _, name := range []string{"vllm_metrics.txt", "vllm_metrics_dp2_old.txt", "sglang_metrics.txt"} {
		f.Add(readTestdata(f, name), name[0] == 's')
	}
	f.Add([]byte("vllm:num_requests_running{engine=\"-1\"} NaN\n"), false)
	f.Add([]byte("sglang:token_usage 1e308\nsglang:num_queue_reqs -5\n"), true)
	f.Fuzz(func(t *testing.T, data []byte, sglang bool) {
		engine := EngineVLLM
		if sglang {
			engine = EngineSGLang
		}
		m, err := ParseMetrics(engine, bytes.NewReader(data))
		if err != nil {
			return
		}
		for r, rm := range m.Ranks {
			if r < 0 || rm.Waiting < 0 || rm.Running < 0 || rm.KVTotalBlocks < 0 || rm.BlockSize < 0 {
				t.Fatalf("rank %d has negative values: %+v", r, rm)
			}
			used, total := rm.KVBlocks(16)
			if used < 0 || used > total && total > 0 {
				t.Fatalf("rank %d: used %d of %d blocks", r, used, total)
			}
		}
	})
}

func FuzzParseModels(f *testing.F) {
	f.Add(readTestdata(f, "vllm_models.json"))
	f.Add([]byte(`{"data":[{"id":"a","parent":"b"},{"id":"b"}]}`))
	f.Add([]byte(`{"data":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseModels(data)
		if err == nil && m.Base == "" {
			t.Fatal("no error but no base model")
		}
	})
}

// BenchmarkParseMetricsVLLM measures one scrape's parsing, done every 250 ms.
func BenchmarkParseMetricsVLLM(b *testing.B) {
	text := readTestdata(b, "vllm_metrics.txt")
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for i := 0; i < b.N; i++ {
		if _, err := ParseMetrics(EngineVLLM, bytes.NewReader(text)); err != nil {
			b.Fatal(err)
		}
	}
}
