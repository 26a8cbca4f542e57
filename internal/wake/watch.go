package wake

import (
	"context"
	"strconv"
	"time"
)

// Bounds of the watch over a connection (see the package doc).
const (
	// confirmWait is how long a command may go unconfirmed before the
	// connection is probed. A slow confirmation costs one PING; a lost one
	// is found out by the PONG.
	confirmWait = 100 * time.Millisecond
	// probeEvery is the interval between PINGs while none is answered: a
	// healed partition is noticed within it.
	probeEvery = 100 * time.Millisecond
	// keepalive is how long a connection may receive nothing before it is
	// probed.
	keepalive = 5 * time.Second
	// deadAfter is how long a PING may go unanswered before the connection
	// is replaced (go-redis's own health check allows 3 s as well). A
	// partition or a paused server shorter than this keeps the connection.
	deadAfter = 3 * time.Second
)

// probe registers a PING sent at now on c and returns its payload (h.mu held).
func (h *Hub) probe(c *conn, now time.Time) string {
	c.seq++
	p := strconv.FormatUint(c.seq, 10)
	c.probes[p] = now
	return p
}

// answered records the PONG with payload on c and reports whether it proves
// a command lost: written before its PING, yet not confirmed before its PONG.
func (h *Hub) answered(c *conn, payload string) (lost bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c.heard = time.Now()
	at, ok := c.probes[payload]
	if !ok {
		return false
	}
	for p, t := range c.probes {
		if !t.After(at) { // answered now, or lost: PONGs come in order
			delete(c.probes, p)
		}
	}
	for _, p := range c.pending {
		if !p.sent.IsZero() && p.sent.Before(at) {
			return true
		}
	}
	return false
}

// watch abandons c when it does not connect within dialTimeout, probes it
// while a command is overdue or the connection is silent, and replaces it
// when a PING goes unanswered for deadAfter. It ends with c.
func (h *Hub) watch(ctx context.Context, c *conn) {
	defer h.wg.Done()
	t := time.NewTimer(dialTimeout)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.kick:
		}
		ping, dead, next := h.assess(c, time.Now())
		if dead {
			h.fail(c)
			return
		}
		if ping != "" {
			pctx, cancel := context.WithTimeout(ctx, writeTimeout)
			_ = c.ps.Ping(pctx, ping) // a broken connection fails its reader
			cancel()
		}
		t.Stop()
		t.Reset(next)
	}
}

// assess decides, at now, whether c is dead, whether to send a PING (its
// payload), and when to look again.
func (h *Hub) assess(c *conn, now time.Time) (ping string, dead bool, next time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c.dead {
		return "", false, keepalive
	}
	if !c.up { // connecting: abandoned after dialTimeout
		left := c.born.Add(dialTimeout).Sub(now)
		return "", left <= 0, max(left, time.Millisecond)
	}
	var oldest, newest time.Time
	for _, t := range c.probes {
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
		if t.After(newest) {
			newest = t
		}
	}
	if !oldest.IsZero() && now.Sub(oldest) >= deadAfter {
		return "", true, 0
	}
	quiet := keepalive // how long c may be silent before it is probed
	for _, w := range h.watches {
		if w.ch.conn == c {
			quiet = min(quiet, w.every)
		}
	}
	need := now.Sub(c.heard) >= quiet
	var due time.Time // when the next pending command becomes overdue
	for _, p := range c.pending {
		d := p.since.Add(confirmWait)
		if !d.After(now) {
			need = true
		} else if due.IsZero() || d.Before(due) {
			due = d
		}
	}
	if need && (newest.IsZero() || now.Sub(newest) >= probeEvery) {
		ping = h.probe(c, now)
		if oldest.IsZero() {
			oldest = now
		}
	}
	next = c.heard.Add(quiet).Sub(now)
	if !due.IsZero() {
		next = min(next, due.Sub(now))
	}
	if !oldest.IsZero() {
		next = min(next, probeEvery, oldest.Add(deadAfter).Sub(now))
	}
	return ping, false, max(next, time.Millisecond)
}
