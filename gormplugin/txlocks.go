package gormplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cacheguard/cacheguard/locks"
)

// txLocks is the per-transaction registry: the row locks a transaction holds
// until its COMMIT or ROLLBACK, under one owner, and the cache keys to
// invalidate after its COMMIT.
type txLocks struct {
	p     *Plugin
	owner string
	vals  context.Context // the values of the context that began it, never cancelled: its invalidation reports under it

	mu      sync.Mutex             // guards the fields below
	held    map[string]*locks.Lock // by name
	last    string                 // the greatest name held
	keys    []string               // to invalidate after COMMIT
	unstamp []func()               // to run after ROLLBACK (see stamp)
	marks   []savepoint            // the savepoints open, oldest first
	seen    map[string]bool        // keys already listed
	base    map[string]uint64      // by name: the fence a row had before this transaction first stamped it (noBase: not known)
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
	p.begin() // ended by finish
	return &txLocks{p: p, owner: owner, vals: context.WithoutCancel(ctx), held: map[string]*locks.Lock{}, seen: map[string]bool{}, base: map[string]uint64{}}
}

// noBase marks a row the transaction stamped without knowing its fence
// before (a write of a struct that carried no version).
const noBase = math.MaxUint64

// setBase records the fence row name had before the transaction first
// stamped it; an earlier record stands (a nested transaction re-claims).
func (r *txLocks) setBase(name string, fence uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.base[name]; !ok {
		r.base[name] = fence
	}
}

// wrote records the rows a fenced statement of the transaction stamped.
func (r *txLocks) wrote(rows []row) {
	for _, w := range rows {
		if w.versioned {
			r.setBase(w.name, w.version)
		} else {
			r.setBase(w.name, noBase)
		}
	}
}

// checkVersions refuses a write of a struct whose version is neither the
// fence its row had before the transaction stamped it nor the
// transaction's own token: once stamped, the row carries the token, which
// the fence condition accepts, so it must not vouch for a struct read
// before another writer's commit.
func (r *txLocks) checkVersions(rows []row) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range rows {
		base, ok := r.base[w.name]
		if !w.versioned || !ok || w.version == w.fence || w.version == base && base != noBase {
			continue
		}
		return &StaleWriteError{Name: w.name, Fence: w.fence, Stored: w.fence, Read: w.version}
	}
	return nil
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
			var err error
			if lk, err = r.p.takeAfter(ctx, name, r.last); err != nil {
				return err
			}
			r.held[name] = lk
			r.last = max(r.last, name)
		}
		rows[i].lock, rows[i].fence = lk, lk.Fence()
	}
	return nil
}

// savepoint is an open savepoint: how many unstamps it leaves alone on a
// ROLLBACK TO it.
type savepoint struct {
	name     string
	unstamps int
}

// savepoint follows a savepoint operation of the transaction (see
// savepointOp). A ROLLBACK TO puts back, newest first, the fences stamped
// by the writes it undid; the savepoint stays open. A RELEASE closes the
// savepoint and those opened after it; their writes are the transaction's.
func (r *txLocks) savepoint(op, name string) {
	r.mu.Lock()
	if op == spSet {
		r.marks = append(r.marks, savepoint{name: name, unstamps: len(r.unstamp)})
		r.mu.Unlock()
		return
	}
	i := len(r.marks) - 1
	for i >= 0 && r.marks[i].name != name {
		i--
	}
	if i < 0 {
		r.mu.Unlock()
		return
	}
	var undo []func()
	if op == spRollback {
		undo = r.unstamp[r.marks[i].unstamps:]
		r.unstamp = slices.Clone(r.unstamp[:r.marks[i].unstamps])
		r.marks = r.marks[:i+1]
	} else {
		r.marks = r.marks[:i]
	}
	r.mu.Unlock()
	for j := len(undo) - 1; j >= 0; j-- {
		undo[j]()
	}
}

func (r *txLocks) addUnstamp(f func()) {
	if f == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unstamp = append(r.unstamp, f)
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
func (r *txLocks) finish(committed bool) {
	r.mu.Lock()
	if r.done {
		r.mu.Unlock()
		return
	}
	r.done, r.commit = true, committed
	held, keys, unstamp := r.held, r.keys, r.unstamp
	r.held, r.keys, r.unstamp = nil, nil, nil
	r.mu.Unlock()
	if !committed {
		for i := len(unstamp) - 1; i >= 0; i-- {
			unstamp[i]()
		}
	}

	defer r.p.end()
	ctx := context.Background()
	if committed {
		r.p.invalidate(r.vals, keys)
	}
	rows := make([]row, 0, len(held))
	for name, lk := range held {
		rows = append(rows, row{name: name, lock: lk})
	}
	r.p.unlockAll(ctx, rows)
}

// committed reports whether the transaction ended with a COMMIT.
func (r *txLocks) committed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.commit
}

// take acquires one lock: waiting for it, or with try a single attempt. The
// first attempt is a TryLock bounded by the UnavailableAfter timeout (see
// attempt), so that an unanswering Redis costs a write that long, not
// go-redis's read timeouts and retries or a Redlock's wait budget; only a
// lock held by another owner is then awaited. A nested acquisition of a lost
// scope (locks.ErrLost) is a stale write: what the caller read under that
// scope may be outdated.
func (p *Plugin) take(ctx context.Context, name string, try bool) (*locks.Lock, error) {
	lk, err := p.take1(ctx, name, try)
	if err == nil && lk.Fence() == 0 && !p.cfg.noFence {
		_ = lk.Unlock(context.WithoutCancel(ctx)) // unusable: nothing was written under it
		return nil, invalid("the Locker issued no fence token for %q (a locks.Redlock issues none): use a locks.Client, or the NoFencing option", name)
	}
	return lk, err
}

func (p *Plugin) take1(ctx context.Context, name string, try bool) (*locks.Lock, error) {
	lk, err := p.attempt(ctx, name)
	switch {
	case err == nil:
		return lk, nil
	case errors.Is(err, errNoAnswer):
		return nil, fmt.Errorf("%w: %q: %w: %w", ErrLock, name, locks.ErrNotObtained, err)
	case errors.Is(err, locks.ErrLost):
		return nil, &StaleWriteError{Name: name, Lost: true, Err: err}
	case !try && errors.Is(err, locks.ErrBusy):
		if lk, err = p.l.Lock(ctx, name, p.cfg.lockOpts...); err == nil {
			return lk, nil
		}
		if errors.Is(err, locks.ErrLost) {
			return nil, &StaleWriteError{Name: name, Lost: true, Err: err}
		}
	}
	return nil, fmt.Errorf("%w: %q: %w", ErrLock, name, err)
}

// errNoAnswer is the cause of an attempt the lock service did not answer
// within UnavailableAfter; it matches locks.ErrUnavailable.
var errNoAnswer = fmt.Errorf("gormplugin: the lock service did not answer in time: %w", locks.ErrUnavailable)

// maxAbandoned bounds the attempts left running after their caller stopped
// waiting: beyond it, new attempts fail at once, without asking Redis.
const maxAbandoned = 64

// attempt makes one TryLock of name and waits for it at most UnavailableAfter.
// The call runs on its own goroutine: go-redis applies a context's deadline to
// a blocked socket read only when the client was built with
// ContextTimeoutEnabled, and the bound must not depend on that. An attempt
// the caller stopped waiting for finishes in the background (owned by the
// plugin; Close waits for it) and gives back a lock it was granted late.
func (p *Plugin) attempt(ctx context.Context, name string) (*locks.Lock, error) {
	if p.abandoned.Load() >= maxAbandoned {
		return nil, fmt.Errorf("%w (%d earlier attempts still unanswered)", errNoAnswer, maxAbandoned)
	}
	const (
		waiting int32 = iota
		answered
		abandoned
	)
	type result struct {
		lk  *locks.Lock
		err error
	}
	var state atomic.Int32
	ch := make(chan result, 1)
	actx, cancel := context.WithTimeout(ctx, p.cfg.unavailableAfter)
	defer cancel()
	p.attempts.Add(1)
	go func() {
		defer p.attempts.Done()
		lk, err := p.l.TryLock(actx, name, p.cfg.lockOpts...)
		if state.CompareAndSwap(waiting, answered) {
			ch <- result{lk, err}
			return
		}
		// The caller gave up: give back a late grant.
		if lk != nil {
			rctx, rcancel := context.WithTimeout(context.Background(), releaseTimeout)
			_ = lk.Unlock(rctx) // best effort: its lease ends it otherwise
			rcancel()
		}
		p.abandoned.Add(-1)
	}()
	answer := func(r result) (*locks.Lock, error) {
		if r.err != nil && actx.Err() != nil && ctx.Err() == nil {
			// The bound, not the caller's context, ended the attempt.
			return nil, fmt.Errorf("%w: no answer within %v (%v)", errNoAnswer, p.cfg.unavailableAfter, r.err)
		}
		return r.lk, r.err
	}
	select {
	case r := <-ch:
		return answer(r)
	case <-actx.Done():
	}
	p.abandoned.Add(1)
	if !state.CompareAndSwap(waiting, abandoned) {
		p.abandoned.Add(-1)
		return answer(<-ch) // it came back meanwhile: the reply is the truth
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", locks.ErrNotObtained, err)
	}
	return nil, fmt.Errorf("%w: no answer within %v", errNoAnswer, p.cfg.unavailableAfter)
}

// lockAll takes the locks of rows (sorted by name) in order, for one
// statement; on failure it releases those it took.
func (p *Plugin) lockAll(ctx context.Context, rows []row) error {
	return p.lockAfter(ctx, rows, "")
}

// lockAfter is lockAll for a statement that already holds locks up to the
// name last (see takeAfter); on failure it releases those it took of rows.
func (p *Plugin) lockAfter(ctx context.Context, rows []row, last string) error {
	for i := range rows {
		lk, err := p.takeAfter(ctx, rows[i].name, last)
		if err != nil {
			p.unlockAll(context.WithoutCancel(ctx), rows[:i])
			for j := range rows[:i] {
				rows[j].lock = nil
			}
			return err
		}
		rows[i].lock, rows[i].fence = lk, lk.Fence()
		last = max(last, rows[i].name)
	}
	return nil
}

// takeAfter is the one rule for lock order: locks are awaited in name order,
// so a name that sorts before last (the greatest one its holder has) is only
// tried, and if busy fails with ErrLockOrder, since waiting could deadlock.
func (p *Plugin) takeAfter(ctx context.Context, name, last string) (*locks.Lock, error) {
	try := name < last
	lk, err := p.take(ctx, name, try)
	if try && busy(err) {
		return nil, fmt.Errorf("%w: %q sorts before %q, which this writer holds, and another writer holds it; declare the rows up front with gormplugin.Transaction: %w", ErrLockOrder, name, last, err)
	}
	return lk, err
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
			p.warn(ctx, "release", "gormplugin: releasing a row lock failed; its lease ends it",
				slog.String("lock", rows[i].name), slog.Any("cause", err))
		}
	}
}

// busy reports whether err is a lock held by another owner (not a Redis
// failure, not the caller's context ending), for every Locker.
func busy(err error) bool { return errors.Is(err, locks.ErrBusy) }

// unavailable reports whether err is a lock that could not be taken because
// the lock service could not be asked (as opposed to held by another writer,
// or the caller's context ending), for every Locker.
func unavailable(err error) bool { return errors.Is(err, locks.ErrUnavailable) }
