// Package childproc runs the test binary again as a child process in a named role, for tests that need real OS processes.
package childproc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a running child. Its stdout arrives on Lines; its stderr goes to the
// test binary's.
type Proc struct {
	Lines <-chan string  // stdout a line at a time; closed once the child's stdout is closed
	Stdin io.WriteCloser // the child's stdin

	cmd  *exec.Cmd
	read chan struct{} // closed when the reader has seen the end of stdout

	once    sync.Once // guards waitErr
	waitErr error
}

// Start runs the test binary (with no tests selected) with envVar=role and env
// added to its environment; the child's TestMain sees envVar and plays role.
// The child is killed and reaped, and its reader ended, in t.Cleanup; the
// kernel kills it too if the test binary dies first (Pdeathsig).
func Start(t testing.TB, envVar, role string, env ...string) *Proc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{envVar + "=" + role}, env...)...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 64)
	p := &Proc{Lines: lines, Stdin: in, cmd: cmd, read: make(chan struct{})}
	go func() {
		defer close(p.read)
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		// A line too long for the scanner must not leave the child blocked
		// on a full pipe.
		io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		in.Close()
		p.Kill()
	})
	return p
}

// Next waits up to within for the child's next line.
func (p *Proc) Next(within time.Duration) (string, error) {
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case l, ok := <-p.Lines:
		if !ok {
			return "", errors.New("child exited")
		}
		return l, nil
	case <-timer.C:
		return "", fmt.Errorf("no line from the child within %v", within)
	}
}

// Signal sends sig to the child.
func (p *Proc) Signal(sig os.Signal) { p.cmd.Process.Signal(sig) }

// Kill SIGKILLs the child, waits until it has exited, and returns the lines it
// printed that were not read from Lines.
func (p *Proc) Kill() []string {
	p.cmd.Process.Kill()
	rest, _ := p.Wait()
	return rest
}

// Wait waits until the child has exited and returns the lines it printed that
// were not read from Lines, and its exit error. Lines is read here, so it must
// not be read at the same time elsewhere.
func (p *Proc) Wait() ([]string, error) {
	var rest []string
	// Reading to the end unblocks the reader; exec wants all reads from
	// the pipe done before cmd.Wait.
	for l := range p.Lines {
		rest = append(rest, l)
	}
	<-p.read
	p.once.Do(func() { p.waitErr = p.cmd.Wait() })
	return rest, p.waitErr
}

// Main starts a TestMain. In a child that Start started, it runs the function
// roles names for the child's role, prints its error, if any, as an "error
// ..." line on stdout, where the parent reads it, and exits; in the test
// binary itself it returns.
func Main(envVar string, roles map[string]func() error) {
	role := os.Getenv(envVar)
	if role == "" {
		return
	}
	run, ok := roles[role]
	if !ok {
		run = func() error { return fmt.Errorf("unknown role %q", role) }
	}
	if err := run(); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	os.Exit(0)
}
