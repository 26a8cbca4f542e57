package cacheguard_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/segmentio/asm/cpu"
	"github.com/segmentio/asm/cpu/x86"

	"github.com/cacheguard/cacheguard/cacheguard"
)

type record struct {
	ID     int64             `msgpack:"id"`
	Name   string            `msgpack:"name"`
	Topics []string          `msgpack:"topics"`
	Attrs  map[string]string `msgpack:"attrs"`
	Raw    []byte            `msgpack:"raw"`
}

// TestMsgPackCodec: values stored with Encoding(MsgPack{}) come back equal
// on a hit, for Get and GetMany; a reader whose codec is not the writer's
// finds a decode error, which is a miss that stores the value again.
func TestMsgPackCodec(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t, cacheguard.Encoding(cacheguard.MsgPack{}))
	key := testKey(t)
	want := record{ID: 42, Name: "cacheguard", Topics: []string{"redis", "cache"}, Attrs: map[string]string{"a": "b"}, Raw: []byte{0, 1, 2}}
	load := func(context.Context) (record, error) { return want, nil }
	var res cacheguard.Result
	for _, wantRes := range []cacheguard.Result{cacheguard.Miss, cacheguard.Hit} {
		v, err := cacheguard.Get(ctx, g, key, load, cacheguard.ReportTo(&res))
		if err != nil || res != wantRes || !reflect.DeepEqual(v, want) {
			t.Fatalf("Get = %+v, %v, %v; want %+v, %v", v, err, res, want, wantRes)
		}
	}
	m, err := cacheguard.GetMany(ctx, g, []string{key}, func(context.Context, []string) (map[string]record, error) {
		t.Error("GetMany loaded a stored value")
		return nil, nil
	}, cacheguard.ReportTo(&res))
	if err != nil || res != cacheguard.Hit || !reflect.DeepEqual(m[key], want) {
		t.Fatalf("GetMany = %+v, %v, %v; want a hit of %+v", m, err, res, want)
	}

	// The other codec's bytes are a decode error: a miss, stored again.
	v, err := cacheguard.Get(ctx, g, key, load, cacheguard.Encoding(cacheguard.JSON{}), cacheguard.ReportTo(&res))
	if err != nil || res != cacheguard.Miss || !reflect.DeepEqual(v, want) {
		t.Fatalf("Get with JSON over MsgPack bytes = %+v, %v, %v; want a load", v, err, res)
	}
	if st := g.Stats(); st.DecodeErrors != 1 {
		t.Fatalf("decode errors = %d, want 1", st.DecodeErrors)
	}
}

// TestJSONRunsNoAVXRoutine checks that importing the package turned off
// segmentio/asm's AVX routines (see cacheguard.JSON): each returns with the
// YMM state dirty, and every call then pays an AVX→SSE transition whose cost
// depends on the host. The routines read these bits on every call.
func TestJSONRunsNoAVXRoutine(t *testing.T) {
	for _, f := range []x86.Feature{x86.AVX, x86.AVX2, x86.AVX512F, x86.AVX512BW} {
		if cpu.X86.Has(f) {
			t.Errorf("segmentio/asm feature %#x is on: JSON's decoder runs its AVX routines", f)
		}
	}
	var v record
	if err := (cacheguard.JSON{}).Unmarshal([]byte(`{"id":42,"name":"cacheguard with a name long enough for a vector scan"}`), &v); err != nil || v.ID != 42 {
		t.Fatalf("Unmarshal = %+v, %v", v, err)
	}
}
