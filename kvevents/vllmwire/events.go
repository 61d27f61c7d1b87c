package vllmwire

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/zeebo/xxh3"
)

// Format is the wire layout of a KV event batch. vLLM has used three.
type Format uint8

const (
	// FormatArray is the layout of vLLM up to 0.23 and the contract of
	// docs/architecture.md §3.2:
	// the batch is [ts, events, data_parallel_rank] and each event is a
	// tagged array ["BlockStored", block_hashes, ...] (msgspec array_like).
	FormatArray Format = iota
	// FormatEventMaps is the layout after vLLM PR #42892: the batch is still
	// an array, but each event is a map whose "type" key holds the tag and
	// whose fields holding their default (None) are omitted.
	FormatEventMaps
	// FormatMap is the layout when the batch struct itself is map-encoded:
	// {"ts": ..., "events": [...], "data_parallel_rank": ...} with map events.
	FormatMap
)

// String names the format for logs.
func (f Format) String() string {
	switch f {
	case FormatArray:
		return "array"
	case FormatEventMaps:
		return "event-maps"
	case FormatMap:
		return "map"
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// EventBatch mirrors vLLM's KVEventBatch (vllm/distributed/kv_events.py):
// fields ts, events, data_parallel_rank in that order.
type EventBatch struct {
	// TS is the publisher's wall clock in seconds (Python time.time()).
	TS float64
	// Events are BlockStored, BlockRemoved and AllBlocksCleared values.
	Events []Event
	// DPRank is data_parallel_rank; nil for None or when absent.
	DPRank *int
	// Format is the wire layout; DecodeBatch records what it read so that
	// EncodeBatch writes the same bytes back.
	Format Format
	// WireFields is how many known positional fields the array form
	// carries. 0 means the current schema (3); vLLM before
	// data_parallel_rank sent 2.
	WireFields int
	// Unknown holds batch fields this package does not know, in wire order.
	Unknown []UnknownField
}

// Event is one KV cache event: BlockStored, BlockRemoved or AllBlocksCleared.
type Event interface {
	// Tag is the msgspec tag: the Python class name.
	Tag() string
	isEvent()
}

var (
	_ Event = BlockStored{}
	_ Event = BlockRemoved{}
	_ Event = AllBlocksCleared{}
)

// Medium names used by vLLM. A nil medium means the device (GPU) tier.
const (
	MediumGPU = "GPU"
	MediumCPU = "CPU"
)

// BlockStored mirrors vLLM's BlockStored, fields in declaration order.
type BlockStored struct {
	BlockHashes     []EngineHash
	ParentBlockHash *EngineHash // nil: the chain starts at the root
	TokenIDs        []uint32
	BlockSize       int
	LoraID          *int64  // deprecated upstream, kept for byte-identity
	Medium          *string // nil or "GPU": device memory
	LoraName        *string
	// ExtraKeys is the raw msgpack of extra_keys (list[tuple | None] | None),
	// one entry per block: LoRA name, multimodal ids, cache_salt (first block
	// only), prompt-embedding hashes. nil means None.
	ExtraKeys                msgpack.RawMessage
	GroupIdx                 *int64
	KVCacheSpecKind          *string
	KVCacheSpecSlidingWindow *int64
	// Unknown holds fields this package does not know, in wire order:
	// positional trailing fields (Name "") or unknown map keys.
	Unknown []UnknownField
	// WireFields is how many positional fields (after the tag) the array
	// form carries; 0 means every field known here. Older vLLM sent 5
	// (through lora_id), 6 (medium), 7 (lora_name), 8 (extra_keys), ...
	WireFields int
}

// BlockRemoved mirrors vLLM's BlockRemoved.
type BlockRemoved struct {
	BlockHashes []EngineHash
	Medium      *string
	GroupIdx    *int64
	Unknown     []UnknownField
	WireFields  int // as BlockStored.WireFields; 0 means all known (3)
}

// AllBlocksCleared mirrors vLLM's AllBlocksCleared: the worker dropped its
// whole cache.
type AllBlocksCleared struct {
	Unknown    []UnknownField
	WireFields int // fields after the tag in the array form (normally 0)
}

// UnknownField is a field this package does not interpret, kept so that a
// batch re-encodes to the bytes it was decoded from.
type UnknownField struct {
	Name  string // "" for a positional field of the array form
	Value msgpack.RawMessage
}

func (BlockStored) isEvent()      {}
func (BlockRemoved) isEvent()     {}
func (AllBlocksCleared) isEvent() {}

// Tag returns "BlockStored".
func (BlockStored) Tag() string { return "BlockStored" }

// Tag returns "BlockRemoved".
func (BlockRemoved) Tag() string { return "BlockRemoved" }

// Tag returns "AllBlocksCleared".
func (AllBlocksCleared) Tag() string { return "AllBlocksCleared" }

// hashKind is how an engine hash travelled on the wire.
type hashKind uint8

const (
	hashUint  hashKind = iota // a non-negative integer (msgpack uint or positive fixint)
	hashInt                   // a negative integer
	hashBytes                 // a byte string (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)
)

// EngineHash is a block hash as the engine publishes it (vLLM's
// ExternalBlockHash = bytes | int). It keeps the wire form so that encoding
// it again gives the same bytes. The zero value is the integer 0.
type EngineHash struct {
	kind hashKind
	v    uint64
	b    string
}

// HashUint returns the engine hash for a non-negative integer.
func HashUint(v uint64) EngineHash { return EngineHash{kind: hashUint, v: v} }

// HashInt returns the engine hash for a signed integer; non-negative values
// are the same as HashUint, as msgpack encodes them alike.
func HashInt(v int64) EngineHash {
	if v >= 0 {
		return EngineHash{kind: hashUint, v: uint64(v)}
	}
	return EngineHash{kind: hashInt, v: uint64(v)}
}

// HashBytes returns the engine hash for a byte string.
func HashBytes(b []byte) EngineHash { return EngineHash{kind: hashBytes, b: string(b)} }

// IsBytes reports whether h is a byte string.
func (h EngineHash) IsBytes() bool { return h.kind == hashBytes }

// Bytes returns the byte-string form, or nil for an integer hash.
func (h EngineHash) Bytes() []byte {
	if h.kind != hashBytes {
		return nil
	}
	return []byte(h.b)
}

// Int returns the integer as a uint64 bit pattern (negative values in two's
// complement) and whether h is an integer.
func (h EngineHash) Int() (uint64, bool) { return h.v, h.kind != hashBytes }

// Key folds h into the 64-bit key the index uses per worker. Integers keep
// their bit pattern; byte strings are hashed.
func (h EngineHash) Key() uint64 {
	if h.kind == hashBytes {
		return xxh3.HashString(h.b) ^ 0x9e3779b97f4a7c15
	}
	return h.v
}

// String renders h for logs and test failures.
func (h EngineHash) String() string {
	switch h.kind {
	case hashInt:
		return fmt.Sprintf("%d", int64(h.v))
	case hashBytes:
		return fmt.Sprintf("0x%x", h.b)
	}
	return fmt.Sprintf("%d", h.v)
}
