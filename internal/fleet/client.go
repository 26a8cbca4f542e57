package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// EditOp is one settings edit the driver sent, and its answer.
type EditOp struct {
	Scenario   string
	Proc       int
	Repo       uint
	ID         string // the edit's id, which the row's settings list records
	Path       string
	Start, End time.Time
	Status     int   // 0: no answer
	Err        error // transport error
	Body       string
	Version    int      // of the row as written, on 200
	Fence      uint64   // likewise
	Span       interval // the critical section as the process reported it (X-Edit-Span), zero if none
	Lost       int64    // when the process saw its lock lost, 0 if it did not
	PausedAt   string   // the step it was paused at, if any
	// Stale: answered 200 saying its cached copies could not be dropped
	// after its COMMIT (X-Cache-Invalidation: pending): gormplugin retries
	// the invalidation in the background, and reads may return the old
	// value until then (see staleGrace).
	Stale bool
}

func (e EditOp) String() string {
	s := fmt.Sprintf("%s p%d %s %s %v..%v", e.ID, e.Proc, e.Path, e.answer(), clock(e.Start), clock(e.End))
	if e.PausedAt != "" {
		s += " paused at " + e.PausedAt
	}
	return s
}

func (e EditOp) answer() string {
	switch {
	case e.Err != nil:
		return "no answer (" + e.Err.Error() + ")"
	case e.Status == http.StatusOK:
		return fmt.Sprintf("200 v%d fence %d", e.Version, e.Fence)
	default:
		return fmt.Sprintf("%d %s", e.Status, strings.TrimSpace(e.Body))
	}
}

// clock formats a time of day with milliseconds, for histories.
func clock(t time.Time) string { return t.Format("15:04:05.000") }

// editRequest describes an edit to send.
type editRequest struct {
	proc       int
	repo       uint
	path       string // default /repos/<repo>/settings
	pauseAt    string // X-Pause-At
	tag        string // X-Hook-Tag
	ignoreLost bool   // X-Ignore-Lost: the transaction does not watch the lock's loss
	rename     bool   // PATCH /repos/<repo> (plain GORM calls, re-entering the request's lock) instead of PUT .../settings (gormplugin.Transaction)
	save       bool   // PATCH /repos/<repo>/settings (First, then Save of the struct read, under the request's lock, without gormplugin.Transaction)
}

// Edit sends one settings edit of repo to process proc and records it.
func (f *Fleet) Edit(ctx context.Context, proc int, repo uint) EditOp {
	return f.edit(ctx, editRequest{proc: proc, repo: repo})
}

func (f *Fleet) edit(ctx context.Context, r editRequest) EditOp {
	method := "PUT"
	switch {
	case r.path != "":
	case r.rename:
		method, r.path = "PATCH", fmt.Sprintf("/repos/%d", r.repo)
	case r.save:
		method, r.path = "PATCH", fmt.Sprintf("/repos/%d/settings", r.repo)
	default:
		r.path = fmt.Sprintf("/repos/%d/settings", r.repo)
	}
	op := EditOp{Scenario: f.Rec.scenario(), Proc: r.proc, Repo: r.repo, ID: f.NewID("e"), Path: method + " " + r.path, PausedAt: r.pauseAt}
	fields := map[string]string{"edit": op.ID}
	if r.rename {
		fields["name"] = "renamed-" + op.ID
	}
	body, _ := json.Marshal(fields)
	op.Start = time.Now()
	hdr := http.Header{}
	if r.pauseAt != "" {
		hdr.Set("X-Pause-At", r.pauseAt)
		hdr.Set("X-Hook-Tag", r.tag)
	}
	if r.ignoreLost {
		hdr.Set("X-Ignore-Lost", "1")
		op.PausedAt += " (ignoring lock loss)"
	}
	resp, err := f.do(ctx, r.proc, method, r.path, body, hdr)
	if err != nil {
		op.Err = err
	} else {
		op.Status = resp.StatusCode
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr != nil {
			op.Err, op.Status = rerr, 0
		}
		op.Span, op.Lost = parseSpan(resp.Header.Get("X-Edit-Span"))
		op.Stale = resp.Header.Get("X-Cache-Invalidation") == "pending"
		if op.Status == http.StatusOK {
			var row repoRow
			if err := json.Unmarshal(b, &row); err != nil {
				op.Body = string(b)
			}
			op.Version, op.Fence = row.Version, row.Fence
		} else {
			op.Body = truncate(string(b), 200)
		}
	}
	op.End = time.Now()
	f.Rec.addEdit(op)
	return op
}

// do sends one request to process proc.
func (f *Fleet) do(ctx context.Context, proc int, method, path string, body []byte, hdr http.Header) (*http.Response, error) {
	u := f.procs[proc].URL()
	if u == "" {
		return nil, errDown
	}
	req, err := http.NewRequestWithContext(ctx, method, u+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return f.client.Do(req)
}

// parseSpan reads X-Edit-Span: enter,exit,lost in Unix nanoseconds.
func parseSpan(h string) (interval, int64) {
	parts := strings.Split(h, ",")
	if len(parts) != 3 {
		return interval{}, 0
	}
	var n [3]int64
	for i, p := range parts {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return interval{}, 0
		}
		n[i] = v
	}
	end := n[1]
	if n[2] != 0 && n[2] < end {
		end = n[2] // the critical section ended when the lock was seen lost
	}
	return interval{n[0], end}, n[2]
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// Routes a read can take.
const (
	RouteGet  = "get"  // GET /repos/:id, through cacheguard.Get
	RouteList = "list" // GET /repos, through ginmw.Cache
)

// ReadOp is one read the driver sent, and its answer.
type ReadOp struct {
	Scenario   string
	Proc       int
	Route      string
	Repo       uint
	Start, End time.Time
	Status     int
	Err        error
	Version    int    // of Repo, on 200
	Cache      string // X-Cache
	Acked      int    // the newest version of Repo acknowledged before the read started
	Seen       int    // the newest version this process had returned on this route before the read started
	PausedAt   string
	// Excused: older than Acked or Seen only by edits answered Stale within
	// staleGrace before the read started (a documented window).
	Excused bool
}

func (r ReadOp) String() string {
	ans := fmt.Sprintf("%d v%d %s", r.Status, r.Version, r.Cache)
	if r.Err != nil {
		ans = "no answer (" + r.Err.Error() + ")"
	}
	return fmt.Sprintf("read p%d %s repo %d %s %v..%v (acked before: v%d, this process had served v%d)",
		r.Proc, r.Route, r.Repo, ans, clock(r.Start), clock(r.End), r.Acked, r.Seen)
}

// Read reads repo on process proc by route and records it, checking it
// against the acknowledged edits (read-your-writes) and the process's earlier
// answers (monotonic reads).
func (f *Fleet) Read(ctx context.Context, proc int, route string, repo uint) ReadOp {
	return f.read(ctx, proc, route, repo, "", "")
}

func (f *Fleet) read(ctx context.Context, proc int, route string, repo uint, pauseAt, tag string) ReadOp {
	op := ReadOp{Scenario: f.Rec.scenario(), Proc: proc, Route: route, Repo: repo, PausedAt: pauseAt}
	path := "/repos"
	if route == RouteGet {
		path = fmt.Sprintf("/repos/%d", repo)
	}
	f.procs[proc].mu.Lock()
	k := seenKey{proc: proc, run: f.procs[proc].runs, route: route, repo: repo}
	f.procs[proc].mu.Unlock()
	op.Acked, op.Seen = f.Rec.readStart(k)
	op.Start = time.Now()
	hdr := http.Header{}
	if pauseAt != "" {
		hdr.Set("X-Pause-At", pauseAt)
		hdr.Set("X-Hook-Tag", tag)
	}
	resp, err := f.do(ctx, proc, "GET", path, nil, hdr)
	if err != nil {
		op.Err = err
	} else {
		op.Status = resp.StatusCode
		op.Cache = resp.Header.Get("X-Cache")
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case rerr != nil:
			op.Err, op.Status = rerr, 0
		case op.Status != http.StatusOK:
		case route == RouteGet:
			var row repoRow
			if err := json.Unmarshal(b, &row); err != nil || row.ID != repo {
				op.Err = fmt.Errorf("bad body %q", truncate(string(b), 100))
			}
			op.Version = row.Version
		default:
			var rows []repoRow
			op.Err = json.Unmarshal(b, &rows)
			found := false
			for _, r := range rows {
				if r.ID == repo {
					op.Version, found = r.Version, true
				}
			}
			if op.Err == nil && !found {
				op.Err = fmt.Errorf("repository %d not in the list", repo)
			}
		}
	}
	op.End = time.Now()
	return f.Rec.addRead(op, k)
}
