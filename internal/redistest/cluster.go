package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterOption configures StartCluster.
type ClusterOption func(*clusterConfig)

type clusterConfig struct {
	replicas bool
	node     []Option
}

// WithReplicas gives every master one replica, so that KillMaster can fail
// over. The default is three masters and no replicas.
func WithReplicas() ClusterOption { return func(c *clusterConfig) { c.replicas = true } }

// WithNodeOptions applies server options, such as AppendFsyncAlways or Config,
// to every node of the cluster. The default is none.
func WithNodeOptions(opts ...Option) ClusterOption {
	return func(c *clusterConfig) { c.node = append(c.node, opts...) }
}

// Cluster is a Redis Cluster of three masters, each optionally with one
// replica, made of redis-server processes on loopback ports. Its methods are
// safe for concurrent use.
type Cluster struct {
	// Set by StartCluster, read-only afterwards.
	nodes []*Server                 // every node started, masters first
	ids   map[*Server]string        // cluster node IDs
	admin map[*Server]*redis.Client // control connections, closed by each Server's Close

	mu        sync.Mutex             // guards the fields below
	masters   []*Server              // current masters
	replicaOf map[*Server]*Server    // current master -> its replica, while it has one
	clients   []*redis.ClusterClient // made by Client, closed at cleanup
}

const (
	clusterWait  = 30 * time.Second      // bounds StartCluster's wait for a stable cluster
	failoverWait = 20 * time.Second      // bounds KillMaster and Sentinel.Failover
	pollEvery    = 20 * time.Millisecond // how often waits re-check their condition
)

// StartCluster starts three masters (and, WithReplicas, one replica each),
// splits the 16384 slots evenly over the masters with CLUSTER ADDSLOTSRANGE,
// joins the nodes with CLUSTER MEET, attaches the replicas with CLUSTER
// REPLICATE, and waits until the cluster is stable (see WaitStable).
// Everything, clients included, is stopped in tb.Cleanup. It skips tb when the
// binary is missing (see Need).
func StartCluster(tb testing.TB, opts ...ClusterOption) *Cluster {
	tb.Helper()
	var cfg clusterConfig
	for _, o := range opts {
		o(&cfg)
	}
	n := 3
	if cfg.replicas {
		n = 6
	}
	// Replicas sync at once instead of waiting 5 s for more; later options win.
	nodeOpts := append([]Option{Config("repl-diskless-sync-delay", "0")}, cfg.node...)
	nodes := StartN(tb, n, append(nodeOpts, clusterMode())...)

	c := &Cluster{
		nodes:     nodes,
		ids:       map[*Server]string{},
		admin:     map[*Server]*redis.Client{},
		masters:   slices.Clone(nodes[:3]),
		replicaOf: map[*Server]*Server{},
	}
	for _, s := range nodes {
		c.admin[s] = adminClient(s)
	}
	for i, r := range nodes[3:] {
		c.replicaOf[nodes[i]] = r
	}
	tb.Cleanup(c.close)

	ctx, cancel := context.WithTimeout(tb.Context(), clusterWait)
	defer cancel()
	if err := c.build(ctx); err != nil {
		tb.Fatal(err)
	}
	return c
}

// adminClient returns a client for control commands: no retries, short
// timeouts, so that a killed or paused node fails a poll instead of stalling it.
func adminClient(s *Server) *redis.Client {
	return s.Client(func(o *redis.Options) {
		o.MaxRetries = -1
		o.DialTimeout = time.Second
		o.ReadTimeout = time.Second
		o.WriteTimeout = time.Second
		o.PoolSize = 2
	})
}

func (c *Cluster) build(ctx context.Context) error {
	for _, s := range c.nodes {
		id, err := c.admin[s].ClusterMyID(ctx).Result()
		if err != nil {
			return fmt.Errorf("redistest: CLUSTER MYID on %s: %w", s.Addr(), err)
		}
		c.ids[s] = id
	}
	for i, m := range c.masters {
		lo, hi := i*clusterSlots/3, (i+1)*clusterSlots/3-1
		if err := c.admin[m].ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("redistest: CLUSTER ADDSLOTSRANGE %d %d on %s: %w", lo, hi, m.Addr(), err)
		}
		// Distinct epochs up front spare the nodes the epoch-collision dance.
		if err := c.admin[m].Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("redistest: CLUSTER SET-CONFIG-EPOCH on %s: %w", m.Addr(), err)
		}
	}
	first := c.admin[c.nodes[0]]
	for _, s := range c.nodes[1:] {
		if err := first.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(s.Port())).Err(); err != nil {
			return fmt.Errorf("redistest: CLUSTER MEET %s: %w", s.Addr(), err)
		}
	}
	if err := poll(ctx, "every node to know every other", c.allKnown); err != nil {
		return err
	}
	for m, r := range c.replicaOf {
		if err := c.admin[r].ClusterReplicate(ctx, c.ids[m]).Err(); err != nil {
			return fmt.Errorf("redistest: CLUSTER REPLICATE on %s: %w", r.Addr(), err)
		}
	}
	return c.WaitStable(ctx)
}

// allKnown reports whether every node lists every node, handshakes done.
func (c *Cluster) allKnown(ctx context.Context) error {
	for _, s := range c.nodes {
		nodes, err := c.clusterNodes(ctx, s)
		if err != nil {
			return err
		}
		for _, o := range c.nodes {
			n, ok := nodes[c.ids[o]]
			if !ok || n.flags["handshake"] || n.flags["noaddr"] {
				return fmt.Errorf("%s does not know %s yet", s.Addr(), o.Addr())
			}
		}
	}
	return nil
}

func (c *Cluster) close() {
	c.mu.Lock()
	clients := c.clients
	c.clients = nil
	c.mu.Unlock()
	for _, cc := range clients {
		cc.Close()
	}
}

// Addrs returns the addresses of the current masters, to seed a cluster client.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, m := range c.Masters() {
		out = append(out, m.Addr())
	}
	return out
}

// Client returns a new cluster client seeded with Addrs, closed at cleanup.
// The options functions may change any field of the redis.ClusterOptions.
func (c *Cluster) Client(opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	o := &redis.ClusterOptions{Addrs: c.Addrs()}
	for _, f := range opts {
		f(o)
	}
	cc := redis.NewClusterClient(o)
	c.mu.Lock()
	c.clients = append(c.clients, cc)
	c.mu.Unlock()
	return cc
}

// Masters returns the current masters: at start, in slot order (the first
// holds slots 0-5460); after KillMaster, the promoted replica takes the killed
// master's place.
func (c *Cluster) Masters() []*Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.masters)
}

// OtherMaster returns a current master other than m (nil when there is none):
// where a test moves m's slot.
func (c *Cluster) OtherMaster(m *Server) *Server {
	for _, o := range c.Masters() {
		if o != m {
			return o
		}
	}
	return nil
}

// Replicas returns the current replicas in the order of their masters in
// Masters. A replica promoted by KillMaster is no longer among them.
func (c *Cluster) Replicas() []*Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Server
	for _, m := range c.masters {
		if r := c.replicaOf[m]; r != nil {
			out = append(out, r)
		}
	}
	return out
}

// NodeID returns the cluster node ID of s (its CLUSTER MYID), or "" when s is
// not a node of c.
func (c *Cluster) NodeID(s *Server) string { return c.ids[s] }

// Slot returns the hash slot of key, as CLUSTER KEYSLOT would, honouring hash
// tags: "{user1}.a" and "{user1}.b" share a slot.
func (c *Cluster) Slot(key string) int { return keySlot(key) }

// MasterForSlot asks a live node (CLUSTER SLOTS) which master serves slot. It
// returns nil when no node answers within 5 s or the slot is not served.
func (c *Cluster) MasterForSlot(slot int) *Server {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, _ := c.masterForSlot(ctx, slot)
	return s
}

func (c *Cluster) masterForSlot(ctx context.Context, slot int) (*Server, error) {
	var lastErr error
	for _, n := range c.live() {
		//lint:ignore SA1019 CLUSTER SLOTS answers on every Redis version the tests may meet
		slots, err := c.admin[n].ClusterSlots(ctx).Result()
		if err != nil {
			lastErr = fmt.Errorf("redistest: CLUSTER SLOTS on %s: %w", n.Addr(), err)
			continue
		}
		for _, r := range slots {
			if int(r.Start) <= slot && slot <= int(r.End) && len(r.Nodes) > 0 {
				if s := c.byID(r.Nodes[0].ID); s != nil {
					return s, nil
				}
				return nil, fmt.Errorf("redistest: slot %d served by unknown node %s", slot, r.Nodes[0].Addr)
			}
		}
		return nil, fmt.Errorf("redistest: slot %d is not served (asked %s)", slot, n.Addr())
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("redistest: no live cluster node")
	}
	return nil, lastErr
}

func (c *Cluster) byID(id string) *Server {
	for s, sid := range c.ids {
		if sid == id {
			return s
		}
	}
	return nil
}

// live returns the running nodes, current masters first.
func (c *Cluster) live() []*Server {
	c.mu.Lock()
	masters := slices.Clone(c.masters)
	c.mu.Unlock()
	var out []*Server
	for _, s := range masters {
		if s.Running() {
			out = append(out, s)
		}
	}
	for _, s := range c.nodes {
		if s.Running() && !slices.Contains(masters, s) {
			out = append(out, s)
		}
	}
	return out
}

// KillMaster SIGKILLs master m and waits (up to 20 s) until its replica
// reports role:master and the surviving nodes agree that the cluster is
// stable again. It returns the promoted replica, which replaces m in Masters.
// It fails tb when m is not a current master or has no replica.
//
// Clients are left alone: a go-redis ClusterClient keeps dialling the dead
// master until its ClusterStateReloadInterval (60 s) passes, as it does not
// reload the slot map on connection errors (redis/go-redis#3979); call its
// ReloadState to catch up at once.
func (c *Cluster) KillMaster(tb testing.TB, m *Server) (promoted *Server) {
	tb.Helper()
	c.mu.Lock()
	isMaster, r := slices.Contains(c.masters, m), c.replicaOf[m]
	c.mu.Unlock()
	switch {
	case !isMaster:
		tb.Fatalf("redistest: KillMaster: %s is not a current master", m.Addr())
	case r == nil:
		tb.Fatalf("redistest: KillMaster: %s has no replica (start the cluster WithReplicas)", m.Addr())
	}
	ctx, cancel := context.WithTimeout(tb.Context(), failoverWait)
	defer cancel()

	m.Kill()
	err := poll(ctx, "replica "+r.Addr()+" to be promoted", func(ctx context.Context) error {
		return wantRole(ctx, c.admin[r], "master")
	})
	if err != nil {
		tb.Fatal(err)
	}
	c.mu.Lock()
	if i := slices.Index(c.masters, m); i >= 0 { // a concurrent KillMaster(m) may have won
		c.masters[i] = r
	}
	delete(c.replicaOf, m)
	c.mu.Unlock()
	if err := c.WaitStable(ctx); err != nil {
		tb.Fatal(err)
	}
	return r
}

// wantRole checks the role field of INFO replication.
func wantRole(ctx context.Context, cl *redis.Client, role string) error {
	info, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if got := ParseInfo(info)["role"]; got != role {
		return fmt.Errorf("%s has role %q, want %q", cl.Options().Addr, got, role)
	}
	return nil
}

// poll calls check every 20 ms until it returns nil or ctx is done; then it
// returns an error that wraps both ctx.Err() and check's last error.
func poll(ctx context.Context, what string, check func(context.Context) error) error {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: waiting for %s: %w", what, errors.Join(ctx.Err(), err))
		case <-t.C:
		}
	}
}
