package slot

import "testing"

// Known slots from the Redis Cluster specification and CLUSTER KEYSLOT.
func TestOf(t *testing.T) {
	for key, want := range map[string]int{
		"foo":                  12182,
		"{user1000}.a":         Of("user1000"),
		"{}foo":                Of("{}foo"),
		"123456789":            12739, // CRC16("123456789") = 0x31C3 = 12739
		"a{b}c{d}":             Of("b"),
		"{user1000}.following": 3443,
	} {
		if got := Of(key); got != want {
			t.Errorf("Of(%q) = %d, want %d", key, got, want)
		}
	}
}
