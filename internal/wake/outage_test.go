package wake_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/internal/wake"
)

// outages are the outage lengths tried: shorter and longer than the linger
// (an idle channel's UNSUBSCRIBE then goes out while Redis is away), and one
// long enough for go-redis to give up dialling for a while (skipped by -short).
var outages = []time.Duration{time.Second, 4 * time.Second, 30 * time.Second}

// An outage longer than the linger used to lose push for good: the idle
// channel's UNSUBSCRIBE went out on the dead connection, go-redis dropped the
// channel from its resubscribe set, no confirmation came, and the Hub kept
// the channel "unsubscribing" with its ready signal still closed, so later
// subscribers returned at once without being subscribed. Now, within a second
// of Redis answering again, a new Subscribe is confirmed by Redis and push is
// delivered — one server and a cluster (the channel's master killed and
// restarted), after 1 s, 4 s and 30 s outages.
func TestPushAfterOutage(t *testing.T) {
	for _, d := range outages {
		t.Run(fmt.Sprintf("server/%v", d), func(t *testing.T) {
			if d > 5*time.Second && testing.Short() {
				t.Skip("long outage: skipped with -short")
			}
			t.Parallel()
			s := redistest.Start(t)
			rdb := s.Client()
			outage(t, wake.New(rdb), s, d,
				func(ctx context.Context, ch string) int64 { return rdb.PubSubNumSub(ctx, ch).Val()[ch] },
				func(ctx context.Context, ch, msg string) error { return rdb.Publish(ctx, ch, msg).Err() })
		})
		t.Run(fmt.Sprintf("cluster/%v", d), func(t *testing.T) {
			if d > 5*time.Second && testing.Short() {
				t.Skip("long outage: skipped with -short")
			}
			t.Parallel()
			cl := redistest.StartCluster(t)
			cc := cl.Client()
			const ch = "w:{outage}"
			m := cl.MasterForSlot(cl.Slot(ch))
			admin := m.Client()
			outage(t, wake.New(cc), m, d,
				func(ctx context.Context, ch string) int64 {
					v, _ := admin.Do(ctx, "PUBSUB", "SHARDNUMSUB", ch).Slice()
					if len(v) != 2 {
						return -1
					}
					n, _ := v[1].(int64)
					return n
				},
				func(ctx context.Context, ch, msg string) error { return cc.SPublish(ctx, ch, msg).Err() })
		})
	}
}

func outage(t *testing.T, h *wake.Hub, s *redistest.Server, d time.Duration,
	numsub func(context.Context, string) int64, publish func(ctx context.Context, ch, msg string) error) {
	ctx := context.Background()
	defer h.Close()
	const ch = "w:{outage}"
	sub, err := h.Subscribe(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	publishUntil(t, func() error { return publish(ctx, ch, "before") }, sub, "before", 5*time.Second)
	sub.Close() // idle: its linger runs out during a long outage

	s.Kill()
	t.Logf("outage of %v", d)
	time.Sleep(d) // the outage's length is the subject
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	answering := time.Now()

	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sub, err = h.Subscribe(sctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	t.Logf("Subscribe returned %v after Redis answered", time.Since(answering))
	redistest.Eventually(t, time.Second, "the channel subscribed at the server within 1s of Redis answering", func() bool {
		return numsub(ctx, ch) == 1
	})
	// Subscribed at the server: a publish now reaches the listener.
	for {
		if err := publish(ctx, ch, "after"); err == nil {
			break
		}
		if time.Since(answering) > 10*time.Second {
			t.Fatal("cannot publish after the restart")
		}
	}
	recv(t, sub, "after", 2*time.Second)
	t.Logf("push delivered %v after Redis answered", time.Since(answering))
}
