package locks_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

func waitCalls(t *testing.T, s *redistest.Server) int {
	t.Helper()
	info, err := s.Info(context.Background(), "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	v, ok := info["cmdstat_wait"]
	if !ok {
		return 0
	}
	calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
	n, _ := strconv.Atoi(calls)
	return n
}

// TestReplicaAcknowledgement: WithReplicas sends WAIT on the connection that
// wrote the lock; too few acknowledgements release the lock and fail; without
// the option no WAIT is sent.
func TestReplicaAcknowledgement(t *testing.T) {
	ctx := context.Background()
	ss := redistest.StartN(t, 2)
	master, replica := ss[0], ss[1]
	if _, err := replica.Do(ctx, "REPLICAOF", "127.0.0.1", master.Port()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "replica linked", func() bool {
		info, _ := replica.Info(ctx, "replication")
		return info["master_link_status"] == "up"
	})
	rdb := master.Client()
	c := locks.New(rdb)
	defer c.Close()

	lk, err := c.TryLock(ctx, "acked")
	if err != nil {
		t.Fatal(err)
	}
	lk.Unlock(ctx)
	if n := waitCalls(t, master); n != 0 {
		t.Fatalf("WAIT sent %d times without WithReplicas", n)
	}

	lk, err = c.TryLock(ctx, "acked", locks.WithReplicas(1, time.Second))
	if err != nil {
		t.Fatalf("with a live replica: %v", err)
	}
	lk.Unlock(ctx)
	if n := waitCalls(t, master); n != 1 {
		t.Fatalf("cmdstat_wait calls = %d, want 1", n)
	}

	replica.Pause()
	defer replica.Resume()
	_, err = c.TryLock(ctx, "acked", locks.WithReplicas(1, 200*time.Millisecond))
	var re *locks.ReplicaError
	if !errors.Is(err, locks.ErrNotObtained) || !errors.As(err, &re) || re.Got != 0 || re.Want != 1 {
		t.Fatalf("with the replica paused: %v, want ErrNotObtained with a ReplicaError 0/1", err)
	}
	if rdb.Exists(ctx, "cg:lock:{acked}").Val() != 0 {
		t.Fatal("a lock refused for want of replicas was left behind")
	}
}
