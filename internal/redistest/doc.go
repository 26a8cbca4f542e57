// Package redistest starts real redis-server processes for tests: one server, N
// independent servers, a Redis Cluster and a Sentinel set-up, and kills, pauses
// and restarts them on demand.
//
// Every process runs on a free loopback port in its own temporary directory with
// persistence off unless asked, is stopped in t.Cleanup, and is killed by the
// kernel if the test binary dies first (Pdeathsig), so no redis-server outlives
// the run.
//
// The binary is taken from REDIS_SERVER_BIN, else from PATH. When it is missing,
// tests that need it are skipped with one message naming the Debian package to
// install, unless CACHEGUARD_REQUIRE_REDIS=1, when they fail instead.
package redistest
