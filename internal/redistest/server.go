package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Option configures a server started by Start, StartN or the cluster helpers.
type Option func(*config)

type config struct {
	persist  bool            // appendonly yes, appendfsync always
	cluster  bool            // cluster-enabled yes
	sentinel *sentinelConfig // non-nil: run as a sentinel (redis-server --sentinel)
	extra    [][]string      // extra directives, one per line
}

// AppendFsyncAlways turns on the append-only file with fsync on every write,
// so data survives Kill followed by Restart.
func AppendFsyncAlways() Option { return func(c *config) { c.persist = true } }

// Config adds one redis.conf directive, e.g. Config("maxmemory-policy", "noeviction").
func Config(directive string, args ...string) Option {
	return func(c *config) { c.extra = append(c.extra, append([]string{directive}, args...)) }
}

func clusterMode() Option { return func(c *config) { c.cluster = true } }

// Server is one redis-server process on a loopback port.
type Server struct {
	bin  string
	port int
	dir  string
	cfg  config

	mu      sync.Mutex      // guards the fields below
	cmd     *exec.Cmd       // the running process, nil when stopped
	exited  chan struct{}   // closed when cmd has exited
	clients []*redis.Client // made by Client, closed by Close
	paused  bool
	closed  bool
}

// Start starts a redis-server for tb and stops it in tb.Cleanup. It skips tb
// when the binary is missing (see Need).
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	bin := Need(tb)
	s, err := newServer(bin, tb.TempDir(), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// StartN starts n independent servers (e.g. for Redlock).
func StartN(tb testing.TB, n int, opts ...Option) []*Server {
	tb.Helper()
	out := make([]*Server, n)
	errs := make([]error, n)
	bin := Need(tb)
	var wg sync.WaitGroup
	for i := range out {
		dir := tb.TempDir()
		wg.Go(func() { out[i], errs[i] = newServer(bin, dir, opts...) })
	}
	wg.Wait()
	for _, s := range out {
		if s != nil {
			tb.Cleanup(s.Close)
		}
	}
	if err := errors.Join(errs...); err != nil {
		tb.Fatal(err)
	}
	return out
}

func newServer(bin, dir string, opts ...Option) (*Server, error) {
	s := &Server{bin: bin, dir: dir}
	for _, o := range opts {
		o(&s.cfg)
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if s.port, err = freePort(s.cfg.cluster); err != nil {
			return nil, err
		}
		if err = s.launch(); err == nil {
			return s, nil
		}
	}
	return nil, err
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// Dir is the server's working directory (its data and log live there).
func (s *Server) Dir() string { return s.dir }

// Client returns a new go-redis client for the server, closed by Close.
func (s *Server) Client(opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: s.Addr()}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	s.mu.Lock()
	s.clients = append(s.clients, c)
	s.mu.Unlock()
	return c
}

func (s *Server) writeConf() (string, error) {
	if s.cfg.sentinel != nil {
		return s.writeSentinelConf()
	}
	var b strings.Builder
	line := func(parts ...string) { b.WriteString(strings.Join(parts, " ") + "\n") }
	line("port", strconv.Itoa(s.port))
	line("bind", "127.0.0.1")
	line("protected-mode", "no")
	line("daemonize", "no")
	line("dir", s.dir)
	line("logfile", filepath.Join(s.dir, "redis.log"))
	line("save", `""`)
	if s.cfg.persist {
		line("appendonly", "yes")
		line("appendfsync", "always")
	} else {
		line("appendonly", "no")
	}
	if s.cfg.cluster {
		line("cluster-enabled", "yes")
		line("cluster-config-file", "nodes.conf")
		line("cluster-node-timeout", "1000")
		line("cluster-require-full-coverage", "no")
		line("cluster-replica-validity-factor", "0")
	}
	for _, e := range s.cfg.extra {
		line(e...)
	}
	p := filepath.Join(s.dir, "redis.conf")
	return p, os.WriteFile(p, []byte(b.String()), 0o600)
}

func (s *Server) launch() error {
	conf, err := s.writeConf()
	if err != nil {
		return err
	}
	args := []string{conf}
	if s.cfg.sentinel != nil {
		args = append(args, "--sentinel")
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	// Pdeathsig: the kernel kills redis-server when the test binary dies, even by SIGKILL.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited, s.paused = cmd, exited, false
	s.mu.Unlock()
	if err := waitReady(s.Addr(), exited, 15*time.Second); err != nil {
		s.Kill()
		return fmt.Errorf("redistest: server on %s: %w\n%s", s.Addr(), err, s.logTail())
	}
	return nil
}

// waitReady waits until the server answers PING, the process exits, or d passes.
func waitReady(addr string, exited <-chan struct{}, d time.Duration) error {
	deadline := time.Now().Add(d)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		if err := ping(addr); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", d, err)
		}
		select {
		case <-exited:
			return errors.New("exited during start")
		case <-time.After(delay):
		}
	}
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Kill sends SIGKILL (a crash: nothing is flushed) and waits for the exit.
// Killing a stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Pause sends SIGSTOP: the server holds its connections but answers nothing.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP, true) }

// Resume sends SIGCONT to a paused server.
func (s *Server) Resume() { s.signal(syscall.SIGCONT, false) }

func (s *Server) signal(sig syscall.Signal, paused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.cmd.Process.Signal(sig)
		s.paused = paused
	}
}

// Running reports whether the process is alive (paused counts as alive).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Restart kills the server (if running) and starts it again on the same port
// and directory. Data survives only with AppendFsyncAlways.
func (s *Server) Restart() error {
	s.Kill()
	var err error
	for attempt := 0; attempt < 20; attempt++ { // the port may linger briefly
		if err = s.launch(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// Close kills the server and closes the clients made by Client. It is safe to
// call more than once.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	clients := s.clients
	s.clients = nil
	s.mu.Unlock()
	for _, c := range clients {
		c.Close()
	}
	s.Kill()
}

// Do runs one command on a short-lived connection (handy for INFO, CONFIG, DEBUG).
func (s *Server) Do(ctx context.Context, args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	return c.Do(ctx, args...).Result()
}

// Info returns one INFO section as a field map.
func (s *Server) Info(ctx context.Context, section string) (map[string]string, error) {
	v, err := s.Do(ctx, "INFO", section)
	if err != nil {
		return nil, err
	}
	return ParseInfo(fmt.Sprint(v)), nil
}

// ParseInfo turns an INFO reply into a field map.
func ParseInfo(info string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(info, "\n") {
		l = strings.TrimSpace(l)
		if k, v, ok := strings.Cut(l, ":"); ok && !strings.HasPrefix(l, "#") {
			m[k] = v
		}
	}
	return m
}
