package redistest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
)

var (
	portMu   sync.Mutex
	portUsed = map[int]bool{} // guarded by portMu: ports handed out by this process
)

// freePort returns a loopback port that is free now. With cluster set, the port
// is below 32768 and port+10000 (the cluster bus) is free too. Ports are drawn at
// random from a range that the kernel does not hand out as ephemeral ports, so
// parallel test binaries rarely collide, and the bind check catches the rest.
func freePort(cluster bool) (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	lo, hi := 12000, 22700 // bus ports land in 22000..32700, still below 32768
	for range 500 {
		p := lo + rand.IntN(hi-lo)
		if portUsed[p] || (cluster && portUsed[p+10000]) {
			continue
		}
		if !canBind(p) || (cluster && !canBind(p+10000)) {
			continue
		}
		portUsed[p] = true
		if cluster {
			portUsed[p+10000] = true
		}
		return p, nil
	}
	return 0, fmt.Errorf("redistest: no free loopback port found")
}

func canBind(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
