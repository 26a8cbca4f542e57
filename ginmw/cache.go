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
	"github.com/cacheguard/cacheguard/locks"
)

// ErrCacheUnavailable means the cache's policy refused to run the handler for
// this request: the miss policy is FailFast and nothing servable was cached,
// the wait budget ended while another request loaded the entry, or Redis was
// unreachable under cacheguard.FailClosed. Cache answers 503 with Retry-After.
var ErrCacheUnavailable = errors.New("ginmw: cached response unavailable")

// Cache returns middleware that caches the status, headers and body of GET and
// HEAD responses for ttl, through cacheguard, as a shared cache in RFC 9111's
// sense: when an entry is missing or expired, one request across every process
// sharing the Redis runs the handler while the others wait for its response
// (or are served the stale one, under cacheguard.ServeStale). Other methods
// pass through; a successful unsafe one (POST, PUT, DELETE, PATCH...) drops
// the entry of its target first. A request no route matched passes through.
//
// The response carries X-Cache: HIT (from Redis or the Guard's near cache),
// MISS (this request ran the handler),
// STALE, COALESCED (served the response another request loaded), or BYPASS
// (this request's handler ran for it alone). What may be stored, and shared
// with the requests that waited for a load, is decided from the request and
// the response's own headers (see the package documentation, Cache): never a
// response marked no-store, private or no-cache (a Cache-Control that does
// not parse, such as "private; max-age=60", counts as no-store), setting a
// cookie, varying on
// a header Cache does not key by, or answering a request with Authorization
// without public, s-maxage or must-revalidate; never longer than what is left
// of its own s-maxage, max-age or Expires (CDN-Cache-Control's when present)
// after its Age, when shorter than ttl; a hit carries Age. Responses that
// are not 2xx (or are 206, or a 2xx but 200, 203 and 204 without explicit
// freshness), or whose body exceeds MaxBody, are shared with the
// requests of the process that waited for them, and not stored. Range
// requests, requests with Cache-Control: no-store and requests whose path is
// not validly escaped (a raw "#": no key names what Gin routes under
// UseRawPath) bypass Cache.
// Conditional requests are answered from the stored response (304 on a
// matching ETag or Last-Modified); the handler never sees the client's
// validators, only those of a stored response it revalidates once its
// lifetime is over (a 304 then refreshes the stored response). Every request
// served from a stored response gets its own copy of its header.
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
	cfg := cacheConfig{maxBody: defaultMaxBody, maxSharedBody: defaultMaxSharedBody}
	for _, o := range opts {
		o(&cfg)
	}
	// StaleGrace(0) first: a response is served past its freshness only when
	// the route's CacheOptions say so (ServeStale, FailSafe, StaleGrace).
	guardOpts := append(append([]cacheguard.CallOption{cacheguard.StaleGrace(0)}, cfg.guardOpts...), cacheguard.TTL(ttl), cacheguard.Encoding(respCodec{}))
	if cfg.engine == nil {
		guardOpts = append(guardOpts, cacheguard.EarlyRefresh(0))
	}
	if len(cfg.tags) > 0 {
		guardOpts = append(guardOpts, cacheguard.Tags(cfg.tags...))
	}
	if err := cfg.validate(g, guardOpts); err != nil {
		panic(err)
	}
	cfg.maxSharedBody = max(cfg.maxSharedBody, cfg.maxBody)
	m := &cacheMW{g: g, cfg: cfg, ttl: ttl, guardOpts: guardOpts}
	return m.serve
}

type cacheMW struct {
	g         *cacheguard.Guard
	cfg       cacheConfig
	ttl       time.Duration
	guardOpts []cacheguard.CallOption // with TTL(ttl); without Variant and ReportTo
}

// entry names where a request's response is stored: the variant of the
// request's key, and the TTL it is stored for.
type entry struct {
	variant string
	ttl     time.Duration
	// strict: the response found there must not be served stale, so the
	// entry is read again under the Wait policy, without FailSafe or
	// SoftTimeout.
	strict bool
	// prior: the stored response found stale on the way here, which a load
	// revalidates (RFC 9111 §4.3.1) when it has a validator.
	prior *response
}

// maxHops bounds how many entries one request reads: a stored response whose
// own lifetime ended leads to the entry kept for that lifetime, a stale one
// that must not be served stale to a second read, and a load that declined to
// run (no request left to run it) is asked again.
const maxHops = 4

func (m *cacheMW) serve(c *gin.Context) {
	r := c.Request
	if c.FullPath() == "" {
		// No route matched (Cache used with Engine.Use): Gin answers 404 or
		// 405, and nothing of it is stored.
		c.Next()
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		m.passUnsafe(c)
		return
	}
	if slot, ok := r.Context().Value(refreshKey{}).(*refreshSlot); ok {
		m.serveRefresh(c, slot)
		return
	}
	if m.bypass(r) != "" {
		c.Header("X-Cache", "BYPASS")
		c.Next()
		return
	}
	key, variant, err := m.cacheKey(c)
	if err != nil {
		writeError(c, badKey(err))
		return
	}
	e := entry{variant: variant, ttl: m.ttl}
	for hop := 1; ; hop++ {
		g := m.get(c, key, e)
		if g.ran {
			// This request's handler ran for the load; its response was
			// streamed to its client already when it outgrew MaxBody.
			if g.own != nil && !g.own.oversize {
				writeResponse(c, g.own, "MISS")
			}
			return
		}
		resp, err := g.resp, g.err
		switch {
		case err == nil && resp.expired(time.Now().UnixMilli()):
			// Its own lifetime, shorter than the TTL it was stored for, is
			// over: the response for now is in the entry kept for that lifetime.
			e = entry{variant: variant + " lifetime:" + resp.lifetime.String(), ttl: resp.lifetime, prior: resp}
		case err == nil && g.res == cacheguard.Stale && resp.strict && !e.strict:
			e.strict, e.prior = true, resp // must-revalidate and the like: wait for a fresh one
		case err == nil:
			writeResponse(c, resp, g.res.String())
			return
		case errors.Is(err, errNoRequest) && r.Context().Err() == nil:
			// This request joined a load that declined to run (a load left
			// without its request): ask again, one of the callers takes the
			// fill now.
		default:
			m.finish(c, key, err)
			return
		}
		if hop == maxHops {
			c.Header("X-Cache", "BYPASS")
			c.Next()
			return
		}
	}
}

// passUnsafe runs the chain for a request of another method than GET and
// HEAD. After an unsafe one (any but OPTIONS and TRACE) that succeeded, the
// entry of its target — its key, for every method, host and varied header —
// is dropped before the response reaches the client, as RFC 9111 §4.4 has a
// cache do; a failure is recorded with c.Error.
func (m *cacheMW) passUnsafe(c *gin.Context) {
	if c.Request.Method == http.MethodOptions || c.Request.Method == http.MethodTrace {
		c.Next()
		return
	}
	key, _, err := m.cacheKey(c)
	if err != nil { // a CacheKey this request does not have: no entry of it
		c.Next()
		return
	}
	afterWrite(c, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), releaseTimeout)
		defer cancel()
		if err := m.g.Invalidate(ctx, key); err != nil {
			c.Error(err) //nolint:errcheck // recorded for loggers
		}
	})
}

// got is what one entry's read gave a request.
type got struct {
	resp *response
	res  cacheguard.Result
	err  error
	own  *response // the response of this request's handler, when it ran for a load
	ran  bool
}

// pending is one request's cacheguard.Get of an entry. The Get runs on a
// goroutine of its own; the request's goroutine waits for its result and,
// when the load needs the handler, runs it: the loader (on a goroutine of
// cacheguard's) leaves an ask, the request's goroutine runs the handler and
// replies, then goes on waiting until the Get returns — after the response
// is stored, so that a request that follows is a HIT. The handler runs at
// most once per request; a loader that asks once the request has left (or
// asks again) runs the route through BackgroundRefresh instead.
type pending struct {
	m   *cacheMW
	e   entry
	req *http.Request // the request as it reached Cache
	// ev carries the loader's ask, then nil once the Get returned (with its
	// result in got): at most two sends, so it never blocks.
	ev  chan *loadAsk
	got got // written by the Get's goroutine before it sends nil on ev

	mu    sync.Mutex // guards asked, left, and the send of an ask
	asked bool
	left  bool // the request no longer takes asks
}

type loadAsk struct {
	ctx   context.Context // the load's context
	reply chan loadReply  // buffered
}

type loadReply struct {
	resp *response
	err  error
}

// get reads entry e of key for the request, running its handler when the
// load asks for it.
func (m *cacheMW) get(c *gin.Context, key string, e entry) got {
	p := &pending{m: m, e: e, req: c.Request, ev: make(chan *loadAsk, 2)}
	opts := make([]cacheguard.CallOption, 0, len(m.guardOpts)+6)
	opts = append(append(opts, m.guardOpts...), cacheguard.Variant(e.variant), cacheguard.ReportTo(&p.got.res))
	if e.ttl != m.ttl {
		opts = append(opts, cacheguard.TTL(e.ttl))
	}
	if e.strict {
		opts = append(opts, cacheguard.Wait(), cacheguard.FailSafe(0, 0), cacheguard.SoftTimeout(0))
	}
	go p.read(key, opts) // ends when the Get does, within the request's context and the wait budget
	var own *response
	ran := false
	for a := range p.ev {
		if a != nil {
			own, ran = p.answer(c, a), true
			continue
		}
		p.mu.Lock()
		p.left = true
		select {
		case a = <-p.ev: // asked as the Get ended (its client went away): others wait for this load
		default:
		}
		p.mu.Unlock()
		if a != nil {
			own, ran = p.answer(c, a), true
		}
		break
	}
	g := p.got
	g.own, g.ran = own, ran
	return g
}

// read runs the Get.
func (p *pending) read(key string, opts []cacheguard.CallOption) {
	p.got.resp, p.got.err = cacheguard.Get(p.req.Context(), p.m.g, key, p.load, opts...)
	p.ev <- nil
}

// load is the cacheguard loader: it runs on a goroutine of cacheguard's.
func (p *pending) load(ctx context.Context) (*response, error) {
	a := &loadAsk{ctx: ctx, reply: make(chan loadReply, 1)}
	p.mu.Lock()
	if p.left || p.asked {
		p.mu.Unlock()
		return p.m.refresh(ctx, p.req, p.e)
	}
	p.asked = true
	p.ev <- a // never blocks: one ask per request
	p.mu.Unlock()
	select {
	case r := <-a.reply:
		return r.resp, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// answer runs the handler for the load, replies, and returns the response
// (nil when it was streamed to the client and not kept).
func (p *pending) answer(c *gin.Context, a *loadAsk) *response {
	replied := false
	defer func() {
		if !replied { // the handler panicked: the panic goes on to Gin's recovery
			a.reply <- loadReply{err: errHandlerPanicked}
		}
	}()
	resp := p.m.run(c, a.ctx, p.e.prior)
	a.reply <- p.m.loaded(a.ctx, p.req, resp, p.e.ttl)
	replied = true
	return resp
}

// loaded is what the loader returns for a response the handler produced for
// req under the load's context lctx, for an entry stored for ttl: the
// response to store, marked with what decide found, or an
// *uncacheableError. Once lctx has ended (Guard.Shutdown or Close, the load
// timeout) the response may be what the handler made of that end (Abort's
// 499 for a context.Canceled): it answers its own request only, and the load
// fails with the context's error, as it does when it ends before the handler
// answers — on the request's goroutine and on a background refresh's alike.
func (m *cacheMW) loaded(lctx context.Context, req *http.Request, r *response, ttl time.Duration) loadReply {
	if err := lctx.Err(); err != nil {
		return loadReply{err: err}
	}
	v := m.decide(req, r)
	if !v.store {
		return loadReply{err: &uncacheableError{resp: r, v: v}}
	}
	r.strict = v.strict
	now := time.Now()
	r.born = now.Add(-v.age).UnixMilli()
	if v.ttl > 0 && v.ttl < ttl {
		r.lifetime, r.expires = v.ttl, now.Add(v.ttl).UnixMilli()
	}
	return loadReply{resp: r}
}

// run runs the rest of the chain with its output captured, under a context
// that keeps the request's values but follows the load's cancellation, with
// the client's validators removed from the request — and prior's in their
// place when it has any: a 304 then answers with prior, its fields updated
// from the 304 (RFC 9111 §4.3.4). It returns nil when the response
// passed through and was not kept (flushed, hijacked, larger than
// MaxSharedBody).
func (m *cacheMW) run(c *gin.Context, lctx context.Context, prior *response) *response {
	origReq, origW := c.Request, c.Writer
	// The handler's context ends when the load's does, with its cause (the
	// Guard's ErrClosed, the load timeout), which endedBy reads: the
	// client is not gone.
	hctx, cancelCause := context.WithCancelCause(context.WithoutCancel(origReq.Context()))
	cancel := func() { cancelCause(nil) }
	if dl, ok := lctx.Deadline(); ok {
		var cancelDeadline context.CancelFunc
		hctx, cancelDeadline = context.WithDeadline(hctx, dl)
		cancel = func() { cancelDeadline(); cancelCause(nil) }
	}
	stop := context.AfterFunc(lctx, func() { cancelCause(context.Cause(lctx)) })
	req := origReq.WithContext(hctx)
	req.Header = unconditional(origReq.Header)
	if etag, lm := prior.validators(); etag != "" || lm != "" {
		req.Header = req.Header.Clone()
		if etag != "" {
			req.Header["If-None-Match"] = []string{etag}
		}
		if lm != "" {
			req.Header["If-Modified-Since"] = []string{lm}
		}
	} else {
		prior = nil
	}
	w := newCaptureWriter(origW, m.cfg.maxBody, m.cfg.maxSharedBody)
	c.Request, c.Writer = req, w
	defer func() {
		stop()
		cancel()
		c.Request, c.Writer = origReq, origW
	}()
	c.Next()
	r := w.captured(m.cfg.vary, origReq.Method == http.MethodHead)
	if r != nil && r.status == http.StatusNotModified && prior != nil {
		r = prior.updated(r)
	}
	return r
}

// finish answers a request whose Get failed without running its handler.
func (m *cacheMW) finish(c *gin.Context, key string, err error) {
	var unc *uncacheableError
	switch by := endedBy(c.Request.Context()); {
	case errors.Is(by, locks.ErrNotHeld), errors.Is(by, cacheguard.ErrClosed):
		Abort(c, by) // a Lock further up the chain lost its lock, the Guard of a load this request runs for closed
	case by != nil:
		c.AbortWithStatus(StatusClientClosedRequest)
	case errors.As(err, &unc) && unc.v.share:
		writeResponse(c, unc.resp, "COALESCED")
	case errors.Is(err, cacheguard.ErrMiss) && m.cfg.engine == nil:
		// FailFast fills in the background, which needs BackgroundRefresh
		// unless the fill asks before this request has left Cache (then this
		// request runs it): serve this one directly.
		c.Error(fmt.Errorf("%w (FailFast needs BackgroundRefresh)", err)) //nolint:errcheck // recorded for loggers
		c.Header("X-Cache", "BYPASS")
		c.Next()
	case errors.Is(err, cacheguard.ErrMiss), errors.Is(err, cacheguard.ErrWaitTimeout), errors.Is(err, cacheguard.ErrUnavailable):
		writeError(c, &Error{Status: http.StatusServiceUnavailable, Kind: ErrCacheUnavailable, Resource: key, RetryAfter: time.Second, Cause: err})
	default:
		// The load this request waited for produced nothing it may replay (a
		// response another user may not see, a streamed one, a panic, a
		// failure in another process, a response another process did not
		// store: cacheguard.ErrUncached, no failure), or the cache failed:
		// run the handler here, for this request alone.
		if unc == nil && !errors.Is(err, cacheguard.ErrUncached) {
			c.Error(err) //nolint:errcheck // recorded for loggers
		}
		c.Header("X-Cache", "BYPASS")
		c.Next()
	}
}
