package ginmw

import (
	"context"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/locks"
)

type refreshKey struct{}

// refreshSlot carries a background refresh's response back from the copy of
// the request sent through the engine.
type refreshSlot struct {
	m      *cacheMW // the Cache that asked
	served bool
	resp   *response
}

// refresh loads entry e when no request is there to run the handler:
// it sends a copy of orig through the engine (BackgroundRefresh), whose Cache
// middleware runs the chain and hands the captured response back.
func (m *cacheMW) refresh(ctx context.Context, orig *http.Request, e entry) (*response, error) {
	if m.cfg.engine == nil {
		return nil, errNoRequest
	}
	slot := &refreshSlot{m: m}
	// The copy is a request of its own, not part of the one that started the
	// load, which may still hold its locks (in middleware after Cache): ctx
	// keeps that request's values, but none of its lock state goes on — no
	// owner, so a Lock in the chain takes its lock afresh and waits for that
	// request's; no held lock for Fence and LockFromContext.
	ctx = locks.WithOwner(context.WithValue(ctx, heldKey{}, (*held)(nil)), "")
	req := orig.Clone(context.WithValue(ctx, refreshKey{}, slot))
	req.Body = http.NoBody
	req.ContentLength = 0
	m.cfg.engine.ServeHTTP(discard{h: http.Header{}}, req)
	if !slot.served {
		return nil, errNotServed
	}
	r := m.loaded(ctx, orig, slot.resp, e.ttl)
	return r.resp, r.err
}

// serveRefresh runs the chain for a background refresh's copy of a request.
func (m *cacheMW) serveRefresh(c *gin.Context, slot *refreshSlot) {
	if slot.m != m {
		c.Next() // another Cache on the same chain
		return
	}
	slot.served = true
	slot.resp = m.run(c, c.Request.Context(), nil)
	c.Abort()
}

// discard is the response writer of a background refresh: the response was
// captured by Cache, nobody reads it.
type discard struct{ h http.Header }

func (d discard) Header() http.Header         { return d.h }
func (d discard) Write(b []byte) (int, error) { return len(b), nil }
func (d discard) WriteHeader(int)             {}
