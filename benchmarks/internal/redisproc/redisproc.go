// Package redisproc starts throwaway redis-server processes for the benchmark
// harness, on free loopback ports, killed with the harness (Pdeathsig).
package redisproc

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
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// BinEnv names the environment variable that points at a redis-server binary.
const BinEnv = "REDIS_SERVER_BIN"

// ErrNoBinary reports that no redis-server binary could be found.
var ErrNoBinary = errors.New("redisproc: redis-server not found: install the Debian package redis-server or set " + BinEnv)

// Binary returns the redis-server to run: REDIS_SERVER_BIN, else the one on PATH.
func Binary() (string, error) {
	if p := os.Getenv(BinEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w (%s=%s: %v)", ErrNoBinary, BinEnv, p, err)
		}
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", ErrNoBinary
	}
	return p, nil
}

// Version returns the output of `redis-server --version`, trimmed.
func Version() string {
	bin, err := Binary()
	if err != nil {
		return "unknown"
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// Server is one redis-server process.
type Server struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start launches a redis-server with persistence off on a free loopback port
// and waits until it answers PING.
func Start() (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	var last error
	for range 5 {
		s, err := launch(bin)
		if err == nil {
			return s, nil
		}
		last = err
	}
	return nil, last
}

// StartN starts n independent servers; on error it stops those already started.
func StartN(n int) ([]*Server, error) {
	out := make([]*Server, 0, n)
	for range n {
		s, err := Start()
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func launch(bin string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cgbench-redis-")
	if err != nil {
		return nil, err
	}
	conf := strings.Join([]string{
		"port " + strconv.Itoa(port),
		"bind 127.0.0.1",
		"protected-mode no",
		"daemonize no",
		"dir " + dir,
		"logfile " + filepath.Join(dir, "redis.log"),
		`save ""`,
		"appendonly no",
		"maxclients 20000",
	}, "\n") + "\n"
	cf := filepath.Join(dir, "redis.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(bin, cf)
	cmd.Dir = dir
	// The kernel kills the server when the harness dies, even by SIGKILL.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redisproc: start %s: %w", bin, err)
	}
	s := &Server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(s.done) }()
	if err := s.waitReady(10 * time.Second); err != nil {
		log := s.logTail()
		s.Close()
		return nil, fmt.Errorf("redisproc: server on %s: %w\n%s", s.addr, err, log)
	}
	return s, nil
}

func (s *Server) waitReady(d time.Duration) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	deadline := time.Now().Add(d)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", d, err)
		}
		select {
		case <-s.done:
			return errors.New("exited during start")
		case <-time.After(delay):
		}
	}
}

func (s *Server) logTail() string {
	f, err := os.Open(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 20 {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.addr }

// Close kills the server, waits for it to exit and removes its directory.
// It is safe to call more than once.
func (s *Server) Close() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
	}
	<-s.done
	os.RemoveAll(s.dir)
}

// CPU returns the server's used CPU time so far (INFO cpu: used_cpu_sys +
// used_cpu_user).
func CPU(ctx context.Context, rdb redis.UniversalClient) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("redisproc: INFO cpu %s: %w", k, err)
		}
		total += f
	}
	return time.Duration(total * float64(time.Second)), nil
}
