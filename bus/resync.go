package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// ResyncRequest is the JSON body of a request on ResyncSubject.
type ResyncRequest struct {
	// Router is the asking replica's ID, for the publisher's log.
	Router string `json:"router"`
	// Reason says why the router's view is stale ("stale": a sequence
	// gap, a restart it cannot reason about, or an unknown parent).
	Reason string `json:"reason,omitempty"`
}

// ResyncReply is the JSON answer: OK once the publisher has queued the
// re-announcement on its event stream (it arrives behind the reply's
// batches, in order), or the reason it could not.
type ResyncReply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// maxResyncBody bounds a request body; anything longer is refused.
const maxResyncBody = 4 << 10

// ServeResync answers resync requests for one worker on nc by calling
// resync, which must only queue the work (it runs on the NATS callback
// goroutine). Unsubscribe the returned subscription to stop.
func ServeResync(nc *nats.Conn, namespace, workerID string, resync func(ResyncRequest) error) (*nats.Subscription, error) {
	subj := ResyncSubject(namespace, workerID)
	sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
		reply := ResyncReply{OK: true}
		if req, err := ParseResyncRequest(m.Data); err != nil {
			reply = ResyncReply{Error: err.Error()}
		} else if err := resync(req); err != nil {
			reply = ResyncReply{Error: err.Error()}
		}
		if m.Reply != "" {
			data, _ := json.Marshal(reply)
			_ = m.Respond(data)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("resync: subscribe %s: %w", subj, err)
	}
	return sub, nil
}

// ParseResyncRequest decodes a resync request body: empty (all fields
// unset) or a JSON object of at most 4 KiB.
func ParseResyncRequest(data []byte) (ResyncRequest, error) {
	var req ResyncRequest
	switch {
	case len(data) > maxResyncBody:
		return req, errors.New("request too large")
	case len(data) == 0:
		return req, nil
	case json.Unmarshal(data, &req) != nil:
		return ResyncRequest{}, errors.New("request is not JSON")
	}
	return req, nil
}

// ErrNoResponder is returned when no publisher answers for the worker
// (e.g. a plain vLLM publishing without kvbridge).
var ErrNoResponder = errors.New("no resync responder for the worker")

// RequestResync asks a worker's publisher to resync and waits for its
// answer until ctx ends.
func RequestResync(ctx context.Context, nc *nats.Conn, namespace, workerID string, req ResyncRequest) error {
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	msg, err := nc.RequestWithContext(ctx, ResyncSubject(namespace, workerID), data)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("resync %s: %w", workerID, ErrNoResponder)
	}
	if err != nil {
		return fmt.Errorf("resync %s: %w", workerID, err)
	}
	var reply ResyncReply
	if len(msg.Data) > maxResyncBody || json.Unmarshal(msg.Data, &reply) != nil {
		return fmt.Errorf("resync %s: malformed reply", workerID)
	}
	if !reply.OK {
		return fmt.Errorf("resync %s: publisher refused: %s", workerID, reply.Error)
	}
	return nil
}
