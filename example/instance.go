package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"
)

// instance is one running copy of the service, as a separate process would
// be: its own listener, Redis client, lock client, cache guard and database
// pool. Only the Redis server and the SQLite file are shared.
type instance struct {
	svc  *service
	rdb  redis.UniversalClient
	srv  *http.Server
	url  string        // http://host:port
	done chan struct{} // closed when Serve returned
	err  error         // what Serve returned, once done is closed
}

// startInstance starts an instance listening on listen ("127.0.0.1:0" for a
// free port). cfg.Redis is set to rdb, which the instance closes.
func startInstance(cfg serviceConfig, rdb redis.UniversalClient, listen string) (*instance, error) {
	cfg.Redis = rdb
	svc, err := newService(cfg)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		svc.Close()
		rdb.Close()
		return nil, err
	}
	in := &instance{
		svc:  svc,
		rdb:  rdb,
		srv:  &http.Server{Handler: svc.engine, ReadHeaderTimeout: 10 * time.Second},
		url:  "http://" + ln.Addr().String(),
		done: make(chan struct{}),
	}
	go func() {
		in.err = in.srv.Serve(ln)
		close(in.done)
	}()
	return in, nil
}

// Close stops accepting requests, waits for those in flight (until ctx ends),
// then shuts the service down within what is left of ctx, and closes the
// Redis client.
func (in *instance) Close(ctx context.Context) error {
	err := in.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		err = errors.Join(err, in.srv.Close())
	}
	<-in.done
	if !errors.Is(in.err, http.ErrServerClosed) {
		err = errors.Join(err, in.err)
	}
	return errors.Join(err, in.svc.Shutdown(ctx), in.rdb.Close())
}

// closeAll closes instances, allowing each a few seconds to finish its requests.
func closeAll(ins []*instance) error {
	var errs []error
	for _, in := range ins {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, in.Close(ctx))
		cancel()
	}
	return errors.Join(errs...)
}

// workdir is a temporary directory holding a new SQLite database with its
// schema and seed rows; remove deletes it.
func workdir() (dbPath string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "cacheguard-example-")
	if err != nil {
		return "", nil, err
	}
	remove = func() { os.RemoveAll(dir) }
	dbPath = filepath.Join(dir, "repos.db")
	if err := createSchema(dbPath); err != nil {
		remove()
		return "", nil, err
	}
	return dbPath, remove, nil
}

// runPrefix returns a key prefix unique to this run, so a run against a shared
// Redis starts cold and never meets another run's keys.
func runPrefix() string {
	b := make([]byte, 4)
	rand.Read(b) //nolint:errcheck // never fails
	return "cgexample:" + hex.EncodeToString(b) + ":"
}

// dropKeys deletes the keys under prefix (best effort, when leaving a Redis
// that outlives the run), on every master of a cluster.
func dropKeys(ctx context.Context, rdb redis.UniversalClient, prefix string) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return dropNodeKeys(ctx, node, prefix)
		})
	}
	return dropNodeKeys(ctx, rdb, prefix)
}

// dropNodeKeys deletes the keys under prefix on one server, one at a time
// on a cluster node (a batch would cross slots).
func dropNodeKeys(ctx context.Context, rdb redis.Cmdable, prefix string) error {
	iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
	var batch []string
	flush := func() error {
		for _, k := range batch {
			if err := rdb.Unlink(ctx, k).Err(); err != nil {
				return err
			}
		}
		batch = batch[:0]
		return nil
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	return flush()
}
