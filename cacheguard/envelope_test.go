package cacheguard

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	now := time.Now().UnixMilli()
	for _, e := range []envelope{
		{freshUntil: now, staleUntil: now + 1000, delta: 1500 * time.Microsecond, gen: 1, payload: []byte(`{"id":1}`)},
		{freshUntil: now, staleUntil: now, gen: now * 1000, negative: true},
		{freshUntil: 0, staleUntil: 0, gen: maxTime, payload: []byte{}},
	} {
		got, err := decodeEnvelope(e.encode())
		if err != nil {
			t.Fatal(err)
		}
		if got.freshUntil != e.freshUntil || got.staleUntil != e.staleUntil || got.delta != e.delta ||
			got.gen != e.gen || got.negative != e.negative || !bytes.Equal(got.payload, e.payload) {
			t.Fatalf("decoded %+v, want %+v", got, e)
		}
	}
}

// FuzzDecodeEnvelope checks that no bytes make decoding panic, that what
// decodes re-encodes to the same bytes, and that a decoded payload reaches the
// codec without a panic either. The seeds run as a normal test.
func FuzzDecodeEnvelope(f *testing.F) {
	now := time.Now().UnixMilli()
	f.Add((&envelope{freshUntil: now, staleUntil: now + 60000, delta: time.Millisecond, gen: 7, payload: []byte(`{"id":7,"name":"x"}`)}).encode())
	f.Add((&envelope{freshUntil: now, staleUntil: now, gen: 7, negative: true}).encode())
	f.Add((&envelope{freshUntil: now, staleUntil: now, gen: 7, payload: []byte(`[1,2`)}).encode())
	f.Add([]byte{})
	f.Add([]byte("cg"))
	f.Add([]byte("cg\x01\x00"))
	f.Add([]byte("cg\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Add([]byte("cg\x01\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00"))
	f.Add([]byte(`{"id":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEnvelope(b)
		if err != nil {
			if !errors.Is(err, ErrDecode) {
				t.Fatalf("error %v does not match ErrDecode", err)
			}
			return
		}
		if e.staleUntil < e.freshUntil || e.freshUntil < 0 {
			t.Fatalf("accepted bad times %d, %d", e.freshUntil, e.staleUntil)
		}
		if again := e.encode(); !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x, want %x", again, b)
		}
		type item struct {
			ID   int
			Name string
		}
		for _, cd := range []Codec{JSON{}, MsgPack{}} {
			if _, err := decodeValue[item](cd, &e); err != nil && !errors.Is(err, ErrDecode) {
				t.Fatalf("%T: payload error %v does not match ErrDecode", cd, err)
			}
		}
	})
}

// TestEarlyRefreshWindow: an early refresh starts at least twice the last
// load's duration before expiry, and never more than a quarter of the TTL.
func TestEarlyRefreshWindow(t *testing.T) {
	e := envelope{freshUntil: 100_000, delta: time.Hour}
	c := config{beta: 1e9, ttl: 60 * time.Second} // a quarter: 15s
	for range 1000 {
		if c.xfetch(e.freshUntil-15_001, &e) {
			t.Fatal("refreshed 15.001s before expiry with a 60s TTL")
		}
	}
	if !c.xfetch(e.freshUntil-14_999, &e) {
		t.Fatal("no refresh 14.999s before expiry with a huge β")
	}
	e.delta, c.beta = 100*time.Millisecond, 1
	for range 1000 {
		if !c.xfetch(e.freshUntil-199, &e) {
			t.Fatal("no refresh 199ms before expiry of a value whose load took 100ms")
		}
	}
}
