package locks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/redis/go-redis/v9"
)

// rlNode is one independent Redis deployment of a Redlock.
type rlNode struct {
	name string // for errors: the address, or "node<i>" when the client does not say
	rdb  redis.UniversalClient
	b    *batcher // the node's script calls: concurrent ones share round trips
}

// nodeIdentity names client c (the i-th given to NewRedlock) and returns the
// identity used to refuse duplicates: the server address when the client
// exposes one (two databases of one server are one node: they fail together),
// the client itself otherwise.
func nodeIdentity(i int, c redis.UniversalClient) (name, id string) {
	switch c := c.(type) {
	case *redis.Client:
		o := c.Options()
		if o.Addr != "" && o.Addr != "FailoverClient" {
			return o.Addr, "addr " + o.Network + " " + o.Addr
		}
	case *redis.ClusterClient:
		addrs := slices.Clone(c.Options().Addrs)
		slices.Sort(addrs)
		if len(addrs) > 0 {
			return "cluster(" + strings.Join(addrs, ",") + ")", "cluster " + strings.Join(addrs, " ")
		}
	}
	return fmt.Sprintf("node%d", i), fmt.Sprintf("client %p", c)
}

// nodeResult is one node's answer to a fanout call.
type nodeResult[T any] struct {
	v    T
	err  error
	done bool // the node answered (v or err); false: no answer in time, err says why
}

// afterClose says what fanout does with a call made after Close.
type afterClose bool

const (
	refuseAfterClose afterClose = false // every node reports ErrClosed
	// sendAfterClose: the call is sent all the same, and fanout waits for every
	// node's answer (each bounded by the timeout), since Close no longer waits
	// for node calls. Only the Unlock of a lock Close dropped, which gives its
	// key back (see Lock.Unlock).
	sendAfterClose afterClose = true
)

// waitAll is fanout after Close, for a call sent all the same: it waits for
// every node's answer, each bounded by timeout, so none outlives it.
func waitAll[T any](r *Redlock, ctx context.Context, timeout time.Duration, call func(ctx context.Context, n *rlNode) (T, error)) []nodeResult[T] {
	out := make([]nodeResult[T], len(r.nodes))
	var wg sync.WaitGroup
	for i := range r.nodes {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			v, err := call(cctx, &r.nodes[i])
			out[i] = nodeResult[T]{v: v, err: err, done: true}
		})
	}
	wg.Wait()
	return out
}

// fanout sends call to every node at once, each under its own timeout, and
// collects the answers until enough reports that the outcome is decided
// (nil: never), every node has answered, the timeout has passed or ctx has
// ended. A node not heard from gets ErrNodeTimeout (or ctx's error) and its
// call goes on in the background, bounded by the timeout when the client
// honours context deadlines (redis.Options.ContextTimeoutEnabled) and by the
// client's own read timeout otherwise; Close waits for it. When then is not
// nil, each node's goroutine runs it after delivering its answer, so that a
// follow-up call to a node is always sent after that node's first call ended.
// After Close, closed says what becomes of the call.
func fanout[T any](r *Redlock, ctx context.Context, timeout time.Duration, closed afterClose,
	call func(ctx context.Context, n *rlNode) (T, error),
	enough func([]nodeResult[T]) bool,
	then func(i int, res nodeResult[T]),
) []nodeResult[T] {
	out := make([]nodeResult[T], len(r.nodes))
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		if closed == sendAfterClose {
			return waitAll(r, ctx, timeout, call)
		}
		for i := range out {
			out[i].err = ErrClosed
		}
		return out
	}
	r.inflight.Add(len(r.nodes))
	r.mu.Unlock()

	type answer struct {
		i   int
		res nodeResult[T]
	}
	ch := make(chan answer, len(r.nodes)) // buffered: a call never blocks after the collector left
	tooLate := fmt.Errorf("%w (%v)", ErrNodeTimeout, timeout)
	for i := range r.nodes {
		go func() {
			defer r.inflight.Done()
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			v, err := call(cctx, &r.nodes[i])
			// With ContextTimeoutEnabled the deadline reaches the socket, whose
			// i/o timeout can fire a moment before cctx counts as expired.
			if err != nil && ctx.Err() == nil && (errors.Is(cctx.Err(), context.DeadlineExceeded) || rcmd.IsTimeout(err)) {
				err = tooLate
			}
			res := nodeResult[T]{v: v, err: err, done: true}
			ch <- answer{i, res}
			if then != nil {
				then(i, res)
			}
		}()
	}

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var stop error
	for pending := len(r.nodes); pending > 0 && stop == nil; {
		select {
		case a := <-ch:
			out[a.i] = a.res
			pending--
			if enough != nil && enough(out) {
				return out
			}
		case <-timer.C:
			stop = tooLate
		case <-ctx.Done():
			stop = ctx.Err()
		}
	}
	for i := range out {
		if !out[i].done {
			out[i].err = stop
		}
	}
	return out
}
