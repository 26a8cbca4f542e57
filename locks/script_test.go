package locks_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestScriptsUnpackBounded is a source check: no script of the package
// unpacks a whole list into one command. Lua cannot unpack much more than
// 8,000 values ("too many results to unpack"), so a list whose size Redis
// decides (a queue's dead places) is passed in slices, unpack(list, i, j)
// (TestManyDeadWaitersDoNotWedgeTheName).
func TestScriptsUnpackBounded(t *testing.T) {
	files, err := filepath.Glob("*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts found: %v", err)
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			code, _, _ := strings.Cut(line, "--")
			for rest := code; ; {
				_, after, ok := strings.Cut(rest, "unpack(")
				if !ok {
					break
				}
				rest = after
				if args := topLevelArgs(after); args != 3 {
					t.Errorf("%s:%d: unpack with %d arguments unpacks a whole list; pass a bounded slice, unpack(list, i, j): %s",
						f, i+1, args, strings.TrimSpace(code))
				}
			}
		}
	}
}

// topLevelArgs counts the arguments of a call whose text, after its opening
// parenthesis, is s (on one line).
func topLevelArgs(s string) int {
	depth, n := 0, 1
	for _, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			if depth == 0 {
				return n
			}
			depth--
		case ',':
			if depth == 0 {
				n++
			}
		}
	}
	return -1 // not closed on this line
}
