package rcmd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestClusterDoSkipsCommandInfoStall: on a ClusterClient whose command-info
// cache is cold, a single command of go-redis's own fetches COMMAND from a
// node under an exclusive lock, under a context of its own (5s with
// ContextTimeoutEnabled, the 5s ReadTimeout otherwise). With that node
// stalled, every other single command of the client waits on the lock,
// whatever its context. Runner.Do's command, to a key on a healthy master,
// under a 200ms context, must not: it returns within its context (300ms of
// slack for a noisy host) with the healthy master's answer.
func TestClusterDoSkipsCommandInfoStall(t *testing.T) {
	cl := redistest.StartCluster(t)
	const key = "rcmd:healthy"
	healthy := cl.MasterForSlot(cl.Slot(key))
	stalled := cl.OtherMaster(healthy)
	if healthy == nil || stalled == nil {
		t.Fatal("no healthy and stalled master")
	}
	for _, c := range []struct {
		name string
		make func(seed string) redis.UniversalClient
	}{
		{"ClusterClient", func(seed string) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{seed}})
		}},
		{"UniversalClient, ContextTimeoutEnabled", func(seed string) redis.UniversalClient {
			return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{seed}, IsClusterMode: true, ContextTimeoutEnabled: true})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			stalled.Pause()
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					stalled.Resume()
				}
			}
			defer resume()
			rdb, stuck, done := stallCommandInfo(t, c.make, healthy, stalled, key)
			defer func() {
				resume() // the fetch, and the command behind it, end once the node answers
				select {
				case <-done:
				case <-time.After(20 * time.Second):
					t.Error("the command behind the COMMAND fetch did not end 20s after the node resumed")
				}
			}()
			if !stuck {
				t.Skip("in 30 fresh clients the COMMAND fetch never went to the stalled master first")
			}
			r := rcmd.New(rdb, 0)
			const wait, slack = 200 * time.Millisecond, 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			start := time.Now()
			err := r.Do(ctx, "get", key).Err()
			took := time.Since(start)
			t.Logf("Runner.Do under a %v context, COMMAND fetch stalled: %v after %v", wait, err, took)
			if took > wait+slack {
				t.Fatalf("Runner.Do returned %v after it was sent, past its %v context (and %v of slack): it waited behind go-redis's COMMAND fetch", took, wait, slack)
			}
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Fatalf("Runner.Do to a healthy master: %v, want its answer", err)
			}
		})
	}
}

// stallCommandInfo makes fresh cluster clients with newClient (seeded with
// healthy alone, so that the slot map comes from it) until one whose first
// single command, sent on a goroutine of its own, fetches COMMAND from
// stalled: the fetch picks a random node. It returns that client, whether it
// found one, and a channel closed when that command has returned (it waits
// for the fetch: until stalled resumes or the fetch's timeout passes).
func stallCommandInfo(t *testing.T, newClient func(seed string) redis.UniversalClient, healthy, stalled *redistest.Server, key string) (redis.UniversalClient, bool, chan struct{}) {
	t.Helper()
	for range 30 {
		rdb := newClient(healthy.Addr())
		t.Cleanup(func() { rdb.Close() })
		cc, ok := rdb.(*redis.ClusterClient)
		if !ok {
			t.Fatalf("made a %T, want a *redis.ClusterClient", rdb)
		}
		sent := make(chan struct{}) // closed when COMMAND is sent to stalled
		cc.OnNewNode(func(node *redis.Client) {
			if node.Options().Addr != stalled.Addr() {
				return
			}
			node.AddHook(redistest.Intercept(func(_ context.Context, cmds []redis.Cmder, send func() error) error {
				if cmds[0].Name() == "command" { // one at a time: under the cache's lock
					select {
					case <-sent:
					default:
						close(sent)
					}
				}
				return send()
			}))
		})
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = rdb.Get(context.Background(), key).Err()
		}()
		select {
		case <-sent:
			return rdb, true, done
		case <-done: // the fetch went to a healthy master first: the cache is warm
		}
	}
	done := make(chan struct{})
	close(done)
	return nil, false, done
}

// TestClusterDoRetriesRefusal: a command that a node refuses for now is sent
// again on a ClusterClient, as go-redis's single command path would, though
// Do sends it as a pipeline: here an MGET during a slot's migration, of a key
// moved to the target and one that exists nowhere. The source answers ASK,
// the target TRYAGAIN, which a pipeline does not send again after an ASK.
// Sent again until its bound, it fails by its caller's deadline (300ms;
// 300ms of slack), never past it (with TRYAGAIN, or, when the deadline ended
// a pipeline midway, what that pipeline last heard); sent again once the
// slot has moved, it gets its answer.
func TestClusterDoRetriesRefusal(t *testing.T) {
	bg := context.Background()
	cl := redistest.StartCluster(t)
	const moved, absent = "{rcmd:mig}moved", "{rcmd:mig}absent"
	slot := cl.Slot(moved)
	from := cl.MasterForSlot(slot)
	to := cl.OtherMaster(from)
	refusals := make(chan struct{}, 64) // a TRYAGAIN came back from a pipeline
	pipelines := 0                      // the client's pipelines
	rdb := cl.Client(func(o *redis.ClusterOptions) {
		o.MaxRedirects = 20
		o.MinRetryBackoff, o.MaxRetryBackoff = 20*time.Millisecond, 80*time.Millisecond
	})
	rdb.AddHook(redistest.Intercept(func(_ context.Context, cmds []redis.Cmder, send func() error) error {
		err := send()
		if len(cmds) == 1 && cmds[0].Name() == "mget" {
			pipelines++ // one Do at a time: no race
			if redis.IsTryAgainError(cmds[0].Err()) {
				select {
				case refusals <- struct{}{}:
				default:
				}
			}
		}
		return err
	}))
	if err := rdb.Set(bg, moved, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	mig, err := cl.BeginMigration(bg, slot, to)
	if err != nil {
		t.Fatal(err)
	}
	if err := mig.MoveKeys(bg, moved); err != nil {
		t.Fatal(err)
	}
	r := rcmd.New(rdb, time.Second)

	const wait, slack = 300 * time.Millisecond, 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(bg, wait)
	defer cancel()
	start := time.Now()
	err = r.Do(ctx, "mget", moved, absent).Err()
	took := time.Since(start)
	t.Logf("MGET refused until its %v deadline: %v after %v, %d pipelines", wait, err, took, pipelines)
	if err == nil || took > wait+slack || pipelines < 2 {
		t.Fatalf("MGET refused until its %v deadline: %v after %v in %d pipelines, want it sent again and failed within the deadline (and %v)",
			wait, err, took, pipelines, slack)
	}

	for len(refusals) > 0 {
		<-refusals
	}
	pipelines = 0
	got := make(chan *redis.Cmd, 1)
	go func() { got <- r.Do(bg, "mget", moved, absent) }()
	select {
	case <-refusals:
	case cmd := <-got:
		t.Fatalf("MGET during the migration: %v, want TRYAGAIN first", cmd)
	}
	if err := mig.Finish(bg); err != nil {
		t.Fatal(err)
	}
	cmd := <-got
	v, err := cmd.Slice()
	t.Logf("MGET sent again across the slot's move: %v %v after %d pipelines", v, err, pipelines)
	if err != nil || len(v) != 2 || v[0] != "v" || v[1] != nil {
		t.Fatalf("MGET sent again across the slot's move: %v %v, want [v <nil>]", v, err)
	}
}
