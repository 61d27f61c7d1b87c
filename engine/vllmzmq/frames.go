// Package vllmzmq speaks vLLM's ZMQ KV-event wire protocol on both sides.
//
// vLLM (and SGLang, whose publisher is a port of vLLM's) publishes KV cache
// events from a ZMQ PUB socket as three-frame messages:
//
//	topic | sequence (8 bytes, big-endian, from 0) | msgpack KVEventBatch
//
// and, when a replay endpoint is configured, answers replay requests on a
// ROUTER socket. A client sends one frame holding the first wanted sequence
// as 8 big-endian bytes (after the empty delimiter a REQ socket adds); the
// engine answers with one message per buffered batch whose sequence is at
// least that number, and then an end marker whose sequence is -1 (eight
// 0xFF bytes) and whose payload is empty. vLLM 0.32 sends each reply as
// "topic | sequence | payload", as on the PUB socket, and the end marker with
// an empty topic; earlier releases (and SGLang) send "sequence | payload".
// Both forms parse. Batches older than the engine's buffer are silently
// absent from the answer: a client learns that replay fell short only by
// comparing the first sequence it got with the one it asked for.
//
// Publisher behaves like vLLM's ZmqEventPublisher (PUB plus a replay ROUTER
// with a bounded buffer); Subscriber is the consuming side with replay,
// dialling the engine; Listener is the consuming side bound for engines
// that connect out (llm-d's layout), whose topics ParseTopic reads.
// Both use github.com/go-zeromq/zmq4, so no libzmq is needed. The payload is
// opaque here: this package never decodes msgpack.
package vllmzmq

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// EndSeq is the sequence number of the end-of-replay marker, -1 as a signed
// 64-bit big-endian integer.
const EndSeq = ^uint64(0)

// SeqLen is the length in bytes of a sequence frame.
const SeqLen = 8

// Event is one published batch as it travels on the PUB socket.
type Event struct {
	// Topic is the first frame, the publisher's configured topic.
	Topic string
	// Seq is the publisher's batch sequence number; it starts at 0 each time
	// the engine starts.
	Seq uint64
	// Payload is the msgpack-encoded KVEventBatch, untouched.
	Payload []byte
}

// Replayed is one batch received from the replay socket.
type Replayed struct {
	// Topic is the publisher's topic when the reply carries one (vLLM 0.32
	// and later); empty for the older two-frame replies.
	Topic string
	// Seq is the batch's sequence number as originally published.
	Seq uint64
	// Payload is the batch exactly as it was published.
	Payload []byte
}

// ErrBadFrames reports a message whose frames do not follow the protocol.
var ErrBadFrames = errors.New("vllmzmq: malformed message")

// AppendSeq appends seq as 8 big-endian bytes.
func AppendSeq(dst []byte, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(dst, seq)
}

// DecodeSeq reads an 8-byte big-endian sequence frame.
func DecodeSeq(frame []byte) (uint64, error) {
	if len(frame) != SeqLen {
		return 0, fmt.Errorf("%w: sequence frame has %d bytes, want %d", ErrBadFrames, len(frame), SeqLen)
	}
	return binary.BigEndian.Uint64(frame), nil
}

// EventFrames returns the three frames of a published batch.
func EventFrames(topic string, seq uint64, payload []byte) [][]byte {
	return [][]byte{[]byte(topic), AppendSeq(make([]byte, 0, SeqLen), seq), payload}
}

// ParseEvent decodes the frames of a message received on a SUB socket.
func ParseEvent(frames [][]byte) (Event, error) {
	if len(frames) != 3 {
		return Event{}, fmt.Errorf("%w: event has %d frames, want 3 (topic, sequence, payload)", ErrBadFrames, len(frames))
	}
	seq, err := DecodeSeq(frames[1])
	if err != nil {
		return Event{}, fmt.Errorf("event: %w", err)
	}
	return Event{Topic: string(frames[0]), Seq: seq, Payload: frames[2]}, nil
}

// ReplayRequestFrames returns what a DEALER client sends to ask for every
// buffered batch from start on: the empty delimiter a REQ socket would add,
// then the sequence.
func ReplayRequestFrames(start uint64) [][]byte {
	return [][]byte{{}, AppendSeq(make([]byte, 0, SeqLen), start)}
}

// ParseReplayRequest decodes a request as a ROUTER socket receives it:
// identity, empty delimiter, 8-byte start sequence. Like vLLM, it accepts
// nothing else.
func ParseReplayRequest(frames [][]byte) (identity []byte, start uint64, err error) {
	if len(frames) != 3 {
		return nil, 0, fmt.Errorf("%w: replay request has %d frames, want 3 (identity, delimiter, start)", ErrBadFrames, len(frames))
	}
	if len(frames[1]) != 0 {
		return nil, 0, fmt.Errorf("%w: replay request delimiter is %d bytes, want empty", ErrBadFrames, len(frames[1]))
	}
	start, err = DecodeSeq(frames[2])
	if err != nil {
		return nil, 0, fmt.Errorf("replay request: %w", err)
	}
	return frames[0], start, nil
}

// ReplayReplyFrames returns what the ROUTER sends back for one buffered
// batch, as vLLM 0.32 does: identity, empty delimiter, topic, sequence,
// payload.
func ReplayReplyFrames(identity []byte, topic string, seq uint64, payload []byte) [][]byte {
	return [][]byte{identity, {}, []byte(topic), AppendSeq(make([]byte, 0, SeqLen), seq), payload}
}

// ReplayEndFrames returns the end-of-replay marker addressed to identity:
// an empty topic, sequence -1 and an empty payload.
func ReplayEndFrames(identity []byte) [][]byte {
	return ReplayReplyFrames(identity, "", EndSeq, []byte{})
}

// ParseReplayReply decodes one reply as a DEALER client receives it. Four
// forms are accepted: vLLM 0.32's "delimiter | topic | sequence | payload",
// the older "delimiter | sequence | payload", and both without the
// delimiter, as a REQ socket hands them over. A three-frame reply is read
// as the older form when its first frame is empty (the two readings then
// agree on sequence and payload) and as "topic | sequence | payload"
// otherwise. end is true for the end-of-replay marker.
func ParseReplayReply(frames [][]byte) (r Replayed, end bool, err error) {
	switch len(frames) {
	case 4:
		if len(frames[0]) != 0 {
			return Replayed{}, false, fmt.Errorf("%w: replay reply delimiter is %d bytes, want empty", ErrBadFrames, len(frames[0]))
		}
		r.Topic = string(frames[1])
		frames = frames[2:]
	case 3:
		if len(frames[0]) != 0 {
			r.Topic = string(frames[0])
		}
		frames = frames[1:]
	case 2:
	default:
		return Replayed{}, false, fmt.Errorf("%w: replay reply has %d frames, want [delimiter] [topic] sequence payload", ErrBadFrames, len(frames))
	}
	seq, err := DecodeSeq(frames[0])
	if err != nil {
		return Replayed{}, false, fmt.Errorf("replay reply: %w", err)
	}
	r.Seq = seq
	if seq == EndSeq {
		if len(frames[1]) != 0 {
			return Replayed{}, false, fmt.Errorf("%w: end-of-replay marker carries a %d-byte payload", ErrBadFrames, len(frames[1]))
		}
		return r, true, nil
	}
	if len(frames[1]) == 0 {
		// vLLM's own example client treats an empty payload as the end too;
		// a real batch is never empty msgpack.
		return r, true, nil
	}
	r.Payload = frames[1]
	return r, false, nil
}

// hasTopicPrefix reports whether a published topic passes a SUB filter,
// which in ZMQ is a byte prefix match.
func hasTopicPrefix(topic []byte, filter string) bool {
	return bytes.HasPrefix(topic, []byte(filter))
}
