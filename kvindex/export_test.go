package kvindex

import "github.com/zeebo/xxh3"

func xxh3Hash(b []byte) uint64 { return xxh3.Hash(b) }
