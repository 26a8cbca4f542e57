package ginmw

import (
	"net/http"
	"reflect"
	"testing"
	"time"
)

func TestRespCodecRoundTrip(t *testing.T) {
	for _, in := range []*response{
		{status: 203, header: http.Header{"Content-Type": {"text/plain"}, "X-Multi": {"a", "", "c"}}, body: []byte("hello\x00world")},
		{status: 200, header: http.Header{}, body: []byte{}, strict: true, lifetime: 30 * time.Second, expires: 1798761600123},
	} {
		b, err := respCodec{}.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var out *response
		if err := (respCodec{}).Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(in, out) {
			t.Fatalf("round trip: %+v != %+v", out, in)
		}
	}
	// A version-1 payload of an earlier release is still read.
	v1 := []byte("gr\x01\x00\xc8\x01\x01A\x01\x01bbody")
	var old *response
	if err := (respCodec{}).Unmarshal(v1, &old); err != nil || old.status != 200 || old.header.Get("A") != "b" || string(old.body) != "body" || old.expires != 0 {
		t.Fatalf("version 1: %+v, %v", old, err)
	}
	if _, err := (respCodec{}).Marshal("not a response"); err == nil {
		t.Fatal("encoded a string")
	}
}

// Unmarshal reports an error, never panics, on bytes that are not a stored
// response (a truncated value, another codec's bytes).
func FuzzRespCodecUnmarshal(f *testing.F) {
	good, _ := respCodec{}.Marshal(&response{status: 200, header: http.Header{"A": {"b"}}, body: []byte("x")})
	for _, seed := range [][]byte{nil, []byte("gr"), []byte("gr\x01\x00\xc8\xff\xff\xff\xff\x0f"), good, good[:len(good)-3], []byte(`{"json":1}`)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r *response
		if err := (respCodec{}).Unmarshal(data, &r); err == nil && (r == nil || r.status < 100 || r.status > 999) {
			t.Fatalf("accepted %q as %+v", data, r)
		}
	})
}
