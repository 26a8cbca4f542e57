package isnil

import "testing"

func TestPointer(t *testing.T) {
	var p *int
	var s fmtStringer = (*named)(nil)
	for _, c := range []struct {
		v    any
		want bool
	}{{nil, false}, {p, true}, {s, true}, {new(int), false}, {3, false}, {named{}, false}} {
		if got := Pointer(c.v); got != c.want {
			t.Errorf("Pointer(%#v) = %v, want %v", c.v, got, c.want)
		}
	}
}

type fmtStringer interface{ String() string }

type named struct{}

func (*named) String() string { return "" }
