package gen

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Stalls watches for stalls — the moments a starved host (or the Go
// runtime) left the test process, or a Redis server, standing still — so
// that an oracle can excuse what a stall explains, as it excuses an injected
// fault: a Redis reply that a node timeout gave up on while the process could
// not read it, or while the server could not write it. A probe runs every
// tick and each that took more than a millisecond longer than it should is
// noted; a stall of d shows as a probe late by at least d − tick. Watching
// ends at the test's cleanup.
type Stalls struct {
	tick time.Duration // between probes
	mu   sync.Mutex
	seen []stall   // the latest, oldest first (at most keepStalls)
	busy time.Time // WatchRedis: when the probe in flight began (zero: none)
	stop chan struct{}
	wg   sync.WaitGroup
}

type stall struct {
	end time.Time
	d   time.Duration
}

const keepStalls = 4096

// WatchStalls starts watching the process: its probe, every millisecond, is a
// sleep of a millisecond, which a stalled process wakes from late.
func WatchStalls(tb testing.TB) *Stalls {
	s := newStalls(tb, time.Millisecond)
	tick := s.tick
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTimer(tick)
		defer t.Stop()
		for {
			before := time.Now()
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.note(before, tick)
				t.Reset(tick)
			}
		}
	}()
	return s
}

// WatchRedis starts watching the Redis server at addr: its probe is a PING
// every 2 ms, on a connection of its own, which a stalled server (or
// process) answers late, a paused one not at all (a 3 s read deadline ends
// it) and a restarting one with an error, each noted as a stall as long as
// the probe took. (Every millisecond, through a go-redis client, three
// servers' probes cost a -race test a third of a core.)
func WatchRedis(tb testing.TB, addr string) *Stalls {
	return WatchRedisEvery(tb, addr, 2*time.Millisecond)
}

// WatchRedisEvery is WatchRedis with a probe every tick: an oracle that
// excuses only long stalls needs few probes.
func WatchRedisEvery(tb testing.TB, addr string, tick time.Duration) *Stalls {
	s := newStalls(tb, tick)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var conn net.Conn
		defer func() {
			if conn != nil {
				_ = conn.Close()
			}
		}()
		buf := make([]byte, 64)
		ping := func() error {
			if conn == nil {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					return err
				}
				conn = c
			}
			_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := conn.Write([]byte("PING\r\n")); err != nil {
				return err
			}
			for n := 0; ; { // "+PONG\r\n"
				m, err := conn.Read(buf[n:])
				if err != nil {
					return err
				}
				if n += m; n >= 7 {
					return nil
				}
			}
		}
		t := time.NewTimer(s.tick)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				before := time.Now()
				s.mu.Lock()
				s.busy = before
				s.mu.Unlock()
				if err := ping(); err != nil && conn != nil {
					_ = conn.Close()
					conn = nil
				}
				s.mu.Lock()
				s.busy = time.Time{}
				s.mu.Unlock()
				s.note(before, 0)
				t.Reset(s.tick)
			}
		}
	}()
	return s
}

func newStalls(tb testing.TB, tick time.Duration) *Stalls {
	s := &Stalls{tick: tick, stop: make(chan struct{})}
	tb.Cleanup(func() { close(s.stop); s.wg.Wait() })
	return s
}

// note notes a probe begun at before that should have taken want, when it
// took more than a millisecond longer.
func (s *Stalls) note(before time.Time, want time.Duration) {
	now := time.Now()
	late := now.Sub(before) - want
	if late <= time.Millisecond {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen) == keepStalls {
		s.seen = append(s.seen[:0], s.seen[1:]...)
	}
	s.seen = append(s.seen, stall{end: now, d: late})
}

// During reports whether what is watched stood still for at least d (as
// Since counts it) at some moment from from to to: a stall that ended after
// from and began before to, or one under way now that began before to.
func (s *Stalls) During(from, to time.Time, d time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if !s.busy.IsZero() && s.busy.Before(to) && now.Sub(s.busy)+s.tick >= d {
		return true
	}
	for i := len(s.seen) - 1; i >= 0 && s.seen[i].end.After(from); i-- {
		if st := s.seen[i]; st.d+s.tick >= d && st.end.Add(-st.d-s.tick).Before(to) {
			return true
		}
	}
	return false
}

// Since reports whether what is watched stood still for at least d (a probe
// late by d − tick, the probes' granularity) at some moment that ended after
// from, or stands still so long now (a probe of a server unanswered that
// long).
func (s *Stalls) Since(from time.Time, d time.Duration) bool {
	return s.During(from, time.Now().Add(time.Hour), d) // every stall begins before then
}
