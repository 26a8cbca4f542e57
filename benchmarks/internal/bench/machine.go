package bench

import (
	"os"
	"runtime"
	"strings"

	"github.com/cacheguard/cacheguard/benchmarks/internal/redisproc"
)

// Machine describes where the numbers were taken.
type Machine struct {
	CPUs     int
	CPUModel string
	Go       string
	Redis    string
	Kernel   string
	LoadAvg  string // at the start of the run
	Busy     bool   // one CPU kept busy beside the benchmark (cgbench -busy)
}

// Describe reads the machine's description.
func Describe() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Redis: redisproc.Version(), CPUModel: "unknown"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = runtime.GOOS + "/" + runtime.GOARCH + " " + strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.LoadAvg = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return m
}
