package ginmw

import (
	"context"
	"slices"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// InvalidateAfter returns middleware for write routes: after the rest of the
// chain answered with a status below 400, it drops the Cache entries named by
// keys for this request — the GET and HEAD responses and every VaryByHeader
// variant, and the values cacheguard.Get keeps under the same names — with
// g.Invalidate, e.g. InvalidateAfter(g, Resource("repos", Param("id")))
// on PUT /repos/:id for a GET route cached with CacheKey(Resource("repos",
// Param("id"))). For a key made with Resource it also invalidates the tag of
// its kind ("repos"), which drops the pages cached with CacheTags("repos") —
// the list pages that show such resources. A key that cannot be extracted
// refuses the request with 400
// before the chain runs. The invalidation runs before the handler's return
// reaches the client unless the handler flushed its response (or it outgrew the
// server's write buffer); a handler that must guarantee it calls g.Invalidate
// before writing. A failure is recorded with c.Error.
func InvalidateAfter(g *cacheguard.Guard, keys ...Key) gin.HandlerFunc {
	if g == nil {
		panic("ginmw: InvalidateAfter called with a nil *cacheguard.Guard")
	}
	for _, k := range keys {
		if k.fn == nil {
			panic("ginmw: InvalidateAfter called with a zero Key")
		}
	}
	var kinds []string // the tags of the Resource kinds (see CacheTags)
	for _, k := range keys {
		if k.kind != "" && !slices.Contains(kinds, k.kind) {
			kinds = append(kinds, k.kind)
		}
	}
	return func(c *gin.Context) {
		names := make([]string, 0, len(keys))
		for _, k := range keys {
			name, err := k.name(c)
			if err != nil {
				writeError(c, badKey(err))
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
		if err := g.Invalidate(ctx, names...); err != nil {
			c.Error(err) //nolint:errcheck // recorded for loggers
		}
		if len(kinds) > 0 {
			if err := g.InvalidateTags(ctx, kinds...); err != nil {
				c.Error(err) //nolint:errcheck // recorded for loggers
			}
		}
	}
}
