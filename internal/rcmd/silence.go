package rcmd

import (
	"sync/atomic"
	"time"
)

// Silence is the clock of a Redis that leaves commands unanswered: how long
// ago the first command sent since Redis last answered any was sent, while
// none has answered since. Commands sent during a silence do not move its
// start; an answer to any command ends it.
//
// It is the one rule for "Redis is silent" in this module: a Runner keeps
// one (commands sent once Redis has been quiet a quarter timeout get the
// command timeout alone: see the package doc) and so does a locks.Breaker
// (once Redis has been silent for its Silence, one failure opens it).
//
// A command whose caller gave up before Redis could have answered, or that
// never reached Redis, is no evidence of silence: Withdraw takes its mark
// back (and with it the wait of the commands sent after it: the next command
// sent starts the silence again).
//
// Times are durations since Start (see Now). A Silence is safe for
// concurrent use once started.
type Silence struct {
	base  time.Time
	heard atomic.Int64 // when Redis last answered (ns since base), 0 before
	// waiting is 1 + when the first command sent after that was sent (ns
	// since base; +1: never 0, "none"); stale when not after heard.
	waiting atomic.Int64
}

// Start sets the origin of s's times; it must be called once, before any
// other method, without concurrent use.
func (s *Silence) Start() { s.base = time.Now() }

// Now returns the time now on s's clock.
func (s *Silence) Now() time.Duration { return time.Since(s.base) }

// Sent records a command sent at now. It returns the command's mark when it
// started a silence (no command sent since the last answer is waiting), for
// Withdraw; else 0.
func (s *Silence) Sent(now time.Duration) (mark int64) {
	w := s.waiting.Load()
	if w > s.heard.Load() {
		return 0 // a command sent since the last answer waits already
	}
	if m := int64(now) + 1; s.waiting.CompareAndSwap(w, m) {
		return m
	}
	return 0
}

// Answered records an answer from Redis at now: the silence, if any, is
// over.
func (s *Silence) Answered(now time.Duration) { s.heard.Store(int64(now)) }

// Withdraw takes back mark (see Sent) of a command that ended at now without
// an answer, when within of its send: a command that ended that soon without
// an answer (its caller gave up, or it never reached Redis) is no evidence
// that Redis is silent.
func (s *Silence) Withdraw(mark int64, now, within time.Duration) {
	if mark != 0 && now-time.Duration(mark-1) < within {
		s.waiting.CompareAndSwap(mark, 0)
	}
}

// Length returns how long Redis has been silent at now: since the first
// command sent after its last answer was sent, or 0 when it is not silent.
func (s *Silence) Length(now time.Duration) time.Duration {
	w := s.waiting.Load()
	if w <= s.heard.Load() {
		return 0
	}
	return max(now-time.Duration(w-1), 0)
}

// AnsweredAfter reports whether Redis answered a command after at.
func (s *Silence) AnsweredAfter(at time.Duration) bool { return s.heard.Load() > int64(at) }
