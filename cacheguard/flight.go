package cacheguard

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"time"
)

// errFlightExpired ends a flight whose starter's wait budget ran out while it
// was waiting for another process's fill (a flight that loads runs on).
var errFlightExpired = errors.New("cacheguard: flight expired")

// subscribeTimeout bounds waiting for the wake-up subscription; without it a
// flight still works, woken by the lease's expiry instead of a push.
const subscribeTimeout = time.Second

// outcome is what a flight gives every caller sharing it.
type outcome struct {
	leader uint64 // the call that started the flight
	loaded bool   // the flight ran the loader
	val    any    // a T (flights are kept apart by type), or nil
	err    error
	// stored describes val as stored in Redis (fresh until, last load),
	// when it was: only such a value may enter the near cache.
	stored *envelope
	// failSafe: val is an older value standing in for a failed load.
	failSafe bool
}

// startFlight runs a new flight f on a goroutine that Close cancels and waits
// for, detached from the caller that started it (a caller that gives up does
// not end a load others share), and ends it with run's outcome.
func (g *Guard) startFlight(parent context.Context, k flightKey, f *flight, run func(ctx context.Context) *outcome) {
	ctx, done, ok := g.track(context.WithoutCancel(parent))
	if !ok {
		g.flights.finish(k, f, &outcome{err: ErrClosed})
		return
	}
	go func() {
		defer done()
		g.flights.finish(k, f, run(ctx))
	}()
}

// flight is one process's miss path for one representation, shared by every
// caller of the process that misses meanwhile under the same generation: get
// the value or the fill lease in one script; fill with the lease, or
// subscribe to the wake-up channel, ask once more, and wait for the holder's
// push (or its lease's expiry) and try again.
func (c *call[T]) flight(ctx context.Context, f *flight, ks keySet, id uint64, deadline time.Time, force bool) (o *outcome) {
	g := c.g
	defer func() {
		if p := recover(); p != nil { // a codec or an observer panicked
			o = &outcome{leader: id, err: newPanicError(p)}
		}
	}()
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	var wakeC <-chan string
	subscribed := false
	tok := token()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		r, err := g.getLease(wctx, ks, tok, c.cfg.lease, time.Now().UnixMilli(), force)
		force = false
		if err == nil {
			f.saw(r.gen)
		}
		f.answered()
		switch {
		case err != nil && ctx.Err() != nil:
			return &outcome{leader: id, err: ErrClosed}
		case err != nil && wctx.Err() != nil:
			return &outcome{leader: id, err: errFlightExpired}
		case err != nil:
			g.note(ctx, EventRedisError, c.key, 0, err)
			return c.failOpen(ctx, id, deadline, err)
		case r.granted:
			return c.fillFor(ctx, f, ks, lease{gen: r.gen, token: tok}, id)
		case r.fresh:
			if o := c.remote(ctx, id, r.value); o != nil {
				return o
			}
			force = true // unreadable: take the lease and replace it
			continue
		}
		if !subscribed {
			// Another fill holds the lease. Register for its push, then ask
			// again: a push sent before the subscription was confirmed would
			// be missed, but its value is then in Redis. (The flight that
			// gets the lease never subscribes: it is everyone's critical
			// path, and only waiters need the push.)
			subscribed = true
			sctx, scancel := context.WithTimeout(wctx, subscribeTimeout)
			sub, err := g.hub.Subscribe(sctx, ks.wake)
			scancel()
			if err == nil {
				defer sub.Close()
				wakeC = sub.C()
			}
			continue
		}
		// Sleep until the holder's push, or a little past its lease (it may
		// die without a word).
		d := r.pttl + time.Millisecond
		timer.Reset(d + rand.N(d/10+1))
		select {
		case m := <-wakeC:
			if o := c.fromWake(ctx, id, m, r.holder); o != nil {
				return o
			}
		case <-timer.C:
		case <-wctx.Done():
			if ctx.Err() != nil {
				return &outcome{leader: id, err: ErrClosed}
			}
			return &outcome{leader: id, err: errFlightExpired}
		}
	}
}

// remote turns an envelope stored by another caller into an outcome, or nil
// when it cannot be decoded (counted).
func (c *call[T]) remote(ctx context.Context, id uint64, b []byte) *outcome {
	g := c.g
	env, err := decodeEnvelope(b)
	if err != nil {
		g.note(ctx, EventDecodeError, c.key, 0, err)
		return nil
	}
	g.note(ctx, EventCoalescedRemote, c.key, 0, nil)
	if env.negative {
		g.note(ctx, EventNegativeHit, c.key, 0, nil)
		return &outcome{leader: id, err: c.notFound()}
	}
	v, err := decodeValue[T](c.cfg.codec, &env)
	if err != nil {
		g.note(ctx, EventDecodeError, c.key, 0, err)
		return nil
	}
	env.payload = nil
	if env.failSafe {
		return &outcome{leader: id, val: v, failSafe: true}
	}
	return &outcome{leader: id, val: v, stored: &env}
}

// fromWake handles a push on the key's channel (shared by every
// representation of the key): 'v'+token+' '+envelope (a fill stored it),
// 'e'+token+' '+message (the fill's load failed), 'n'+token+' ' (the load
// found nothing and negative caching is off), 'h'+token+' ' (a closing Guard
// handed its fill over: take the lease now), 'x' (invalidated). Only a push
// from holder, the fill whose lease this flight saw, is trusted: one from an
// earlier fill can arrive after an invalidation that came later (the
// subscription may predate this flight). It returns nil when the flight must
// ask again.
func (c *call[T]) fromWake(ctx context.Context, id uint64, m, holder string) *outcome {
	if m == "" || m[0] == 'x' {
		return nil
	}
	tok, body, ok := strings.Cut(m[1:], " ")
	if !ok || tok != holder {
		return nil
	}
	switch m[0] {
	case 'v':
		b := []byte(body)
		if len(b) < envHeaderLen {
			return nil
		}
		if env, err := decodeEnvelope(b); err != nil || time.Now().UnixMilli() >= env.freshUntil {
			return nil // unreadable or already old: ask Redis
		}
		return c.remote(ctx, id, b)
	case 'e':
		return &outcome{leader: id, err: remoteError(c.key, body)}
	case 'n':
		return &outcome{leader: id, err: c.notFound()}
	}
	return nil
}
