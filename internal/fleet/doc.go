// Package fleet is cacheguard's end-to-end suite: several OS processes of the
// example service (example/, built once per run) on loopback, sharing one
// redis-server (behind the fault proxy of internal/faultproxy) or a 3-master
// Redis Cluster, and one database (a SQLite file or PostgreSQL), driven over
// HTTP while a nemesis injects faults at named steps, with every guarantee
// counted.
//
//	go test -race -run Fleet ./internal/fleet                     # the bounded run (make test runs it; about 2-3 minutes)
//	FLEET_SOAK=10m go test -v -run TestFleetSoak ./internal/fleet  # the soak (make soak), seed printed
//	FLEET_SEED=42 FLEET_SOAK=10m ...                               # replay a soak's schedule
//	FLEET_REPORT=table.txt ...                                     # also write the final table to a file
//	FLEET_RACE=1 ...                                               # build the service with -race (data races count as crashes)
//
// # The service's test hooks
//
// The processes run with the service's test-only -hooks flag (example/testhooks.go,
// inert without it). A request carrying X-Pause-At: <step> parks at that step
// and the process prints "hook at <step> <tag>"; the driver then SIGSTOPs the
// whole process (so its lease renewals stop too) for longer than the lease,
// lets another process work, and SIGCONTs it, which releases the request
// exactly where it stopped. The edits: a settings edit in gormplugin.Transaction
// (PUT /repos/:id/settings), a rename (PATCH /repos/:id: First, then Updates,
// under the request's lock) and the same settings edit as First then Save
// under the request's lock, without gormplugin.Transaction (PATCH
// /repos/:id/settings). The steps: after-lock (the edit's handler starts
// under ginmw.Lock), after-read (the row was read),
// before-update (after gormplugin's checks, before the UPDATE is sent),
// after-update (before COMMIT), cache-load (after a cache load's database
// read, before the value is stored). POST /_hooks/release releases a parked
// request without a stop, for wake-up probes (a hold of a known length).
// X-Ignore-Lost: 1 runs an edit's transaction under a context that the loss
// of its lock does not cancel, so the database's defences (the plugin's
// lost-scope check, the fence) decide rather than the race, after SIGCONT,
// between the request's goroutine and the lock's watchdog. Edits report their
// critical section in X-Edit-Span. An edit refused before it reached its step
// (409/423/503: its lock lost or busy, on a host too loaded to renew a lease in
// time, or its process's Redis breaker open just after a SIGCONT) is sent
// again after the refusal's Retry-After (1s), three times in all; the
// refusals are recorded and checked like any edit, and the fault log names
// them.
//
// # What is counted
//
// Every edit and read the driver sends is recorded with its start and end on
// the driver's clock. Edits: lost updates (answered 200, missing from the
// row's list of applied edits), duplicate versions, refused edits that were
// applied, statuses other than the documented 200/409/423/503, edits without
// an answer from a process that was not killed, overlapping critical sections
// (two edits of one repository inside their handlers at once, as the
// processes report them on the shared wall clock, neither told its lock was
// lost and neither process stopped meanwhile), and the row's integrity.
// Reads: a read that started after a write was acknowledged must not return
// an older version (read-your-writes, per route: cacheguard.Get and
// ginmw.Cache); a process must not return an older version than it returned
// to a read that ended before this one started (monotonic reads per process).
// Also: loads per cold key, 5xx at the HTTP edge, Redis keys left by bad ids,
// wake-up latency after a fault against its level before, the first
// successful edit after a fault, requests failed by another process's
// shutdown, and crashes (panics or data races on a process's stderr, or an
// exit nobody asked for).
//
// # The table, and defects not fixed yet
//
// Every scenario adds rows to one table, scenario × invariant × count,
// printed at the end of the run (go test -v, or FLEET_REPORT). A row whose
// count is not 0 fails the run, with the seed and the history that shows it,
// unless the defect behind it is an issue item listed in expectFail
// (expect_test.go): those print their counts and pass until the fix merges.
// Negative controls (the service started with -control: gormplugin
// unregistered, fencing off, invalidation off) must count more than 0.
// MATRIX.md maps each guarantee, path and fault to the scenario that covers it.
package fleet
