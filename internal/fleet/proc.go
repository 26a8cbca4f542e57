package fleet

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one OS process of the example service. Its methods are safe for
// concurrent use.
type Proc struct {
	Index int // its place in the fleet

	bin  string
	args []string

	mu      sync.Mutex             // guards the fields below
	cmd     *exec.Cmd              // nil once reaped
	url     string                 // http://host:port of the running process
	exited  chan struct{}          // closed when cmd has been reaped
	expect  map[string]chan string // hook tag -> the step line, for hooks the driver waits for
	stops   []interval             // when the process was stopped (SIGSTOP to SIGCONT), wall clock
	stopped time.Time              // when the current stop began, zero if running
	downs   []interval             // from each kill or SIGTERM to the next start (to: 0 while down)
	stderr  tail                   // the last lines of stderr, of every run
	panics  int                    // lines of stderr that report a panic or a data race
	// panicsSeen is how many of panics a check has reported already.
	panicsSeen int
	runs       int // processes started in this slot
}

// interval is a span of wall-clock time in Unix nanoseconds.
type interval struct{ from, to int64 }

func (iv interval) overlaps(o interval) bool { return iv.from < o.to && o.from < iv.to }

var servingRE = regexp.MustCompile(`serving on (http://\S+)`)

// start launches the process and waits (up to within) until it serves.
func (p *Proc) start(within time.Duration) error {
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), "REDIS_URL=")
	// Pdeathsig: the kernel kills the service when the test binary dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("fleet: start %s: %w", p.bin, err)
	}
	exited := make(chan struct{})
	serving := make(chan string, 1)
	var readers sync.WaitGroup
	readers.Add(2)
	go func() { defer readers.Done(); p.readStdout(stdout, serving) }()
	go func() { defer readers.Done(); p.readStderr(stderr) }()
	go func() {
		readers.Wait() // exec wants the pipes drained before Wait
		cmd.Wait()     //nolint:errcheck // the exit is observed through exited
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited, p.url = cmd, exited, ""
	p.runs++
	p.mu.Unlock()

	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case u := <-serving:
		p.mu.Lock()
		p.url = u
		if n := len(p.downs); n > 0 && p.downs[n-1].to == 0 {
			p.downs[n-1].to = time.Now().UnixNano() // down until it serves again
		}
		p.mu.Unlock()
		return nil
	case <-exited:
		return fmt.Errorf("fleet: process %d exited during start:\n%s", p.Index, p.Stderr())
	case <-timer.C:
		p.Kill()
		return fmt.Errorf("fleet: process %d not serving within %v:\n%s", p.Index, within, p.Stderr())
	}
}

func (p *Proc) readStdout(r io.Reader, serving chan<- string) {
	sc := bufio.NewScanner(r)
	sent := false
	for sc.Scan() {
		l := sc.Text()
		if m := servingRE.FindStringSubmatch(l); m != nil && !sent {
			serving <- m[1]
			sent = true
			continue
		}
		if rest, ok := strings.CutPrefix(l, "hook at "); ok {
			step, tag, _ := strings.Cut(rest, " ")
			p.mu.Lock()
			ch := p.expect[tag]
			delete(p.expect, tag)
			p.mu.Unlock()
			if ch != nil {
				ch <- step
			}
		}
	}
	io.Copy(io.Discard, r) //nolint:errcheck // a line too long for the scanner must not block the child
}

func (p *Proc) readStderr(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l := sc.Text()
		p.mu.Lock()
		p.stderr.add(l)
		if strings.HasPrefix(l, "panic:") || strings.Contains(l, "WARNING: DATA RACE") || strings.HasPrefix(l, "fatal error:") {
			p.panics++
		}
		p.mu.Unlock()
	}
	io.Copy(io.Discard, r) //nolint:errcheck // as above
}

// URL is the base URL of the running process ("" while it is down).
func (p *Proc) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return ""
	}
	return p.url
}

// Expect registers tag: the returned channel receives the step when the
// process prints "hook at <step> <tag>".
func (p *Proc) Expect(tag string) <-chan string {
	ch := make(chan string, 1)
	p.mu.Lock()
	if p.expect == nil {
		p.expect = map[string]chan string{}
	}
	p.expect[tag] = ch
	p.mu.Unlock()
	return ch
}

// Stop sends SIGSTOP: the whole process freezes, its lease renewals too.
func (p *Proc) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.stopped.IsZero() {
		p.stopped = time.Now()
		p.cmd.Process.Signal(syscall.SIGSTOP) //nolint:errcheck // a dead process is seen elsewhere
	}
}

// Cont sends SIGCONT, which also releases the request parked at its step.
func (p *Proc) Cont() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !p.stopped.IsZero() {
		p.cmd.Process.Signal(syscall.SIGCONT) //nolint:errcheck // as above
		p.stops = append(p.stops, interval{p.stopped.UnixNano(), time.Now().UnixNano()})
		p.stopped = time.Time{}
	}
}

// wasStopped reports whether the process was stopped at some time within iv.
func (p *Proc) wasStopped(iv interval) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.stops {
		if s.overlaps(iv) {
			return true
		}
	}
	return !p.stopped.IsZero() && p.stopped.UnixNano() < iv.to
}

// Kill SIGKILLs the process and waits until it is reaped.
func (p *Proc) Kill() { p.signalWait(syscall.SIGKILL, 0) }

// Term sends SIGTERM (a graceful shutdown) and waits up to within for the
// exit, then SIGKILLs it. It reports whether the process exited by itself.
func (p *Proc) Term(within time.Duration) bool { return p.signalWait(syscall.SIGTERM, within) }

func (p *Proc) signalWait(sig syscall.Signal, within time.Duration) bool {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	if cmd != nil && !p.stopped.IsZero() {
		p.stops = append(p.stops, interval{p.stopped.UnixNano(), time.Now().UnixNano()})
		p.stopped = time.Time{}
		if sig != syscall.SIGKILL {
			cmd.Process.Signal(syscall.SIGCONT) //nolint:errcheck // it must run to exit gracefully
		}
	}
	if cmd != nil {
		p.downs = append(p.downs, interval{from: time.Now().UnixNano()})
	}
	p.mu.Unlock()
	if cmd == nil {
		return true
	}
	cmd.Process.Signal(sig) //nolint:errcheck // an exited process is reaped below
	clean := true
	if within > 0 {
		timer := time.NewTimer(within)
		select {
		case <-exited:
		case <-timer.C:
			clean = false
			cmd.Process.Kill() //nolint:errcheck // as above
		}
		timer.Stop()
	}
	<-exited
	p.mu.Lock()
	if p.cmd == cmd {
		p.cmd = nil
	}
	p.mu.Unlock()
	return clean
}

// killedDuring reports whether the driver took the process down (kill or
// SIGTERM) at some time between start and end, or it was down then.
func (p *Proc) killedDuring(start, end time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	iv := interval{start.UnixNano(), end.UnixNano()}
	for _, d := range p.downs {
		if d.to == 0 {
			d.to = math.MaxInt64
		}
		if d.overlaps(iv) || d.from == iv.to {
			return true
		}
	}
	return false
}

// down reports whether the driver took the process down and has not restarted it.
func (p *Proc) down() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.downs)
	return n > 0 && p.downs[n-1].to == 0
}

// Exited reports whether the current process has exited (or was taken down).
func (p *Proc) Exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return true
	}
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Panics is the number of panics and data races the processes in this slot
// reported on stderr.
func (p *Proc) Panics() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.panics
}

// Stderr returns the last lines the processes in this slot wrote to stderr.
func (p *Proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// tail keeps the last lines written.
type tail struct{ lines []string }

const tailLines = 60

func (t *tail) add(l string) {
	t.lines = append(t.lines, l)
	if len(t.lines) > tailLines {
		t.lines = t.lines[len(t.lines)-tailLines:]
	}
}

func (t *tail) String() string { return strings.Join(t.lines, "\n") }

var errDown = errors.New("fleet: process is down")
