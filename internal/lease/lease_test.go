package lease

import (
	"testing"
	"time"
)

func TestGrant(t *testing.T) {
	now := time.Now()
	g := Grant{Sent: now, Lease: 3 * time.Second}
	if !g.Deadline().Equal(now.Add(3*time.Second)) || !g.RenewAt().Equal(now.Add(time.Second)) {
		t.Fatalf("deadline %v renewAt %v", g.Deadline().Sub(now), g.RenewAt().Sub(now))
	}
	if g.Spent() || g.Due() {
		t.Fatal("a grant sent now is neither spent nor due")
	}
	old := Grant{Sent: now.Add(-2 * time.Second), Lease: 3 * time.Second}
	if old.Spent() || !old.Due() {
		t.Fatal("two thirds into its lease: due, not spent")
	}
	if !(Grant{Sent: now.Add(-3 * time.Second), Lease: 3 * time.Second}).Spent() {
		t.Fatal("at its deadline: spent")
	}
	// 3 s leaves a margin of 32 ms: 20 ms left is too little to hand over.
	if m := g.Margin(); m != 32*time.Millisecond {
		t.Fatalf("margin %v, want 32ms", m)
	}
	if !(Grant{Sent: time.Now().Add(-3*time.Second + 20*time.Millisecond), Lease: 3 * time.Second}).Spent() {
		t.Fatal("less than its margin left: spent")
	}
	if (Grant{Sent: time.Now().Add(-3*time.Second + time.Second), Lease: 3 * time.Second}).Spent() {
		t.Fatal("a second left: not spent")
	}
}
