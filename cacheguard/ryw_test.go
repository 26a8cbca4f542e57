package cacheguard_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/childproc"
)

// dbKey is the "database" of a read-your-writes test: the row's version, a
// counter in Redis that every process reads and writes.
func dbKey(key string) string { return "test:db:" + key }

// versionLoad reads the row's version from the "database".
func versionLoad(rdb redis.UniversalClient, key string) func(context.Context) (item, error) {
	return func(ctx context.Context) (item, error) {
		v, err := rdb.Get(ctx, dbKey(key)).Int()
		return item{ID: v, Name: "db"}, err
	}
}

// childWriter is another process of the service: it reads commands on stdin
// and answers one line each.
//
//	write   commits the next version (INCR) and invalidates the key: "ok <version>"
//	get     Get of the key through this process's Guard: "got <version>"
func childWriter(ctx context.Context, rdb *redis.Client, key string) error {
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0))
	defer g.Close()
	sc := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	for sc.Scan() {
		switch sc.Text() {
		case "write":
			v, err := rdb.Incr(ctx, dbKey(key)).Result()
			if err != nil {
				return err
			}
			if err := g.Invalidate(ctx, key); err != nil {
				return err
			}
			fmt.Println("ok", v)
		case "get":
			v, err := cacheguard.Get(ctx, g, key, versionLoad(rdb, key))
			if err != nil {
				return err
			}
			fmt.Println("got", v.ID)
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
	}
	return sc.Err()
}

// ask sends a command to a child and returns its answer.
func ask(t *testing.T, p *childproc.Proc, cmd string) string {
	t.Helper()
	if _, err := fmt.Fprintln(p.Stdin, cmd); err != nil {
		t.Fatal(err)
	}
	line, err := p.Next(30 * time.Second)
	if err != nil || strings.HasPrefix(line, "error") {
		t.Fatalf("child, %s: %q, %v", cmd, line, err)
	}
	return line
}

// TestReadYourWritesAcrossProcesses is the sequence of issue 14 item 1, with
// process B a real child process. A's first Get starts a fill that reads
// version 1 and then stalls. B commits version 2 and invalidates; B's Get
// loads and stores 2; A reads 2. B commits 3 and invalidates. A Get on A that
// starts after both invalidations returned must return 3 or later — it must
// neither join A's stalled flight (version 1) nor go back below the 2 that A
// already served.
func TestReadYourWritesAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	key := testKey(t)
	if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	b := startChild(t, "writer", childKey+"="+key)
	if line, err := b.Next(30 * time.Second); err != nil || line != "ready" {
		t.Fatalf("child: %q, %v", line, err)
	}
	a, _ := newGuard(t, cacheguard.EarlyRefresh(0))

	read := versionLoad(rdb, key)
	var stalled atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	load := func(ctx context.Context) (item, error) {
		v, err := read(ctx)
		if stalled.CompareAndSwap(false, true) {
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return v, err
	}
	first := make(chan item, 1)
	go func() {
		v, _ := cacheguard.Get(ctx, a, key, load)
		first <- v
	}()
	<-entered // A's fill read version 1 and stalls
	defer func() {
		close(release)
		<-first // a call that began before the invalidations may return 1
	}()

	ask(t, b, "write") // version 2, invalidated
	if got := ask(t, b, "get"); got != "got 2" {
		t.Fatalf("B: %q, want got 2", got)
	}
	// A's fill stalls until the load timeout (10s): a call that waited for
	// it, rather than for the renewal that finds its lease void, would run
	// out of a 5s wait budget (ErrWaitTimeout) with version 2 in Redis.
	v2, err := cacheguard.Get(ctx, a, key, load, cacheguard.WaitBudget(5*time.Second))
	if err != nil || v2.ID != 2 {
		t.Fatalf("A after B's fill: %v, %v; want version 2", v2, err)
	}
	ask(t, b, "write") // version 3, invalidated

	misses := a.Stats().Misses
	third := make(chan item, 1)
	errc := make(chan error, 1)
	go func() {
		v, err := cacheguard.Get(ctx, a, key, load)
		errc <- err
		third <- v
	}()
	// The third Get has either joined a flight (counted as a miss) or
	// answered; only then may A's stalled fill go on.
	eventually(t, 10*time.Second, "the third Get to miss", func() bool { return a.Stats().Misses > misses || len(errc) > 0 })
	select {
	case err = <-errc:
	case <-time.After(time.Second):
		// Still waiting: it joined the stalled flight. Let that flight end to
		// see what it returns.
		release <- struct{}{}
		err = <-errc
	}
	v3 := <-third
	if err != nil || v3.ID < 3 {
		t.Fatalf("A's Get after both invalidations returned: %v, %v; want version 3 or later (A had served 2)", v3, err)
	}
}

// TestLatePushOfAnEarlierLeaseIsNotTrusted: one token can hold a key's fill
// lease under two generations. A lease request that Redis runs twice — a
// resend after a stall (rcmd.Busy), go-redis retrying it on another
// connection, a copy stuck on the wire — is granted again by its second run
// when the key was invalidated after its fill stored; nobody fills that
// second lease. A flight of another process that finds it follows it, and
// the push of the first lease's fill, still on its way to that process (a
// slow subscription), names the same token. Served, it would hand a call
// that began after the invalidation a value loaded before it. A push serves
// only the flight that saw the lease it names: generation and token.
func TestLatePushOfAnEarlierLeaseIsNotTrusted(t *testing.T) {
	ctx := context.Background()
	key := testKey(t)
	var lease atomic.Pointer[[]any] // A's get-or-lease request, as sent
	a := shared(t)
	a.AddHook(replyHook(func(cmd redis.Cmder) {
		if args := cmd.Args(); len(args) > 2 && args[0] == "evalsha" && args[1] == cacheguard.LeaseScriptSHA() {
			cp := append([]any(nil), args...)
			lease.Store(&cp)
		}
	}))
	ga := cacheguard.New(a)
	defer ga.Close()
	wake := "cg:fw:{" + key + "}"
	sub := shared(t).Subscribe(ctx, wake)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	before := counter{name: "before"}
	if v, err := cacheguard.Get(ctx, ga, key, before.load, cacheguard.Lease(time.Second)); err != nil || v.Name != "before" {
		t.Fatalf("A's fill: %v, %v", v, err)
	}
	var push string // the fill's push, as Redis sent it
	select {
	case m := <-sub.Channel():
		push = m.Payload
	case <-time.After(10 * time.Second):
		t.Fatal("no push of A's fill")
	}
	if err := ga.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	// A's request runs again: it takes the lease under the new generation,
	// with the token whose fill stored before the invalidation.
	again, err := a.Do(ctx, *lease.Load()...).Slice()
	if err != nil || len(again) != 1 {
		t.Fatalf("A's lease request again: %v, %v", again, err)
	}
	if r, _ := again[0].([]any); len(r) != 2 || r[0] != int64(1) {
		t.Fatalf("A's lease request again answered %v; want the lease granted", again[0])
	}

	b := shared(t)
	waiting := watchWaiting(b)
	gb := cacheguard.New(b)
	defer gb.Close()
	after := counter{name: "after"}
	type got struct {
		v   item
		err error
	}
	done := make(chan got, 1)
	go func() {
		v, err := cacheguard.Get(ctx, gb, key, after.load, cacheguard.WaitBudget(5*time.Second))
		done <- got{v, err}
	}()
	select {
	case <-waiting: // B follows the second lease
	case r := <-done:
		t.Fatalf("B's Get did not wait for the lease nobody fills: %v, %v", r.v, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("B's Get never waited for the lease")
	}
	// The first fill's push reaches B late.
	if err := a.Publish(ctx, wake, push).Err(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.v.Name != "after" {
		t.Fatalf("B's Get, begun after the invalidation, returned %v, %v; want a value loaded after it", r.v, r.err)
	}
}
