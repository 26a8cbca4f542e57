package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// testEdge sends bad ids and bodies at the HTTP edge, and cold-key
// stampedes at both cached routes.
func testEdge(t *testing.T) {
	f := Start(t, Config{CacheTTL: 3 * time.Second})
	ctx := t.Context()

	s := f.Scenario(t, rep, "bad ids and bodies at the HTTP edge")
	// "01" is an alias of 1: the handler edits row 1, under the lock
	// "repos:01" (14.5); the others are not ids at all.
	badIDs := []string{"0", "-1", "abc", "01", "+1", "1e3", "0x1", "99999999999999999999", "%20", "1%2F2", strings.Repeat("7", 200)}
	type req struct{ method, path, body string }
	var reqs []req
	for _, id := range badIDs {
		reqs = append(reqs, req{"GET", "/repos/" + id, ""}, req{"PUT", "/repos/" + id + "/settings", `{"edit":"bad-id"}`})
	}
	for _, body := range []string{"nope", "{}", `{"edit":""}`, `{"edit":5}`, `{"edit":"x","visibility":"secret"}`,
		`{"edit":"` + strings.Repeat("y", 65) + `"}`, `{"edit":"x","default_branch":""}`, `{"edit":"` + strings.Repeat("z", 2<<20) + `"}`} {
		reqs = append(reqs, req{"PUT", "/repos/1/settings", body})
	}
	reqs = append(reqs, req{"GET", "/repos?" + strings.Repeat("q=1&", 500), ""}, req{"DELETE", "/repos/1", ""}, req{"HEAD", "/repos", ""})
	var fiveXX, accepted []string
	for i, r := range reqs {
		status, body, err := f.raw(ctx, i%f.Procs(), r.method, r.path, r.body)
		line := fmt.Sprintf("%s %s (%d bytes): %d %s %v", r.method, truncate(r.path, 40), len(r.body), status, truncate(body, 80), err)
		switch {
		case err != nil || status >= 500:
			fiveXX = append(fiveXX, line)
		case r.method == "PUT" && status == http.StatusOK && !strings.HasPrefix(r.path, "/repos/01/"):
			accepted = append(accepted, line)
		}
	}
	s.Count(InvEdge5xx, len(fiveXX), nil, fiveXX...)
	s.Count("bad edits answered 200", len(accepted), nil, accepted...)
	var left []string
	for _, id := range badIDs {
		keys, err := f.Keys(ctx, "*{repos:"+id+"}*")
		if err != nil {
			t.Fatal(err)
		}
		left = append(left, keys...)
	}
	// ginmw.Lock takes the lock before the handler validates the id (14.5),
	// and each lock name leaves a fence counter for days (13.9).
	s.Count(InvKeysLeft, len(left), []string{"14.5", "13.9"}, left...)
	s.Figure("bad requests sent", fmt.Sprint(len(reqs)))
	s.CheckProcs(nil)
	s.Done()

	s = f.Scenario(t, rep, "cold-key stampede, 40 reads over 4 processes")
	repo := f.FreshRepo()
	n := f.stampede(ctx, t, RouteGet, repo, 40)
	s.Count(InvLoads+" (first read of a key)", max(n-1, 0), nil)
	s.Figure("loads, first read of a key", fmt.Sprint(n))
	expired := time.Now().Add(3 * f.Cfg.CacheTTL)
	for {
		keys, err := f.Keys(ctx, fmt.Sprintf("v:{repo:%d}", repo))
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		if time.Now().After(expired) {
			t.Fatalf("the cached repository %d did not expire within %v", repo, 3*f.Cfg.CacheTTL)
		}
		hold(ctx, 100*time.Millisecond)
	}
	n = f.stampede(ctx, t, RouteGet, repo, 40)
	s.Count(InvLoads+" (after expiry)", max(n-1, 0), nil)
	s.Figure("loads, after expiry", fmt.Sprint(n))
	f.Edit(ctx, 0, repo) // invalidates the list too
	n = f.stampede(ctx, t, RouteList, repo, 40)
	s.Count(InvLoads+" (ginmw.Cache, after an invalidation)", max(n-1, 0), nil)
	s.Figure("loads, ginmw.Cache after an invalidation", fmt.Sprint(n))
	s.CheckReads(readIssues, false)
	s.Done()

	// The harness's own retry (parkEdit): an edit refused before its step
	// (here: its lock held by an edit parked on another process, for longer
	// than its wait budget) is sent again, parkTries times in all, and each
	// refusal is logged and checked like any edit.
	s = f.Scenario(t, rep, "harness: an edit refused before its step is sent again")
	repo = f.FreshRepo()
	var held EditOp
	pk, err := f.park(ctx, 1, StepAfterRead, func(tag string) {
		held = f.edit(ctx, editRequest{proc: 1, repo: repo, pauseAt: StepAfterRead, tag: tag})
	})
	if err != nil {
		t.Fatal(err)
	}
	_, refused, err := f.parkEdit(ctx, editRequest{proc: 0, repo: repo, pauseAt: StepAfterRead})
	if !errors.Is(err, errNotReached) || !refusal(refused.Status) {
		t.Errorf("an edit waiting for a held lock: got %v, want %v after a refusal", err, errNotReached)
	}
	if err := f.release(ctx, pk.proc, pk.tag); err != nil {
		t.Fatal(err)
	}
	<-pk.done
	f.mu.Lock()
	again := 0
	for _, e := range f.faults {
		if strings.Contains(e.what, "sent again") {
			again++
		}
	}
	f.mu.Unlock()
	if again != parkTries-1 {
		t.Errorf("edits sent again: %d, want %d", again, parkTries-1)
	}
	s.CheckEdits(ctx, nil)
	s.Figure("the held edit", held.answer())
	s.Figure("the refused edit (last try)", refused.answer())
	s.Done()
}

// stampede sends n reads of repo by route at once, spread over the
// processes, and returns the cache loads they caused.
func (f *Fleet) stampede(ctx context.Context, t *testing.T, route string, repo uint, n int) int {
	t.Helper()
	before, err := f.CacheLoads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			f.Read(ctx, i%f.Procs(), route, repo)
		})
	}
	close(start)
	wg.Wait()
	after, err := f.CacheLoads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return int(after - before)
}

// raw sends one request and returns its status and body.
func (f *Fleet) raw(ctx context.Context, proc int, method, path, body string) (int, string, error) {
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	resp, err := f.do(ctx, proc, method, path, b, nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out), err
}
