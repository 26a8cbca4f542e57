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

// Every key of a name shares the name's slot, and distinct names keep
// distinct keys, whatever braces they hold.
func TestTag(t *testing.T) {
	seen := map[string]string{}
	for _, name := range []string{"repo:42", "}", "}x", "a}b", "{a}", "{}", "a{b", "~x", "{", "}repos:42"} {
		tag, rest := Tag(name)
		a, b := "p:lock:{"+tag+"}"+rest, "p:fence:{"+tag+"}"+rest
		if Of(a) != Of(b) || Of(a) != Of("{"+tag+"}") {
			t.Errorf("%q: keys %q and %q in slots %d and %d", name, a, b, Of(a), Of(b))
		}
		if other, ok := seen[a]; ok {
			t.Errorf("%q and %q share the key %q", name, other, a)
		}
		seen[a] = name
	}
	if tag, rest := Tag("repo:42"); tag != "repo:42" || rest != "" {
		t.Errorf("Tag(repo:42) = %q, %q: want the name itself", tag, rest)
	}
}
