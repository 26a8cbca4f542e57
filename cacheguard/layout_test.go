package cacheguard_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// A key's values live in one hash, one field per representation, as long as
// the longest-lived of them; a fill drops the fields of representations past
// their stale window, so a representation no longer asked for does not live
// on with the others.
func TestValuesHashDropsDeadRepresentations(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGuard(t, cacheguard.Jitter(0), cacheguard.EarlyRefresh(0))
	key := testKey(t)
	if _, err := cacheguard.Get(ctx, g, key, func(context.Context) (string, error) { return "text", nil }, cacheguard.TTL(50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := cacheguard.Get(ctx, g, key, (&counter{name: "item"}).load, cacheguard.TTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := rdb.HLen(ctx, valueKey(key)).Val(); n != 2 {
		t.Fatalf("%d fields, want 2", n)
	}
	if ttl := rdb.PTTL(ctx, valueKey(key)).Val(); ttl < 59*time.Minute {
		t.Fatalf("hash TTL %v, want the longest value's (an hour)", ttl)
	}
	// The string's envelope says when it stops being servable (bytes 12-20).
	eventually(t, 5*time.Second, "the string value past its stale window", func() bool {
		b, err := rdb.HGet(ctx, valueKey(key), "string").Bytes()
		return err == nil && len(b) >= 20 && int64(binary.BigEndian.Uint64(b[12:])) < time.Now().UnixMilli()
	})
	if _, err := cacheguard.Get(ctx, g, key, func(context.Context) (int, error) { return 7, nil }); err != nil {
		t.Fatal(err)
	}
	fields := rdb.HKeys(ctx, valueKey(key)).Val()
	if len(fields) != 2 || rdb.HExists(ctx, valueKey(key), "string").Val() {
		t.Fatalf("fields %q after a fill, want the item's and the int's (the dead string dropped)", fields)
	}
}

// A generation lost in Redis (evicted, flushed) never turns an invalidated
// value into a hit: Invalidate deletes the values themselves.
func TestLostGenerationInvalidatesValues(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGuard(t)
	key := testKey(t)
	c := &counter{name: "v"}
	if _, err := cacheguard.Get(ctx, g, key, c.load); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, "cg:g:{"+key+"}").Err(); err != nil {
		t.Fatal(err)
	}
	var res cacheguard.Result
	if v, err := cacheguard.Get(ctx, g, key, c.load, cacheguard.ReportTo(&res)); err != nil || v.ID != 1 || res != cacheguard.Hit {
		t.Fatalf("Get with the generation lost: %v, %v, %v; want the value stored (a hit)", v, err, res)
	}
	if err := g.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	if v, err := cacheguard.Get(ctx, g, key, c.load, cacheguard.ReportTo(&res)); err != nil || v.ID != 2 || res != cacheguard.Miss {
		t.Fatalf("Get after Invalidate: %v, %v, %v; want a new load", v, err, res)
	}
}
