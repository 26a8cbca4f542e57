package cacheguard

import (
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/cacheguard/cacheguard/internal/rcmd"
)

var (
	// ErrInvalid marks a bad argument, reported before anything is sent to Redis.
	ErrInvalid = errors.New("cacheguard: invalid argument")
	// ErrNotFound is what a loader returns (or wraps) when the thing it loads does
	// not exist. Such a result is cached as absent for the negative TTL, and Get
	// returns an error matching ErrNotFound to every caller until it expires.
	ErrNotFound = errors.New("cacheguard: not found")
	// ErrWaitTimeout means the wait budget (see Wait) ended before a fresh value
	// arrived. The load it waited for goes on and still fills the cache.
	ErrWaitTimeout = errors.New("cacheguard: wait budget exceeded")
	// ErrMiss is returned under FailFast when no fresh or servable stale value
	// is cached; a fill has been started in the background.
	ErrMiss = errors.New("cacheguard: not cached")
	// ErrUnavailable is returned under FailClosed when Redis cannot be reached,
	// and by an Invalidate that could not reach it; it is joined with the Redis
	// error. It is the same value as locks.ErrUnavailable.
	ErrUnavailable = rcmd.ErrUnavailable
	// ErrRemoteLoad means the load this call waited for failed in another
	// process; the error carries that load's message.
	ErrRemoteLoad = errors.New("cacheguard: load failed in another process")
	// ErrClosed is returned by calls on a Guard after Close, and to callers whose
	// shared load Close stopped. A loader may return it too (wrapped or not)
	// to decline the load — its own process is closing, or it only wanted to
	// wait for another fill: the fill is then handed over as Close hands it
	// over (waiters in other processes take it over, they get no error), and
	// no load is counted (no EventLoad).
	ErrClosed = errors.New("cacheguard: guard closed")
	// ErrUncached is what a loader returns (or wraps) for a result that is not
	// a failure but must not be cached — e.g. ginmw's answer that sets a
	// cookie: the callers get the error as it is, and FailSafe never replaces
	// it with an older value. Waiters in other processes get an error
	// matching ErrUncached (not ErrRemoteLoad: nothing failed) with its text;
	// ginmw.Cache runs their handlers then, as for its own callers.
	ErrUncached = errors.New("cacheguard: result not to be cached")
	// ErrDecode marks bytes that are not a valid envelope, or a payload the codec
	// cannot decode. Get never returns it: such a value is treated as a miss.
	ErrDecode = errors.New("cacheguard: cannot decode cached value")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// PanicError is the error every caller sharing a load receives when the loader
// panicked. The process survives and the fill lease is released. A waiter in
// another process gets an error matching both ErrRemoteLoad and a *PanicError
// whose Value is the panic value's text (a string) and whose Stack is nil: a
// stack does not cross processes.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the loader's stack at the panic; nil in another process
}

func newPanicError(v any) *PanicError { return &PanicError{Value: v, Stack: debug.Stack()} }

func (e *PanicError) Error() string { return fmt.Sprintf("cacheguard: loader panicked: %v", e.Value) }

// declined reports whether a load's err declines it — an error matching
// ErrClosed: its process is closing, or the loader was only waiting for
// another fill — which is no load (its fill is handed over). A panic never
// declines, whatever its value (panic(ErrClosed) included): it is a load
// that failed.
func declined(err error) bool {
	var pe *PanicError
	return errors.Is(err, ErrClosed) && !errors.As(err, &pe)
}

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}
