package ginmw_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/locks"
)

// panicOf runs f and returns what it panicked with, or nil.
func panicOf(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}

// Every constructor refuses a value it would otherwise accept and then
// answer every request wrongly (500, 400, a success status for a refusal, a
// lock on nothing): it panics with a "ginmw: " message, wrapping the error of
// locks or cacheguard when theirs is the rule broken — the check their calls
// run (locks.CheckCallOptions, Guard.CheckCallOptions), run at construction.
// The probe's five cases (TestProbeInvalidOptionsPanicAtConstruction) are
// the first of each kind.
func TestConstructorsRefuseInvalidValues(t *testing.T) {
	l, _, s := newLocker(t)
	rl := locks.NewRedlock([]redis.UniversalClient{s.Client()})
	t.Cleanup(func() { rl.Close() })
	g, _ := startGuard(t)
	closed, _ := startGuard(t)
	closed.Close()
	seventeen := make([]string, 17)
	for i := range seventeen {
		seventeen[i] = fmt.Sprint("t", i)
	}
	var nilClient *locks.Client
	var nilEngine *gin.Engine
	for _, tc := range []struct {
		what string
		f    func()
		want error // what the panic must match besides its message; nil: any; errNoPanic: none
	}{
		// Lock's options.
		{"Lock lease below MinLease", func() { ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.Lease(time.Microsecond))) }, locks.ErrInvalid},
		{"Lock negative wait budget", func() { ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(-time.Second))) }, locks.ErrInvalid},
		{"Lock nil call option", func() { ginmw.Lock(l, repoKey, ginmw.LockOptions(nil)) }, locks.ErrInvalid},
		{"Lock NodeTimeout on a Client", func() { ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.NodeTimeout(time.Second))) }, locks.ErrInvalid},
		{"Lock Fair on a Redlock", func() { ginmw.Lock(rl, repoKey, ginmw.LockOptions(locks.Fair())) }, locks.ErrInvalid},
		{"Lock nil locker", func() { ginmw.Lock(nil, repoKey) }, nil},
		{"Lock nil *locks.Client", func() { ginmw.Lock(nilClient, repoKey) }, nil},
		{"Lock zero key", func() { ginmw.Lock(l, ginmw.Key{}) }, nil},
		{"ConflictStatus 42", func() { ginmw.Lock(l, repoKey, ginmw.ConflictStatus(42)) }, nil},
		{"ConflictStatus 100", func() { ginmw.Lock(l, repoKey, ginmw.ConflictStatus(http.StatusContinue)) }, nil},
		{"ConflictStatus 200", func() { ginmw.Lock(l, repoKey, ginmw.ConflictStatus(http.StatusOK)) }, nil},
		{"ConflictStatus 204", func() { ginmw.Lock(l, repoKey, ginmw.ConflictStatus(http.StatusNoContent)) }, nil},
		{"ConflictStatus 303", func() { ginmw.Lock(l, repoKey, ginmw.ConflictStatus(http.StatusSeeOther)) }, nil},
		{"ConflictStatus 600", func() { ginmw.Lock(l, repoKey, ginmw.ConflictStatus(600)) }, nil},
		{"ErrorHandler nil", func() { ginmw.Lock(l, repoKey, ginmw.ErrorHandler(nil)) }, nil},
		{"Methods none", func() { ginmw.Lock(l, repoKey, ginmw.Methods()) }, nil},
		{"Methods empty", func() { ginmw.Lock(l, repoKey, ginmw.Methods("PUT", "")) }, nil},
		{"Methods not a token", func() { ginmw.Lock(l, repoKey, ginmw.Methods("PUT DELETE")) }, nil},
		// Cache's options.
		{"Cache negative load timeout", func() { ginmw.Cache(g, time.Minute, ginmw.CacheOptions(cacheguard.LoadTimeout(-time.Second))) }, cacheguard.ErrInvalid},
		{"Cache empty tag", func() { ginmw.Cache(g, time.Minute, ginmw.CacheTags("")) }, cacheguard.ErrInvalid},
		{"Cache 17 tags", func() { ginmw.Cache(g, time.Minute, ginmw.CacheTags(seventeen...)) }, cacheguard.ErrInvalid},
		{"Cache jitter 2", func() { ginmw.Cache(g, time.Minute, ginmw.CacheOptions(cacheguard.Jitter(2))) }, cacheguard.ErrInvalid},
		{"Cache nil call option", func() { ginmw.Cache(g, time.Minute, ginmw.CacheOptions(nil)) }, cacheguard.ErrInvalid},
		{"Cache empty VaryByHeader name", func() { ginmw.Cache(g, time.Minute, ginmw.VaryByHeader("")) }, nil},
		{"Cache VaryByHeader not a token", func() { ginmw.Cache(g, time.Minute, ginmw.VaryByHeader("Accept Language")) }, nil},
		{"Cache nil guard", func() { ginmw.Cache(nil, time.Minute) }, nil},
		{"Cache zero TTL", func() { ginmw.Cache(g, 0) }, nil},
		{"Cache MaxBody 0", func() { ginmw.Cache(g, time.Minute, ginmw.MaxBody(0)) }, nil},
		{"Cache MaxSharedBody -1", func() { ginmw.Cache(g, time.Minute, ginmw.MaxSharedBody(-1)) }, nil},
		{"CacheKey zero key", func() { ginmw.CacheKey(ginmw.Key{}) }, nil},
		{"BackgroundRefresh nil", func() { ginmw.BackgroundRefresh(nil) }, nil},
		{"BackgroundRefresh nil *gin.Engine", func() { ginmw.BackgroundRefresh(nilEngine) }, nil},
		// InvalidateAfter and the keys.
		{"InvalidateAfter nil guard", func() { ginmw.InvalidateAfter(nil, repoKey) }, nil},
		{"InvalidateAfter no key", func() { ginmw.InvalidateAfter(g) }, nil},
		{"InvalidateAfter zero key", func() { ginmw.InvalidateAfter(g, repoKey, ginmw.Key{}) }, nil},
		{"Param empty", func() { ginmw.Param("") }, nil},
		{"Query empty", func() { ginmw.Query("") }, nil},
		{"Header empty", func() { ginmw.Header("") }, nil},
		{"Header not a token", func() { ginmw.Header("X Tenant") }, nil},
		{"Resource empty kind", func() { ginmw.Resource("", ginmw.Param("id")) }, nil},
		{"Resource zero key", func() { ginmw.Resource("repos", ginmw.Key{}) }, nil},
		{"Resource kind too long for the longest values", func() { ginmw.Resource(strings.Repeat("k", locks.MaxNameLen-ginmw.MaxKeyLen), ginmw.Param("id")) }, nil},
		{"Resource kind of the longest names", func() { ginmw.Resource(strings.Repeat("k", locks.MaxNameLen-ginmw.MaxKeyLen-1), ginmw.Param("id")) }, errNoPanic},
		{"Func nil", func() { ginmw.Func(nil) }, nil},
		{"Check nil", func() { ginmw.Check(repoKey, nil) }, nil},
		{"Int zero key", func() { ginmw.Int(ginmw.Key{}) }, nil},
		// Valid values construct.
		{"ConflictStatus 423", func() { ginmw.Lock(l, repoKey, ginmw.ConflictStatus(http.StatusLocked)) }, errNoPanic},
		{"ConflictStatus 503", func() { ginmw.Lock(l, repoKey, ginmw.ConflictStatus(http.StatusServiceUnavailable)) }, errNoPanic},
		{"Lock valid options", func() {
			ginmw.Lock(l, repoKey, ginmw.Methods("put"), ginmw.LockOptions(locks.WaitBudget(0), locks.Lease(time.Minute), locks.Fair()))
		}, errNoPanic},
		{"Redlock valid options", func() { ginmw.Lock(rl, repoKey, ginmw.LockOptions(locks.NodeTimeout(time.Second))) }, errNoPanic},
		{"Cache valid options", func() {
			r := gin.New()
			ginmw.Cache(g, time.Minute, ginmw.VaryByHeader("accept-language", "Authorization"), ginmw.CacheTags("repos"),
				ginmw.BackgroundRefresh(r), ginmw.CacheOptions(cacheguard.ServeStale(time.Minute)))
		}, errNoPanic},
		{"Cache on a closed Guard", func() { ginmw.Cache(closed, time.Minute) }, errNoPanic},
		{"InvalidateAfter", func() { ginmw.InvalidateAfter(g, repoKey) }, errNoPanic},
		{"keys", func() {
			ginmw.Header("X-Tenant")
			ginmw.Query("tenant")
			ginmw.Func(func(*gin.Context) (string, error) { return "", nil })
		}, errNoPanic},
	} {
		p := panicOf(tc.f)
		switch {
		case tc.want == errNoPanic:
			if p != nil {
				t.Errorf("%s: panic %v, want none", tc.what, p)
			}
		case p == nil || !strings.HasPrefix(fmt.Sprint(p), "ginmw: "):
			t.Errorf("%s: panic %v, want a \"ginmw: \" message", tc.what, p)
		case tc.want != nil:
			if err, isErr := p.(error); !isErr || !errors.Is(err, tc.want) {
				t.Errorf("%s: panic %v, want an error matching %v", tc.what, p, tc.want)
			}
		}
	}
}

// errNoPanic marks a construction that must not panic.
var errNoPanic = errors.New("no panic")
