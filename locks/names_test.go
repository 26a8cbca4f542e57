package locks

import (
	"fmt"
	"testing"
)

// TestNameCacheKeepsHotNames (issue 33, item 5): a client using 10,000 names
// over and over keeps their keys built, instead of building them again each
// time the cache was full and cleared all at once (at 4,096 names); past its
// bound the cache evicts the oldest names one at a time.
func TestNameCacheKeepsHotNames(t *testing.T) {
	var nc nameCache
	const hot = 10_000
	built := make([]*string, hot)
	for i := range hot {
		ks, _ := nc.get("cg:", fmt.Sprint("hot", i))
		built[i] = &ks[0]
	}
	for i := range hot {
		if ks, _ := nc.get("cg:", fmt.Sprint("hot", i)); &ks[0] != built[i] {
			t.Fatalf("the keys of hot name %d were built again", i)
		}
	}

	// Past the bound, the oldest names go first, one per new name.
	for i := range maxCachedNames {
		nc.get("cg:", fmt.Sprint("more", i))
	}
	n := 0
	nc.m.Range(func(any, any) bool { n++; return true })
	if n != maxCachedNames {
		t.Fatalf("%d names cached, want the bound %d", n, maxCachedNames)
	}
	for i := range hot {
		if _, ok := nc.m.Load(fmt.Sprint("hot", i)); ok {
			t.Fatalf("hot name %d still cached after %d newer names", i, maxCachedNames)
		}
	}
	if _, ok := nc.m.Load(fmt.Sprint("more", 0)); !ok {
		t.Fatal("the oldest of the newer names was evicted before the older ones")
	}
}
