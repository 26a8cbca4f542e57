package ginmw

import (
	"context"
	"fmt"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// Invalidate drops the entries Cache stored under keys — the GET and HEAD
// responses and every VaryByHeader variant — and voids the loads in flight
// for them, so the next request loads afresh. A key is a resource name given
// to CacheKey ("repos:42"), or a PathKey for routes cached by path. It is
// g.Invalidate(ctx, keys...) with ginmw's own checks: one resource name drops
// the responses Cache keeps and the values cacheguard.Get keeps under it alike,
// which is why gormplugin can invalidate through the Guard directly.
func Invalidate(ctx context.Context, g *cacheguard.Guard, keys ...string) error {
	if g == nil {
		return fmt.Errorf("%w: nil *cacheguard.Guard", ErrInvalid)
	}
	for _, k := range keys {
		if k == "" {
			return fmt.Errorf("%w: empty key", ErrInvalid)
		}
	}
	return g.Invalidate(ctx, keys...)
}

// InvalidateAfter returns middleware for write routes: after the rest of the
// chain answered with a status below 400, it drops the Cache entries named by
// keys for this request, e.g. InvalidateAfter(g, Resource("repos", Param("id")))
// on PUT /repos/:id for a GET route cached with CacheKey(Resource("repos",
// Param("id"))). A key that cannot be extracted refuses the request with 400
// before the chain runs. The invalidation runs before the handler's return
// reaches the client unless the handler flushed its response (or it outgrew the
// server's write buffer); a handler that must guarantee it calls Invalidate
// before writing. A failure is recorded with c.Error.
func InvalidateAfter(g *cacheguard.Guard, keys ...KeyFunc) gin.HandlerFunc {
	if g == nil {
		panic("ginmw: InvalidateAfter called with a nil *cacheguard.Guard")
	}
	for _, k := range keys {
		if k.fn == nil {
			panic("ginmw: InvalidateAfter called with a zero KeyFunc")
		}
	}
	return func(c *gin.Context) {
		names := make([]string, 0, len(keys))
		for _, k := range keys {
			name, err := k.name(c)
			if err != nil {
				WriteError(c, badKey(err))
				return
			}
			names = append(names, name)
		}
		c.Next()
		if c.Writer.Status() >= 400 {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), releaseTimeout)
		defer cancel()
		if err := Invalidate(ctx, g, names...); err != nil {
			c.Error(err) //nolint:errcheck // recorded for loggers
		}
	}
}
