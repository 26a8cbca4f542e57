package rcmd

import (
	"testing"
	"time"
)

// TestSilence: the first command sent after an answer starts the silence,
// later ones do not move it, an answer ends it; a mark withdrawn soon after
// its send ends it too (the next command starts it again), one withdrawn
// late does not.
func TestSilence(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	var s Silence
	s.Start()
	if got := s.Length(ms(5)); got != 0 {
		t.Fatalf("nothing sent: silent %v", got)
	}
	m := s.Sent(ms(10))
	if m == 0 {
		t.Fatal("the first command sent marked nothing")
	}
	if again := s.Sent(ms(20)); again != 0 {
		t.Fatal("a command sent during a silence marked it again")
	}
	if got := s.Length(ms(110)); got != ms(100) {
		t.Fatalf("silent %v, want 100ms (since the first send)", got)
	}
	s.Answered(ms(120))
	if got := s.Length(ms(130)); got != 0 || !s.AnsweredAfter(ms(110)) || s.AnsweredAfter(ms(120)) {
		t.Fatalf("after an answer at 120ms: silent %v, answered after 110ms %v, after 120ms %v",
			got, s.AnsweredAfter(ms(110)), s.AnsweredAfter(ms(120)))
	}
	s.Withdraw(m, ms(130), ms(1000)) // a stale mark: changes nothing
	m = s.Sent(ms(200))
	s.Withdraw(m, ms(300), ms(50)) // withdrawn late: the silence stands
	if got := s.Length(ms(300)); got != ms(100) {
		t.Fatalf("after a late withdrawal: silent %v, want 100ms", got)
	}
	s.Answered(ms(310))
	m = s.Sent(ms(400))
	s.Withdraw(m, ms(420), ms(50)) // withdrawn soon: no silence
	if got := s.Length(ms(500)); got != 0 {
		t.Fatalf("after an early withdrawal: silent %v, want 0", got)
	}
	if m2 := s.Sent(ms(600)); m2 == 0 || s.Length(ms(650)) != ms(50) {
		t.Fatalf("the next command after a withdrawal: mark %d, silent %v, want a mark and 50ms", m2, s.Length(ms(650)))
	}
}
