package locks

import (
	"context"

	"github.com/cacheguard/cacheguard/internal/rid"
)

type ownerKey struct{}

// WithOwner returns a context under which Lock and TryLock acquire on behalf of
// owner id: a nested acquisition of a name this owner already holds re-enters
// (the hold count goes up, and it shares the holding's fence) instead of
// waiting for itself, and each Unlock takes one hold back. The id must be
// unique to one logical holder (a request, a job): two holders sharing an id
// would share the lock.
//
// A lost scope is never re-acquired behind the caller's back: while this
// process has a Lock of the name under the owner that is not Unlocked yet, a
// nested acquisition only ever re-enters that holding. It never waits for
// another owner: on a Client it makes one attempt; on a Redlock, Lock (not
// TryLock) tries again within the wait budget when failing nodes kept an
// attempt from a quorum, as a fresh Lock would; and when the holding is
// Unlocked while a Redlock attempt is on the way (it counted re-entries
// only), it is made once more at once as a fresh acquisition, TryLock too.
// When the holding is lost — known already, or found by an attempt (the key
// is gone or another owner's) — it takes nothing, marks every Lock of the
// scope lost, and fails with ErrLost (which matches ErrNotHeld and
// ErrNotObtained), until every Lock of the scope is Unlocked. After that the
// owner may lock the name afresh, under a newer fence.
//
// On a Redlock, an owner's acquisitions of one name in one process take turns
// attempt by attempt (an attempt lasts at most its nodes' timeout): a holding
// there has no fence, and two first acquisitions at once, reaching the nodes
// in different orders, could not tell that they began one holding.
func WithOwner(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ownerKey{}, id)
}

// OwnerFrom returns the owner id set by WithOwner.
func OwnerFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(ownerKey{}).(string)
	return id, ok && id != ""
}

// NewOwnerID returns a random 128-bit id in hex, for WithOwner.
func NewOwnerID() string { return rid.New() }
