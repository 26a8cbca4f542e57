package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// sentinelMasterName is the name under which the sentinel monitors the master.
const sentinelMasterName = "mymaster"

// sentinelConfig makes a Server run as a sentinel monitoring one master.
type sentinelConfig struct {
	master string // the monitored master's name
	port   int    // the monitored master's port on 127.0.0.1
}

func sentinelMode(master string, port int) Option {
	return func(c *config) { c.sentinel = &sentinelConfig{master: master, port: port} }
}

// writeSentinelConf writes a sentinel's config: quorum 1, the master down
// after 1 s of silence, a failover given up after 3 s. The sentinel rewrites
// the file as it learns, so it lives in the server's own (writable) directory;
// Restart rewrites it from scratch, monitoring the original master again.
func (s *Server) writeSentinelConf() (string, error) {
	sc := s.cfg.sentinel
	lines := [][]string{
		{"port", strconv.Itoa(s.port)},
		{"bind", "127.0.0.1"},
		{"protected-mode", "no"},
		{"daemonize", "no"},
		{"dir", s.dir},
		{"logfile", filepath.Join(s.dir, "redis.log")},
		{"sentinel", "resolve-hostnames", "no"},
		{"sentinel", "monitor", sc.master, "127.0.0.1", strconv.Itoa(sc.port), "1"},
		{"sentinel", "down-after-milliseconds", sc.master, "1000"},
		{"sentinel", "failover-timeout", sc.master, "3000"},
	}
	var b strings.Builder
	for _, l := range append(lines, s.cfg.extra...) {
		b.WriteString(strings.Join(l, " ") + "\n")
	}
	p := filepath.Join(s.dir, "redis.conf")
	return p, os.WriteFile(p, []byte(b.String()), 0o600)
}

// Sentinel is a Redis Sentinel set-up: one master, one replica and one
// sentinel process monitoring them, all on loopback ports. Its methods are
// safe for concurrent use.
type Sentinel struct {
	// Set by StartSentinel, read-only afterwards.
	sentinel *Server
	admin    *redis.SentinelClient // to the sentinel, closed at cleanup

	mu      sync.Mutex      // guards the fields below
	master  *Server         // the current master
	replica *Server         // its replica; nil after Failover
	clients []*redis.Client // made by Client, closed at cleanup
}

// StartSentinel starts a master, a replica of it (REPLICAOF) and a sentinel
// (redis-server --sentinel) monitoring the master under MasterName with
// quorum 1, and waits until the replica is in sync and the sentinel knows it.
// Everything, clients included, is stopped in tb.Cleanup. It skips tb when the
// binary is missing (see Need).
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	bin := Need(tb)
	// The replica syncs at once instead of waiting 5 s for more replicas.
	data := StartN(tb, 2, Config("repl-diskless-sync-delay", "0"))
	master, replica := data[0], data[1]
	ctx, cancel := context.WithTimeout(tb.Context(), clusterWait)
	defer cancel()

	r := adminClient(replica)
	if err := r.ReplicaOf(ctx, "127.0.0.1", strconv.Itoa(master.Port())).Err(); err != nil {
		tb.Fatalf("redistest: REPLICAOF on %s: %v", replica.Addr(), err)
	}
	if err := poll(ctx, "replica "+replica.Addr()+" to sync", func(ctx context.Context) error {
		return linkUp(ctx, r)
	}); err != nil {
		tb.Fatal(err)
	}

	sent, err := newServer(bin, tb.TempDir(), sentinelMode(sentinelMasterName, master.Port()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(sent.Close)
	st := &Sentinel{
		sentinel: sent,
		admin: redis.NewSentinelClient(&redis.Options{
			Addr: sent.Addr(), MaxRetries: -1,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		}),
		master:  master,
		replica: replica,
	}
	tb.Cleanup(st.close)
	if err := poll(ctx, "the sentinel to see replica "+replica.Addr(), st.knowsReplica); err != nil {
		tb.Fatal(err)
	}
	return st
}

// linkUp checks that a replica's link to its master is up.
func linkUp(ctx context.Context, cl *redis.Client) error {
	info, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if st := ParseInfo(info)["master_link_status"]; st != "up" {
		return fmt.Errorf("%s: master_link_status:%s", cl.Options().Addr, st)
	}
	return nil
}

// knowsReplica checks that the sentinel sees the master up and its replica up
// and in sync, so that a failover can pick the replica.
func (st *Sentinel) knowsReplica(ctx context.Context) error {
	m, err := st.admin.Master(ctx, sentinelMasterName).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL MASTER: %w", err)
	}
	if m["flags"] != "master" {
		return fmt.Errorf("sentinel sees the master as %q", m["flags"])
	}
	replicas, err := st.admin.Replicas(ctx, sentinelMasterName).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL REPLICAS: %w", err)
	}
	want := st.Replica().Addr()
	for _, r := range replicas {
		if net.JoinHostPort(r["ip"], r["port"]) == want {
			if r["flags"] != "slave" || r["master-link-status"] != "ok" {
				return fmt.Errorf("sentinel sees replica %s as %q, link %q", want, r["flags"], r["master-link-status"])
			}
			return nil
		}
	}
	return fmt.Errorf("sentinel does not know replica %s yet", want)
}

func (st *Sentinel) close() {
	st.mu.Lock()
	clients := st.clients
	st.clients = nil
	st.mu.Unlock()
	for _, c := range clients {
		c.Close()
	}
	st.admin.Close()
}

// MasterName is the name under which the sentinel monitors the master.
func (st *Sentinel) MasterName() string { return sentinelMasterName }

// SentinelAddrs returns the sentinels' addresses (there is one).
func (st *Sentinel) SentinelAddrs() []string { return []string{st.sentinel.Addr()} }

// Master returns the current master: after Failover, the promoted replica.
func (st *Sentinel) Master() *Server {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.master
}

// Replica returns the master's replica, or nil after Failover (the old master
// is dead, so the promoted one has none).
func (st *Sentinel) Replica() *Server {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.replica
}

// Client returns a new failover client (redis.NewFailoverClient) that finds
// the master through the sentinel, closed at cleanup. The options functions
// may change any field of the redis.FailoverOptions.
func (st *Sentinel) Client(opts ...func(*redis.FailoverOptions)) *redis.Client {
	o := &redis.FailoverOptions{MasterName: st.MasterName(), SentinelAddrs: st.SentinelAddrs()}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewFailoverClient(o)
	st.mu.Lock()
	st.clients = append(st.clients, c)
	st.mu.Unlock()
	return c
}

// Failover SIGKILLs the master and waits (up to 20 s) until the sentinel
// reports the replica's address for MasterName (SENTINEL
// get-master-addr-by-name) and the replica reports role:master. It returns the
// promoted replica, which Master returns from then on. It fails tb when there
// is no replica left to promote.
func (st *Sentinel) Failover(tb testing.TB) *Server {
	tb.Helper()
	st.mu.Lock()
	old, r := st.master, st.replica
	st.mu.Unlock()
	if r == nil {
		tb.Fatal("redistest: Failover: the master has no replica left to promote")
	}
	ctx, cancel := context.WithTimeout(tb.Context(), failoverWait)
	defer cancel()
	rc := adminClient(r)

	old.Kill()
	err := poll(ctx, "the sentinel to promote "+r.Addr(), func(ctx context.Context) error {
		addr, err := st.admin.GetMasterAddrByName(ctx, sentinelMasterName).Result()
		if err != nil {
			return fmt.Errorf("SENTINEL get-master-addr-by-name: %w", err)
		}
		if len(addr) != 2 || net.JoinHostPort(addr[0], addr[1]) != r.Addr() {
			return fmt.Errorf("sentinel reports master %v", addr)
		}
		return wantRole(ctx, rc, "master")
	})
	if err != nil {
		tb.Fatal(err)
	}
	st.mu.Lock()
	st.master, st.replica = r, nil
	st.mu.Unlock()
	return r
}
