package rid

import "testing"

func TestNew(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := New()
		if len(id) != 32 || seen[id] {
			t.Fatalf("id %q: want 32 hex digits, never twice", id)
		}
		seen[id] = true
	}
}
