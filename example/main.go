// Command example is a small repository-settings service built on cacheguard:
// reads through cacheguard.Get and ginmw.Cache, settings edits and renames
// under ginmw.Lock with gormplugin's row guard, fence column and
// invalidate-after-commit.
//
// By default it runs a short demonstration against an embedded Redis and a
// SQLite file in a temporary directory, and exits:
//
//	go run ./example
//	go run ./example serve                 # keep serving; prints curl lines to try
//	go run ./example -redis 127.0.0.1:6379 # a real Redis (or REDIS_URL=rediss://:password@host:port/0)
//
// Several serve processes make one service when they share a Redis, a
// database and a key prefix:
//
//	go run ./example serve -redis 127.0.0.1:6379 -db /tmp/repos.db -prefix svc: -listen :8081
//	go run ./example serve -redis 127.0.0.1:6379 -db /tmp/repos.db -prefix svc: -listen :8082
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/locks"
)

const usage = `usage: go run ./example [flags] [demo|serve]

  demo   (default) start %[1]d instances, fire a burst of concurrent reads at a
         cold repository and concurrent conflicting settings edits, print a table
  serve  serve one instance until interrupted, printing curl lines to try

flags:
  -redis addr      Redis to use: host:port or a redis:// or rediss:// URL
                   (password, database and TLS through the URL); default
                   $REDIS_URL, else an embedded in-process server
  -instances n     demo: instances of the service (default %[1]d)
  -requests n      demo: concurrent reads in each burst (default %[2]d)
  -edits n         demo: concurrent settings edits (default %[3]d)
  -edit-wait d     how long an edit waits for the repository's lock before
                   409 (default %[4]s in the demo, %[6]s in serve)
  -listen addr     serve: address to listen on (default %[5]s, a free port)
  -db dsn          serve: the database, a SQLite file or a postgres:// URL,
                   shared by every process of the service (its table is
                   created and seeded when missing); default a new SQLite
                   file in a temporary directory
  -prefix p        serve: the prefix of every Redis key, shared by every
                   process of the service; default a new one per run (whose
                   keys are deleted at exit)
  -cluster         -redis names a node of a Redis Cluster
  -lease d         the repository locks' lease, renewed while held (default %[7]s)
  -cache-ttl d     how long a cached repository or list stays fresh (default %[8]s)
  -near-cache n    keep up to n decoded values in each process too (cacheguard
                   NearCache, invalidated across processes within ~1ms; reads
                   that begin within that window after another process's edit
                   may still see the old value); default off
  -redlock a,b,c   serve: take the repository locks as a Redlock on these
                   independent redis-servers (no fence tokens: the GORM plugin
                   runs without fencing); default: locks on -redis
  -quiet           serve: no request log

test-only flags (for the end-to-end suite in internal/fleet; not for a deployment):
  -hooks           enable pause points: a request with X-Pause-At: <step>
                   stops at that step until released (see testhooks.go)
  -control name    with -hooks, switch a protection off to show what it
                   prevents: no-plugin, no-fencing or no-invalidate
`

// options are the parsed command line.
type options struct {
	mode      string
	redis     string
	cluster   bool // -redis names a cluster node
	listen    string
	db        string // serve: "" for a new SQLite file
	prefix    string // serve: "" for a new one
	lease     time.Duration
	cacheTTL  time.Duration
	nearCache int
	redlock   string // serve: lock servers for a Redlock, comma-separated
	quiet     bool
	hooks     bool   // test-only pause points
	control   string // test-only: a protection switched off
	demo      demoConfig
	waitSet   bool // -edit-wait was given
}

func main() {
	gin.SetMode(gin.ReleaseMode)
	redis.SetLogger(quietRedis{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// quietRedis drops go-redis's own log lines (dial retries and the like): the
// program reports Redis failures itself, in one line.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// run is the whole program: it returns the exit code (2 for bad usage, 1 for
// a failure).
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	opts, err := parse(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		printUsage(stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "example: %v (go run ./example -h for usage)\n", err)
		return 2
	}
	r, err := openRedis(ctx, opts.redis, opts.cluster)
	if err != nil {
		fmt.Fprintf(stderr, "example: %v\n", err)
		return 1
	}
	defer r.Close()
	if opts.mode == "serve" {
		err = serve(ctx, r, opts, stdout)
	} else {
		err = demo(ctx, r, opts.demo, stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "example: %v\n", err)
		return 1
	}
	return 0
}

func printUsage(w io.Writer) {
	d := defaultDemo()
	fmt.Fprintf(w, usage, d.Instances, d.Requests, d.Edits, d.EditWait, defaultListen, defaultEditWait, defaultLease, defaultCacheTTL)
}

const defaultListen = "127.0.0.1:0"

// defaultLease is the repository locks' lease (locks' own default).
const defaultLease = 10 * time.Second

// defaultEditWait is how long a served edit waits for its repository's lock
// before it is answered 409: ginmw.Lock's own default.
const defaultEditWait = 5 * time.Second

// parse reads flags before and after the mode word ("serve -listen :8080"
// and "-listen :8080 serve" both work).
func parse(args []string, getenv func(string) string) (options, error) {
	o := options{mode: "demo", redis: getenv("REDIS_URL"), listen: defaultListen, lease: defaultLease, cacheTTL: defaultCacheTTL, demo: defaultDemo()}
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.redis, "redis", o.redis, "")
	fs.StringVar(&o.listen, "listen", o.listen, "")
	fs.IntVar(&o.demo.Instances, "instances", o.demo.Instances, "")
	fs.IntVar(&o.demo.Requests, "requests", o.demo.Requests, "")
	fs.IntVar(&o.demo.Edits, "edits", o.demo.Edits, "")
	fs.DurationVar(&o.demo.EditWait, "edit-wait", o.demo.EditWait, "")
	fs.BoolVar(&o.cluster, "cluster", false, "")
	fs.StringVar(&o.db, "db", "", "")
	fs.StringVar(&o.prefix, "prefix", "", "")
	fs.DurationVar(&o.lease, "lease", o.lease, "")
	fs.DurationVar(&o.cacheTTL, "cache-ttl", o.cacheTTL, "")
	fs.IntVar(&o.nearCache, "near-cache", 0, "")
	fs.StringVar(&o.redlock, "redlock", "", "")
	fs.BoolVar(&o.quiet, "quiet", false, "")
	fs.BoolVar(&o.hooks, "hooks", false, "")
	fs.StringVar(&o.control, "control", "", "")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if rest := fs.Args(); len(rest) > 0 {
		o.mode = rest[0]
		if err := fs.Parse(rest[1:]); err != nil {
			return o, err
		}
		if fs.NArg() > 0 {
			return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
		}
	}
	fs.Visit(func(f *flag.Flag) { o.waitSet = o.waitSet || f.Name == "edit-wait" })
	switch {
	case o.mode != "demo" && o.mode != "serve":
		return o, fmt.Errorf("unknown mode %q: want demo or serve", o.mode)
	case o.demo.Instances < 1 || o.demo.Instances > 64:
		return o, fmt.Errorf("-instances %d: want 1 to 64", o.demo.Instances)
	case o.demo.Requests < 1 || o.demo.Requests > 5000:
		return o, fmt.Errorf("-requests %d: want 1 to 5000", o.demo.Requests)
	case o.demo.Edits < 1 || o.demo.Edits > 1000:
		return o, fmt.Errorf("-edits %d: want 1 to 1000", o.demo.Edits)
	case o.demo.EditWait < 0:
		return o, fmt.Errorf("-edit-wait %v: must not be negative", o.demo.EditWait)
	case o.lease < 10*time.Millisecond:
		return o, fmt.Errorf("-lease %v: want at least 10ms", o.lease)
	case o.nearCache < 0:
		return o, fmt.Errorf("-near-cache %d: must not be negative", o.nearCache)
	case o.cacheTTL < time.Millisecond:
		return o, fmt.Errorf("-cache-ttl %v: want at least 1ms", o.cacheTTL)
	case o.control != "" && !o.hooks:
		return o, fmt.Errorf("-control %s: only with -hooks (it switches a protection off)", o.control)
	case o.control != "" && !validControl(o.control):
		return o, fmt.Errorf("-control %q: want one of %s", o.control, strings.Join(controls, ", "))
	case o.cluster && o.redis == "":
		return o, fmt.Errorf("-cluster: needs -redis (the embedded server is not a cluster)")
	}
	if o.db != "" {
		if _, err := dialector(o.db); err != nil {
			return o, err
		}
	}
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		return o, fmt.Errorf("-listen %q: %v", o.listen, err)
	}
	if o.redis != "" {
		if _, err := redisOptions(o.redis); err != nil {
			return o, err
		}
	}
	return o, nil
}

// redisOptions turns host:port or a redis:// / rediss:// URL into client options.
func redisOptions(spec string) (*redis.Options, error) {
	if strings.Contains(spec, "://") {
		o, err := redis.ParseURL(spec)
		if err != nil {
			return nil, fmt.Errorf("bad Redis URL: %v", err)
		}
		return o, nil
	}
	host, port, err := net.SplitHostPort(spec)
	if err != nil || port == "" {
		return nil, fmt.Errorf("bad Redis address %q: want host:port or a redis:// URL", spec)
	}
	if host == "" {
		spec = "127.0.0.1:" + port
	}
	return &redis.Options{Addr: spec}, nil
}

// redisServer is where the instances' clients connect: a real server, or an
// embedded one started for this run.
type redisServer struct {
	opts     *redis.Options
	cluster  bool      // opts.Addr is a node of a Redis Cluster
	embedded *embedded // nil for a real server
	desc     string    // for the banner
}

// openRedis starts the embedded server when spec is empty, or checks that the
// real one answers a PING within a few seconds.
func openRedis(ctx context.Context, spec string, cluster bool) (*redisServer, error) {
	if spec == "" {
		e, err := startEmbedded()
		if err != nil {
			return nil, err
		}
		return &redisServer{
			opts:     &redis.Options{Addr: e.Addr()},
			embedded: e,
			desc:     "embedded (miniredis) at " + e.Addr(),
		}, nil
	}
	opts, err := redisOptions(spec)
	if err != nil {
		return nil, err
	}
	r := &redisServer{opts: opts, cluster: cluster, desc: opts.Addr}
	if cluster {
		r.desc = "cluster at " + opts.Addr
	}
	if opts.TLSConfig != nil {
		r.desc += " (TLS)"
	}
	probe := *opts
	probe.MaxRetries = -1 // one attempt
	probe.DialTimeout = 2 * time.Second
	rdb := redis.NewClient(&probe)
	defer rdb.Close()
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		var nerr net.Error
		if errors.As(err, &nerr) || errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("cannot reach Redis at %s: %v", opts.Addr, err)
		}
		return nil, fmt.Errorf("the Redis at %s refused the connection: %v", opts.Addr, err)
	}
	return r, nil
}

// client returns a new client of its own, as a separate process would have:
// a cluster client when the server is a cluster node. As the README's
// client, it bounds its socket calls by their contexts
// (ContextTimeoutEnabled), so each command ends at its command timeout when
// Redis stalls; a circuit breaker on it, shared by the locks, the cache and
// the GORM plugin, then makes every call fail at once while Redis is down or
// stalled instead of waiting for go-redis's retries and timeouts.
// When m is not nil, the breaker's openings and closings are stamped on it
// (GET /stats), for the end-to-end suite's figures.
func (r *redisServer) client(m *meter) redis.UniversalClient {
	o := *r.opts
	o.ContextTimeoutEnabled = true
	var rdb redis.UniversalClient
	if r.cluster {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 []string{o.Addr},
			Username:              o.Username,
			Password:              o.Password,
			TLSConfig:             o.TLSConfig,
			ContextTimeoutEnabled: true,
		})
	} else {
		rdb = redis.NewClient(&o)
	}
	b := &locks.Breaker{}
	if m != nil {
		b.Observer = m.breaker
	}
	rdb.AddHook(b)
	return rdb
}

// Close stops the embedded server, if any.
func (r *redisServer) Close() {
	if r.embedded != nil {
		r.embedded.Close()
	}
}
