package ginmw

import (
	"bufio"
	"context"
	"net"
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
// reaches the client: it runs when the response's status is committed (the
// handler's first write), or when the chain returns having written nothing.
// A handler that writes its answer before its write is done calls
// g.Invalidate itself. A failure is recorded with c.Error.
func InvalidateAfter(g *cacheguard.Guard, keys ...Key) gin.HandlerFunc {
	switch {
	case g == nil:
		panic("ginmw: InvalidateAfter called with a nil *cacheguard.Guard")
	case len(keys) == 0:
		panic("ginmw: InvalidateAfter called with no Key: it would invalidate nothing")
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
		afterWrite(c, func() {
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
		})
	}
}

// afterWrite runs the rest of the chain and then drop, once, if the response
// succeeded (a status below 400): when the status is committed — before any
// byte of the response can reach the client, even through a flush — or when
// the chain returns without having written. It is how every write route
// invalidates: InvalidateAfter, and Cache after an unsafe method.
func afterWrite(c *gin.Context, drop func()) {
	orig := c.Writer
	w := &committingWriter{ResponseWriter: orig, drop: drop}
	c.Writer = w
	defer func() { c.Writer = orig }()
	c.Next()
	w.commit()
}

// committingWriter runs drop before the response is committed.
type committingWriter struct {
	gin.ResponseWriter
	drop func()
	done bool
}

func (w *committingWriter) commit() {
	if !w.done {
		w.done = true
		if w.ResponseWriter.Status() < 400 {
			w.drop()
		}
	}
}

func (w *committingWriter) WriteHeaderNow() { w.commit(); w.ResponseWriter.WriteHeaderNow() }

func (w *committingWriter) Write(b []byte) (int, error) { w.commit(); return w.ResponseWriter.Write(b) }

func (w *committingWriter) WriteString(s string) (int, error) {
	w.commit()
	return w.ResponseWriter.WriteString(s)
}

func (w *committingWriter) Flush() { w.commit(); w.ResponseWriter.Flush() }

func (w *committingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.done = true // a switch of protocols is no write to invalidate for
	return w.ResponseWriter.Hijack()
}
