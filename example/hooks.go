package main

// Test-only hooks. The end-to-end suite (internal/fleet) runs several
// processes of this service and injects faults at precise steps of a
// request: it starts them with -hooks, and sends requests that carry
//
//	X-Pause-At: <step>   one of the steps below
//	X-Hook-Tag: <tag>    the suite's name for the request
//
// When such a request reaches its step, the process prints
//
//	hook at <step> <tag>
//
// on stdout and parks the request there, on a channel (a parked cache load
// also goes on when its context ends), until it is released:
// by SIGCONT, which releases every parked request (the suite SIGSTOPs the process on reading the line, waits, and
// continues it, so the pause lands exactly at the step) or by
// POST /_hooks/release?tag=<tag> (a hold without a stop, e.g. to measure how
// fast a waiter is woken). Each request pauses at most once.
//
// A request with X-Ignore-Lost: 1 runs its edit's transaction under a
// context that the loss of its lock does not cancel, so that a paused write
// meets the database's defences (the plugin's lost-scope check, the fence
// condition) rather than a cancelled context: which of the two comes first
// after SIGCONT is otherwise a race between goroutines.
//
// -control switches one protection off, so the suite can show that it bites
// without it (negative controls): no-plugin (gormplugin not registered: no
// row guard, no fencing, no invalidation), no-fencing (gormplugin.NoFencing)
// and no-invalidate (no cache invalidation after COMMIT). Under no-plugin and
// no-fencing every edit also ignores its lock's loss, as with X-Ignore-Lost,
// so that the control does not depend on that race either.
//
// Edits also report their critical section in a response header,
// X-Edit-Span: <enter>,<exit>,<lost> in Unix nanoseconds (lost is 0 when the
// request's lock was never reported lost), which the suite compares across
// processes to count overlapping critical sections.
//
// Without -hooks the service's *hooks is nil and every method below is a no-op.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/gormplugin"
)

// The steps a request can pause at.
const (
	stepAfterLock    = "after-lock"    // the edit's handler starts: ginmw.Lock holds the repository
	stepAfterRead    = "after-read"    // the edit read the row (inside its transaction, for a settings edit by PUT)
	stepBeforeUpdate = "before-update" // inside the write: after gormplugin's checks, before the UPDATE is sent
	stepAfterUpdate  = "after-update"  // the UPDATE ran, the transaction is not committed yet
	stepCacheLoad    = "cache-load"    // inside a cache load (cacheguard.Get's loader, ginmw.Cache's handler)
)

var steps = []string{stepAfterLock, stepAfterRead, stepBeforeUpdate, stepAfterUpdate, stepCacheLoad}

// The negative controls (-control).
const (
	controlNoPlugin     = "no-plugin"
	controlNoFencing    = "no-fencing"
	controlNoInvalidate = "no-invalidate"
)

var controls = []string{controlNoPlugin, controlNoFencing, controlNoInvalidate}

func validControl(name string) bool { return slices.Contains(controls, name) }

const (
	headerPauseAt    = "X-Pause-At"
	headerHookTag    = "X-Hook-Tag"
	headerIgnoreLost = "X-Ignore-Lost"
	headerEditSpan   = "X-Edit-Span"
)

// hooks are the test-only pause points and controls of one process.
type hooks struct {
	out     io.Writer // where "hook at" lines go
	control string    // the protection switched off, or ""

	mu     sync.Mutex // guards parked and the lines written to out
	parked map[*pausePoint]chan struct{}

	sigs chan os.Signal // SIGCONT
	stop chan struct{}  // closed by close: every parked request goes on
	done chan struct{}  // closed when the signal loop has returned
	once sync.Once
}

// newHooks starts the hooks; close stops them.
func newHooks(out io.Writer, control string) *hooks {
	h := &hooks{
		out:     out,
		control: control,
		parked:  map[*pausePoint]chan struct{}{},
		sigs:    make(chan os.Signal, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	signal.Notify(h.sigs, syscall.SIGCONT)
	go h.loop()
	return h
}

// loop releases every parked request when the process is continued.
func (h *hooks) loop() {
	defer close(h.done)
	for {
		select {
		case <-h.stop:
			return
		case <-h.sigs:
			h.release(func(*pausePoint) bool { return true })
		}
	}
}

// close releases every parked request and stops the signal loop.
func (h *hooks) close() {
	if h == nil {
		return
	}
	h.once.Do(func() {
		signal.Stop(h.sigs)
		close(h.stop)
		<-h.done
		h.release(func(*pausePoint) bool { return true })
	})
}

// release lets the parked requests that match go on, and returns how many.
func (h *hooks) release(match func(*pausePoint) bool) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for p, ch := range h.parked {
		if match(p) {
			close(ch)
			delete(h.parked, p)
			n++
		}
	}
	return n
}

// pausePoint is where one request asked to pause.
type pausePoint struct {
	step, tag string
	once      sync.Once
}

type (
	pauseKey      struct{}
	ignoreLostKey struct{}
)

// routes adds the hooks' middleware (before every other, so the request's
// context carries its pause point through ginmw.Lock, cacheguard and GORM)
// and the release endpoint.
func (h *hooks) routes(r *gin.Engine) {
	if h == nil {
		return
	}
	r.Use(func(c *gin.Context) {
		ctx := c.Request.Context()
		if step := c.GetHeader(headerPauseAt); step != "" {
			ctx = context.WithValue(ctx, pauseKey{}, &pausePoint{step: step, tag: c.GetHeader(headerHookTag)})
		}
		if c.GetHeader(headerIgnoreLost) == "1" {
			ctx = context.WithValue(ctx, ignoreLostKey{}, true)
		}
		c.Request = c.Request.WithContext(ctx)
		c.Next()
	})
	r.POST("/_hooks/release", func(c *gin.Context) {
		tag := c.Query("tag")
		n := h.release(func(p *pausePoint) bool { return p.tag == tag })
		c.JSON(http.StatusOK, gin.H{"released": n})
	})
}

// at parks the request of ctx if it asked to pause at step (once), after
// telling the suite on stdout, until it is released: a pause in the middle
// of a write ignores the request's cancellation, as a real pause would.
func (h *hooks) at(ctx context.Context, step string) { h.park(ctx, step, nil) }

// inLoad is the step inside a cache load, after the database read and before
// the value is stored: the request of req is parked there until it is
// released or the load's context ends (a load timeout, or the cache guard
// closing), which it returns as a slow query would.
func (h *hooks) inLoad(req, load context.Context) error {
	if h.park(req, stepCacheLoad, load.Done()) {
		return context.Cause(load)
	}
	return nil
}

// park parks the request of ctx at step if it asked for it, and reports
// whether abort ended the pause.
func (h *hooks) park(ctx context.Context, step string, abort <-chan struct{}) (aborted bool) {
	if h == nil {
		return false
	}
	p, _ := ctx.Value(pauseKey{}).(*pausePoint)
	if p == nil || p.step != step {
		return false
	}
	p.once.Do(func() {
		ch := make(chan struct{})
		h.mu.Lock()
		select {
		case <-h.stop:
			h.mu.Unlock()
			return
		default:
		}
		h.parked[p] = ch
		fmt.Fprintf(h.out, "hook at %s %s\n", step, p.tag)
		h.mu.Unlock()
		select {
		case <-ch:
		case <-abort:
			aborted = true
			h.release(func(q *pausePoint) bool { return q == p })
		}
	})
	return aborted
}

// registerGORM places the write steps among GORM's and gormplugin's
// callbacks: before-update after the plugin's fence step (the last check
// before the statement), after-update after the plugin's post-write check.
func (h *hooks) registerGORM(db *gorm.DB) error {
	if h == nil {
		return nil
	}
	upd := db.Callback().Update()
	err := upd.Before("gorm:update").After("gormplugin:fence").Register("example:"+stepBeforeUpdate, func(tx *gorm.DB) {
		h.at(tx.Statement.Context, stepBeforeUpdate)
	})
	if err != nil {
		return err
	}
	return upd.After("gormplugin:check").Before("gorm:after_update").Register("example:"+stepAfterUpdate, func(tx *gorm.DB) {
		if tx.Error == nil {
			h.at(tx.Statement.Context, stepAfterUpdate)
		}
	})
}

// controlName returns the protection switched off, or "".
func (h *hooks) controlName() string {
	if h == nil {
		return ""
	}
	return h.control
}

// unguarded reports whether gormplugin must not be registered (no-plugin).
func (h *hooks) unguarded() bool { return h.controlName() == controlNoPlugin }

// pluginOptions returns gormplugin's options: the service's invalidation,
// changed by the control.
func (h *hooks) pluginOptions(invalidate gormplugin.Option) []gormplugin.Option {
	switch h.controlName() {
	case controlNoFencing:
		return []gormplugin.Option{invalidate, gormplugin.NoFencing()}
	case controlNoInvalidate:
		return nil
	}
	return []gormplugin.Option{invalidate}
}

// txContext returns the context an edit's transaction runs under: ctx, or,
// when the request or the control asks to ignore lock loss, ctx without its
// cancellation (its values — the lock owner, the fence — are kept).
func (h *hooks) txContext(ctx context.Context) context.Context {
	if h == nil {
		return ctx
	}
	if ignore, _ := ctx.Value(ignoreLostKey{}).(bool); ignore || h.control == controlNoPlugin || h.control == controlNoFencing {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// unguardedTransaction is a plain GORM transaction, for the no-plugin control.
func unguardedTransaction(ctx context.Context, db *gorm.DB, fn func(tx *gorm.DB) error, _ ...any) error {
	return db.WithContext(ctx).Transaction(fn)
}

// editSpan is an edit's critical section as the process saw it.
type editSpan struct {
	enter time.Time
	lost  time.Time   // when the request's context ended before the edit did
	mu    sync.Mutex  // guards lost
	stop  func() bool // of the context.AfterFunc that records lost
}

// enterEdit starts an edit's span (nil without hooks).
func (h *hooks) enterEdit(ctx context.Context) *editSpan {
	if h == nil {
		return nil
	}
	sp := &editSpan{enter: time.Now()}
	sp.stop = context.AfterFunc(ctx, func() {
		sp.mu.Lock()
		sp.lost = time.Now()
		sp.mu.Unlock()
	})
	return sp
}

// done ends the span and reports it in the response's X-Edit-Span header.
func (sp *editSpan) done(c *gin.Context) {
	if sp == nil {
		return
	}
	exit := time.Now()
	sp.stop()
	sp.mu.Lock()
	var lost int64
	if !sp.lost.IsZero() {
		lost = sp.lost.UnixNano()
	}
	sp.mu.Unlock()
	c.Header(headerEditSpan, strconv.FormatInt(sp.enter.UnixNano(), 10)+","+strconv.FormatInt(exit.UnixNano(), 10)+","+strconv.FormatInt(lost, 10))
}

// leave ends the span of an edit that was refused before its transaction.
func (sp *editSpan) leave() {
	if sp != nil {
		sp.stop()
	}
}
