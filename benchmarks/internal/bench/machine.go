package bench

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

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
	Costs    HostCosts
}

// HostCosts are what this host's kernel and scheduler charge for the steps a
// lock hand-off or a woken waiter is made of, measured when the run starts.
// They can differ tenfold between hosts (a virtual machine may trap to its
// hypervisor on each of them), and the rows that measure wake-ups (hand-off,
// the wait for a coalesced load) move with them: they let two RESULTS.md be
// compared.
type HostCosts struct {
	Syscall   time.Duration // one getppid(2), the mean of many
	WakeP50   time.Duration // a round trip between two OS threads over two pipes: each side sleeps in read(2) until the other writes
	WakeP99   time.Duration
	SleepLate time.Duration // how late time.Sleep(1ms) returns, p50
	Err       string        // why they could not be measured
}

// String describes c for RESULTS.md.
func (c HostCosts) String() string {
	if c.Err != "" {
		return "not measured: " + c.Err
	}
	us := func(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/1e3) }
	return fmt.Sprintf("a system call %.2f µs; a wake-up round trip between two threads p50 %s, p99 %s; "+
		"time.Sleep(1ms) returns %s late (p50)", float64(c.Syscall)/1e3, us(c.WakeP50), us(c.WakeP99), us(c.SleepLate))
}

// measureCosts measures HostCosts, in about a second.
func measureCosts() HostCosts {
	var c HostCosts
	const calls = 100000
	t0 := time.Now()
	for range calls {
		syscall.Getppid()
	}
	c.Syscall = time.Since(t0) / calls
	wake, err := wakeRoundTrips(5000)
	if err != nil {
		return HostCosts{Err: err.Error()}
	}
	c.WakeP50, c.WakeP99 = wake[len(wake)/2], wake[len(wake)*99/100]
	late := make([]time.Duration, 300)
	for i := range late {
		t := time.Now()
		time.Sleep(time.Millisecond)
		late[i] = time.Since(t) - time.Millisecond
	}
	slices.Sort(late)
	c.SleepLate = late[len(late)/2]
	return c
}

// wakeRoundTrips times n round trips of one byte between this goroutine and
// an echo on another locked OS thread, over two pipes, sorted. The echo ends
// before it returns.
func wakeRoundTrips(n int) ([]time.Duration, error) {
	ar, aw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	br, bw, err := os.Pipe()
	if err != nil {
		ar.Close()
		aw.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() { // echoes a to b until a is closed
		defer close(done)
		defer bw.Close()
		defer ar.Close()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b := make([]byte, 1)
		for {
			if _, err := ar.Read(b); err != nil {
				return
			}
			if _, err := bw.Write(b); err != nil {
				return
			}
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	out := make([]time.Duration, 0, n)
	b := make([]byte, 1)
	for range n {
		t := time.Now()
		if _, err = aw.Write(b); err != nil {
			break
		}
		if _, err = br.Read(b); err != nil {
			break
		}
		out = append(out, time.Since(t))
	}
	aw.Close()
	<-done
	br.Close()
	if err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}

// Describe reads the machine's description and measures its costs.
func Describe() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Redis: redisproc.Version(), CPUModel: "unknown", Costs: measureCosts()}
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
