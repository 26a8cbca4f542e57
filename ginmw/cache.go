package ginmw

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
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
	cfg := cacheConfig{maxBody: defaultMaxBody}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.maxBody <= 0 {
		panic("ginmw: MaxBody must be positive")
	}
	m := &cacheMW{g: g, cfg: cfg}
	m.guardOpts = append(append([]cacheguard.CallOption(nil), cfg.guardOpts...), cacheguard.TTL(ttl), cacheguard.Encoding(respCodec{}))
	if cfg.engine == nil {
		m.guardOpts = append(m.guardOpts, cacheguard.EarlyRefresh(0))
	}
	if len(cfg.tags) > 0 {
		m.guardOpts = append(m.guardOpts, cacheguard.Tags(cfg.tags...))
	}
	return m.serve
}

type cacheMW struct {
	g         *cacheguard.Guard
	cfg       cacheConfig
	guardOpts []cacheguard.CallOption // without ReportTo
}

// pending is one request's Get. The Get runs on the request's goroutine; when
// the load needs the handler, the loader (on a goroutine of cacheguard's)
// leaves an ask and cancels the Get's context, so that the request's
// goroutine returns from Get, runs the handler and replies. Once the request
// has left Cache, a loader runs the route again through BackgroundRefresh
// instead.
type pending struct {
	m         *cacheMW
	key       string
	variant   string
	req       *http.Request // the request as it reached Cache
	cancelGet context.CancelFunc

	res cacheguard.Result // how the Get was served (ReportTo)

	mu   sync.Mutex // guards ask, left
	ask  *loadAsk
	left bool // the request no longer takes asks
}

type loadAsk struct {
	ctx   context.Context // the load's context
	reply chan loadReply  // buffered
}

type loadReply struct {
	resp *response
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
	key, variant, err := m.cacheKey(c)
	if err != nil {
		writeError(c, badKey(err))
		return
	}

	for tries := 0; ; tries++ {
		gctx, cancel := context.WithCancel(r.Context())
		p := &pending{m: m, key: key, variant: variant, req: r, cancelGet: cancel}
		opts := make([]cacheguard.CallOption, 0, len(m.guardOpts)+2)
		opts = append(append(opts, m.guardOpts...), cacheguard.Variant(variant), cacheguard.ReportTo(&p.res))
		resp, err := cacheguard.Get(gctx, m.g, key, p.load, opts...)
		cancel()
		p.mu.Lock()
		a := p.ask
		p.left = true
		p.mu.Unlock()
		if a != nil {
			// The load needs this request's handler (other requests may be waiting for it).
			if out := p.answer(c, a); out != nil {
				if out.cacheable() {
					m.settle(r.Context(), key, variant)
				}
				writeResponse(c, out, "MISS")
			}
			return
		}
		if (errors.Is(err, errSettled) || errors.Is(err, errNoRequest)) && tries < 2 && r.Context().Err() == nil {
			// This request joined a load that declined to run (another
			// request's settle, or a load left without its request): ask
			// again, one of the callers takes the fill now.
			continue
		}
		m.finish(c, p, resp, err)
		return
	}
}

// answer runs the handler for the load, replies, and returns the response for
// this request's client (nil when it was streamed to the client already).
func (p *pending) answer(c *gin.Context, a *loadAsk) *response {
	replied := false
	defer func() {
		if !replied { // the handler panicked: the panic goes on to Gin's recovery
			a.reply <- loadReply{err: errHandlerPanicked}
		}
	}()
	resp := p.m.run(c, a.ctx)
	a.reply <- loaded(resp)
	replied = true
	return resp
}

// settle waits until the load this request answered has stored its response,
// so that a request that follows this one is served from the cache instead of
// joining a load that has already answered: it joins that load with a Get, or
// reads what it stored. Should the entry be gone meanwhile (invalidated), the
// Get finds no load to join and its loader declines, so nothing old is
// stored. It declines with an error matching cacheguard.ErrClosed, which
// hands the fill over: the waiters of other processes take it over instead
// of failing, and requests here that joined it ask again.
func (m *cacheMW) settle(ctx context.Context, key, variant string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	opts := append(m.guardOpts[:len(m.guardOpts):len(m.guardOpts)], cacheguard.Variant(variant))
	_, _ = cacheguard.Get(ctx, m.g, key, refuseLoad, opts...) // only waiting
}

// settleTimeout bounds settle: the store it waits for is one round trip.
const settleTimeout = 500 * time.Millisecond

var errSettled = fmt.Errorf("ginmw: entry gone after its load answered, load declined: %w", cacheguard.ErrClosed)

func refuseLoad(context.Context) (*response, error) { return nil, errSettled }

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
	p.mu.Lock()
	if p.left || p.ask != nil {
		p.mu.Unlock()
		return p.m.refresh(ctx, p.req, p.key, p.variant)
	}
	p.ask = a
	p.mu.Unlock()
	p.cancelGet() // the request's goroutine returns from Get and takes the ask
	select {
	case r := <-a.reply:
		return r.resp, r.err
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
	return w.captured(m.cfg.vary, origReq.Method == http.MethodHead)
}

// finish answers a request whose Get ended without asking for its handler.
func (m *cacheMW) finish(c *gin.Context, p *pending, resp *response, err error) {
	var unc *uncacheableError
	switch {
	case err == nil:
		writeResponse(c, resp, p.res.String())
	case c.Request.Context().Err() != nil:
		c.AbortWithStatus(StatusClientClosedRequest)
	case errors.As(err, &unc) && unc.resp != nil && unc.resp.shareable():
		writeResponse(c, unc.resp, "COALESCED")
	case errors.Is(err, cacheguard.ErrMiss) && m.cfg.engine == nil:
		// FailFast fills in the background, which needs BackgroundRefresh
		// unless the fill asks before this request has left Cache (then this
		// request runs it): serve this one directly.
		c.Error(fmt.Errorf("%w (FailFast needs BackgroundRefresh)", err)) //nolint:errcheck // recorded for loggers
		c.Header("X-Cache", "BYPASS")
		c.Next()
	case errors.Is(err, cacheguard.ErrMiss), errors.Is(err, cacheguard.ErrWaitTimeout), errors.Is(err, cacheguard.ErrUnavailable):
		writeError(c, &Error{Status: http.StatusServiceUnavailable, Kind: ErrCacheUnavailable, Resource: p.key, RetryAfter: time.Second, Cause: err})
	default:
		// The load this request waited for produced nothing it may replay (a
		// response setting a cookie, a streamed one, a panic, a failure in
		// another process), or the cache failed: run the handler here, uncached.
		if unc == nil {
			c.Error(err) //nolint:errcheck // recorded for loggers
		}
		c.Header("X-Cache", "BYPASS")
		c.Next()
	}
}
