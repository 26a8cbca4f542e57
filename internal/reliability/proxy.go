package reliability

import "github.com/cacheguard/cacheguard/internal/faultproxy"

// The fault proxy lives in internal/faultproxy, shared with the end-to-end
// suite (internal/fleet); these names keep the scenarios short.
type (
	// Proxy is faultproxy.Proxy.
	Proxy = faultproxy.Proxy
	// Fault is faultproxy.Fault.
	Fault = faultproxy.Fault
)

// Faults.
const (
	Pass        = faultproxy.Pass
	Latency     = faultproxy.Latency
	BlackHole   = faultproxy.BlackHole
	DropReplies = faultproxy.DropReplies
	Reset       = faultproxy.Reset
)

// NewProxy is faultproxy.New.
func NewProxy(target string) (*Proxy, error) { return faultproxy.New(target) }
