package wake_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/internal/wake"
)

// listener records what a watched channel tells it.
type listener struct {
	mu       sync.Mutex
	heard    []string
	sessions []uint64 // each distinct session told, 0 when down
	lives    int
}

func (l *listener) Heard(p string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.heard = append(l.heard, p)
}

func (l *listener) Live(session uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lives++
	if n := len(l.sessions); n == 0 || l.sessions[n-1] != session {
		l.sessions = append(l.sessions, session)
	}
}

func (l *listener) state() (heard []string, sessions []uint64, lives int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.heard...), append([]uint64(nil), l.sessions...), l.lives
}

// A watched channel gives its listener every message and proves it alive
// while it is quiet (a PING answered every interval); when its
// connection is killed the session ends at once (0), and a new one begins
// once it is subscribed again — one server, and a cluster, where the channel
// is a classic one that hears a PUBLISH sent to any node.
func TestWatch(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		s := redistest.Start(t)
		rdb := s.Client()
		watchCase(t, wake.New(rdb), rdb, func(ctx context.Context) error {
			return rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err()
		})
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t)
		cc := cl.Client()
		watchCase(t, wake.New(cc), cc, func(ctx context.Context) error {
			return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				return m.ClientKillByFilter(ctx, "TYPE", "pubsub").Err()
			})
		})
	})
}

func watchCase(t *testing.T, h *wake.Hub, pub redis.UniversalClient, kill func(context.Context) error) {
	ctx := context.Background()
	defer h.Close()
	l := &listener{}
	if _, err := h.Watch("w:watched", l, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, "the first session", func() bool {
		_, sessions, _ := l.state()
		return len(sessions) == 1 && sessions[0] > 0
	})
	for _, m := range []string{"a", "b", "c"} {
		if err := pub.Publish(ctx, "w:watched", m).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// (In order on one server; on a cluster, messages published through
	// other nodes come over the cluster bus, in no order.)
	redistest.Eventually(t, 5*time.Second, "the messages", func() bool {
		heard, _, _ := l.state()
		slices.Sort(heard)
		return slices.Equal(heard, []string{"a", "b", "c"})
	})
	_, _, lives := l.state()
	redistest.Eventually(t, 5*time.Second, "proofs while quiet", func() bool {
		_, _, n := l.state()
		return n >= lives+3
	})
	_, before, _ := l.state()
	if err := kill(ctx); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, "the session ended, then a new one", func() bool {
		_, sessions, _ := l.state()
		n := len(sessions)
		return n >= len(before)+2 && sessions[n-2] == 0 && sessions[n-1] > before[len(before)-1]
	})
	if err := pub.Publish(ctx, "w:watched", "d").Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, "a message in the new session", func() bool {
		heard, _, _ := l.state()
		return heard[len(heard)-1] == "d"
	})
}
