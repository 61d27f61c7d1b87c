package vllmzmq

import "testing"

func TestParseTopic(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Topic
		bad  bool
	}{
		{in: "kv@10.0.0.5@Qwen/Qwen3-8B", want: Topic{Host: "10.0.0.5", Model: "Qwen/Qwen3-8B"}},
		{in: "kv@10.0.0.5:8000@Qwen/Qwen3-8B", want: Topic{Host: "10.0.0.5", Port: 8000, Model: "Qwen/Qwen3-8B"}},
		{in: "kv@[fd00::1]:8000@m", want: Topic{Host: "fd00::1", Port: 8000, Model: "m"}},
		{in: "kv@[fd00::1]@m", want: Topic{Host: "fd00::1", Model: "m"}},
		{in: "kv@fd00::1@m", want: Topic{Host: "fd00::1", Model: "m"}},
		{in: "kv@pod-a.ns.svc@m@with@ats", want: Topic{Host: "pod-a.ns.svc", Model: "m@with@ats"}},
		{in: "kv@10.0.0.5@", want: Topic{Host: "10.0.0.5"}},
		{in: "", bad: true},                    // vLLM's default topic names nobody
		{in: "kv-events", bad: true},           // no prefix
		{in: "kv@10.0.0.5", bad: true},         // no model part
		{in: "kv@@m", bad: true},               // no host
		{in: "kv@10.0.0.5:0@m", bad: true},     // port out of range
		{in: "kv@10.0.0.5:99999@m", bad: true}, // port out of range
		{in: "kv@10.0.0.5:http@m", bad: true},  // port not a number
		{in: "kv@10.0.0.5@m\n", bad: true},     // control character
		{in: "kv@a b@m", bad: true},            // space in host
		{in: "kv@" + string(make([]byte, 2000)) + "@m", bad: true},
	} {
		got, err := ParseTopic(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseTopic(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseTopic(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{"kv@10.0.0.5@m", "kv@10.0.0.5:8000@m", "kv@[::1]:1@m", "kv@::1@", "kv@@", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tp, err := ParseTopic(s)
		if err != nil {
			return
		}
		// What parses writes back to a topic that parses to the same value.
		again, err := ParseTopic(tp.String())
		if err != nil || again != tp {
			t.Fatalf("%q parsed to %+v, which writes %q and parses back to %+v, %v", s, tp, tp.String(), again, err)
		}
	})
}
