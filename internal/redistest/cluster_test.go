package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestClusterSpreadsKeys(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := StartCluster(t)
	cc := c.Client()
	for i := range 300 {
		if err := cc.Set(ctx, fmt.Sprintf("spread:%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	masters := c.Masters()
	if len(masters) != 3 || len(c.Replicas()) != 0 {
		t.Fatalf("%d masters, %d replicas; want 3, 0", len(masters), len(c.Replicas()))
	}
	for _, m := range masters {
		n, err := m.Do(ctx, "DBSIZE")
		if err != nil {
			t.Fatal(err)
		}
		if n.(int64) == 0 {
			t.Errorf("master %s holds no keys", m.Addr())
		}
	}
	for _, key := range []string{"spread:7", "{user1}.a", "{user1}.b", "{}x", "a{}{b}"} {
		want, err := cc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Slot(key); got != int(want) {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
		}
	}
	// The master MasterForSlot names answers for the key without a redirect.
	m := c.MasterForSlot(c.Slot("spread:7"))
	if m == nil {
		t.Fatal("no master for spread:7")
	}
	if v, err := m.Do(ctx, "GET", "spread:7"); err != nil || v != "7" {
		t.Fatalf("GET spread:7 on %s: %v, %v", m.Addr(), v, err)
	}
}

func TestClusterKillMaster(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := StartCluster(t, WithReplicas())
	if len(c.Replicas()) != 3 {
		t.Fatalf("%d replicas, want 3", len(c.Replicas()))
	}
	cc := c.Client()
	const key = "failover:key"
	if err := cc.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	slot := c.Slot(key)
	old := c.MasterForSlot(slot)
	promoted := c.KillMaster(t, old)

	if slices.Contains(c.Masters(), old) || !slices.Contains(c.Masters(), promoted) {
		t.Fatalf("Masters() = %v after promoting %s over %s", addrs(c.Masters()), promoted.Addr(), old.Addr())
	}
	if got := c.MasterForSlot(slot); got != promoted {
		t.Fatalf("slot %d on %v, want the promoted %s", slot, got, promoted.Addr())
	}
	// go-redis v9.23 does not reload the slot map when the old master refuses
	// connections (redis/go-redis#3979): it would keep dialling it until
	// ClusterStateReloadInterval (60 s). Ask for a reload on each failure.
	err := retry(ctx, func() error {
		err := cc.Set(ctx, key, "after", 0).Err()
		if err != nil {
			cc.ReloadState(ctx)
		}
		return err
	})
	if err != nil {
		t.Fatalf("write after failover: %v", err)
	}
	if v, err := cc.Get(ctx, key).Result(); err != nil || v != "after" {
		t.Fatalf("GET after failover: %q, %v", v, err)
	}
}

func TestClusterMigrateSlot(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := StartCluster(t)
	cc := c.Client()
	const key = "migrate:key"
	if err := cc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	slot := c.Slot(key)
	from := c.MasterForSlot(slot)
	to := otherMaster(c, from)
	if err := c.MigrateSlot(ctx, slot, to); err != nil {
		t.Fatal(err)
	}
	if got := c.MasterForSlot(slot); got != to {
		t.Fatalf("slot %d on %v after migration, want %s", slot, got, to.Addr())
	}
	if n, err := to.Do(ctx, "CLUSTER", "COUNTKEYSINSLOT", slot); err != nil || n.(int64) != 1 {
		t.Fatalf("COUNTKEYSINSLOT on the target: %v, %v", n, err)
	}
	if v, err := cc.Get(ctx, key).Result(); err != nil || v != "v" {
		t.Fatalf("GET after migration: %q, %v", v, err)
	}
	if err := c.MigrateSlot(ctx, slot, to); err == nil {
		t.Fatal("migrating a slot to its own master succeeded")
	}
}

func TestClusterAskRedirect(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := StartCluster(t)
	cc := c.Client()
	moved, stays, fresh := "{ask}.moved", "{ask}.stays", "{ask}.fresh"
	for _, k := range []string{moved, stays} {
		if err := cc.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	slot := c.Slot(moved)
	to := otherMaster(c, c.MasterForSlot(slot))
	m, err := c.BeginMigration(ctx, slot, to)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.MoveKeys(ctx, moved); err != nil {
		t.Fatal(err)
	}
	if err := m.MoveKeys(ctx, "not-in-slot"); err == nil {
		t.Fatal("MoveKeys accepted a key of another slot")
	}

	// The source no longer has the key: it answers ASK, not MOVED.
	_, err = m.From().Do(ctx, "GET", moved)
	var rerr redis.Error
	if !errors.As(err, &rerr) || !strings.HasPrefix(rerr.Error(), "ASK ") {
		t.Fatalf("GET %s on the source: %v, want an ASK redirect", moved, err)
	}
	// The cluster client follows ASK for the moved key, reads the other
	// directly, and creates a new key on the target.
	for _, k := range []string{moved, stays} {
		if v, err := cc.Get(ctx, k).Result(); err != nil || v != k {
			t.Fatalf("GET %s mid-migration: %q, %v", k, v, err)
		}
	}
	if err := cc.Set(ctx, fresh, fresh, 0).Err(); err != nil {
		t.Fatalf("SET %s mid-migration: %v", fresh, err)
	}

	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.MasterForSlot(slot); got != to {
		t.Fatalf("slot %d on %v after Finish, want %s", slot, got, to.Addr())
	}
	for _, k := range []string{moved, stays, fresh} {
		if v, err := cc.Get(ctx, k).Result(); err != nil || v != k {
			t.Fatalf("GET %s after Finish: %q, %v", k, v, err)
		}
	}
	if n, err := to.Do(ctx, "CLUSTER", "COUNTKEYSINSLOT", slot); err != nil || n.(int64) != 3 {
		t.Fatalf("COUNTKEYSINSLOT on the target: %v, %v; want 3", n, err)
	}
}

func otherMaster(c *Cluster, not *Server) *Server {
	for _, m := range c.Masters() {
		if m != not {
			return m
		}
	}
	return nil
}

func addrs(ss []*Server) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Addr())
	}
	return out
}

// retry calls f every 20 ms until it succeeds or 10 s pass.
func retry(ctx context.Context, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return poll(ctx, "a successful call", func(context.Context) error { return f() })
}
