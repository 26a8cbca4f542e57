package main

// Test-only: fault hooks for the end-to-end suite. Nothing in this file is
// part of the example a user copies; a real deployment runs without it
// (serviceConfig.TestHooks is nil, and nothing below is installed).
//
// The suite (internal/fleet) runs several processes of this service and
// injects faults at precise steps of a request: it starts them with -hooks,
// and sends requests that carry
//
//	X-Pause-At: <step>   one of the steps below
//	X-Hook-Tag: <tag>    the suite's name for the request
//
// When such a request reaches its step, the process prints
//
//	hook at <step> <tag>
//
// on stdout and parks the request there, on a channel (a parked cache load
// also goes on when its context ends), until it is released: by SIGCONT,
// which releases every parked request (the suite SIGSTOPs the process on
// reading the line, waits, and continues it, so the pause lands exactly at
// the step), or by POST /_hooks/release?tag=<tag> (a hold without a stop,
// e.g. to measure how fast a waiter is woken). Each request pauses at most
// once.
//
// A request with X-Ignore-Lost: 1 runs its edit under a context that the
// loss of its lock does not cancel, so that a paused write meets the
// database's defences (the plugin's lost-scope check, the fence condition)
// rather than a cancelled context: which of the two comes first after
// SIGCONT is otherwise a race between goroutines.
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
// The hooks are installed from outside the handlers, so the handlers read as
// a user would write them:
//
//   - routes: a middleware before every other reads the headers into the
//     request's context (it travels through ginmw.Lock, cacheguard and GORM
//     from there), and POST /_hooks/release;
//   - underLock: a middleware placed right after ginmw.Lock on the edit
//     routes: the edit's span (and X-Edit-Span on its answer), the
//     after-lock step, and the context that ignores the lock's loss;
//   - registerGORM: GORM callbacks for the steps inside database work:
//     after-read (an edit's first read), cache-load (a read outside an edit:
//     cacheguard.Get's loader, ginmw.Cache's handler), before-update and
//     after-update (placed around gormplugin's own callbacks);
//   - pluginOptions: the negative controls, applied where the service
//     registers gormplugin.

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
	stepCacheLoad    = "cache-load"    // inside a cache load (cacheguard.Get's loader, ginmw.Cache's handler), after its read
)

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

// testHooks are the test-only pause points and controls of one process.
type testHooks struct {
	out     io.Writer // where "hook at" lines go
	control string    // the protection switched off, or ""

	mu     sync.Mutex // guards parked and the lines written to out
	parked map[*pausePoint]chan struct{}

	sigs chan os.Signal // SIGCONT
	stop chan struct{}  // closed by close: every parked request goes on
	done chan struct{}  // closed when the signal loop has returned
	once sync.Once
}

// newTestHooks starts the hooks; close stops them.
func newTestHooks(out io.Writer, control string) *testHooks {
	h := &testHooks{
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
func (h *testHooks) loop() {
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
func (h *testHooks) close() {
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
func (h *testHooks) release(match func(*pausePoint) bool) int {
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
	pauseKey      struct{} // *pausePoint: the request asked to pause
	ignoreLostKey struct{} // true: the request asked to ignore its lock's loss
	editKey       struct{} // true: the request is an edit, past ginmw.Lock
)

// routes adds the hooks' middleware (before every other, so the request's
// context carries its pause point through ginmw.Lock, cacheguard and GORM)
// and the release endpoint.
func (h *testHooks) routes(r *gin.Engine) {
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

// underLock returns the middleware that goes right after ginmw.Lock on the
// edit routes (none without hooks). It starts the edit's span on the
// request's context under the lock (which the lock's loss cancels), parks
// the request at after-lock if it asked to, and runs the handler with the
// edit marked (for after-read) and, when the request or the control asks,
// under a context that the lock's loss does not cancel (its values — the
// lock owner, the fence — are kept). The span ends when the handler starts
// its answer, which then carries X-Edit-Span.
func (h *testHooks) underLock() []gin.HandlerFunc {
	if h == nil {
		return nil
	}
	return []gin.HandlerFunc{func(c *gin.Context) {
		orig, origW := c.Request, c.Writer
		ctx := orig.Context()
		sp := &editSpan{ResponseWriter: origW, enter: time.Now()}
		sp.stop = context.AfterFunc(ctx, func() {
			sp.mu.Lock()
			sp.lost = time.Now()
			sp.mu.Unlock()
		})
		defer func() {
			sp.stop()
			c.Request, c.Writer = orig, origW
		}()
		h.at(ctx, stepAfterLock)
		ctx = context.WithValue(ctx, editKey{}, true)
		if ignore, _ := ctx.Value(ignoreLostKey{}).(bool); ignore || h.control == controlNoPlugin || h.control == controlNoFencing {
			ctx = context.WithoutCancel(ctx)
		}
		c.Request, c.Writer = orig.WithContext(ctx), sp
		c.Next()
	}}
}

// editSpan is an edit's critical section as the process saw it, and the
// ResponseWriter that reports it: the span ends when the handler starts its
// answer, before the status line is sent, so the header can go with it.
type editSpan struct {
	gin.ResponseWriter
	enter, exit time.Time   // exit: zero until the answer starts
	mu          sync.Mutex  // guards lost
	lost        time.Time   // when the request's context ended before the edit did
	stop        func() bool // of the context.AfterFunc that records lost
}

// done ends the span (once) and puts it in the answer's X-Edit-Span header.
func (sp *editSpan) done() {
	if !sp.exit.IsZero() {
		return
	}
	sp.exit = time.Now()
	sp.stop()
	sp.mu.Lock()
	var lost int64
	if !sp.lost.IsZero() {
		lost = sp.lost.UnixNano()
	}
	sp.mu.Unlock()
	sp.Header().Set(headerEditSpan, strconv.FormatInt(sp.enter.UnixNano(), 10)+","+strconv.FormatInt(sp.exit.UnixNano(), 10)+","+strconv.FormatInt(lost, 10))
}

// The calls that send the status line (gin's Render calls WriteHeader first,
// which only records the status, then Write).

func (sp *editSpan) Write(b []byte) (int, error) {
	sp.done()
	return sp.ResponseWriter.Write(b)
}

func (sp *editSpan) WriteString(s string) (int, error) {
	sp.done()
	return sp.ResponseWriter.WriteString(s)
}

func (sp *editSpan) WriteHeaderNow() {
	sp.done()
	sp.ResponseWriter.WriteHeaderNow()
}

// at parks the request of ctx if it asked to pause at step (once), after
// telling the suite on stdout, until it is released: a pause in the middle
// of a write ignores the request's cancellation, as a real pause would.
func (h *testHooks) at(ctx context.Context, step string) { h.park(ctx, step, nil) }

// park parks the request of ctx at step if it asked for it, and reports
// whether abort ended the pause.
func (h *testHooks) park(ctx context.Context, step string, abort <-chan struct{}) (aborted bool) {
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

// registerGORM places the steps inside database work among GORM's and
// gormplugin's callbacks (none without hooks):
//
//   - after-read, after a query of an edit (marked by underLock) that
//     succeeded: the edit's first read of the row;
//   - cache-load, after a query on repos outside an edit that succeeded:
//     the read of cacheguard.Get's loader or of ginmw.Cache's handler. It
//     parks until released or until the query's context (the load's) ends,
//     which the query then returns, as a slow query would;
//   - before-update, after the plugin's fence step (the last check before
//     the statement);
//   - after-update, after the plugin's post-write check.
func (h *testHooks) registerGORM(db *gorm.DB) error {
	if h == nil {
		return nil
	}
	err := db.Callback().Query().After("gorm:after_query").Register("example:read-steps", func(tx *gorm.DB) {
		ctx := tx.Statement.Context
		switch {
		case tx.Error != nil:
		case ctx.Value(editKey{}) != nil:
			h.at(ctx, stepAfterRead)
		case tx.Statement.Table == "repos":
			if h.park(ctx, stepCacheLoad, ctx.Done()) {
				tx.AddError(context.Cause(ctx)) //nolint:errcheck // the query's error now
			}
		}
	})
	if err != nil {
		return err
	}
	upd := db.Callback().Update()
	err = upd.Before("gorm:update").After("gormplugin:fence").Register("example:"+stepBeforeUpdate, func(tx *gorm.DB) {
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

// pluginOptions applies the control to gormplugin's options, the service's
// invalidation: it returns the options to register the plugin with, and use
// false when the plugin must not be registered at all (no-plugin). Without
// hooks it returns [invalidate], true.
func (h *testHooks) pluginOptions(invalidate gormplugin.Option) (_ []gormplugin.Option, use bool) {
	switch h.controlName() {
	case controlNoPlugin:
		return nil, false
	case controlNoFencing:
		return []gormplugin.Option{invalidate, gormplugin.NoFencing()}, true
	case controlNoInvalidate:
		return nil, true
	}
	return []gormplugin.Option{invalidate}, true
}

// controlName returns the protection switched off, or "".
func (h *testHooks) controlName() string {
	if h == nil {
		return ""
	}
	return h.control
}

// unguardedTransaction is a plain GORM transaction, for the no-plugin control.
func unguardedTransaction(ctx context.Context, db *gorm.DB, fn func(tx *gorm.DB) error, _ ...any) error {
	return db.WithContext(ctx).Transaction(fn)
}
