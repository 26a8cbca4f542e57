// Package rid makes the random ids this module stores in Redis: fill-lease
// and lock tokens, lock owners, and the ids of processes in channel names and
// messages.
package rid

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
)

// New returns 128 random bits in hex, from the runtime's per-thread ChaCha8
// generator: unpredictable and free of locks and system calls.
func New() string {
	var raw [16]byte
	binary.LittleEndian.PutUint64(raw[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(raw[8:], rand.Uint64())
	var b [32]byte
	hex.Encode(b[:], raw[:])
	return string(b[:])
}
