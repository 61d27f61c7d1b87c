package kvindex

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/kvevents/vllmwire"
)

// Multimodal extra keys (docs/architecture.md §3.5).
//
// vLLM folds the identifier of every multimodal item whose placeholder range
// overlaps a block into that block's hash as an "extra key"
// (vllm/v1/core/kv_cache_utils.py, _gen_mm_extra_hash_keys and
// generate_block_hash_extra_keys, read at vllm-project/vllm commit
// 001cabc1be16a59a70d720ed61a13b678c060a18). The per-block extra keys are
// the tuple lora_name + mm keys + cache_salt (first block of the request
// only) + prompt-embedding hashes, or None when empty. Each mm key is
// (identifier, offset - block_start) in current vLLM; releases before the
// offset was added put the bare identifier string. BlockStored carries the
// same tuples in extra_keys, one entry per block (list[tuple | None]).
//
// The router never reproduces the engine's hash function (sha256/pickle,
// sha256_cbor, xxhash, xxhash_cbor, all over (parent, token tuple, extra
// keys)); it folds the identifiers into its own chain, on the request side
// from where each image sits in the prompt and on the event side from the
// extra keys, so that both sides agree.

// MMPlacement is one multimodal item in a prompt: its identifier (the
// client's uuid, or the identity the router derived and injected) and the
// token range of its placeholder, [Offset, Offset+Length).
type MMPlacement struct {
	ID     string
	Offset int
	Length int
}

// MMKey is one multimodal extra key of a block: the item's identifier and
// its offset relative to the block's first token (negative when the item
// began in an earlier block), as vLLM writes it.
type MMKey struct {
	ID     string
	Offset int
}

// MMBlockKeys returns, for each of the nTokens/blockSize full blocks, the
// multimodal keys vLLM attaches to it: every item whose placeholder range
// overlaps the block, in prompt order. items must be sorted by Offset. It
// returns nil when no block has a key.
//
// This is current vLLM's rule (start >= offset+length: past the item). The
// same vLLM change that added the offset to the key changed it from ">":
// engines that publish bare identifiers also key the one block that starts
// exactly where an item ends. Against those, a prediction stops at that
// block when an image ends on a block boundary (about one image in
// block_size); the router does not guess the engine's version per request.
func MMBlockKeys(items []MMPlacement, nTokens, blockSize int) [][]MMKey {
	if blockSize < 1 || len(items) == 0 {
		return nil
	}
	n := nTokens / blockSize
	var out [][]MMKey
	cur := 0
	for b := 0; b < n && cur < len(items); b++ {
		start, end := b*blockSize, (b+1)*blockSize
		var keys []MMKey
		for cur < len(items) {
			it := items[cur]
			if end <= it.Offset {
				break // the block has not reached this item
			}
			if start >= it.Offset+it.Length {
				cur++ // the block is past this item
				continue
			}
			keys = append(keys, MMKey{ID: it.ID, Offset: it.Offset - start})
			if end >= it.Offset+it.Length {
				cur++ // this block holds the item's end; the next may start here too
				continue
			}
			break
		}
		if len(keys) > 0 {
			if out == nil {
				out = make([][]MMKey, n)
			}
			out[b] = keys
		}
	}
	return out
}

// HashBlocksMM is HashBlocks for a prompt with multimodal items: a block
// with keys hashes as xxh3_64(LE64(h_{i-1}) ‖ LE32 tokens ‖ for each key
// LE32(len(id)) ‖ id); a block without keys exactly as in HashBlocks, so a
// text-only prefix gives the same hashes either way. keys may be shorter
// than the number of blocks (missing entries mean no key) or nil.
func HashBlocksMM(seed uint64, tokens []uint32, blockSize int, keys [][]MMKey, dst []uint64) []uint64 {
	if len(keys) == 0 {
		return HashBlocks(seed, tokens, blockSize, dst)
	}
	if blockSize < 1 {
		return dst
	}
	n := len(tokens) / blockSize
	prev := seed
	var buf []byte
	for i := 0; i < n; i++ {
		blk := tokens[i*blockSize : (i+1)*blockSize]
		if i >= len(keys) || len(keys[i]) == 0 {
			var one [1]uint64
			prev = HashBlocks(prev, blk, blockSize, one[:0])[0]
			dst = append(dst, prev)
			continue
		}
		buf = binary.LittleEndian.AppendUint64(buf[:0], prev)
		for _, t := range blk {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		for _, k := range keys[i] {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(len(k.ID)))
			buf = append(buf, k.ID...)
		}
		prev = nonZero(xxh3.Hash(buf))
		dst = append(dst, prev)
	}
	return dst
}

// EncodeMMExtraKeys returns BlockStored.extra_keys for blocks whose only
// extra keys are multimodal ones, in current vLLM's layout: one entry per
// block, None or a tuple of [identifier, offset] pairs. It is what kvsim
// publishes; nil keys give nil (extra_keys None).
func EncodeMMExtraKeys(keys [][]MMKey, nBlocks int) msgpack.RawMessage {
	if len(keys) == 0 {
		return nil
	}
	list := make([]any, nBlocks)
	for i := 0; i < nBlocks && i < len(keys); i++ {
		if len(keys[i]) == 0 {
			continue
		}
		tup := make([]any, len(keys[i]))
		for j, k := range keys[i] {
			tup[j] = []any{k.ID, int64(k.Offset)}
		}
		list[i] = tup
	}
	raw, err := msgpack.Marshal(list)
	if err != nil { // cannot happen for strings and integers
		return nil
	}
	return raw
}

// ErrExtraKeys wraps every error BlockMMKeys returns.
var ErrExtraKeys = errors.New("malformed extra_keys")

// BlockMMKeys reads the multimodal keys of each of nBlocks blocks from a
// BlockStored's raw extra_keys (nil: None), and, for a root event (no
// parent: its first block is the request's first), the cache salt. It accepts every layout vLLM
// has shipped:
//
//   - an mm key as a 2-element array [identifier string, offset int]
//     (current vLLM);
//   - an mm key as a bare identifier string (vLLM 0.10–0.11, before the
//     offset was added). Strings are also how the LoRA name (first element,
//     equal to lora) and the cache salt (last element of the request's first
//     block) travel; in a root event (root true) the first block's last
//     string is taken as the salt unless the same string also keys the
//     second block (an image running on past the first block).
//
// Byte strings (prompt-embedding hashes) and None entries carry no mm key.
// Entries past nBlocks are an error, as is anything that is not a list of
// tuples (or None). The returned offsets are 0 for the bare-string layout.
func BlockMMKeys(extraKeys []byte, lora string, nBlocks int, root bool) (keys [][]MMKey, salt string, err error) {
	keys, salt, err = blockMMKeys(extraKeys, lora, nBlocks, root)
	if err != nil {
		return nil, "", err
	}
	if !root {
		salt = ""
	}
	return keys, salt, nil
}

func blockMMKeys(extraKeys []byte, lora string, nBlocks int, root bool) ([][]MMKey, string, error) {
	if len(extraKeys) == 0 {
		return nil, "", nil
	}
	r := vllmwire.NewReader(extraKeys)
	if null, err := r.IsNil(); err != nil || null {
		return nil, "", wrapExtra(err)
	}
	n, err := r.ArrayLen()
	if err != nil {
		return nil, "", wrapExtra(err)
	}
	if n > nBlocks {
		return nil, "", fmt.Errorf("%w: %d entries for %d blocks", ErrExtraKeys, n, nBlocks)
	}
	var out [][]MMKey
	var bare [][]string // bare strings per block, for the old layout
	for b := 0; b < n; b++ {
		null, err := r.IsNil()
		if err != nil {
			return nil, "", wrapExtra(err)
		}
		if null {
			continue
		}
		m, err := r.ArrayLen()
		if err != nil {
			return nil, "", fmt.Errorf("%w: block %d: %w", ErrExtraKeys, b, err)
		}
		for i := 0; i < m; i++ {
			c, err := r.Peek()
			if err != nil {
				return nil, "", wrapExtra(err)
			}
			switch {
			case vllmwire.IsStringCode(c):
				s, err := r.Str()
				if err != nil {
					return nil, "", wrapExtra(err)
				}
				if i == 0 && lora != "" && s == lora {
					continue
				}
				if bare == nil {
					bare = make([][]string, n)
				}
				bare[b] = append(bare[b], s)
			case vllmwire.IsArrayCode(c):
				k, err := readMMKey(r)
				if err != nil {
					return nil, "", fmt.Errorf("%w: block %d key %d: %w", ErrExtraKeys, b, i, err)
				}
				if out == nil {
					out = make([][]MMKey, n)
				}
				out[b] = append(out[b], k)
			default:
				if err := r.Skip(); err != nil {
					return nil, "", wrapExtra(err)
				}
			}
		}
	}
	if r.Remaining() != 0 {
		return nil, "", fmt.Errorf("%w: %d bytes after the list", ErrExtraKeys, r.Remaining())
	}
	if bare == nil {
		return out, "", nil
	}
	if out != nil {
		// Current layout: the tuples are the mm keys; a string after the
		// LoRA name is the salt, on the request's first block.
		salt := ""
		if root && len(bare[0]) > 0 {
			salt = bare[0][0]
		}
		return out, salt, nil
	}
	// Old layout: bare strings are mm identifiers, except the salt.
	salt := ""
	if root && len(bare[0]) > 0 {
		last := bare[0][len(bare[0])-1]
		continues := n > 1 && len(bare[1]) > 0 && bare[1][0] == last
		if !continues {
			salt = last
			bare[0] = bare[0][:len(bare[0])-1]
		}
	}
	for b, ids := range bare {
		if len(ids) == 0 {
			continue
		}
		if out == nil {
			out = make([][]MMKey, n)
		}
		for _, id := range ids {
			out[b] = append(out[b], MMKey{ID: id})
		}
	}
	return out, salt, nil
}

func readMMKey(r vllmwire.Reader) (MMKey, error) {
	m, err := r.ArrayLen()
	if err != nil {
		return MMKey{}, err
	}
	if m != 2 {
		return MMKey{}, fmt.Errorf("mm key with %d elements, want 2", m)
	}
	id, err := r.Str()
	if err != nil {
		return MMKey{}, fmt.Errorf("mm identifier: %w", err)
	}
	off, err := r.Int64()
	if err != nil {
		return MMKey{}, fmt.Errorf("mm offset: %w", err)
	}
	if off < -(1<<40) || off > 1<<40 {
		return MMKey{}, fmt.Errorf("mm offset %d out of range", off)
	}
	return MMKey{ID: id, Offset: int(off)}, nil
}

func wrapExtra(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrExtraKeys, err)
}
