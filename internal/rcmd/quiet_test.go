package rcmd

import (
	"testing"
	"time"
)

// TestDeadlineFollowsQuiet: a command sent while nothing waits, or while
// Redis answered since the oldest waiting command was sent, may wait
// Patience command timeouts; once a command has waited a quarter timeout
// with nothing answered since it was sent, the next ones get the command
// timeout, raised to the estimate of the reply time when answers come
// slowly.
func TestDeadlineFollowsQuiet(t *testing.T) {
	const base = 100 * time.Millisecond
	r := &Runner{timeout: base}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, c := range []struct {
		name          string
		heard, waited time.Duration // 0: none
		now           time.Duration
		want          time.Duration
	}{
		{"nothing sent yet", 0, 0, ms(1000), Patience * base},
		{"answered since the last send", ms(900), ms(800), ms(1000), Patience * base},
		{"a send waits, under a quarter timeout", ms(900), ms(980), ms(1000), Patience * base},
		{"a send waited over a quarter timeout", ms(900), ms(970), ms(1000), base},
		{"quiet for long", 0, ms(10), ms(1000), base},
	} {
		r.quiet.heard.Store(int64(c.heard))
		r.quiet.waiting.Store(int64(c.waited))
		if got := r.timeoutAt(c.now); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}

	for i := range 16 { // answers in 10ms and 70ms, alternately
		r.sample(ms(10 + 60*(i%2)))
	}
	r.quiet.heard.Store(int64(ms(900)))
	r.quiet.waiting.Store(int64(ms(901)))
	got := r.timeoutAt(ms(1000))
	if got <= ms(140) || got >= Patience*base { // 167ms by RFC 6298's arithmetic
		t.Fatalf("quiet, after uneven 10-70ms answers: %v, want over 140ms and under %v", got, Patience*base)
	}
	for range 50 { // very slow answers: capped at Patience timeouts
		r.sample(time.Hour)
	}
	if got := r.timeoutAt(ms(1000)); got != Patience*base {
		t.Fatalf("quiet, after hour-long answers: %v, want the cap %v", got, Patience*base)
	}
}
