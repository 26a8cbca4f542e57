package ginmw

import (
	"context"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/locks"
)

type heldKey struct{}

// held is what Lock puts on the request context.
type held struct {
	lk *locks.Lock
}

// lockedCtx is the handler's context under Lock: the request's context,
// cancelled when the lock is lost, carrying the lock (one allocation for both).
type lockedCtx struct {
	context.Context
	held held
}

func (c *lockedCtx) Value(key any) any {
	if key == (heldKey{}) {
		return &c.held
	}
	return c.Context.Value(key)
}

// Fence returns the fence token of the lock Lock holds for the request ctx
// belongs to (the innermost one when Lock is used more than once); ctx is the
// request's context or the *gin.Context itself. Pass the token to the storage
// the handler writes, and have that storage refuse tokens smaller than one it
// has seen. ok is false when no lock is held (the route is not locked, the
// method is skipped, FailOpen ran the handler unlocked) or when the Locker
// issues no fence tokens (a locks.Redlock: its locks' Fence is 0).
func Fence(ctx context.Context) (token uint64, ok bool) {
	h := heldIn(ctx)
	if h == nil || h.lk.Fence() == 0 {
		return 0, false
	}
	return h.lk.Fence(), true
}

// heldIn returns what Lock put on the request's context, or nil; ctx is that
// context or the *gin.Context (whose Value does not reach the request's
// context unless the engine has ContextWithFallback).
func heldIn(ctx context.Context) *held {
	if c, ok := ctx.(*gin.Context); ok {
		if c.Request == nil {
			return nil
		}
		ctx = c.Request.Context()
	}
	h, _ := ctx.Value(heldKey{}).(*held)
	return h
}

// LockFromContext returns the lock Lock holds for the request ctx belongs to
// (the innermost one when Lock is used more than once; ctx as for Fence), e.g.
// to Extend it before a long step or to read its Name. The middleware
// releases it: do not call Unlock.
func LockFromContext(ctx context.Context) (*locks.Lock, bool) {
	h := heldIn(ctx)
	if h == nil {
		return nil, false
	}
	return h.lk, true
}
