package rcmd_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

var redisAddr string

func TestMain(m *testing.M) { redistest.Main(m, &redisAddr) }

// counter counts the commands a client sends, by name, and records the
// command contexts' causes when they ended.
type counter struct {
	mu     sync.Mutex
	n      map[string]int
	causes []error
}

func (c *counter) add(ctx context.Context, cmds ...redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	for _, cmd := range cmds {
		c.n[cmd.Name()]++
	}
	if ctx.Err() != nil {
		c.causes = append(c.causes, context.Cause(ctx))
	}
}

func (c *counter) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		c.add(ctx, cmd)
		return err
	}
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		c.add(ctx, cmds...)
		return err
	}
}

var echo = rcmd.NewScript("return {KEYS[1], ARGV[1]}")

// TestRunSendsEVALOnceOnNoScript: a script goes as EVALSHA; a server without
// it answers NOSCRIPT once and gets it as EVAL, after which EVALSHA suffices.
func TestRunSendsEVALOnceOnNoScript(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	var c counter
	rdb := s.Client()
	rdb.AddHook(&c)
	r := rcmd.New(rdb, 0)
	if r.Base() != rcmd.DefaultTimeout {
		t.Fatalf("timeout %v, want the default %v", r.Base(), rcmd.DefaultTimeout)
	}
	for i := range 3 {
		v, err := r.Run(ctx, echo, []string{"k"}, "a").StringSlice()
		if err != nil || len(v) != 2 || v[0] != "k" || v[1] != "a" {
			t.Fatalf("call %d: %v %v", i, v, err)
		}
	}
	if c.get("evalsha") != 3 || c.get("eval") != 1 {
		t.Fatalf("sent %d EVALSHA and %d EVAL, want 3 and 1", c.get("evalsha"), c.get("eval"))
	}
}

// TestExecNoScript: in a pipeline, the script calls a server does not have
// are sent again as EVAL, and their outcome reaches the commands the caller
// made; the other commands are not sent twice.
func TestExecNoScript(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	var c counter
	rdb := s.Client()
	rdb.AddHook(&c)
	r := rcmd.New(rdb, 0)
	a, b := echo.Cmd(ctx, []any{"k1"}, "x"), echo.Cmd(ctx, []any{"k2"}, "y")
	set := redis.NewStatusCmd(ctx, "set", "plain", "1")
	r.Exec(ctx, nil, []redis.Cmder{a, set, b}, 0, false)
	for i, cmd := range []*redis.Cmd{a, b} {
		v, err := cmd.StringSlice()
		if err != nil || len(v) != 2 || v[1] != []string{"x", "y"}[i] {
			t.Fatalf("script call %d: %v %v", i, v, err)
		}
	}
	if err := set.Err(); err != nil {
		t.Fatal(err)
	}
	if c.get("set") != 1 || c.get("eval") != 2 || c.get("evalsha") != 2 {
		t.Fatalf("sent set %d, eval %d, evalsha %d; want 1, 2, 2", c.get("set"), c.get("eval"), c.get("evalsha"))
	}
}

// TestExecWhole: with whole set, a NOSCRIPT sends every command again, so a
// WAIT still follows the write it waits for, and its reply reaches the
// caller's command.
func TestExecWhole(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	var c counter
	rdb := s.Client()
	rdb.AddHook(&c)
	r := rcmd.New(rdb, 0)
	call := echo.Cmd(ctx, []any{"k"}, "z")
	wait := redis.NewCmd(ctx, "wait", 0, 0)
	r.Exec(ctx, rdb, []redis.Cmder{call, wait}, 0, true)
	if v, err := call.StringSlice(); err != nil || v[1] != "z" {
		t.Fatalf("script: %v %v", v, err)
	}
	if n, err := wait.Int(); err != nil || n != 0 {
		t.Fatalf("wait: %v %v", n, err)
	}
	if c.get("wait") != 2 || c.get("eval") != 1 {
		t.Fatalf("sent wait %d, eval %d; want 2 and 1", c.get("wait"), c.get("eval"))
	}
}

// TestTimeoutOnStall: with the server paused, a command and a pipeline end
// at the command timeout with ErrTimeout (not the caller's context error),
// and their context's cause, as a hook sees it, is ErrTimeout; the calls
// return while the server is still paused. A caller whose own deadline comes
// first gets its context's error instead.
func TestTimeoutOnStall(t *testing.T) {
	s := redistest.Start(t)
	var c counter
	rdb := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	rdb.AddHook(&c)
	r := rcmd.New(rdb, 100*time.Millisecond)
	bg := context.Background()
	if err := r.Do(bg, "get", "absent").Err(); !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	s.Pause()
	defer s.Resume()

	start := time.Now()
	err := r.Do(bg, "get", "k").Err()
	t.Logf("a command on a paused server returned after %v: %v", time.Since(start), err)
	if !errors.Is(err, rcmd.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("command: %v, want ErrTimeout and not context.DeadlineExceeded", err)
	}
	if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("command: %v is not a net.Error timeout", err)
	}
	get := redis.NewStringCmd(bg, "get", "k")
	run := echo.Cmd(bg, []any{"k"}, "v")
	r.Exec(bg, nil, []redis.Cmder{get, run}, 0, false)
	for _, cmd := range []redis.Cmder{get, run} {
		if err := cmd.Err(); !errors.Is(err, rcmd.ErrTimeout) {
			t.Fatalf("pipelined %s: %v, want ErrTimeout", cmd.Name(), err)
		}
	}
	c.mu.Lock()
	causes := append([]error(nil), c.causes...)
	c.mu.Unlock()
	if len(causes) < 2 {
		t.Fatalf("hooks saw causes %v, want ErrTimeout for the command and the pipeline", causes)
	}
	for _, cause := range causes {
		if cause != rcmd.ErrTimeout {
			t.Fatalf("hooks saw causes %v, want ErrTimeout", causes)
		}
	}

	ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	defer cancel()
	err = r.Do(ctx, "get", "k").Err()
	if errors.Is(err, rcmd.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with the caller's shorter deadline: %v, want context.DeadlineExceeded", err)
	}
}

// TestCuts: a context cuts a command sent now when its deadline comes before
// the command's bound, extra included; none does without a deadline.
func TestCuts(t *testing.T) {
	r := rcmd.New(redis.NewClient(&redis.Options{Addr: redisAddr}), 100*time.Millisecond)
	defer r.Client().Close()
	short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	mid, cancel1 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel1()
	long, cancel2 := context.WithTimeout(context.Background(), time.Hour)
	defer cancel2()
	for _, c := range []struct {
		name  string
		ctx   context.Context
		extra time.Duration
		want  bool
	}{
		{"no deadline", context.Background(), 0, false},
		{"an hour", long, 0, false},
		{"10ms", short, 0, true},
		{"5s", mid, 0, false},
		{"5s, a WAIT of 10s", mid, 10 * time.Second, true},
	} {
		if got := r.Cuts(c.ctx, c.extra); got != c.want {
			t.Errorf("%s: Cuts = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestBound: a caller's deadline earlier than the command timeout is the
// command's (no context is derived); under a context that cannot be
// cancelled, the commands sent within Slack of one another share one
// deadline and its context, which keeps the caller's values and ends with
// ErrTimeout as its cause; under one that can, each command gets its own,
// unless the caller passes it through Uncancelled.
func TestBound(t *testing.T) {
	const timeout = 100 * time.Millisecond
	r := rcmd.New(redis.NewClient(&redis.Options{Addr: redisAddr}), timeout)
	defer r.Client().Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if b, stop := r.Bound(ctx, 0); b != ctx {
		stop()
		t.Fatal("Bound derived a context from one with an earlier deadline")
	}

	type key struct{}
	bg := context.Background()
	vctx := context.WithoutCancel(context.WithValue(ctx, key{}, "v"))
	// Sharing is promised to commands sent within Slack (3ms here) of one
	// another: a pair the host (or the race detector) held apart longer is
	// tried again, up to 100 times, and judged on the first pair that was not.
	var start time.Time
	var b1, b2, b7 context.Context
	var uctx context.Context
	var ucancel context.CancelFunc = func() {}
	for try := 0; ; try++ {
		ucancel()
		start = time.Now()
		b1, _ = r.Bound(bg, 0)
		b2, _ = r.Bound(vctx, 0)
		// Uncancelled: the caller's values and deadline, the shared
		// deadline's channel; the caller's cancellation does not reach the
		// command.
		uctx, ucancel = context.WithDeadline(context.WithValue(bg, key{}, "u"), start.Add(rcmd.Patience*timeout+rcmd.Slack(timeout)/2))
		b7, _ = r.Bound(rcmd.Uncancelled(uctx), 0)
		if time.Since(start) < rcmd.Slack(timeout)/2 {
			break
		}
		if try == 100 {
			t.Fatalf("no two Bound calls within %v of one another in 100 tries", rcmd.Slack(timeout)/2)
		}
	}
	dl, ok := b1.Deadline()
	if !ok || dl.Before(start.Add(rcmd.Patience*timeout)) || dl.After(time.Now().Add(rcmd.Patience*timeout+rcmd.Slack(timeout))) {
		t.Fatalf("bound deadline %v after the call, want Patience command timeouts and at most Slack more", dl.Sub(start))
	}
	if dl2, _ := b2.Deadline(); !dl2.Equal(dl) || b1.Done() != b2.Done() {
		t.Fatalf("two commands under uncancellable contexts a moment apart: deadlines %v and %v, want one shared", dl, dl2)
	}
	if v := b2.Value(key{}); v != "v" {
		t.Fatalf("the bound context lost the caller's value: %v", v)
	}
	cctx, ccancel := context.WithCancel(bg)
	defer ccancel()
	b3, stop3 := r.Bound(cctx, 0)
	defer stop3()
	if b3.Done() == b1.Done() {
		t.Fatal("a command under a cancellable context shares another's deadline")
	}
	defer ucancel()
	if b7.Done() != b1.Done() || b7.Value(key{}) != "u" {
		t.Fatal("a command under an Uncancelled context neither shares the deadline nor keeps the caller's values")
	}
	if dl7, _ := b7.Deadline(); dl7.After(start.Add(rcmd.Patience*timeout + rcmd.Slack(timeout)/2)) {
		t.Fatalf("Uncancelled command's deadline %v after the caller's", dl7.Sub(start))
	}
	ucancel()
	if b7.Err() != nil {
		t.Fatal("the caller's cancellation ended an Uncancelled command's context")
	}
	for _, b := range []context.Context{b1, b2, b3, b7} {
		<-b.Done()
		if !rcmd.TimedOut(b) || context.Cause(b) != rcmd.ErrTimeout || !errors.Is(b.Err(), context.DeadlineExceeded) {
			t.Fatalf("ended with %v, cause %v: want DeadlineExceeded and ErrTimeout", b.Err(), context.Cause(b))
		}
	}
	if vctx.Err() != nil || cctx.Err() != nil {
		t.Fatal("a command's bound ended its caller's context")
	}
	// Another Runner's shared deadline, later than this one's, is not kept.
	long := rcmd.New(r.Client(), 10*timeout)
	b5, stop5 := long.Bound(bg, 0)
	defer stop5()
	b6, stop6 := r.Bound(b5, 0)
	defer stop6()
	if dl, _ := b6.Deadline(); dl.After(time.Now().Add(rcmd.Patience*timeout + rcmd.Slack(timeout))) {
		t.Fatalf("bound under a longer shared deadline ends %v from now, want this Runner's", time.Until(dl))
	}
	// A context derived from a shared one ends with it, with its cause.
	b4, stop4 := r.Bound(bg, 0)
	defer stop4()
	d4, cancel4 := context.WithCancel(b4)
	defer cancel4()
	<-d4.Done()
	if !rcmd.TimedOut(d4) {
		t.Fatalf("derived context ended with cause %v, want ErrTimeout", context.Cause(d4))
	}
}

// TestNoCutWhileRedisAnswers: a command sent while Redis answers the
// Runner's other commands is not cut at the command timeout (on a client with
// ContextTimeoutEnabled a cut costs the connection): a 550ms BLPOP under a
// 500ms timeout gets its answer (by 650ms: Redis 7.0 checks BLPOP's timeout
// ten times a second; the bound is 1s). Once Redis falls silent (paused), the first
// command waits Patience timeouts and is no Busy timeout; the ones sent after
// it has waited a quarter timeout get the command timeout itself.
func TestNoCutWhileRedisAnswers(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	const base = 500 * time.Millisecond
	r := rcmd.New(rdb, base)
	bg := context.Background()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // Redis keeps answering the Runner
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				_ = r.Do(bg, "ping").Err()
			}
		}
	}()
	err := r.Do(bg, "blpop", "rcmd:absent", "0.55").Err()
	close(stop)
	wg.Wait()
	if !errors.Is(err, redis.Nil) {
		t.Fatalf("a 550ms BLPOP under a 500ms command timeout while Redis answered: %v, want its answer (redis.Nil)", err)
	}
	if got := r.Timeout(); got != rcmd.Patience*base {
		t.Fatalf("while Redis answers: a command may wait %v, want %v", got, rcmd.Patience*base)
	}

	s.Pause()
	defer s.Resume()
	first := make(chan error, 1)
	go func() { first <- r.Do(bg, "get", "k").Err() }()
	quiet := time.Now().Add(10 * time.Second)
	for r.Timeout() == rcmd.Patience*base { // the first command waits; a quarter timeout on, Redis is quiet
		if time.Now().After(quiet) {
			t.Fatalf("Redis paused: a command may still wait %v, want less", r.Timeout())
		}
		time.Sleep(time.Millisecond)
	}
	err = r.Do(bg, "get", "k").Err()
	if !errors.Is(err, rcmd.ErrTimeout) || rcmd.Busy(err) {
		t.Fatalf("a command sent to a quiet Redis: %v, want ErrTimeout, not Busy", err)
	}
	if err := <-first; !errors.Is(err, rcmd.ErrTimeout) || rcmd.Busy(err) {
		t.Fatalf("the command in flight when Redis paused: %v, want ErrTimeout, not Busy", err)
	}
}

// TestCancelledCommandLeavesNoSilence: a command that its caller cancelled
// while Redis was healthy is no evidence that Redis is quiet (issue 46, item
// 4). 200ms after a BLPOP cancelled 20ms into its wait, a command may still
// wait Patience command timeouts; sent into a 450ms stall under a 300ms
// command timeout, it gets its answer, as does a control Runner that never
// saw the cancelled command.
func TestCancelledCommandLeavesNoSilence(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	const base = 300 * time.Millisecond
	r, control := rcmd.New(rdb, base), rcmd.New(rdb, base)
	bg := context.Background()
	for _, x := range []*rcmd.Runner{r, control} {
		if err := x.Do(bg, "ping").Err(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	sent := time.Now()
	err := r.Do(ctx, "blpop", "rcmd:cancelled", "1").Err()
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, rcmd.ErrTimeout) {
		t.Fatalf("BLPOP under a 20ms context: %v, want the caller's DeadlineExceeded", err)
	}
	<-time.After(time.Until(sent.Add(200 * time.Millisecond))) // time is the subject: 200ms after the send
	if got := r.Timeout(); got != rcmd.Patience*base {
		t.Errorf("200ms after a command its caller cancelled at 20ms: a command may wait %v, want %v (Redis is not quiet)",
			got, rcmd.Patience*base)
	}

	s.Pause()
	resumed := make(chan struct{})
	time.AfterFunc(450*time.Millisecond, func() { s.Resume(); close(resumed) })
	defer func() { <-resumed }()
	errs := make(chan error, 2)
	for _, x := range []*rcmd.Runner{r, control} {
		go func() { errs <- x.Do(bg, "get", "rcmd:k").Err() }()
	}
	for range 2 {
		if err := <-errs; err != nil && !errors.Is(err, redis.Nil) {
			t.Errorf("a command sent into a 450ms stall under a %v command timeout: %v, want its answer", base, err)
		}
	}
}

type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// TestMayHaveRun: a failure may have run in Redis unless Redis answered it
// (an error reply) or it never left the pool, and only when that answer was
// its only attempt: on a client that retries (go-redis's default), the error
// is the last attempt's.
func TestMayHaveRun(t *testing.T) {
	refused := replyError("READONLY You can't write against a read only replica.")
	one, three := redis.NewClient(&redis.Options{Addr: redisAddr, MaxRetries: -1}), redis.NewClient(&redis.Options{Addr: redisAddr})
	defer one.Close()
	defer three.Close()
	once, retried := rcmd.New(one, 0), rcmd.New(three, 0)
	for _, c := range []struct {
		name  string
		r     *rcmd.Runner
		err   error
		maybe bool
	}{
		{"no failure", once, nil, false},
		{"an absent value", retried, redis.Nil, false},
		{"an error reply, one attempt", once, refused, false},
		{"a pool timeout, one attempt", once, redis.ErrPoolTimeout, false},
		{"a timeout", once, context.DeadlineExceeded, true},
		{"a broken connection", once, &net.OpError{Op: "read", Err: errors.New("reset")}, true},
		{"an error reply after retries", retried, refused, true},
		{"a pool timeout after retries", retried, redis.ErrPoolTimeout, true},
	} {
		if got := c.r.MayHaveRun(c.err); got != c.maybe {
			t.Errorf("%s: MayHaveRun(%v) = %v, want %v", c.name, c.err, got, c.maybe)
		}
	}
}
