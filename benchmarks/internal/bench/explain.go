package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cacheguard/cacheguard/benchmarks/internal/stats"
)

// Explain reads the trace of one real-database mix run (a file cgbench
// -trace wrote) and writes what its failed requests were waiting for, with
// the counts that tell a starved database from a cacheguard wake-up that
// went wrong: for each failed request, whether a query of its key ran until
// (nearly) its deadline (the database), whether the value's push had reached
// its process well before the deadline (a wake-up lost or late in the
// process), whether a query of its key ended well before it but no push came
// (the store, the publish or the delivery), or none of these (Redis, the
// connection pool, the CPU); and the connections dialled, the reads cut by
// their deadline (each closes its connection on a client with
// ContextTimeoutEnabled), and the loads run uncached for a Redis error.
func Explain(w io.Writer, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var reps []Report
	if err := json.Unmarshal(b, &reps); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	start := int64(0)
	spans := map[int64][][2]int64{} // by key: the queries' start and end
	var queries []time.Duration
	for _, r := range reps {
		if r.PG == nil {
			return fmt.Errorf("%s: not a real-database mix trace", path)
		}
		if start == 0 || r.Start < start {
			start = r.Start
		}
		for _, s := range r.PG.Spans {
			spans[s.Key] = append(spans[s.Key], [2]int64{s.Start, s.End})
			queries = append(queries, time.Duration(s.End-s.Start))
		}
	}
	var n, failed, dials, cut, failOpen int
	why := map[string]int{}
	for _, r := range reps {
		base := ""
		pushes := map[string][]int64{} // by key: when its value's push reached the process
		for _, e := range r.Trace {
			switch {
			case e.What == "miss" && base == "":
				base = e.Key[:strings.LastIndexByte(e.Key, ':')+1]
			case e.What == "push" && strings.HasPrefix(e.Key, "cg:fw:{") && strings.HasPrefix(e.Err, "v"):
				k := strings.TrimSuffix(strings.TrimPrefix(e.Key, "cg:fw:{"), "}")
				pushes[k] = append(pushes[k], e.At)
			case e.At < start:
			case e.What == "hello":
				dials++
			case e.What == "hget" && e.End > 0 && (strings.Contains(e.Err, "deadline") || strings.Contains(e.Err, "timeout")):
				cut++
			case e.What == "fail_open":
				failOpen++
			}
		}
		for _, p := range pushes {
			slices.Sort(p)
		}
		for i, o := range r.PG.Out {
			n++
			if o == outOK {
				continue
			}
			failed++
			at, end, k := r.ReqAt[i], r.ReqAt[i]+r.PG.LatAll[i], int64(r.ReqKey[i])
			p := pushes[fmt.Sprint(base, k)]
			j := sort.Search(len(p), func(j int) bool { return p[j] > at })
			margin := int64(50 * time.Millisecond)
			running := slices.ContainsFunc(spans[k], func(s [2]int64) bool { return s[0] <= end && s[1] > end-margin })
			switch {
			case running:
				why["a query of its key ran until 50 ms before its deadline or later"]++
			case j < len(p) && p[j] < end-margin:
				why["its value was pushed to its process >50 ms before its deadline"]++
			case slices.ContainsFunc(spans[k], func(s [2]int64) bool { return s[1] > at && s[1] <= end-margin }):
				why["a query of its key ended >50 ms before its deadline; no push reached its process by then"]++
			default:
				why["no query of its key ran during it, no push came (Redis, the pool, the CPU)"]++
			}
		}
	}
	q := stats.Durations(queries)
	fmt.Fprintf(w, "%s: %d requests, %d failed; %d queries, p50 %v, p99 %v; after the start: %d connections dialled, "+
		"%d reads cut by their deadline, %d loads run uncached (fail-open)\n", path, n, failed, len(queries),
		q.P50.Round(time.Millisecond), q.P99.Round(time.Millisecond), dials, cut, failOpen)
	keys := make([]string, 0, len(why))
	for k := range why {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %6d failed: %s\n", why[k], k)
	}
	return nil
}
