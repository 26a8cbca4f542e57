package ginmw

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// ErrCacheUnavailable means the cache's policy refused to run the handler for
// this request: the miss policy is FailFast and nothing servable was cached,
// the wait budget ended while another request loaded the entry, or Redis was
// unreachable under cacheguard.FailClosed. Cache answers 503 with Retry-After.
var ErrCacheUnavailable = errors.New("ginmw: cached response unavailable")

// Cache returns middleware that caches the status, headers and body of GET and
// HEAD responses for ttl, through cacheguard: when an entry is missing or
// expired, one request across every process sharing the Redis runs the
// handler while the others wait for its response (or are served the stale one,
// under cacheguard.ServeStale). Other methods pass through.
//
// The response carries X-Cache: HIT, MISS (this request ran the handler),
// STALE, COALESCED (served the response another request loaded), or BYPASS
// (not cached: see below). By default Cache never stores a response that is
// not 2xx (or is 206), that sets a cookie, or whose body exceeds MaxBody, and
// requests that carry Authorization or Range bypass it. Conditional requests
// are answered from the stored response (304 on a matching ETag or
// Last-Modified); the handler itself always sees an unconditional request.
//
// The handler runs on its request's goroutine, under a context that keeps the
// request's values but is detached from its cancellation (other requests may
// be waiting for the response) and bounded by the load timeout. Cache panics
// with a "ginmw:" message when g is nil, ttl is not positive or an option is
// invalid.
func Cache(g *cacheguard.Guard, ttl time.Duration, opts ...CacheOption) gin.HandlerFunc {
	switch {
	case g == nil:
		panic("ginmw: Cache called with a nil *cacheguard.Guard")
	case ttl <= 0:
		panic("ginmw: Cache called with a non-positive TTL")
	}
	cfg := cacheConfig{maxBody: DefaultMaxBody}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.maxBody <= 0 {
		panic("ginmw: MaxBody must be positive")
	}
	m := &cacheMW{g: g, cfg: cfg}
	m.guardOpts = append(append([]cacheguard.Option(nil), cfg.guardOpts...), cacheguard.TTL(ttl), cacheguard.WithCodec(respCodec{}))
	if cfg.engine == nil {
		m.guardOpts = append(m.guardOpts, cacheguard.EarlyRefresh(0))
	}
	return m.serve
}

type cacheMW struct {
	g         *cacheguard.Guard
	cfg       cacheConfig
	guardOpts []cacheguard.Option // without ReportTo
}

// pending is one request's Get in flight. The loader of a fill asks the
// request's goroutine to run the handler; once the request has left Cache,
// it runs the route again through BackgroundRefresh instead.
type pending struct {
	m    *cacheMW
	key  string
	req  *http.Request // the request as it reached Cache
	asks chan *loadAsk // unbuffered: received only by the request's goroutine
	done chan struct{} // closed when the request stops taking asks

	// Set and read on the request's goroutine only.
	ran      bool
	resp     *response // the response the handler produced here (nil if streamed)
	streamed bool
}

type loadAsk struct {
	ctx   context.Context // the load's context
	reply chan loadReply  // buffered
}

type loadReply struct {
	resp *response
	err  error
}

type getResult struct {
	resp *response
	res  cacheguard.Result
	err  error
}

func (m *cacheMW) serve(c *gin.Context) {
	r := c.Request
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		c.Next()
		return
	}
	if slot, ok := r.Context().Value(refreshKey{}).(*refreshSlot); ok {
		m.serveRefresh(c, slot)
		return
	}
	if (!m.cfg.allowAuthz && r.Header.Get("Authorization") != "") || r.Header.Get("Range") != "" {
		c.Header("X-Cache", "BYPASS")
		c.Next()
		return
	}
	key, err := m.cacheKey(c)
	if err != nil {
		WriteError(c, &Error{Status: http.StatusBadRequest, Kind: ErrBadKey, Cause: err})
		return
	}

	p := &pending{m: m, key: key, req: r, asks: make(chan *loadAsk), done: make(chan struct{})}
	out := make(chan getResult, 1)
	go func() {
		var gr getResult
		opts := make([]cacheguard.Option, 0, len(m.guardOpts)+1)
		opts = append(append(opts, m.guardOpts...), cacheguard.ReportTo(&gr.res))
		gr.resp, gr.err = cacheguard.Get(r.Context(), m.g, key, p.load, opts...)
		out <- gr
	}()
	var got getResult
	taking := true
	defer func() {
		if taking { // the handler panicked: let the Get end before the panic goes on to Gin's recovery
			close(p.done)
			<-out
		}
	}()
	got = p.await(c, out)
	close(p.done)
	taking = false
	m.finish(c, p, got)
}

// await runs the handler whenever the load asks for it, until the Get ends.
func (p *pending) await(c *gin.Context, out <-chan getResult) getResult {
	for {
		select {
		case a := <-p.asks:
			p.answer(c, a)
		case got := <-out:
			return got
		}
	}
}

func (p *pending) answer(c *gin.Context, a *loadAsk) {
	if p.ran {
		a.reply <- loadReply{err: errAlreadyRan}
		return
	}
	p.ran = true
	replied := false
	defer func() {
		if !replied {
			a.reply <- loadReply{err: errHandlerPanicked}
		}
	}()
	resp := p.m.run(c, a.ctx)
	p.resp, p.streamed = resp, resp == nil
	a.reply <- loaded(resp)
	replied = true
}

// loaded is what the loader returns for a response the handler produced.
func loaded(resp *response) loadReply {
	if resp == nil || !resp.cacheable() {
		return loadReply{err: &uncacheableError{resp: resp}}
	}
	return loadReply{resp: resp}
}

// load is the cacheguard loader: it runs on a goroutine of cacheguard's.
func (p *pending) load(ctx context.Context) (*response, error) {
	a := &loadAsk{ctx: ctx, reply: make(chan loadReply, 1)}
	select {
	case p.asks <- a:
		r := <-a.reply
		return r.resp, r.err
	case <-p.done:
		return p.m.refresh(ctx, p.req, p.key)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run runs the rest of the chain with its output captured, under a context
// that keeps the request's values but follows the load's cancellation, with
// the validators removed from the request. It returns nil when the response
// passed through (streamed, too large, hijacked).
func (m *cacheMW) run(c *gin.Context, lctx context.Context) *response {
	origReq, origW := c.Request, c.Writer
	base := context.WithoutCancel(origReq.Context())
	var hctx context.Context
	var cancel context.CancelFunc
	if dl, ok := lctx.Deadline(); ok {
		hctx, cancel = context.WithDeadline(base, dl)
	} else {
		hctx, cancel = context.WithCancel(base)
	}
	stop := context.AfterFunc(lctx, cancel)
	req := origReq.WithContext(hctx)
	req.Header = unconditional(origReq.Header)
	w := newCaptureWriter(origW, m.cfg.maxBody)
	c.Request, c.Writer = req, w
	defer func() {
		stop()
		cancel()
		c.Request, c.Writer = origReq, origW
	}()
	c.Next()
	return w.captured(m.cfg.vary)
}

// finish answers the request once its Get has ended.
func (m *cacheMW) finish(c *gin.Context, p *pending, got getResult) {
	var unc *uncacheableError
	switch {
	case p.ran && p.streamed:
		// The response went out as the handler wrote it.
	case p.ran:
		writeResponse(c, p.resp, "MISS")
	case got.err == nil:
		writeResponse(c, got.resp, got.res.String())
	case c.Request.Context().Err() != nil:
		c.AbortWithStatus(StatusClientClosedRequest)
	case errors.As(got.err, &unc) && unc.resp != nil && unc.resp.shareable():
		writeResponse(c, unc.resp, "COALESCED")
	case errors.Is(got.err, cacheguard.ErrMiss), errors.Is(got.err, cacheguard.ErrWaitTimeout), errors.Is(got.err, cacheguard.ErrUnavailable):
		c.Header("Retry-After", "1")
		WriteError(c, &Error{Status: http.StatusServiceUnavailable, Kind: ErrCacheUnavailable, Resource: p.key, RetryAfter: time.Second, Cause: got.err})
	default:
		// The load this request waited for produced nothing it may replay (a
		// response setting a cookie, a streamed one, a panic, a failure in
		// another process), or the cache failed: run the handler here, uncached.
		if unc == nil {
			c.Error(got.err) //nolint:errcheck // recorded for loggers
		}
		c.Header("X-Cache", "BYPASS")
		c.Next()
	}
}
