package vllmwire

import (
	"errors"
	"fmt"
)

// ErrMalformed wraps every error DecodeBatch returns.
var ErrMalformed = errors.New("malformed KV event batch")

// DecodeBatch decodes one vLLM KVEventBatch from msgpack: the array form
// [ts, events, data_parallel_rank] or the map form, with events as tagged
// arrays or tagged maps, hashes as integers or bytes. Unknown trailing
// fields and unknown map keys are kept in Unknown; anything malformed
// returns an error wrapping ErrMalformed, never a panic.
func DecodeBatch(data []byte) (EventBatch, error) {
	b, err := decodeBatch(newReader(data))
	if err != nil {
		return EventBatch{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return b, nil
}

func decodeBatch(r *reader) (EventBatch, error) {
	c, err := r.peek()
	if err != nil {
		return EventBatch{}, err
	}
	var b EventBatch
	switch {
	case isArrayCode(c):
		err = decodeBatchArray(r, &b)
	case isMapCode(c):
		err = decodeBatchMap(r, &b)
	default:
		return EventBatch{}, fmt.Errorf("batch: want array or map, got %s", codeName(c))
	}
	if err != nil {
		return EventBatch{}, err
	}
	if r.remaining() != 0 {
		return EventBatch{}, fmt.Errorf("%d bytes after the batch", r.remaining())
	}
	return b, nil
}

func decodeBatchArray(r *reader, b *EventBatch) error {
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	if n < 2 {
		return fmt.Errorf("batch: %d fields, want at least ts and events", n)
	}
	if b.TS, err = r.float(); err != nil {
		return fmt.Errorf("batch ts: %w", err)
	}
	maps, err := decodeEvents(r, b)
	if err != nil {
		return err
	}
	b.Format = FormatArray
	if maps {
		b.Format = FormatEventMaps
	}
	if n >= 3 {
		if b.DPRank, err = decodeDPRank(r); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ {
		v, err := r.raw()
		if err != nil {
			return fmt.Errorf("batch field %d: %w", i, err)
		}
		b.Unknown = append(b.Unknown, UnknownField{Value: v})
	}
	if n != 3 {
		b.WireFields = min(n, 3)
	}
	return nil
}

func decodeBatchMap(r *reader, b *EventBatch) error {
	n, err := r.mapLen()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	var haveTS, haveEvents bool
	for i := 0; i < n; i++ {
		key, err := r.str()
		if err != nil {
			return fmt.Errorf("batch key: %w", err)
		}
		switch key {
		case "ts":
			if b.TS, err = r.float(); err != nil {
				return fmt.Errorf("batch ts: %w", err)
			}
			haveTS = true
		case "events":
			if _, err := decodeEvents(r, b); err != nil {
				return err
			}
			haveEvents = true
		case "data_parallel_rank":
			if b.DPRank, err = decodeDPRank(r); err != nil {
				return err
			}
		default:
			v, err := r.raw()
			if err != nil {
				return fmt.Errorf("batch %q: %w", key, err)
			}
			b.Unknown = append(b.Unknown, UnknownField{Name: key, Value: v})
		}
	}
	if !haveTS || !haveEvents {
		return errors.New("batch map lacks ts or events")
	}
	b.Format = FormatMap
	return nil
}

func decodeDPRank(r *reader) (*int, error) {
	v, err := r.optInt64()
	if err != nil {
		return nil, fmt.Errorf("batch data_parallel_rank: %w", err)
	}
	if v == nil {
		return nil, nil
	}
	if *v < 0 || *v > 1<<30 {
		return nil, fmt.Errorf("batch data_parallel_rank %d out of range", *v)
	}
	rank := int(*v)
	return &rank, nil
}

// decodeEvents fills b.Events and reports whether the first event was a map.
func decodeEvents(r *reader, b *EventBatch) (firstIsMap bool, err error) {
	n, err := r.arrayLen()
	if err != nil {
		return false, fmt.Errorf("batch events: %w", err)
	}
	b.Events = make([]Event, 0, n)
	for i := 0; i < n; i++ {
		c, err := r.peek()
		if err != nil {
			return false, fmt.Errorf("event %d: %w", i, err)
		}
		var ev Event
		switch {
		case isArrayCode(c):
			ev, err = decodeEventArray(r)
		case isMapCode(c):
			ev, err = decodeEventMap(r)
			if i == 0 {
				firstIsMap = true
			}
		default:
			err = fmt.Errorf("want array or map, got %s", codeName(c))
		}
		if err != nil {
			return false, fmt.Errorf("event %d: %w", i, err)
		}
		b.Events = append(b.Events, ev)
	}
	return firstIsMap, nil
}

// Field positions of the array forms (after the tag), in vLLM's declaration order.
const (
	storedFields  = 11 // block_hashes … kv_cache_spec_sliding_window
	removedFields = 3  // block_hashes, medium, group_idx
	minStored     = 4  // through block_size
)

func decodeEventArray(r *reader) (Event, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, errors.New("empty event array")
	}
	tag, err := r.str()
	if err != nil {
		return nil, fmt.Errorf("tag: %w", err)
	}
	n-- // fields after the tag
	switch tag {
	case "BlockStored":
		if n < minStored {
			return nil, fmt.Errorf("BlockStored with %d fields, want at least %d", n, minStored)
		}
		var ev BlockStored
		for i := 0; i < n; i++ {
			if i >= storedFields {
				v, err := r.raw()
				if err != nil {
					return nil, fmt.Errorf("BlockStored field %d: %w", i, err)
				}
				ev.Unknown = append(ev.Unknown, UnknownField{Value: v})
				continue
			}
			if err := decodeStoredField(r, &ev, storedFieldNames[i]); err != nil {
				return nil, err
			}
		}
		if n != storedFields {
			ev.WireFields = min(n, storedFields)
		}
		return ev, nil
	case "BlockRemoved":
		if n < 1 {
			return nil, errors.New("BlockRemoved without block_hashes")
		}
		var ev BlockRemoved
		for i := 0; i < n; i++ {
			if i >= removedFields {
				v, err := r.raw()
				if err != nil {
					return nil, fmt.Errorf("BlockRemoved field %d: %w", i, err)
				}
				ev.Unknown = append(ev.Unknown, UnknownField{Value: v})
				continue
			}
			if err := decodeRemovedField(r, &ev, removedFieldNames[i]); err != nil {
				return nil, err
			}
		}
		if n != removedFields {
			ev.WireFields = min(n, removedFields)
		}
		return ev, nil
	case "AllBlocksCleared":
		var ev AllBlocksCleared
		for i := 0; i < n; i++ {
			v, err := r.raw()
			if err != nil {
				return nil, fmt.Errorf("AllBlocksCleared field %d: %w", i, err)
			}
			ev.Unknown = append(ev.Unknown, UnknownField{Value: v})
		}
		return ev, nil
	}
	return nil, fmt.Errorf("unknown event tag %q", tag)
}

var storedFieldNames = [storedFields]string{
	"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
	"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
	"kv_cache_spec_sliding_window",
}

var removedFieldNames = [removedFields]string{"block_hashes", "medium", "group_idx"}

// decodeStoredField reads the field called name into ev; it reports
// errUnknownField for names BlockStored does not have.
func decodeStoredField(r *reader, ev *BlockStored, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.BlockHashes, err = r.engineHashes()
	case "parent_block_hash":
		ev.ParentBlockHash, err = r.optEngineHash()
	case "token_ids":
		ev.TokenIDs, err = r.tokens()
	case "block_size":
		var v int64
		v, err = r.int64()
		if err == nil && (v < 0 || v > 1<<24) {
			err = fmt.Errorf("%d out of range", v)
		}
		ev.BlockSize = int(v)
	case "lora_id":
		ev.LoraID, err = r.optInt64()
	case "medium":
		ev.Medium, err = r.optStr()
	case "lora_name":
		ev.LoraName, err = r.optStr()
	case "extra_keys":
		var null bool
		if null, err = r.isNil(); err == nil && !null {
			ev.ExtraKeys, err = r.raw()
		}
	case "group_idx":
		ev.GroupIdx, err = r.optInt64()
	case "kv_cache_spec_kind":
		ev.KVCacheSpecKind, err = r.optStr()
	case "kv_cache_spec_sliding_window":
		ev.KVCacheSpecSlidingWindow, err = r.optInt64()
	default:
		return errUnknownField
	}
	if err != nil {
		return fmt.Errorf("BlockStored %s: %w", name, err)
	}
	return nil
}

func decodeRemovedField(r *reader, ev *BlockRemoved, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.BlockHashes, err = r.engineHashes()
	case "medium":
		ev.Medium, err = r.optStr()
	case "group_idx":
		ev.GroupIdx, err = r.optInt64()
	default:
		return errUnknownField
	}
	if err != nil {
		return fmt.Errorf("BlockRemoved %s: %w", name, err)
	}
	return nil
}

var errUnknownField = errors.New("unknown field")
