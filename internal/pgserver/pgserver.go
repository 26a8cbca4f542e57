// Package pgserver starts a private PostgreSQL server for tests and
// benchmarks: a new cluster (initdb) in a temporary directory, listening on a
// free loopback port, stopped and removed by Stop. It needs the PostgreSQL
// server binaries (the Debian package postgresql, or PG_BIN pointing at a
// directory holding initdb and postgres).
package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// BinEnv names the environment variable that points at the directory of the
// PostgreSQL server binaries (initdb, postgres).
const BinEnv = "PG_BIN"

// ErrNoBinary reports that no PostgreSQL server binaries could be found.
var ErrNoBinary = errors.New("pgserver: PostgreSQL server binaries not found: install the Debian package postgresql (apt-get install postgresql) or set " + BinEnv)

var findOnce = sync.OnceValues(func() (string, error) {
	if d := os.Getenv(BinEnv); d != "" {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err != nil {
			return "", fmt.Errorf("%w (%s=%s: %v)", ErrNoBinary, BinEnv, d, err)
		}
		return d, nil
	}
	// Debian keeps the server binaries out of PATH, one directory per major version.
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", ErrNoBinary
})

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// BinDir returns the directory of the server binaries.
func BinDir() (string, error) { return findOnce() }

// Options tune a server. The zero value is a server for tests: no fsync, a
// small cache, 200 connections at most.
type Options struct {
	MaxConnections int      // default 200
	Settings       []string // more "name=value" server settings (postgres -c)
	Log            bool     // keep the server's log (in Dir()/postgres.log) instead of discarding it
}

// Server is one running PostgreSQL server.
type Server struct {
	dir  string // the temporary directory: data/, the socket, the log
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when the server process has exited
	cred *syscall.Credential

	mu      sync.Mutex // guards stopped
	stopped bool
}

// Start initialises a new cluster and starts a server on it. Running as
// root, the cluster belongs to the user "postgres" (which the Debian package
// creates), as PostgreSQL refuses to run as root.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 200
	}
	dir, err := os.MkdirTemp("", "cacheguard-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, done: make(chan struct{})}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fail(fmt.Errorf("pgserver: running as root needs the user postgres (created by the Debian package postgresql): %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("pgserver: initdb: %w\n%s", err, tail(out)))
	}

	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return fail(err)
		}
		s.port = port
		err = s.launch(ctx, bin, data, opts)
		if err == nil {
			return s, nil
		}
		if attempt == 3 || ctx.Err() != nil {
			return fail(err)
		}
	}
}

func (s *Server) launch(ctx context.Context, bin, data string, opts Options) error {
	args := []string{"-D", data, "-p", strconv.Itoa(s.port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=" + strconv.Itoa(opts.MaxConnections),
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "shared_buffers=64MB", "-c", "track_counts=on", "-c", "log_min_messages=warning"}
	for _, kv := range opts.Settings {
		args = append(args, "-c", kv)
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	var logBuf bytes.Buffer
	if opts.Log {
		f, err := os.Create(filepath.Join(s.dir, "postgres.log"))
		if err != nil {
			return err
		}
		defer f.Close()
		cmd.Stdout, cmd.Stderr = f, f
	} else {
		cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgserver: start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-done:
			return fmt.Errorf("pgserver: postgres exited at start: %s", tail(logBuf.Bytes()))
		default:
		}
		if c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond); err == nil {
			c.Close()
			if s.ready(ctx, bin) {
				s.cmd, s.done = cmd, done
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("pgserver: postgres not ready within 30s: %s", tail(logBuf.Bytes()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ready asks pg_isready whether the server accepts connections (it refuses
// them while it recovers or starts up, although the port is open).
func (s *Server) ready(ctx context.Context, bin string) bool {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "postgres")
	return cmd.Run() == nil
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

// Dir returns the server's temporary directory (removed by Stop).
func (s *Server) Dir() string { return s.dir }

// DSN returns a connection string for database db as the superuser postgres.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=%s sslmode=disable", s.port, db)
}

// CreateDB creates database name (an identifier: letters, digits and _).
func (s *Server) CreateDB(ctx context.Context, name string) error {
	for _, r := range name {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return fmt.Errorf("pgserver: database name %q: use lower-case letters, digits and _", name)
		}
	}
	return s.PSQL(ctx, "postgres", "CREATE DATABASE "+name)
}

// PSQL runs sql with psql on database db, failing on the first error.
func (s *Server) PSQL(ctx context.Context, db, sql string) error {
	bin, err := BinDir()
	if err != nil {
		return err
	}
	psql := filepath.Join(bin, "psql")
	if _, err := os.Stat(psql); err != nil {
		if psql, err = exec.LookPath("psql"); err != nil {
			return fmt.Errorf("pgserver: psql not found: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
		"-p", strconv.Itoa(s.port), "-U", "postgres", "-d", db, "-c", sql)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgserver: psql: %w: %s", err, tail(out))
	}
	return nil
}

// Pid returns the postmaster's process id (e.g. to read its CPU time).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Stop stops the server (fast shutdown, then a kill after 10s) and removes
// its directory. It is safe to call more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	s.mu.Unlock()
	if s.cmd != nil {
		s.cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.done
		}
	}
	os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte) string {
	const n = 2000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}
