package bench

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// osCounts is what the kernel counted for this process: context switches
// (voluntary and involuntary, getrusage RUSAGE_SELF; the voluntary ones are
// a thread going to sleep — in futex, epoll_wait — which is what handing
// work to another goroutine costs when no thread is awake to take it; the
// involuntary ones also count preemption by other work on the host) and read/write system
// calls (/proc/self/io: syscr counts read(2)-like calls, syscw write(2)-like
// ones, which is how go-redis talks to Redis; futex and epoll_wait are not
// counted). The system calls are what the code asks of the kernel per call,
// on any host. The context switches are not only that: they also count the
// runtime's monitor thread (sysmon), which sleeps 20 µs to 10 ms between
// looks while the process runs, so a call that takes longer (its server
// slower to answer) costs more of them, and the threads that go idle
// between replies. A slower cycle or a faster client thus counts more switches
// per call with no hand-off added; who woke whom is counted exactly by
// wakes, from the execution trace. sys is -1 where /proc/self/io cannot be
// read. cpu is the process's CPU time (user+system, ns): unlike the counts
// it scales with the host's speed, but two systems' in one run compare.
type osCounts struct{ csw, vcsw, sys, cpu int64 }

func readOS() osCounts {
	var c osCounts
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.csw, c.vcsw = ru.Nvcsw+ru.Nivcsw, ru.Nvcsw
		c.cpu = ru.Utime.Nano() + ru.Stime.Nano()
	}
	c.sys = -1
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return c
	}
	defer f.Close()
	var r, w int64 = -1, -1
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "syscr":
			r = n
		case "syscw":
			w = n
		}
	}
	if r >= 0 && w >= 0 {
		c.sys = r + w
	}
	return c
}

// since sets rep's OS counts to what the kernel counted after c.
func (c osCounts) since(rep *Report) {
	now := readOS()
	rep.CSw, rep.VCSw, rep.CPU = now.csw-c.csw, now.vcsw-c.vcsw, now.cpu-c.cpu
	rep.Syscalls = -1
	if c.sys >= 0 && now.sys >= 0 {
		rep.Syscalls = now.sys - c.sys
	}
}
