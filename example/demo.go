package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// demoConfig sizes the demonstration.
type demoConfig struct {
	Instances int           // copies of the service, each with its own clients
	Requests  int           // concurrent GETs in each burst
	Edits     int           // concurrent conflicting settings edits
	EditWait  time.Duration // an edit's wait budget for the lock, then 409
	EditCost  time.Duration // an edit's time between its read and its write
	QueryCost time.Duration // how long a repository query holds a connection
	Pool      int           // database connections per instance
}

func defaultDemo() demoConfig {
	return demoConfig{
		Instances: 3,
		Requests:  1000,
		Edits:     20,
		EditWait:  250 * time.Millisecond,
		EditCost:  20 * time.Millisecond,
		QueryCost: 20 * time.Millisecond,
		Pool:      4,
	}
}

// demoRepo is the repository the demonstration reads and edits.
const demoRepo = 1

// demo runs the demonstration on r, prints its table, and fails when an
// invariant broke.
func demo(ctx context.Context, r *redisServer, cfg demoConfig, out io.Writer) error {
	fmt.Fprintf(out, "cacheguard demo: %d instances of a repository-settings service, each with its own\n", cfg.Instances)
	fmt.Fprintf(out, "Redis client, lock client, cache guard and database pool (%d connections).\n", cfg.Pool)
	fmt.Fprintf(out, "  redis   %s\n", r.desc)
	rep, err := runDemo(ctx, cfg, func() redis.UniversalClient { return r.client(nil) }, out)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	printReport(out, cfg, rep)
	if err := rep.ok(); err != nil {
		return fmt.Errorf("invariant broken: %w", err)
	}
	return nil
}

// runDemo starts the instances on a new database, runs the bursts and the
// edits, and closes everything. newClient makes each instance's Redis client.
func runDemo(ctx context.Context, cfg demoConfig, newClient func() redis.UniversalClient, out io.Writer) (rep *report, err error) {
	dbPath, remove, err := workdir()
	if err != nil {
		return nil, err
	}
	defer remove()
	fmt.Fprintf(out, "  sqlite  %s (WAL); a repository query holds a connection for %v\n", dbPath, cfg.QueryCost)

	prefix := runPrefix()
	m := &meter{}
	base := serviceConfig{
		DB:        dbPath,
		Prefix:    prefix,
		Pool:      cfg.Pool,
		QueryCost: cfg.QueryCost,
		EditCost:  cfg.EditCost,
		EditWait:  cfg.EditWait,
		Meter:     m,
	}
	var ins []*instance
	defer func() {
		err = errors.Join(err, closeAll(ins))
		rdb := newClient()
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = errors.Join(err, dropKeys(dctx, rdb, prefix), rdb.Close())
		cancel()
	}()
	urls := make([]string, 0, cfg.Instances)
	for range cfg.Instances {
		in, err := startInstance(base, newClient(), "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ins = append(ins, in)
		urls = append(urls, in.url)
	}
	fmt.Fprintf(out, "  serving %s\n\n", strings.Join(urls, "  "))

	// Warm up on another repository: every instance's pools (database,
	// Redis, pub/sub, scripts), the runtime, and as many HTTP connections as
	// a burst sends requests (cache hits by then), so that neither burst pays
	// for first connections and each burst's requests arrive together.
	client := newHTTPClient(cfg.Requests)
	defer client.CloseIdleConnections()
	fmt.Fprintf(out, "warm-up    %d concurrent GETs of another repository:", cfg.Requests)
	for _, w := range []struct {
		path string
		n    int
	}{{"/repos/2", 2 * cfg.Pool * cfg.Instances}, {"/naive/repos/2", 2 * cfg.Pool * cfg.Instances}, {"/repos/2", cfg.Requests}} {
		if _, err := burst(ctx, client, urls, w.path, w.n, 2, io.Discard); err != nil {
			return nil, err
		}
	}
	fmt.Fprintln(out, " done")

	rep = &report{}
	path := fmt.Sprintf("/repos/%d", demoRepo)
	fmt.Fprintf(out, "burst 1/2  %d concurrent GET %s (cacheguard.Get) on a cold key:", cfg.Requests, path)
	before := m.queries.Load()
	if rep.Guarded, err = burst(ctx, client, urls, path, cfg.Requests, demoRepo, out); err != nil {
		return nil, err
	}
	rep.Guarded.Loads = m.queries.Load() - before

	path = fmt.Sprintf("/naive/repos/%d", demoRepo)
	fmt.Fprintf(out, "burst 2/2  %d concurrent GET %s (plain cache-aside) on a cold key:", cfg.Requests, path)
	before = m.queries.Load()
	if rep.Naive, err = burst(ctx, client, urls, path, cfg.Requests, demoRepo, out); err != nil {
		return nil, err
	}
	rep.Naive.Loads = m.queries.Load() - before

	fmt.Fprintf(out, "edits      %d concurrent PUT /repos/%d/settings (ginmw.Lock, wait %v):", cfg.Edits, demoRepo, cfg.EditWait)
	results, err := editBurst(ctx, client, urls, cfg.Edits, out)
	if err != nil {
		return nil, err
	}
	var final Repo
	if err := ins[0].svc.db.WithContext(ctx).First(&final, demoRepo).Error; err != nil {
		return nil, fmt.Errorf("read the final row: %w", err)
	}
	rep.Edits = checkEdits(results, final)
	rep.Edits.MaxConcurrent = m.maxEdit.Load()
	if rep.Edits.MaxConcurrent > 1 {
		rep.Edits.Problems = append(rep.Edits.Problems,
			fmt.Sprintf("%d edits were inside the critical section at once", rep.Edits.MaxConcurrent))
	}

	if rep.Reads, err = readBack(ctx, client, urls, final.Version); err != nil {
		return nil, err
	}
	return rep, nil
}

// progress prints a mark each time another quarter of a burst has completed.
type progress struct {
	mu    sync.Mutex // guards done and writes to w
	w     io.Writer
	total int
	done  int
}

func (p *progress) step() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	if p.done*4/p.total != (p.done-1)*4/p.total {
		fmt.Fprintf(p.w, " %d", p.done)
	}
}

func (p *progress) end(elapsed time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, " (%v)\n", round(elapsed))
}

// fire sends n requests at once through client, each from its own goroutine
// released by one barrier, and calls done with each answer. It returns when
// every request has been answered.
func fire(ctx context.Context, client *http.Client, n int, req func(i int) (*http.Request, error), done func(i int, status int, body []byte, took time.Duration, err error), out io.Writer) (time.Duration, error) {
	p := &progress{w: out, total: n}
	reqs := make([]*http.Request, n)
	for i := range reqs {
		r, err := req(i)
		if err != nil {
			return 0, err
		}
		reqs[i] = r.WithContext(ctx)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			resp, err := client.Do(r)
			var body []byte
			status := 0
			if err == nil {
				body, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				status = resp.StatusCode
			}
			done(i, status, body, time.Since(t0), err)
			p.step()
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	p.end(elapsed)
	return elapsed, ctx.Err()
}

// newHTTPClient returns an HTTP client that keeps up to n connections per
// instance open between bursts.
func newHTTPClient(n int) *http.Client {
	return &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: n, DisableCompression: true},
		Timeout:   30 * time.Second,
	}
}

// burst GETs path n times at once across the instances; a 200 must carry
// repository id.
func burst(ctx context.Context, client *http.Client, urls []string, path string, n int, id uint, out io.Writer) (burstStats, error) {
	lat := make([]time.Duration, n)
	failed := make([]bool, n)
	elapsed, err := fire(ctx, client, n,
		func(i int) (*http.Request, error) { return http.NewRequest("GET", urls[i%len(urls)]+path, nil) },
		func(i, status int, body []byte, took time.Duration, err error) {
			lat[i] = took
			var r Repo
			failed[i] = err != nil || status != http.StatusOK || json.Unmarshal(body, &r) != nil || r.ID != id
		}, out)
	if err != nil {
		return burstStats{}, err
	}
	s := burstStats{Requests: n, Elapsed: elapsed}
	for _, f := range failed {
		if f {
			s.Failed++
		}
	}
	slices.Sort(lat)
	s.P50, s.P99 = percentile(lat, 50), percentile(lat, 99)
	return s, nil
}

// editResult is one settings edit's answer.
type editResult struct {
	ID     string
	Status int
	Repo   Repo // the row as written, for a 200
	Err    error
}

// editBurst sends n conflicting edits of the demo repository at once.
func editBurst(ctx context.Context, client *http.Client, urls []string, n int, out io.Writer) ([]editResult, error) {
	results := make([]editResult, n)
	_, err := fire(ctx, client, n,
		func(i int) (*http.Request, error) {
			results[i].ID = fmt.Sprintf("edit-%02d", i+1)
			body, _ := json.Marshal(map[string]string{"edit": results[i].ID})
			url := fmt.Sprintf("%s/repos/%d/settings", urls[i%len(urls)], demoRepo)
			r, err := http.NewRequest("PUT", url, bytes.NewReader(body))
			if err == nil {
				r.Header.Set("Content-Type", "application/json")
			}
			return r, err
		},
		func(i, status int, body []byte, _ time.Duration, err error) {
			results[i].Status, results[i].Err = status, err
			if err == nil && status == http.StatusOK {
				results[i].Err = json.Unmarshal(body, &results[i].Repo)
			}
		}, out)
	return results, err
}

// readBack asks every instance for the repository, and one for the cached
// list: after the edits' commits invalidated both, all must serve version want.
func readBack(ctx context.Context, client *http.Client, urls []string, want int) (readStats, error) {
	s := readStats{Instances: len(urls)}
	get := func(url string, v any) error {
		req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return json.NewDecoder(resp.Body).Decode(v)
	}
	for _, u := range urls {
		var r Repo
		if err := get(fmt.Sprintf("%s/repos/%d", u, demoRepo), &r); err != nil {
			return s, err
		}
		if r.Version == want {
			s.Fresh++
		}
	}
	var list []Repo
	if err := get(urls[0]+"/repos", &list); err != nil {
		return s, err
	}
	for _, r := range list {
		if r.ID == demoRepo {
			s.ListFresh = r.Version == want
		}
	}
	return s, nil
}
