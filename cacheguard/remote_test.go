package cacheguard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// remoteOutcome runs load as process A's fill of a fresh key while a Get of
// process B waits for it, and returns how many times B's own loader ran and
// the errors A's caller and B's got.
func remoteOutcome(t *testing.T, load func(context.Context) (item, error)) (bLoads int64, aErr, bErr error) {
	t.Helper()
	ctx := context.Background()
	a, _ := newGuard(t, cacheguard.Logger(nil))
	b, rdbB := newGuard(t, cacheguard.Logger(nil))
	waiting := watchWaiting(rdbB)
	key := testKey(t)
	started, release := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, a, key, func(ctx context.Context) (item, error) {
			close(started)
			<-release
			return load(ctx)
		})
		aDone <- err
	}()
	<-started
	own := &counter{name: "b"}
	bDone := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, b, key, own.load)
		bDone <- err
	}()
	<-waiting
	close(release)
	aErr, bErr = <-aDone, <-bDone
	return own.n.Load(), aErr, bErr
}

// A panic reaches the waiters of other processes as a *PanicError that
// matches ErrRemoteLoad too, its value the panic's text (the release message
// used to carry the text alone: an ErrRemoteLoad and no *PanicError).
func TestRemoteWaiterGetsPanicError(t *testing.T) {
	bLoads, aErr, bErr := remoteOutcome(t, func(context.Context) (item, error) { panic("loader boom") })
	var pe *cacheguard.PanicError
	if !errors.As(aErr, &pe) || pe.Stack == nil {
		t.Fatalf("holder's caller: %v, want a *PanicError with a stack", aErr)
	}
	if !errors.As(bErr, &pe) || !errors.Is(bErr, cacheguard.ErrRemoteLoad) {
		t.Fatalf("remote waiter: %v (%T), want a *PanicError matching ErrRemoteLoad", bErr, bErr)
	}
	if pe.Value != "loader boom" || pe.Stack != nil || bLoads != 0 {
		t.Errorf("remote PanicError: value %#v, stack %d bytes, own loads %d; want the text, no stack, none", pe.Value, len(pe.Stack), bLoads)
	}
	// An error passed to panic arrives as its text.
	_, _, bErr = remoteOutcome(t, func(context.Context) (item, error) { panic(errors.New("db gone")) })
	if !errors.As(bErr, &pe) || pe.Value != "db gone" {
		t.Errorf("remote waiter of panic(error): %v, want a *PanicError of \"db gone\"", bErr)
	}
}

// An answer not to be cached (ErrUncached) is not a failure: the waiters of
// other processes get an error matching ErrUncached, not ErrRemoteLoad (they
// were told the load failed, and ginmw answered them 503).
func TestRemoteWaiterOfUncachedAnswer(t *testing.T) {
	bLoads, aErr, bErr := remoteOutcome(t, func(context.Context) (item, error) {
		return item{Name: "with-cookie"}, fmt.Errorf("set-cookie: %w", cacheguard.ErrUncached)
	})
	if !errors.Is(aErr, cacheguard.ErrUncached) {
		t.Fatalf("holder's caller: %v, want its loader's ErrUncached", aErr)
	}
	if !errors.Is(bErr, cacheguard.ErrUncached) || errors.Is(bErr, cacheguard.ErrRemoteLoad) || bLoads != 0 {
		t.Errorf("remote waiter: %v, own loads %d; want ErrUncached and not ErrRemoteLoad, no load", bErr, bLoads)
	}
	// A failure is still a failure elsewhere ('e', as every release sends it).
	_, _, bErr = remoteOutcome(t, func(context.Context) (item, error) { return item{}, errors.New("db down") })
	var pe *cacheguard.PanicError
	if !errors.Is(bErr, cacheguard.ErrRemoteLoad) || errors.Is(bErr, cacheguard.ErrUncached) || errors.As(bErr, &pe) {
		t.Errorf("remote waiter of a failed load: %v, want ErrRemoteLoad alone", bErr)
	}
}
