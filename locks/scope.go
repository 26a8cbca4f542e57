package locks

import (
	"context"
	"sync"
)

// A scope is one owner's holding of one lock name in this process: the Locks
// acquired under WithOwner(ctx, owner) that are not Unlocked yet. They share
// the lock (one key, one fence); a nested acquisition joins the scope only as
// a re-entry of that same holding. Once the scope is lost — one of its Locks
// lost the lock, or a nested attempt found the holding gone — it stays lost
// until every Lock of it is Unlocked, and nested acquisitions fail with
// ErrLost meanwhile: granting the name afresh would let a write based on what
// was read under the lost Lock land under a newer fence.
type scope struct {
	reg   *scopes
	key   scopeKey
	fence uint64 // the holding's fence (Client; 0 for Redlock)

	// Guarded by reg.mu:
	locks map[*held]struct{} // the scope's Locks not yet Unlocked
	err   error              // why it was lost; nil while held
	fresh bool               // made by a re-entry: the fresh grant it re-entered has not joined yet
}

type scopeKey struct{ owner, name string }

// scopes registers the scopes of one Client or Redlock. The zero value is ready.
type scopes struct {
	mu    sync.Mutex // guards m, turns and every scope's locks and err
	m     map[scopeKey]*scope
	turns map[scopeKey]*turn // see turn
}

// A turn lets one attempt at a time go on (see scopes.turn).
type turn struct {
	token chan struct{} // holds a value while an attempt has the turn
	users int           // attempts that have it or wait for it; guarded by scopes.mu
}

// turn returns once no other attempt of owner at name (a Redlock's, see
// Redlock.acquire) has the turn, or ctx ends (its error), and the func that
// ends this attempt's turn.
func (r *scopes) turn(ctx context.Context, owner, name string) (end func(), err error) {
	k := scopeKey{owner, name}
	r.mu.Lock()
	t := r.turns[k]
	if t == nil {
		if r.turns == nil {
			r.turns = map[scopeKey]*turn{}
		}
		t = &turn{token: make(chan struct{}, 1)}
		r.turns[k] = t
	}
	t.users++
	r.mu.Unlock()
	leave := func() {
		r.mu.Lock()
		if t.users--; t.users == 0 {
			delete(r.turns, k)
		}
		r.mu.Unlock()
	}
	select {
	case t.token <- struct{}{}:
		return func() { <-t.token; leave() }, nil
	case <-ctx.Done():
		leave()
		return func() {}, ctx.Err()
	}
}

// find returns owner's scope of name, nil when there is none, or ErrLost when
// it is lost.
func (r *scopes) find(owner, name string) (*scope, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sc := r.m[scopeKey{owner, name}]
	if sc != nil && sc.err != nil {
		return nil, ErrLost
	}
	return sc, nil
}

// held reports whether owner has a scope of name that is not lost.
func (r *scopes) held(owner, name string) bool {
	sc, err := r.find(owner, name)
	return sc != nil && err == nil
}

// join adds h, a Lock just granted to owner, to its scope. When this process
// already has a scope of the name, h joins it only if the scope is held and h
// is of that very holding (the same fence): a re-entry of it, or the fresh
// grant that a re-entry made before h's reply was handled re-entered (two
// first acquisitions by one owner racing: the second to reach Redis re-enters
// the first's grant, and may be handled first). Otherwise the scope is lost
// (its holding is gone, as h's fresh grant shows), h is not added, and join
// returns ErrLost: the caller gives h's grant back.
func (r *scopes) join(h *held, owner string, reentered bool) error {
	k := scopeKey{owner, h.name}
	r.mu.Lock()
	sc := r.m[k]
	switch {
	case sc == nil:
		if r.m == nil {
			r.m = map[scopeKey]*scope{}
		}
		sc = &scope{reg: r, key: k, fence: h.fence, locks: map[*held]struct{}{}, fresh: reentered}
		r.m[k] = sc
	case sc.err == nil && sc.fence == h.fence && (reentered || sc.fresh):
		if !reentered {
			sc.fresh = false
		}
	default:
		r.mu.Unlock()
		r.lose(sc, ErrLost)
		return ErrLost
	}
	sc.locks[h] = struct{}{}
	h.sc = sc
	r.mu.Unlock()
	return nil
}

// current reports whether sc still has Locks not yet Unlocked.
func (r *scopes) current(sc *scope) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[sc.key] == sc
}

// lose marks sc lost and every Lock of it: their holding is gone.
func (r *scopes) lose(sc *scope, err error) {
	r.mu.Lock()
	if sc.err == nil {
		sc.err = err
	}
	hs := make([]*held, 0, len(sc.locks))
	for h := range sc.locks {
		hs = append(hs, h)
	}
	r.mu.Unlock()
	for _, h := range hs {
		h.lose(err)
	}
}

// lost records that h, a Lock of sc, lost the lock.
func (sc *scope) lost(err error) {
	sc.reg.mu.Lock()
	if sc.err == nil {
		sc.err = err
	}
	sc.reg.mu.Unlock()
}

// leave takes h, being Unlocked, out of its scope; the scope ends with its
// last Lock.
func (sc *scope) leave(h *held) {
	r := sc.reg
	r.mu.Lock()
	delete(sc.locks, h)
	if len(sc.locks) == 0 && r.m[sc.key] == sc {
		delete(r.m, sc.key)
	}
	r.mu.Unlock()
}
