package bench

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestReadSessionTraceGroupsTurnsBySession(t *testing.T) {
	trace := strings.Join([]string{
		`{"session_id": "b", "timestamp": 1500, "input_length": 4, "output_length": 2, "hash_ids": [7]}`,
		`{"session_id": "a", "timestamp": 1000, "input_length": 4, "output_length": 1, "hash_ids": [1]}`,
		`{"timestamp": 1200, "input_length": 8, "output_length": 3, "hash_ids": [1, 2]}`,
		`{"session_id": "a", "delay": 250.5, "input_length": 9, "output_length": 1, "hash_ids": [1, 3, 4]}`,
		``,
		`{"session_id": "b", "timestamp": 4000, "input_length": 5, "output_length": 1, "hash_ids": [7, 8]}`,
		`{"session_id": "a", "input_length": 3, "output_length": 1, "hash_ids": [5]}`,
	}, "\n")
	got, err := ReadSessionTrace(strings.NewReader(trace), 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []TraceSession{
		{ID: "a", Start: 0, Turns: []SessionTurn{
			{InputLength: 4, OutputLength: 1, HashIDs: []int64{1}},
			{Delay: 250500 * time.Microsecond, InputLength: 9, OutputLength: 1, HashIDs: []int64{1, 3, 4}},
			{InputLength: 3, OutputLength: 1, HashIDs: []int64{5}},
		}},
		{ID: "", Start: 200 * time.Millisecond, Turns: []SessionTurn{{InputLength: 8, OutputLength: 3, HashIDs: []int64{1, 2}}}},
		{ID: "b", Start: 500 * time.Millisecond, Turns: []SessionTurn{
			{InputLength: 4, OutputLength: 2, HashIDs: []int64{7}},
			// No delay: the gap between the two rows' timestamps.
			{Delay: 2500 * time.Millisecond, InputLength: 5, OutputLength: 1, HashIDs: []int64{7, 8}},
		}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("sessions\n got %+v\nwant %+v", got, want)
	}
}

func TestReadSessionTraceRefusesWhatItCannotTime(t *testing.T) {
	first := `{"session_id": "a", "timestamp": 100, "input_length": 4, "output_length": 1, "hash_ids": [1]}`
	for _, tc := range []struct {
		name, trace, wantErr string
	}{
		{"first turn without timestamp", `{"session_id": "a", "input_length": 4, "output_length": 1, "hash_ids": [1]}`, "needs a timestamp"},
		{"delay on a first turn", `{"session_id": "a", "timestamp": 0, "delay": 5, "input_length": 4, "output_length": 1, "hash_ids": [1]}`, "delay on the first turn"},
		{"turn before the previous", first + "\n" + `{"session_id": "a", "timestamp": 50, "input_length": 4, "output_length": 1, "hash_ids": [1]}`, "line 2"},
		{"negative delay", first + "\n" + `{"session_id": "a", "delay": -1, "input_length": 4, "output_length": 1, "hash_ids": [1]}`, "delay"},
		{"negative hash id", `{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [-3]}`, "negative hash id"},
		{"ids do not cover the prompt", `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}`, "want 2"},
		{"two values on a line", `{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]} {}`, "more than one"},
		{"huge timestamp", `{"timestamp": 1e300, "input_length": 4, "output_length": 1, "hash_ids": [1]}`, "timestamp"},
		{"empty", "\n\n", "no records"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadSessionTrace(strings.NewReader(tc.trace), 4)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestWriteSessionTraceReadsBack(t *testing.T) {
	in := []TraceSession{
		{ID: "x", Start: 0, Turns: []SessionTurn{
			{InputLength: 5, OutputLength: 2, HashIDs: []int64{0, 1}},
			{Delay: 3 * time.Second, InputLength: 9, OutputLength: 1, HashIDs: []int64{0, 2, 3}},
		}},
		{Start: 1500 * time.Millisecond, Turns: []SessionTurn{{InputLength: 1, OutputLength: 1, HashIDs: []int64{4}}}},
	}
	var buf bytes.Buffer
	if err := WriteSessionTrace(&buf, in); err != nil {
		t.Fatal(err)
	}
	out, err := ReadSessionTrace(&buf, 4)
	if err != nil {
		t.Fatal(err)
	}
	in[1].ID = "s1" // named by its position
	if !reflect.DeepEqual(out, in) {
		t.Fatalf("read back\n got %+v\nwant %+v", out, in)
	}
}

func TestReadSessionTraceReadsThePlainTrace(t *testing.T) {
	plain, err := ReadTrace(bytes.NewReader(bundledTrace), DefaultTraceBlockSize)
	if err != nil {
		t.Fatal(err)
	}
	sessions, err := ReadSessionTrace(bytes.NewReader(bundledTrace), DefaultTraceBlockSize)
	if err != nil {
		t.Fatal(err)
	}
	if len(sessions) != len(plain) {
		t.Fatalf("%d sessions for %d records", len(sessions), len(plain))
	}
	for i, s := range sessions {
		r := plain[i]
		if len(s.Turns) != 1 || s.Start != time.Duration(r.Timestamp-plain[0].Timestamp)*time.Millisecond ||
			!reflect.DeepEqual(s.Turns[0].HashIDs, r.HashIDs) || s.Turns[0].InputLength != r.InputLength {
			t.Fatalf("session %d = %+v, record %+v", i, s, r)
		}
	}
}

func FuzzReadSessionTrace(f *testing.F) {
	f.Add([]byte(`{"session_id": "a", "timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": [1]}` + "\n" +
		`{"session_id": "a", "delay": 2.5, "input_length": 8, "output_length": 1, "hash_ids": [1, 2]}`))
	f.Add([]byte(`{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0, 1]}`))
	f.Add([]byte(`{"session_id": "a", "timestamp": 9, "input_length": 4, "output_length": 1, "hash_ids": [1]}` + "\n" +
		`{"session_id": "a", "timestamp": 3, "input_length": 4, "output_length": 1, "hash_ids": [1]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		sessions, err := ReadSessionTrace(bytes.NewReader(data), 4)
		if err != nil {
			return
		}
		for i, s := range sessions {
			if len(s.Turns) == 0 || s.Start < 0 || (i > 0 && s.Start < sessions[i-1].Start) {
				t.Fatalf("session %d: %+v", i, s)
			}
			for _, tn := range s.Turns {
				if tn.Delay < 0 || tn.InputLength < 1 || tn.OutputLength < 1 || len(tn.HashIDs) != (tn.InputLength+3)/4 {
					t.Fatalf("turn %+v", tn)
				}
			}
		}
		// What was read writes back and reads again to the same sessions,
		// up to whole milliseconds.
		var buf bytes.Buffer
		if err := WriteSessionTrace(&buf, sessions); err != nil {
			t.Fatal(err)
		}
		again, err := ReadSessionTrace(&buf, 4)
		if err != nil {
			t.Fatalf("written trace does not read back: %v", err)
		}
		if len(again) != len(sessions) {
			t.Fatalf("%d sessions read back, want %d", len(again), len(sessions))
		}
	})
}
