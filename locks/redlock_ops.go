package locks

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/rcmd"
)

// A Redlock holding keeps {lock key, acquisition id} in held.keys: each
// acquisition (a re-entry included) is one field of the lock's hash on every
// node that granted it, released and renewed by itself.

// release gives back h's acquisition on every node. It reports the owner's
// remaining holds when a quorum confirmed, -1 when too few nodes still had the
// acquisition for it to have been held, and a *RedlockError when too many
// nodes failed to answer to tell.
func (r *Redlock) release(ctx context.Context, h *held) (int64, error) {
	h.mu.Lock()
	lease := h.lease
	h.mu.Unlock()
	key, acq := h.keys[0], h.keys[1]
	px := rlPXFor(h.cfg, lease)
	keys, args := rlRelease(key, h.owner, acq, px.Milliseconds())
	r.releasing(h)
	call := func(ctx context.Context, n *rlNode) (int64, error) { return releaseNode(ctx, n, keys, args) }
	res := fanout(r, ctx, rlNodeTimeout(h.cfg, px), sendAfterClose, call, nil, nil)
	confirmed, failed, notOwner, remaining := 0, 0, 0, int64(0)
	for _, x := range res {
		switch {
		case x.err != nil:
			failed++
		case x.v >= 0:
			confirmed++
			remaining = max(remaining, x.v)
		case x.v == -1:
			notOwner++
		}
	}
	switch {
	case confirmed >= r.quorum:
		return remaining, nil
	case notOwner > len(r.nodes)-r.quorum:
		return -1, nil // the owner's holding is gone
	case confirmed+failed < r.quorum:
		return -2, nil // this acquisition is: the owner's other holds may stand
	}
	e := r.opError("unlock", h.name)
	for i, x := range res {
		switch {
		case x.err != nil:
			e.Failed = append(e.Failed, NodeError{Addr: r.nodes[i].name, Err: x.err})
		case x.v >= 0:
			e.Granted = append(e.Granted, r.nodes[i].name)
		default:
			e.Refused = append(e.Refused, r.nodes[i].name)
		}
	}
	e.Err = ctx.Err()
	return 0, e
}

// extend gives h's acquisition the validity lease from now on every node (see
// extendAll).
func (r *Redlock) extend(ctx context.Context, h *held, lease time.Duration) error {
	return r.extendAll(ctx, []*held{h}, []time.Duration{lease})[0]
}

// renewBatch renews every lock in hs by its own lease (its validity), for the
// renewer (see extendAll).
// The outcomes come together, once a quorum decided each lock or the node
// timeout passed.
func (r *Redlock) renewBatch(ctx context.Context, hs []*held, report func(*held, error)) {
	leases := make([]time.Duration, len(hs))
	for i, h := range hs {
		h.mu.Lock()
		leases[i] = h.wireLease // see takeWire
		h.mu.Unlock()
	}
	for i, err := range r.extendAll(ctx, hs, leases) {
		report(hs[i], err)
	}
}

// extendAll extends each hs[i] to validity leases[i] on every node at once,
// one pipeline per node, and judges each lock by the quorum rule: nil when
// extended; errHoldGone when its validity ran out first, or too many nodes no
// longer have the acquisition for a quorum to be possible; errNotOwner when
// too many no longer have the owner's holding at all (every acquisition of
// the owner is lost then); a *RedlockError otherwise. A holding whose
// validity has already run out is not extended: it is lost.
func (r *Redlock) extendAll(ctx context.Context, hs []*held, leases []time.Duration) []error {
	errs := make([]error, len(hs))
	var live []int // indexes in hs of the holdings still within their validity
	deadlines := make([]time.Time, len(hs))
	now := time.Now()
	for i, h := range hs {
		h.mu.Lock()
		deadlines[i] = h.deadline
		h.mu.Unlock()
		if now.Before(deadlines[i]) {
			live = append(live, i)
		} else {
			errs[i] = errHoldGone // lost: held.lose gives it back
		}
	}
	if len(live) == 0 {
		return errs
	}
	send := make([]*held, len(live))
	pxs := make([]int64, len(live))
	var timeout time.Duration
	for j, i := range live {
		send[j] = hs[i]
		px := rlPXFor(hs[i].cfg, leases[i])
		pxs[j] = px.Milliseconds()
		timeout = max(timeout, rlNodeTimeout(hs[i].cfg, px))
	}
	confirmed := func(res []nodeResult[[]error], j int) int {
		n := 0
		for _, x := range res {
			if x.done && x.err == nil && x.v[j] == nil {
				n++
			}
		}
		return n
	}
	sent := time.Now()
	res := fanout(r, ctx, timeout, refuseAfterClose, func(ctx context.Context, n *rlNode) ([]error, error) {
		return extendPipeline(ctx, n.b.run, send, pxs)
	}, func(res []nodeResult[[]error]) bool {
		for j := range send {
			if confirmed(res, j) < r.quorum {
				return false
			}
		}
		return true
	}, nil)
	now = time.Now()

	for j, i := range live {
		h := hs[i]
		e := r.opError("extend", h.name)
		for n, x := range res {
			switch {
			case !x.done && x.err == nil:
				// Still pending after every lock reached its quorum: not needed.
			case x.err != nil:
				e.Failed = append(e.Failed, NodeError{Addr: r.nodes[n].name, Err: x.err})
			case x.v[j] == nil:
				e.Granted = append(e.Granted, r.nodes[n].name)
			case refusal(x.v[j]):
				e.Refused = append(e.Refused, r.nodes[n].name)
			default:
				e.Failed = append(e.Failed, NodeError{Addr: r.nodes[n].name, Err: x.v[j]})
			}
		}
		notOwner := 0
		for _, x := range res {
			if x.done && x.err == nil && x.v[j] == errNotOwner {
				notOwner++
			}
		}
		switch {
		case notOwner > len(r.nodes)-r.quorum:
			// No quorum has the owner's holding any more.
			errs[i] = errNotOwner
		case !now.Before(deadlines[i]) || len(e.Refused) > len(r.nodes)-r.quorum:
			// The validity ran out before a quorum confirmed, or a quorum can
			// no longer confirm: the acquisition is lost, and the nodes where
			// this round did extend it must not keep it alive (held.lose
			// gives it back).
			errs[i] = errHoldGone
		case len(e.Granted) >= r.quorum && now.Sub(sent) < leases[i]:
			errs[i] = nil
		case len(e.Granted) >= r.quorum:
			e.Err = ErrNoValidity // the new validity was used up by the round itself
			errs[i] = e
		default:
			e.Err = ctx.Err()
			errs[i] = e
		}
	}
	return errs
}

// abandon gives h's acquisition back on every node; when h expired, not
// before the nodes may expire it themselves: its local deadline is its
// validity's end, which comes the drift allowance before the keys' lease ends.
func (r *Redlock) abandon(h *held, expired bool) {
	var after time.Time
	if expired {
		h.mu.Lock()
		after = h.deadline.Add(rlDrift(h.cfg, rlPXFor(h.cfg, h.lease)))
		h.mu.Unlock()
	}
	r.releaseInBackground(h, after)
}

// releaseInBackground gives back h's acquisition on every node without
// waiting, from after on (at once when it has passed). Close waits for what
// is on the wire, and drops what is still waiting for after (the keys then
// expire with their lease).
func (r *Redlock) releaseInBackground(h *held, after time.Time) {
	h.mu.Lock()
	lease := h.lease
	h.mu.Unlock()
	key, acq := h.keys[0], h.keys[1]
	r.releasing(h)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.inflight.Add(1)
	r.mu.Unlock()
	px := rlPXFor(h.cfg, lease)
	keys, args := rlRelease(key, h.owner, acq, px.Milliseconds())
	go func() {
		defer r.inflight.Done()
		if wait := time.Until(after); wait > 0 {
			t := time.NewTimer(wait)
			defer t.Stop()
			select {
			case <-t.C:
			case <-r.ren.ctx.Done(): // closed
				return
			}
		}
		fanout(r, context.Background(), rlNodeTimeout(h.cfg, px), refuseAfterClose,
			func(ctx context.Context, n *rlNode) (int64, error) {
				return releaseNode(ctx, n, keys, args)
			}, nil, nil)
	}()
}

// extendPipeline runs the extend script for every lock in hs on one node, in
// one pipeline (NOSCRIPT handled as everywhere, see script). Per lock: the
// outcome as extended reads it (redlock_extend.lua replies as extend.lua).
func extendPipeline(ctx context.Context, run *rcmd.Runner, hs []*held, pxs []int64) ([]error, error) {
	cmds := make([]*redis.Cmd, len(hs))
	for i, h := range hs {
		h.mu.Lock()
		seq := h.seq // the command on h's wire (see takeWire)
		h.mu.Unlock()
		cmds[i] = redlockExtendS.cmd(ctx, []any{h.keys[0]}, h.owner, h.keys[1], pxs[i], seq)
	}
	exec(ctx, run, nil, cmds, 0, false)
	out := make([]error, len(hs))
	for i, c := range cmds {
		out[i] = extended(c.Int64())
	}
	return out, nil
}

func (r *Redlock) opError(op, name string) *RedlockError {
	return &RedlockError{Op: op, Name: name, Nodes: len(r.nodes), Quorum: r.quorum}
}
