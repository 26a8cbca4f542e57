// Package cachetests runs the HTTP caching conformance suite
// (github.com/http-tests/cache-tests, the suite behind cache-tests.fyi)
// against ginmw.Cache: a Gin engine whose one catch-all route is
// ginmw.Cache(g, time.Minute) in front of a reverse proxy to the suite's
// origin server, over a real redis-server.
//
// It needs the suite's source with its npm dependencies installed and Node
// 20 or later:
//
//	git clone https://github.com/http-tests/cache-tests /tmp/cache-tests
//	(cd /tmp/cache-tests && npm i --omit=dev)
//	make cachetests CACHE_TESTS=/tmp/cache-tests
//
// The test (TestConformance, skipped without CACHE_TESTS) prints every
// required test that failed, the counts by result, and writes the suite's
// JSON results to CACHE_TESTS_OUT when set. CI does not run it.
package cachetests
