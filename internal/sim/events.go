package sim

import "github.com/kvroute/kvroute/kvindex"

// EventKind tells which KV cache event an Event is.
type EventKind uint8

// The KV cache events vLLM publishes.
const (
	// BlockStored: full blocks were computed and entered the prefix cache.
	BlockStored EventKind = iota + 1
	// BlockRemoved: cached blocks were evicted.
	BlockRemoved
	// AllBlocksCleared: the whole prefix cache was dropped.
	AllBlocksCleared
)

// String names the kind as vLLM's event tag does.
func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "Unknown"
}

// Event is one KV cache event in the engine's terms.
type Event struct {
	Kind EventKind
	// Hashes are the engine hashes of the stored or removed blocks, in
	// chain order for BlockStored.
	Hashes []int64
	// Parent is the engine hash of the block before Hashes[0]; HasParent is
	// false when the first stored block starts the sequence.
	Parent    int64
	HasParent bool
	// Tokens are the token ids of all stored blocks, BlockSize per block.
	Tokens []int32
	// BlockSize is the engine's block size (BlockStored only).
	BlockSize int
	// MMKeys are the multimodal keys of the stored blocks (BlockStored
	// only; nil or shorter than Hashes where blocks have none).
	MMKeys [][]kvindex.MMKey
}

// EventSink receives the engine's events in the order they happen. The
// slices in an Event are reused after the call returns: copy what you keep.
type EventSink interface {
	KVEvent(Event)
}

// EventSinkFunc adapts a function to EventSink.
type EventSinkFunc func(Event)

var _ EventSink = EventSinkFunc(nil)

// KVEvent calls f.
func (f EventSinkFunc) KVEvent(e Event) { f(e) }

type discardSink struct{}

var _ EventSink = discardSink{}

func (discardSink) KVEvent(Event) {}
