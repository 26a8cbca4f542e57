package locks_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/locks"
)

// wrappedLocker is a Locker of another type, as a user's decorator is.
type wrappedLocker struct{ locks.Locker }

// CheckCallOptions refuses exactly what a call refuses before Redis, for
// each Locker against its own defaults (a Client whose fence retention a
// call's lease outgrows, a Redlock's refusal of Fair, a Client's of
// NodeTimeout), and for a Locker of another type only what every Locker
// refuses. ginmw.Lock checks its options with it when it is built.
func TestCheckCallOptionsIsTheCallsCheck(t *testing.T) {
	ctx := context.Background()
	c, _, s := newClient(t, locks.FenceRetention(20*time.Second))
	rl := locks.NewRedlock([]redis.UniversalClient{s.Client()})
	t.Cleanup(func() { rl.Close() })
	cases := []struct {
		what string
		opts []locks.CallOption
	}{
		{"none", nil},
		{"lease below MinLease", []locks.CallOption{locks.Lease(time.Microsecond)}},
		{"lease at MinLease", []locks.CallOption{locks.Lease(locks.MinLease)}},
		{"lease past the client's fence retention", []locks.CallOption{locks.Lease(time.Minute)}},
		{"negative wait", []locks.CallOption{locks.WaitBudget(-time.Second)}},
		{"zero wait", []locks.CallOption{locks.WaitBudget(0)}},
		{"fair", []locks.CallOption{locks.Fair()}},
		{"negative replicas", []locks.CallOption{locks.Replicas(-1, time.Second)}},
		{"replicas without timeout", []locks.CallOption{locks.Replicas(1, 0)}},
		{"node timeout", []locks.CallOption{locks.NodeTimeout(10 * time.Millisecond)}},
		{"negative node timeout", []locks.CallOption{locks.NodeTimeout(-1)}},
		{"no fencing", []locks.CallOption{locks.NoFencing(), locks.NoRenewal()}},
		{"a nil option", []locks.CallOption{locks.NoRenewal(), nil}},
	}
	for _, l := range []struct {
		name  string
		l     locks.Locker
		exact bool // the check is the call's own; else it may refuse less
	}{{"Client", c, true}, {"Redlock", rl, true}, {"wrapper", wrappedLocker{c}, false}} {
		for _, tc := range cases {
			checkErr := locks.CheckCallOptions(l.l, tc.opts...)
			lk, callErr := l.l.TryLock(ctx, "check:"+tc.what, tc.opts...)
			if lk != nil {
				lk.Unlock(ctx)
			}
			refused, callRefused := errors.Is(checkErr, locks.ErrInvalid), errors.Is(callErr, locks.ErrInvalid)
			if checkErr != nil && !refused {
				t.Errorf("%s, %s: CheckCallOptions: %v, want nil or an ErrInvalid", l.name, tc.what, checkErr)
			}
			if refused && !callRefused || l.exact && callRefused && !refused {
				t.Errorf("%s, %s: CheckCallOptions says %v, the call %v", l.name, tc.what, checkErr, callErr)
			}
		}
	}
	// The ones that must be refused whatever the Locker, a nil option too.
	for _, l := range []locks.Locker{c, rl, wrappedLocker{c}, nil} {
		for _, opts := range [][]locks.CallOption{{locks.Lease(time.Microsecond)}, {locks.WaitBudget(-time.Second)}, {nil}} {
			if err := locks.CheckCallOptions(l, opts...); !errors.Is(err, locks.ErrInvalid) {
				t.Errorf("%T: CheckCallOptions(%v): %v, want ErrInvalid", l, opts, err)
			}
		}
	}
	var nilClient *locks.Client
	if err := locks.CheckCallOptions(nilClient); !errors.Is(err, locks.ErrInvalid) {
		t.Errorf("a nil *Client: %v, want ErrInvalid", err)
	}
}

// A nil option is bad input everywhere options are taken: a call fails with
// ErrInvalid (it panicked on a nil interface before), New and NewRedlock
// panic with a "locks:" message.
func TestNilOptionIsInvalid(t *testing.T) {
	ctx := context.Background()
	c, _, s := newClient(t)
	if _, err := c.Lock(ctx, "nil-option", nil); !errors.Is(err, locks.ErrInvalid) {
		t.Errorf("Lock with a nil option: %v, want ErrInvalid", err)
	}
	if err := locks.Optimistic(ctx, s.Client(), func(*redis.Tx) error { return nil }, []string{"k"}, nil); !errors.Is(err, locks.ErrInvalid) {
		t.Errorf("Optimistic with a nil option: %v, want ErrInvalid", err)
	}
	for what, build := range map[string]func(){
		"New":        func() { locks.New(s.Client(), nil).Close() },
		"NewRedlock": func() { locks.NewRedlock([]redis.UniversalClient{s.Client()}, nil).Close() },
	} {
		func() {
			defer func() {
				if p, ok := recover().(string); !ok || !strings.HasPrefix(p, "locks: ") {
					t.Errorf("%s with a nil option: panic %v, want a \"locks: \" message", what, p)
				}
			}()
			build()
		}()
	}
}
