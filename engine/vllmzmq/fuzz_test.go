package vllmzmq

import (
	"bytes"
	"testing"
)

// splitFrames turns fuzz input into frames: 0x00 0x00 separates them, so
// the corpus can express empty frames and any byte inside one.
func splitFrames(data []byte) [][]byte {
	return bytes.Split(data, []byte{0, 0})
}

func FuzzParseEvent(f *testing.F) {
	f.Add([]byte("kv-events\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05\x00\x00\x93\xcb"))
	f.Add([]byte{})
	f.Add([]byte("\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := splitFrames(data)
		ev, err := ParseEvent(frames)
		if err != nil {
			return
		}
		// A parsed event re-encodes to the same frames.
		again := EventFrames(ev.Topic, ev.Seq, ev.Payload)
		for i := range again {
			if !bytes.Equal(again[i], frames[i]) {
				t.Fatalf("frame %d round-trips to %x, was %x", i, again[i], frames[i])
			}
		}
	})
}

func FuzzParseReplayRequest(f *testing.F) {
	f.Add([]byte("id\x00\x00\x00\x00\x01\x01\x01\x01\x01\x01\x01\x01"))
	f.Add([]byte("\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := splitFrames(data)
		id, start, err := ParseReplayRequest(frames)
		if err != nil {
			return
		}
		if !bytes.Equal(id, frames[0]) || !bytes.Equal(AppendSeq(nil, start), frames[2]) {
			t.Fatalf("request %x parsed to id %x start %d", frames, id, start)
		}
	})
}

func FuzzParseReplayReply(f *testing.F) {
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x93"))
	f.Add([]byte("\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00"))
	f.Add([]byte("\x01\x01\x01\x01\x01\x01\x01\x01\x00\x00\x92"))
	// vLLM 0.32: delimiter, topic, sequence, payload; its end marker.
	f.Add([]byte("\x00\x00kv@w\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x93"))
	f.Add([]byte("\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, end, err := ParseReplayReply(splitFrames(data))
		if err != nil {
			return
		}
		if end != (len(r.Payload) == 0) {
			t.Fatalf("end=%v but payload has %d bytes", end, len(r.Payload))
		}
		// Whatever parsed re-encodes, in vLLM 0.32's form, to a reply that
		// parses to the same batch.
		again, againEnd, err := ParseReplayReply(ReplayReplyFrames([]byte("id"), r.Topic, r.Seq, r.Payload)[1:])
		if err != nil || againEnd != end || again.Seq != r.Seq || again.Topic != r.Topic || !bytes.Equal(again.Payload, r.Payload) {
			t.Fatalf("%+v re-encoded parses to %+v end=%v err=%v", r, again, againEnd, err)
		}
	})
}
