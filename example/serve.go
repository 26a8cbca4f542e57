package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cacheguard/cacheguard/ginmw"
)

// serve runs one instance on a new database until ctx ends (SIGINT or
// SIGTERM), then closes everything.
func serve(ctx context.Context, r *redisServer, o options, out io.Writer) (err error) {
	dbPath, remove, err := workdir()
	if err != nil {
		return err
	}
	defer remove()
	wait := ginmw.DefaultWait
	if o.waitSet {
		wait = o.demo.EditWait
	}
	prefix := runPrefix()
	cfg := serviceConfig{
		DBPath:    dbPath,
		Prefix:    prefix,
		Pool:      8,
		QueryCost: o.demo.QueryCost,
		EditWait:  wait,
		Meter:     &meter{},
		Log:       out,
	}
	in, err := startInstance(cfg, r.client(), o.listen)
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, closeAll([]*instance{in}))
		if r.embedded == nil { // leave a shared Redis as it was found
			rdb := r.client()
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = errors.Join(err, dropKeys(dctx, rdb, prefix), rdb.Close())
			cancel()
		}
	}()

	u := in.url
	fmt.Fprintf(out, `cacheguard example serving on %s
  redis   %s (keys under %q)
  sqlite  %s; a repository query holds a connection for %v

try:
  curl -i %s/repos/1      # cacheguard.Get: X-Cache MISS, then HIT
  curl -i %s/repos        # ginmw.Cache on the list: X-Cache MISS, then HIT
  curl -i -X PUT %s/repos/1/settings \
       -H 'Content-Type: application/json' -d '{"edit":"e1","default_branch":"trunk"}'
                          # ginmw.Lock + gormplugin: version and fence go up
  curl -i %s/repos/1      # the edit, read back: the commit invalidated the cache
  curl -s %s/stats        # this instance's cache counters

Ctrl-C stops.
`, u, r.desc, prefix, dbPath, cfg.QueryCost, u, u, u, u, u)

	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "stopping")
		return nil
	case <-in.done:
		return fmt.Errorf("server stopped: %w", in.err)
	}
}
