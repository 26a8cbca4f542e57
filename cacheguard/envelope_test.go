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
// load's duration before expiry, and never more than the value's lead: one
// point, drawn per value, between an eighth and a quarter of the TTL.
func TestEarlyRefreshWindow(t *testing.T) {
	c := config{beta: 1e9, ttl: 60 * time.Second} // a quarter: 15s; an eighth: 7.5s
	var lo, hi float64 = 15_000, 0
	for i := range 1000 {
		e := envelope{freshUntil: 100_000 + int64(i), delta: time.Hour + time.Duration(i)*time.Microsecond}
		lead := c.lead(&e)
		if lead < 7_500 || lead > 15_000 {
			t.Fatalf("lead %vms is outside an eighth to a quarter of a 60s TTL", lead)
		}
		lo, hi = min(lo, lead), max(hi, lead)
		for range 10 {
			if c.xfetch(e.freshUntil-int64(lead)-1, &e) {
				t.Fatalf("refreshed %vms before expiry, past the value's lead %vms", int64(lead)+1, lead)
			}
		}
		if !c.xfetch(e.freshUntil-int64(lead)+1, &e) {
			t.Fatalf("no refresh within the value's lead %vms with a huge β", lead)
		}
	}
	if hi-lo < 7_000 {
		t.Fatalf("leads of 1000 values span %v to %vms: not spread over the window", lo, hi)
	}
	e := envelope{freshUntil: 100_000}
	e.delta, c.beta = 100*time.Millisecond, 1
	for range 1000 {
		if !c.xfetch(e.freshUntil-199, &e) {
			t.Fatal("no refresh 199ms before expiry of a value whose load took 100ms")
		}
	}
}
