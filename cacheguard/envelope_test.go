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

// TestEarlyRefreshWindow: an early refresh starts at the value's lead
// before expiry: between twice and four times the last load's duration, and
// never more than a cap between an eighth and a quarter of the TTL — both
// drawn per value, so that values spread over the window.
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
		if c.xfetch(e.freshUntil-int64(lead)-1, &e) {
			t.Fatalf("refreshed %vms before expiry, past the value's lead %vms", int64(lead)+1, lead)
		}
		if !c.xfetch(e.freshUntil-int64(lead)+1, &e) {
			t.Fatalf("no refresh within the value's lead %vms", lead)
		}
	}
	if hi-lo < 7_000 {
		t.Fatalf("capped leads of 1000 values span %v to %vms: not spread over the window", lo, hi)
	}
	c.beta, lo, hi = 1, 1e9, 0
	for i := range 1000 {
		e := envelope{freshUntil: 100_000 + int64(i), delta: 100*time.Millisecond + time.Duration(i)*time.Microsecond}
		lead := c.lead(&e)
		if d := float64(e.delta.Microseconds()) / 1000; lead < 2*d || lead >= 4*d {
			t.Fatalf("lead %vms of a value whose load took about 100ms: not between 2Δ and 4Δ", lead)
		}
		lo, hi = min(lo, lead), max(hi, lead)
	}
	if hi-lo < 150 {
		t.Fatalf("leads of 1000 values whose load took 100ms span %v to %vms: not spread", lo, hi)
	}
}

// TestHotKeyRefreshesNoEarlierForMoreHits: how early a value is refreshed
// does not grow with how often it is read. XFetch's gap, drawn per hit,
// reached past 4Δ before expiry for about one hit in twelve, so a hot key was
// refreshed earlier than it needs, for more loads than the ideal.
func TestHotKeyRefreshesNoEarlierForMoreHits(t *testing.T) {
	c := config{beta: 1, ttl: time.Minute}
	e := envelope{freshUntil: 100_000, delta: 100 * time.Millisecond}
	for range 10_000 { // ten thousand hits 450ms before expiry
		if c.xfetch(e.freshUntil-450, &e) {
			t.Fatal("a hit 450ms before expiry refreshed a value whose load took 100ms (more than 4Δ early)")
		}
	}
}
