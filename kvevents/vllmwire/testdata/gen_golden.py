#!/usr/bin/python3
"""Writes the golden vLLM KV event frames in this directory.

The frames are built with msgpack-python (Debian's python3-msgpack) laid out
the way vLLM's msgspec structs encode (vllm/distributed/kv_events.py):
array_like structs as positional arrays with the tag first and every field
present; map structs as {"type": tag, field: value, ...} in declaration
order with None defaults omitted (omit_defaults=True). msgpack-python and
msgspec agree on scalar encodings: smallest int form with unsigned codes for
non-negative values, str8 for 32..255-byte strings, float64 for floats.
Run: /usr/bin/python3 kvevents/vllmwire/testdata/gen_golden.py
"""
import hashlib
import os

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
TS = 1789095808.8378847


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def stored_array(hashes, parent, tokens, block_size, lora_id=None, medium="GPU",
                 lora_name=None, extra_keys=None, group_idx=None, kind=None, window=None):
    return ["BlockStored", hashes, parent, tokens, block_size, lora_id, medium,
            lora_name, extra_keys, group_idx, kind, window]


def stored_map(hashes, parent, tokens, block_size, lora_id=None, medium="GPU",
               lora_name=None, extra_keys=None, group_idx=None, kind=None, window=None):
    m = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
         "token_ids": tokens, "block_size": block_size, "lora_id": lora_id,
         "medium": medium, "lora_name": lora_name}
    for k, v in (("extra_keys", extra_keys), ("group_idx", group_idx),
                 ("kv_cache_spec_kind", kind), ("kv_cache_spec_sliding_window", window)):
        if v is not None:
            m[k] = v
    return m


def removed_map(hashes, medium="GPU", group_idx=None):
    m = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
    if group_idx is not None:
        m["group_idx"] = group_idx
    return m


TOK = [151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198, 151667]
TOK2 = list(range(1000, 1016))
BIG = 15760518052499183552  # > 2**63: uint64 on the wire

frames = {
    # vLLM 0.11..0.23: array_like batch and events, every field present.
    "array_v023.msgpack": pack([TS, [
        stored_array([BIG, 42], None, TOK + TOK2, 16, extra_keys=[["tenant-a"], None],
                     group_idx=0, kind="full_attention"),
        ["BlockRemoved", [42], "GPU", 0],
        ["AllBlocksCleared"],
    ], 0]),
    # vLLM 0.9: [ts, events] and BlockStored through lora_id, BlockRemoved with hashes only;
    # hashes were Python hash() values, so negative int64 occur.
    "array_v09.msgpack": pack([1.5, [
        ["BlockStored", [-4611686018427387904, 7], None, TOK + TOK2, 16, None],
        ["BlockRemoved", [7]],
    ]]),
    # vLLM after PR #42892: array batch, tagged map events, None defaults omitted.
    "eventmaps.msgpack": pack([TS, [
        stored_map([BIG], None, TOK, 16, extra_keys=[None], group_idx=0, kind="full_attention"),
        stored_map([9, 10], BIG, TOK2 + TOK, 16, medium="CPU", lora_name="sql-lora", lora_id=3,
                   extra_keys=[["sql-lora"], ["sql-lora"]], group_idx=0, kind="full_attention"),
        removed_map([9], medium="CPU", group_idx=0),
        {"type": "AllBlocksCleared"},
    ], 0]),
    # Batch struct map-encoded too (EventBatch without array_like).
    "map.msgpack": pack({"ts": TS, "events": [
        stored_map([1], None, TOK, 16, extra_keys=[["tenant-b"]]),
        removed_map([1]),
    ], "data_parallel_rank": 1}),
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: 32-byte sha256 hashes as bytes.
    "bytes_hashes.msgpack": pack([TS, [
        stored_array([hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest()],
                     hashlib.sha256(b"root").digest(), TOK + TOK2, 16,
                     extra_keys=None, group_idx=0, kind="full_attention"),
    ], None]),
}

for name, data in frames.items():
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)
    print(name, len(data), data[:16].hex())
