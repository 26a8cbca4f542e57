package locks_test

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/logtest"
	"github.com/cacheguard/cacheguard/locks"
)

// panicky is an Observer that panics on every event, after telling lost of
// an EventLost.
func panicky(lost chan<- struct{}) func(context.Context, locks.Event) {
	return func(_ context.Context, e locks.Event) {
		if e.Kind == locks.EventLost && lost != nil {
			select {
			case lost <- struct{}{}:
			default:
			}
		}
		panic("observer boom: " + e.Kind.String())
	}
}

// waitLog waits for a log message containing want, skipping others.
func waitLog(t *testing.T, h *logtest.Handler, want string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case m := <-h.C:
			if strings.Contains(m, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no log message %q within %v", want, d)
		}
	}
}

// TestObserverPanicIsLogged: a panic in the user's Observer is recovered,
// logged, and changes no outcome. Before, a panic on EventAcquired left
// TryLock after the holding was registered for renewal: the caller got no
// handle, and the name stayed held and renewed until Close; a panic on
// EventLost, raised on the renewal goroutine, killed the process.
func TestObserverPanicIsLogged(t *testing.T) {
	ctx := context.Background()
	log := logtest.New(64)
	lost := make(chan struct{}, 1)
	c, rdb, s := newClient(t, locks.Lease(300*time.Millisecond), locks.Logger(log.Logger()), locks.Observer(panicky(lost)))
	other := locks.New(s.Client(), locks.Logger(nil))
	t.Cleanup(func() { other.Close() })

	lk, err := c.TryLock(ctx, "obs")
	if err != nil {
		t.Fatalf("TryLock with a panicking Observer: %v", err)
	}
	waitLog(t, log, "Observer panicked", 5*time.Second)
	if _, err := other.TryLock(ctx, "obs"); !errors.Is(err, locks.ErrBusy) {
		t.Fatalf("another owner while held: %v, want ErrBusy", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if c.Held() != 0 {
		t.Fatalf("Held() = %d after Unlock", c.Held())
	}
	theirs, err := other.TryLock(ctx, "obs")
	if err != nil {
		t.Fatalf("another owner after Unlock: %v", err)
	}
	if _, err := c.TryLock(ctx, "obs"); !errors.Is(err, locks.ErrBusy) {
		t.Fatalf("TryLock of a held name: %v, want ErrBusy (EventNotObtained's panic ignored)", err)
	}
	if err := theirs.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// EventLost on the renewal goroutine: the process and the goroutine live
	// on, and what follows the event (the lost lock's warning) still runs.
	lk, err = c.TryLock(ctx, "obs:lost")
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, "cg:lock:{obs:lost}").Err(); err != nil {
		t.Fatal(err)
	}
	within(t, lk.Lost(), 5*time.Second, "the deleted lock to count as lost")
	within(t, lost, 5*time.Second, "EventLost to reach the Observer")
	waitLog(t, log, "lock lost while held", 5*time.Second)
	_ = lk.Unlock(ctx)
	lk, err = c.TryLock(ctx, "obs:after")
	if err != nil {
		t.Fatalf("TryLock after the renewal goroutine's Observer panicked: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedlockObserverPanicIsLogged: the same on a Redlock.
func TestRedlockObserverPanicIsLogged(t *testing.T) {
	ctx := context.Background()
	log := logtest.New(64)
	set := newRedlockSet(t, 3, nil, locks.Logger(log.Logger()), locks.Observer(panicky(nil)))
	lk, err := set.r.TryLock(ctx, "obs")
	if err != nil {
		t.Fatalf("Redlock TryLock with a panicking Observer: %v", err)
	}
	waitLog(t, log, "Observer panicked", 5*time.Second)
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	lk, err = set.r.TryLock(ctx, "obs")
	if err != nil {
		t.Fatalf("TryLock after Unlock: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestObserverCallsGoThroughNotify is a source check: no code of the
// package calls an Observer (a Client's or Redlock's observer, a Breaker's
// Observer) but notify, which recovers its panics.
func TestObserverCallsGoThroughNotify(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(af, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && strings.EqualFold(sel.Sel.Name, "observer") {
				t.Errorf("%s: an Observer called directly; call notify (observe.go)", fset.Position(call.Pos()))
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}
