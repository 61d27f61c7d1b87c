package bench

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseTraceRecordChecksTheMooncakeInvariants(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		wantErr    string
	}{
		{"valid", `{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}`, ""},
		{"exact multiple", `{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]}`, ""},
		{"not json", `{"timestamp": `, "trace record"},
		{"negative timestamp", `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [0]}`, "negative timestamp"},
		{"empty prompt", `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [0]}`, "input_length"},
		{"no output", `{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [0]}`, "output_length"},
		{"no ids", `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}`, "no hash_ids"},
		{"too few ids", `{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [0]}`, "want 2"},
		{"too many ids", `{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0, 1]}`, "want 1"},
		{"string id", `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}`, "trace record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTraceRecord([]byte(tc.line), 512)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestReadTraceNamesTheBadLineAndRejectsTimeTravel(t *testing.T) {
	good := `{"timestamp": 10, "input_length": 5, "output_length": 1, "hash_ids": [0]}`
	if _, err := ReadTrace(strings.NewReader(good+"\n\n"+`{"timestamp": 3`), 512); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("bad third line: error %v, want one naming line 3", err)
	}
	back := `{"timestamp": 9, "input_length": 5, "output_length": 1, "hash_ids": [0]}`
	if _, err := ReadTrace(strings.NewReader(good+"\n"+back), 512); err == nil || !strings.Contains(err.Error(), "back in time") {
		t.Errorf("decreasing timestamps: error %v", err)
	}
	if _, err := ReadTrace(strings.NewReader("\n"), 512); err == nil {
		t.Error("an empty trace is accepted")
	}
}

func TestBundledTraceIsTheConversationTraceHead(t *testing.T) {
	recs, err := BundledTrace()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3894 || len(bundledTrace) > 1<<20 {
		t.Fatalf("%d records in %d bytes, want 3894 in at most 1 MiB", len(recs), len(bundledTrace))
	}
	if recs[0].HashIDs[0] != 0 || recs[len(recs)-1].Timestamp != 1265999 {
		t.Errorf("first hash %d, last timestamp %d: not the conversation trace's head", recs[0].HashIDs[0], recs[len(recs)-1].Timestamp)
	}
}

func TestTracePromptSharesTokensExactlyWhereHashIDsAgree(t *testing.T) {
	a := TracePrompt(TraceRecord{InputLength: 1200, HashIDs: []int64{0, 7, 9}}, 512)
	b := TracePrompt(TraceRecord{InputLength: 1100, HashIDs: []int64{0, 7, 8}}, 512)
	c := TracePrompt(TraceRecord{InputLength: 600, HashIDs: []int64{1, 7}}, 512)
	if len(a) != 1200 || len(b) != 1100 || len(c) != 600 {
		t.Fatalf("lengths %d %d %d, want the input lengths", len(a), len(b), len(c))
	}
	common := 0
	for common < len(b) && a[common] == b[common] {
		common++
	}
	if common != 1024 {
		t.Errorf("prompts with hash ids [0 7 9] and [0 7 8] share %d tokens, want 1024", common)
	}
	if a[0] == c[0] {
		t.Error("different first hash ids start with the same token")
	}
	for _, tok := range a {
		if tok < tokenBase || tok >= tokenBase+tokenSpan {
			t.Fatalf("token %d outside [%d, %d)", tok, tokenBase, tokenBase+tokenSpan)
		}
	}
}

func FuzzParseTraceRecord(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}`), 512)
	f.Add([]byte(`{"timestamp": 1e3, "input_length": 1, "output_length": 1, "hash_ids": [-1]}`), 16)
	f.Add([]byte(`{"hash_ids": null}`), 512)
	f.Add([]byte(`[]`), 1)
	f.Fuzz(func(t *testing.T, line []byte, bs int) {
		if bs <= 0 || bs > 1<<16 {
			return
		}
		r, err := ParseTraceRecord(line, bs)
		if err != nil {
			return
		}
		if r.InputLength > 1<<20 {
			return
		}
		if p := TracePrompt(r, bs); len(p) != r.InputLength {
			t.Fatalf("valid record %+v gives a %d-token prompt", r, len(p))
		}
	})
}

func FuzzReadTrace(f *testing.F) {
	f.Add([]byte(string(bundledTrace[:2000])))
	f.Add([]byte("{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n\n{"))
	f.Add([]byte("\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := ReadTrace(bytes.NewReader(data), 512)
		if err == nil && len(recs) == 0 {
			t.Fatal("no error and no records")
		}
	})
}
