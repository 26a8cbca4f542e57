package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/locks"
)

// serve runs one instance until ctx ends (SIGINT or SIGTERM), then closes
// everything. Without -db it works on a new SQLite file; without -prefix on
// keys of its own, which it deletes from a real Redis at exit.
func serve(ctx context.Context, r *redisServer, o options, out io.Writer) (err error) {
	dsn := o.db
	if dsn == "" {
		dbPath, remove, err := workdir()
		if err != nil {
			return err
		}
		defer remove()
		dsn = dbPath
	} else if err := createSchema(dsn); err != nil {
		return err
	}
	wait := defaultEditWait
	if o.waitSet {
		wait = o.demo.EditWait
	}
	prefix, shared := o.prefix, o.prefix != ""
	if !shared {
		prefix = runPrefix()
	}
	cfg := serviceConfig{
		DB:        dsn,
		Prefix:    prefix,
		Pool:      8,
		QueryCost: o.demo.QueryCost,
		EditWait:  wait,
		Lease:     o.lease,
		CacheTTL:  o.cacheTTL,
		NearCache: o.nearCache,
		Meter:     &meter{},
		Log:       out,
	}
	if o.quiet {
		cfg.Log = nil
	}
	if o.redlock != "" {
		for _, addr := range strings.Split(o.redlock, ",") {
			c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
			c.AddHook(&locks.Breaker{})
			defer c.Close()
			cfg.LockServers = append(cfg.LockServers, c)
		}
	}
	if o.hooks {
		cfg.TestHooks = newTestHooks(out, o.control)
	}
	in, err := startInstance(cfg, r.client(cfg.Meter), o.listen)
	if err != nil {
		cfg.TestHooks.close()
		return err
	}
	defer func() {
		// Requests parked by the test-only hooks stay parked through the
		// shutdown, as slow requests would be: it waits for them (up to its
		// grace), then closes the service, which ends parked cache loads.
		err = errors.Join(err, closeAll([]*instance{in}))
		cfg.TestHooks.close()
		if r.embedded == nil && !shared { // leave a shared Redis as it was found
			rdb := r.client(nil)
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = errors.Join(err, dropKeys(dctx, rdb, prefix), rdb.Close())
			cancel()
		}
	}()

	u := in.url
	fmt.Fprintf(out, `cacheguard example serving on %s
  redis   %s (keys under %q)
  db      %s; a repository query holds a connection for %v

try:
  curl -i %s/repos/1      # cacheguard.Get: X-Cache MISS, then HIT
  curl -i %s/repos        # ginmw.Cache on the list: X-Cache MISS, then HIT
  curl -i -X PUT %s/repos/1/settings \
       -H 'Content-Type: application/json' -d '{"edit":"e1","default_branch":"trunk"}'
                          # ginmw.Lock + gormplugin: version and fence go up
  curl -i -X PATCH %s/repos/1/settings \
       -H 'Content-Type: application/json' -d '{"edit":"e3","visibility":"public"}'
                          # the same edit as First and Save under the lock (no Transaction)
  curl -i -X PATCH %s/repos/1 \
       -H 'Content-Type: application/json' -d '{"edit":"e2","name":"acme/api2"}'
                          # a rename: plain GORM First and Updates under the same lock
  curl -i %s/repos/1      # the edits, read back: the commits invalidated the cache
  curl -s %s/stats        # this instance's cache counters

Ctrl-C stops.
`, u, r.desc, prefix, redactDSN(dsn), cfg.QueryCost, u, u, u, u, u, u, u)

	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "stopping")
		return nil
	case <-in.done:
		return fmt.Errorf("server stopped: %w", in.err)
	}
}
