package reliability

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// noLeaks makes t fail, after every other cleanup of t has run, when t left
// goroutines, sockets or redis-server processes behind. Call it first in a
// test, so its cleanup runs last.
func noLeaks(t *testing.T) {
	t.Helper()
	opts := append(redistest.LeakOptions(), goleak.IgnoreCurrent())
	sockets, servers := countSockets(), countChildren("redis-server")
	t.Cleanup(func() {
		goleak.VerifyNone(t, opts...)
		// Connections and killed processes are torn down asynchronously:
		// give the counts a bounded moment to settle, as goleak does.
		if n := settle(countSockets, sockets); n > sockets {
			t.Errorf("%d sockets open after the scenario, %d before: a connection leaked", n, sockets)
		}
		if n := settle(func() int { return countChildren("redis-server") }, servers); n > servers {
			t.Errorf("%d redis-server processes left behind (%d before)", n, servers)
		}
	})
}

// settle polls count until it is at most want or 5 s pass, and returns the last count.
func settle(count func() int, want int) int {
	deadline := time.Now().Add(5 * time.Second)
	n := count()
	for n > want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = count()
	}
	return n
}

// countSockets counts this process's open socket descriptors.
func countSockets() int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// countChildren counts live child processes of this process named comm.
func countChildren(comm string) int {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	me := strconv.Itoa(os.Getpid())
	n := 0
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + p.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if i < 0 || j < i {
			continue
		}
		f := strings.Fields(s[j+1:])
		if s[i+1:j] == comm && len(f) > 1 && f[1] == me && f[0] != "Z" {
			n++
		}
	}
	return n
}
