package main

import (
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"
)

// metrics answers GET /metrics in Prometheus's text exposition format, from
// the Guard's Stats and the lock Client's count of held locks: what a
// Prometheus server scrapes, with no dependency added. A real service would
// rather use the cgotel module with OpenTelemetry's Prometheus exporter
// (see cgotel/README.md), which also gives latency histograms and traces.
func (s *service) metrics(c *gin.Context) {
	st := s.guard.Stats()
	w := c.Writer
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintln(w, "# HELP cacheguard_cache_events_total Cache outcomes, by kind.")
	fmt.Fprintln(w, "# TYPE cacheguard_cache_events_total counter")
	for _, e := range []struct {
		kind string
		n    uint64
	}{
		{"hit", st.Hits}, {"miss", st.Misses}, {"load", st.Loads},
		{"coalesced_local", st.CoalescedLocal}, {"coalesced_remote", st.CoalescedRemote},
		{"stale", st.StaleServed}, {"early_refresh", st.EarlyRefreshes}, {"negative_hit", st.NegativeHits},
		{"wait_timeout", st.WaitTimeouts}, {"fail_open", st.FailOpenLoads}, {"decode_error", st.DecodeErrors},
		{"redis_error", st.RedisErrors}, {"near_hit", st.NearHits}, {"fail_safe", st.FailSafe},
	} {
		fmt.Fprintf(w, "cacheguard_cache_events_total{event=%q} %d\n", e.kind, e.n)
	}
	if s.locks != nil {
		fmt.Fprintln(w, "# HELP cacheguard_locks_held Locks this process keeps alive.")
		fmt.Fprintln(w, "# TYPE cacheguard_locks_held gauge")
		fmt.Fprintf(w, "cacheguard_locks_held %d\n", s.locks.Held())
	}
}
