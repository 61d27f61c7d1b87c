package vllmwire

import (
	"errors"
	"fmt"
)

// decodeEventMap reads a tagged map event. The "type" key may come anywhere,
// so fields are read into every candidate shape and the tag picks one.
func decodeEventMap(r *reader) (Event, error) {
	n, err := r.mapLen()
	if err != nil {
		return nil, err
	}
	var (
		tag      string
		stored   BlockStored
		removed  BlockRemoved
		unknown  []UnknownField
		seen     = map[string]bool{}
		rejected error
	)
	for i := 0; i < n; i++ {
		key, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("event key: %w", err)
		}
		if seen[key] {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		if key == "type" {
			if tag, err = r.str(); err != nil {
				return nil, fmt.Errorf("event type: %w", err)
			}
			continue
		}
		// BlockStored's fields are a superset of BlockRemoved's, so one read
		// serves both; BlockRemoved copies what it shares afterwards.
		start := r.pos()
		err = decodeStoredField(r, &stored, key)
		if errors.Is(err, errUnknownField) {
			v, err := r.raw()
			if err != nil {
				return nil, fmt.Errorf("event %q: %w", key, err)
			}
			unknown = append(unknown, UnknownField{Name: key, Value: v})
			continue
		}
		if err != nil {
			// A value wrong for BlockStored may still be fine for no event;
			// remember the error and keep reading to learn the tag.
			if rejected == nil {
				rejected = err
			}
			end, serr := skipValue(r.data, start, 0)
			if serr != nil {
				return nil, serr
			}
			if _, serr := r.br.Seek(int64(end), 0); serr != nil {
				return nil, serr
			}
		}
	}
	switch tag {
	case "BlockStored":
		if rejected != nil {
			return nil, rejected
		}
		if !seen["block_hashes"] || !seen["token_ids"] || !seen["block_size"] {
			return nil, errors.New("BlockStored lacks block_hashes, token_ids or block_size")
		}
		stored.Unknown = unknown
		return stored, nil
	case "BlockRemoved":
		if rejected != nil {
			return nil, rejected
		}
		if !seen["block_hashes"] {
			return nil, errors.New("BlockRemoved lacks block_hashes")
		}
		removed.BlockHashes, removed.Medium, removed.GroupIdx = stored.BlockHashes, stored.Medium, stored.GroupIdx
		for _, name := range storedFieldNames {
			if seen[name] && name != "block_hashes" && name != "medium" && name != "group_idx" {
				return nil, fmt.Errorf("BlockRemoved has BlockStored field %q", name)
			}
		}
		removed.Unknown = unknown
		return removed, nil
	case "AllBlocksCleared":
		for _, name := range storedFieldNames {
			if seen[name] {
				return nil, fmt.Errorf("AllBlocksCleared has field %q", name)
			}
		}
		return AllBlocksCleared{Unknown: unknown}, nil
	case "":
		return nil, errors.New("event map without a type key")
	}
	return nil, fmt.Errorf("unknown event tag %q", tag)
}
