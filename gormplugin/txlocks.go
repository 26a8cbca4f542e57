package gormplugin

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/cacheguard/cacheguard/locks"
)

// txLocks is the per-transaction registry: the row locks a transaction holds
// until its COMMIT or ROLLBACK, under one owner, and the cache keys to
// invalidate after its COMMIT.
type txLocks struct {
	p     *Plugin
	owner string

	mu      sync.Mutex             // guards the fields below
	held    map[string]*locks.Lock // by name
	last    string                 // the greatest name held
	keys    []string               // to invalidate after COMMIT
	seen    map[string]bool        // keys already listed
	adopted bool                   // a transaction has taken these locks over
	done    bool                   // committed or rolled back
	commit  bool                   // ended by COMMIT
}

// newTxLocks starts a registry whose owner is ctx's (a request that holds a
// row through ginmw then re-enters), or a new one.
func (p *Plugin) newTxLocks(ctx context.Context) *txLocks {
	owner, ok := locks.OwnerFrom(ctx)
	if !ok {
		owner = locks.NewOwnerID()
	}
	return &txLocks{p: p, owner: owner, held: map[string]*locks.Lock{}, seen: map[string]bool{}}
}

// adopt hands the registry to the first transaction that begins with it on
// its context; false when another already has.
func (r *txLocks) adopt() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.adopted || r.done {
		return false
	}
	r.adopted = true
	return true
}

// lock takes the locks of rows (sorted by name) for the rest of the
// transaction, filling in each row's lock and fence. A name already held is
// not taken again. Locks are taken in name order; a name that sorts before
// one already held is only tried (waiting for it could deadlock with a
// transaction that holds it and waits for ours), and ErrLockOrder reports
// that it was busy.
func (r *txLocks) lock(ctx context.Context, rows []row) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return fmt.Errorf("%w: the transaction has already ended", ErrInvalid)
	}
	ctx = locks.WithOwner(ctx, r.owner)
	for i := range rows {
		name := rows[i].name
		lk := r.held[name]
		if lk == nil {
			try := len(r.held) > 0 && name < r.last
			var err error
			lk, err = r.p.take(ctx, name, try)
			if err != nil {
				if try && busy(err) {
					return fmt.Errorf("%w: %q sorts before %q, which this transaction holds, and another writer holds it; declare the rows up front with gormplugin.Transaction: %w", ErrLockOrder, name, r.last, err)
				}
				return err
			}
			r.held[name] = lk
			r.last = max(r.last, name)
		}
		rows[i].lock, rows[i].fence = lk, lk.Fence()
	}
	return nil
}

func (r *txLocks) addKeys(keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		if !r.seen[k] {
			r.seen[k] = true
			r.keys = append(r.keys, k)
		}
	}
}

// finish ends the registry once: after a COMMIT (committed) it invalidates
// the pending keys, then it releases every lock.
func (r *txLocks) finish(committed bool) error {
	r.mu.Lock()
	if r.done {
		r.mu.Unlock()
		return nil
	}
	r.done, r.commit = true, committed
	held, keys := r.held, r.keys
	r.held, r.keys = nil, nil
	r.mu.Unlock()

	ctx := context.Background()
	var err error
	if committed {
		err = r.p.invalidate(ctx, keys)
	}
	rows := make([]row, 0, len(held))
	for name, lk := range held {
		rows = append(rows, row{name: name, lock: lk})
	}
	r.p.unlockAll(ctx, rows)
	return err
}

// committed reports whether the transaction ended with a COMMIT.
func (r *txLocks) committed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.commit
}

// take acquires one lock: waiting for it, or with try a single attempt.
func (p *Plugin) take(ctx context.Context, name string, try bool) (*locks.Lock, error) {
	var (
		lk  *locks.Lock
		err error
	)
	if try {
		lk, err = p.l.TryLock(ctx, name, p.cfg.lockOpts...)
	} else {
		lk, err = p.l.Lock(ctx, name, p.cfg.lockOpts...)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrLock, name, err)
	}
	return lk, nil
}

// lockAll takes the locks of rows (sorted by name) in order, for one
// statement; on failure it releases those it took.
func (p *Plugin) lockAll(ctx context.Context, rows []row) error {
	for i := range rows {
		lk, err := p.take(ctx, rows[i].name, false)
		if err != nil {
			p.unlockAll(context.WithoutCancel(ctx), rows[:i])
			for j := range rows[:i] {
				rows[j].lock = nil
			}
			return err
		}
		rows[i].lock, rows[i].fence = lk, lk.Fence()
	}
	return nil
}

// unlockAll releases the locks of rows, in reverse order. A lock already lost
// is not an error; another failure is logged, and the lease ends the lock.
func (p *Plugin) unlockAll(ctx context.Context, rows []row) {
	for i := len(rows) - 1; i >= 0; i-- {
		lk := rows[i].lock
		if lk == nil {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		err := lk.Unlock(rctx)
		cancel()
		if err != nil && !errors.Is(err, locks.ErrNotHeld) {
			p.warn(ctx, "gormplugin: releasing %q: %v", rows[i].name, err)
		}
	}
}

// busy reports whether err is a lock held by another owner (not a Redis
// failure, not the caller's context ending).
func busy(err error) bool {
	var noe *locks.NotObtainedError
	return errors.As(err, &noe) && noe.Err == nil
}

// unavailable reports whether err is a lock that could not be taken because
// Redis could not be asked (as opposed to held by another writer, or the
// caller's context ending).
func unavailable(err error) bool {
	var noe *locks.NotObtainedError
	if !errors.As(err, &noe) || noe.Err == nil {
		return false
	}
	var re *locks.ReplicaError
	return !errors.Is(noe.Err, context.Canceled) && !errors.Is(noe.Err, context.DeadlineExceeded) && !errors.As(noe.Err, &re)
}
