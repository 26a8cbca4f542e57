package cacheguard

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// The stored envelope, version 3 (lease.lua and fill.lua read the header too):
//
//	0  'c' 'g'            magic
//	2  version            2
//	3  flags              bit 0: negative (a cached absence, no payload); bit 1: tags;
//	                      bit 2: fail-safe (an older value kept after a failed load:
//	                      fresh-until ends its back-off, stale-until its max age)
//	4  fresh-until        unix ms, uint64 big-endian (the writer's wall clock)
//	12 stale-until        unix ms, uint64 big-endian (≥ fresh-until)
//	20 last load          µs, uint32 big-endian (Δ of early refresh)
//	24 generation         uint64 big-endian: the key's generation the load started under
//	32 keep-until         unix ms, uint64 big-endian (≥ stale-until): how long the value
//	                      is kept in Redis — its stale window or FailSafe's max age past
//	                      fresh-until — the one number of its retention: the values
//	                      hash's expiry and a sibling's fill (fill.lua) both obey it
//	40 tags               when flag bit 1 is set: count (1 byte), the hash of the
//	                      tag set (uint64), and each tag's version when the load
//	                      began (count × uint64), tags sorted by name
//	   payload            the codec's bytes
const (
	envVersion   = 3
	envHeaderLen = 40
	flagNegative = 1 << 0
	flagTags     = 1 << 1
	flagFailSafe = 1 << 2
	knownFlags   = flagNegative | flagTags | flagFailSafe
	// maxTime bounds the times (year 287,000) and generations: getlease.lua
	// reads them as doubles, exact up to 2^53.
	maxTime = 1<<53 - 1
)

type envelope struct {
	freshUntil int64 // unix ms
	staleUntil int64 // unix ms
	keepUntil  int64 // unix ms
	delta      time.Duration
	gen        int64 // the key's generation when the fill lease was granted
	negative   bool
	failSafe   bool
	tagHash    uint64   // the tag set's hash (see tagSet), with tagVers
	tagVers    []uint64 // the tags' versions when the load began; nil: untagged
	payload    []byte
	// epoch is the near cache's epoch when the value entered it (see
	// nearCache); never stored in Redis, 0 for a value read from there.
	epoch uint64
}

func (e *envelope) encode() []byte {
	tl := 0
	if e.tagVers != nil {
		tl = 1 + 8 + 8*len(e.tagVers)
	}
	b := make([]byte, envHeaderLen+tl+len(e.payload))
	b[0], b[1], b[2] = 'c', 'g', envVersion
	if e.negative {
		b[3] = flagNegative
	}
	if e.failSafe {
		b[3] |= flagFailSafe
	}
	if e.tagVers != nil {
		b[3] |= flagTags
		t := b[envHeaderLen:]
		t[0] = byte(len(e.tagVers))
		binary.BigEndian.PutUint64(t[1:], e.tagHash)
		for i, v := range e.tagVers {
			binary.BigEndian.PutUint64(t[9+8*i:], v)
		}
	}
	binary.BigEndian.PutUint64(b[4:], uint64(e.freshUntil))
	binary.BigEndian.PutUint64(b[12:], uint64(e.staleUntil))
	binary.BigEndian.PutUint32(b[20:], uint32(min(e.delta.Microseconds(), math.MaxUint32)))
	binary.BigEndian.PutUint64(b[24:], uint64(e.gen))
	binary.BigEndian.PutUint64(b[32:], uint64(max(e.keepUntil, e.staleUntil)))
	copy(b[envHeaderLen+tl:], e.payload)
	return b
}

// decodeEnvelope parses b; the payload aliases b. Any bytes that are not a
// version-3 envelope are an error wrapping ErrDecode.
func decodeEnvelope(b []byte) (envelope, error) {
	switch {
	case len(b) < envHeaderLen:
		return envelope{}, fmt.Errorf("%w: %d bytes, shorter than the header", ErrDecode, len(b))
	case b[0] != 'c' || b[1] != 'g':
		return envelope{}, fmt.Errorf("%w: not an envelope", ErrDecode)
	case b[2] != envVersion:
		return envelope{}, fmt.Errorf("%w: envelope version %d, want %d", ErrDecode, b[2], envVersion)
	case b[3]&^knownFlags != 0:
		return envelope{}, fmt.Errorf("%w: unknown flags %#x", ErrDecode, b[3])
	}
	fresh := binary.BigEndian.Uint64(b[4:])
	stale := binary.BigEndian.Uint64(b[12:])
	gen := binary.BigEndian.Uint64(b[24:])
	keep := binary.BigEndian.Uint64(b[32:])
	if keep > maxTime || stale < fresh || keep < stale {
		return envelope{}, fmt.Errorf("%w: bad times %d, %d, %d", ErrDecode, fresh, stale, keep)
	}
	if gen == 0 || gen > maxTime {
		return envelope{}, fmt.Errorf("%w: bad generation %d", ErrDecode, gen)
	}
	e := envelope{
		freshUntil: int64(fresh),
		staleUntil: int64(stale),
		keepUntil:  int64(keep),
		delta:      time.Duration(binary.BigEndian.Uint32(b[20:])) * time.Microsecond,
		gen:        int64(gen),
		negative:   b[3]&flagNegative != 0,
		failSafe:   b[3]&flagFailSafe != 0,
		payload:    b[envHeaderLen:],
	}
	if b[3]&flagTags != 0 {
		t := e.payload
		if len(t) < 9 || len(t) < 9+8*int(t[0]) {
			return envelope{}, fmt.Errorf("%w: truncated tags", ErrDecode)
		}
		n := int(t[0])
		e.tagHash = binary.BigEndian.Uint64(t[1:])
		e.tagVers = make([]uint64, n)
		for i := range n {
			e.tagVers[i] = binary.BigEndian.Uint64(t[9+8*i:])
		}
		e.payload = t[9+8*n:]
	}
	if e.negative && len(e.payload) != 0 {
		return envelope{}, fmt.Errorf("%w: negative envelope with a payload", ErrDecode)
	}
	return e, nil
}

// decodeValue decodes the payload of e into a T with cd, recovering a panicking codec.
func decodeValue[T any](cd Codec, e *envelope) (v T, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: codec panicked: %v", ErrDecode, p)
		}
	}()
	if err := cd.Unmarshal(e.payload, &v); err != nil {
		return v, fmt.Errorf("%w: %w", ErrDecode, err)
	}
	return v, nil
}
