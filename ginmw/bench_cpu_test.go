package ginmw_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// cpuMeter measures the CPU time a benchmark costs this process and its
// redis-server. On a machine shared with other work, wall-clock requests/s
// swing with the neighbours' load; CPU time per request does not, and with
// every core busy it is what bounds requests/s.
type cpuMeter struct {
	s           *redistest.Server
	self, redis time.Duration
}

func startCPU(b *testing.B, s *redistest.Server) *cpuMeter {
	m := &cpuMeter{s: s}
	m.self, m.redis = selfCPU(b), redisCPU(b, s)
	return m
}

// report adds client-cpu-µs/op, redis-cpu-µs/op and cpu-µs/op.
func (m *cpuMeter) report(b *testing.B) {
	self := selfCPU(b) - m.self
	red := redisCPU(b, m.s) - m.redis
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
	b.ReportMetric(per(self), "client-cpu-µs/op")
	b.ReportMetric(per(red), "redis-cpu-µs/op")
	b.ReportMetric(per(self+red), "cpu-µs/op")
}

func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func redisCPU(b *testing.B, s *redistest.Server) time.Duration {
	info, err := s.Info(context.Background(), "cpu")
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(info[k], 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %q", k, info[k])
		}
		total += v
	}
	return time.Duration(total * float64(time.Second))
}
