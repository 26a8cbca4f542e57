package wake_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/faultproxy"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/internal/wake"
)

// blackHole is the partition's length: as long as the linger, so an idle
// channel's UNSUBSCRIBE goes out into it.
const blackHole = 2 * time.Second

// A black hole (the fault proxy keeps every connection open and drops the
// bytes both ways) used to lose push for good: the commands written into it
// — a new channel's SUBSCRIBE, an idle channel's UNSUBSCRIBE — never reached
// Redis, no confirmation ever came, and the connection, which raised no
// error, was never replaced, so those channels stayed unconfirmed and every
// later Subscribe of them waited out the confirmation bound and got no push.
// Now, once the partition heals: a channel subscribed before it keeps
// receiving, a channel subscribed during it is confirmed and receives, and a
// channel subscribed after it is confirmed by Redis when Subscribe returns —
// one server and a cluster (only the channels' master behind the proxy).
func TestPushAfterBlackHole(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		t.Parallel()
		s := redistest.Start(t)
		p := newProxy(t, s.Addr())
		rdb := s.Client(func(o *redis.Options) { o.Addr = p.Addr() })
		admin := s.Client()
		blackHoleCase(t, wake.New(rdb), p, blackHole, [3]string{"bh:old", "bh:during", "bh:idle"},
			func(ctx context.Context, ch string) int64 { return admin.PubSubNumSub(ctx, ch).Val()[ch] },
			func(ctx context.Context, ch, msg string) error { return admin.Publish(ctx, ch, msg).Err() })
	})
	// Longer than a PING may go unanswered: the connection is replaced while
	// the partition lasts (its replacement's attempts fail until it heals),
	// and everything is subscribed again on the next attempt after it.
	t.Run("server/long", func(t *testing.T) {
		if testing.Short() {
			t.Skip("long partition: skipped with -short")
		}
		t.Parallel()
		s := redistest.Start(t)
		p := newProxy(t, s.Addr())
		rdb := s.Client(func(o *redis.Options) { o.Addr = p.Addr() })
		admin := s.Client()
		blackHoleCase(t, wake.New(rdb), p, 5*time.Second, [3]string{"bh:old", "bh:during", "bh:idle"},
			func(ctx context.Context, ch string) int64 { return admin.PubSubNumSub(ctx, ch).Val()[ch] },
			func(ctx context.Context, ch, msg string) error { return admin.Publish(ctx, ch, msg).Err() })
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.StartCluster(t)
		m := cl.MasterForSlot(cl.Slot("bh:{0}"))
		p := newProxy(t, m.Addr())
		cc := cl.Client(func(o *redis.ClusterOptions) {
			o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
				if addr == m.Addr() {
					addr = p.Addr() // only the channels' master is partitioned
				}
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}
		})
		// Three channels in different slots of the same master.
		var names [3]string
		names[0] = "bh:{0}"
		for i, n := 1, 1; n < 3; i++ {
			name := "bh:{" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + "}"
			if cl.MasterForSlot(cl.Slot(name)) == m && cl.Slot(name) != cl.Slot(names[n-1]) {
				names[n] = name
				n++
			}
		}
		admin := m.Client()
		blackHoleCase(t, wake.New(cc), p, blackHole, names,
			func(ctx context.Context, ch string) int64 {
				v, _ := admin.Do(ctx, "PUBSUB", "SHARDNUMSUB", ch).Slice()
				if len(v) != 2 {
					return -1
				}
				n, _ := v[1].(int64)
				return n
			},
			func(ctx context.Context, ch, msg string) error { return admin.SPublish(ctx, ch, msg).Err() })
	})
}

func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// blackHoleCase runs the scenario on the channels old (subscribed before the
// partition), during (subscribed in it) and idle (subscribed before, idle in
// it, subscribed again after it).
func blackHoleCase(t *testing.T, h *wake.Hub, p *faultproxy.Proxy, hole time.Duration, names [3]string,
	numsub func(context.Context, string) int64, publish func(ctx context.Context, ch, msg string) error) {
	ctx := context.Background()
	defer h.Close()
	old, during, idle := names[0], names[1], names[2]
	oldSub, err := h.Subscribe(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	defer oldSub.Close()
	idleSub, err := h.Subscribe(ctx, idle)
	if err != nil {
		t.Fatal(err)
	}
	publishUntil(t, func() error { return publish(ctx, old, "before") }, oldSub, "before", 5*time.Second)
	idleSub.Close() // its linger runs out inside the partition

	accepted := p.Accepted()
	p.Set(faultproxy.BlackHole)
	start := time.Now()
	type result struct {
		sub *wake.Sub
		err error
	}
	res := make(chan result, 1)
	go func() {
		s, err := h.Subscribe(ctx, during)
		res <- result{s, err}
	}()
	time.Sleep(hole - time.Since(start)) // the partition's length is the subject
	redials := p.Accepted() - accepted
	p.Set(faultproxy.Pass)
	healed := time.Now()
	t.Logf("%v partition: %d connections made during it", hole, redials)
	if hole > 4*time.Second && redials == 0 {
		t.Error("a connection whose PINGs went unanswered for the whole partition was kept")
	}
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	duringSub := r.sub
	defer duringSub.Close()

	// Push reaches the listeners subscribed before and during the partition.
	for _, c := range []struct {
		name string
		sub  *wake.Sub
	}{{old, oldSub}, {during, duringSub}} {
		publishUntil(t, func() error { return publish(ctx, c.name, "after") }, c.sub, "after", 2*time.Second+time.Since(healed))
		t.Logf("%s: push delivered %v after the partition healed", c.name, time.Since(healed))
	}

	// A channel subscribed after the partition is confirmed by Redis when
	// Subscribe returns, and receives the next publish.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	begin := time.Now()
	sub, err := h.Subscribe(sctx, idle)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	took := time.Since(begin)
	if n := numsub(ctx, idle); n != 1 {
		t.Fatalf("Subscribe of %s returned after %v (%v after the partition healed) without the channel subscribed at the server (numsub %d)",
			idle, took, time.Since(healed), n)
	}
	t.Logf("%s: Subscribe confirmed in %v, %v after the partition healed", idle, took, time.Since(healed))
	if err := publish(ctx, idle, "after"); err != nil {
		t.Fatal(err)
	}
	recv(t, sub, "after", time.Second)
}
