package cacheguard_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
)

type Repo struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

// The wait policy (the default): one call across the fleet loads, the others
// wait for its value.
func ExampleGet() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	g := cacheguard.New(rdb)
	defer g.Close()
	g.Invalidate(ctx, "example:repo:42") // start cold

	loadRepo := func(ctx context.Context) (Repo, error) {
		fmt.Println("loading repo 42 from the database")
		return Repo{ID: 42, Name: "cacheguard"}, nil
	}
	for range 2 {
		var res cacheguard.Result
		repo, err := cacheguard.Get(ctx, g, "example:repo:42", loadRepo,
			cacheguard.TTL(time.Minute), cacheguard.ReportTo(&res))
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(res, repo.Name)
	}
	// Output:
	// loading repo 42 from the database
	// MISS cacheguard
	// HIT cacheguard
}

// The serve-stale policy: after its TTL a value is served at once for the
// stale window while one refresh runs in the background.
func ExampleGet_serveStale() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	g := cacheguard.New(rdb, cacheguard.TTL(20*time.Millisecond), cacheguard.ServeStale(time.Minute), cacheguard.Jitter(0))
	defer g.Close()
	g.Invalidate(ctx, "example:stale")

	version := 0
	load := func(ctx context.Context) (int, error) { version++; return version, nil }
	v, _ := cacheguard.Get(ctx, g, "example:stale", load)
	fmt.Println("loaded version", v)

	time.Sleep(30 * time.Millisecond) // the value's TTL passes
	var res cacheguard.Result
	v, _ = cacheguard.Get(ctx, g, "example:stale", load, cacheguard.ReportTo(&res))
	fmt.Println(res, "version", v)
	// Output:
	// loaded version 1
	// STALE version 1
}

// The fail-fast policy: a miss never waits; the fill runs in the background.
func ExampleGet_failFast() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	g := cacheguard.New(rdb)
	defer g.Close()
	g.Invalidate(ctx, "example:failfast")

	load := func(ctx context.Context) (string, error) { return "hello", nil }
	_, err := cacheguard.Get(ctx, g, "example:failfast", load, cacheguard.FailFast())
	fmt.Println(errors.Is(err, cacheguard.ErrMiss))
	// Output:
	// true
}

// A loader's ErrNotFound is cached as absent for the negative TTL.
func ExampleGet_notFound() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	g := cacheguard.New(rdb, cacheguard.NegativeTTL(10*time.Second))
	defer g.Close()
	g.Invalidate(ctx, "example:user:404")

	load := func(ctx context.Context) (Repo, error) {
		fmt.Println("querying the database")
		return Repo{}, fmt.Errorf("user 404: %w", cacheguard.ErrNotFound)
	}
	for range 2 {
		_, err := cacheguard.Get(ctx, g, "example:user:404", load)
		fmt.Println(errors.Is(err, cacheguard.ErrNotFound))
	}
	// Output:
	// querying the database
	// true
	// true
}

// Invalidate after a write: the next Get loads again, and a fill that started
// before the invalidation cannot store its now outdated value.
func ExampleGuard_Invalidate() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	g := cacheguard.New(rdb)
	defer g.Close()
	g.Invalidate(ctx, "example:settings")

	name := "old"
	load := func(ctx context.Context) (string, error) { return name, nil }
	v, _ := cacheguard.Get(ctx, g, "example:settings", load)
	fmt.Println(v)

	name = "new" // the database row changes...
	if err := g.Invalidate(ctx, "example:settings"); err != nil {
		fmt.Println(err)
	}
	v, _ = cacheguard.Get(ctx, g, "example:settings", load)
	fmt.Println(v)
	// Output:
	// old
	// new
}
