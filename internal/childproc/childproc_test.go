package childproc_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cacheguard/cacheguard/internal/childproc"
)

const childEnv = "CHILDPROC_TEST_CHILD"

func TestMain(m *testing.M) {
	childproc.Main(childEnv, map[string]func() error{
		"echo": func() error { // echoes stdin until it closes
			sc := bufio.NewScanner(os.Stdin)
			for sc.Scan() {
				fmt.Println(sc.Text())
			}
			return nil
		},
		"fail":  func() error { return errors.New("boom") },
		"block": func() error { fmt.Println("ready"); select {} },
	})
	goleak.VerifyTestMain(m)
}

func next(t *testing.T, p *childproc.Proc) string {
	t.Helper()
	l, err := p.Next(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestEcho(t *testing.T) {
	p := childproc.Start(t, childEnv, "echo")
	fmt.Fprintln(p.Stdin, "hi")
	if l := next(t, p); l != "hi" {
		t.Fatalf("got %q, want hi", l)
	}
	fmt.Fprintln(p.Stdin, "bye")
	p.Stdin.Close()
	if rest, err := p.Wait(); err != nil || !slices.Equal(rest, []string{"bye"}) {
		t.Fatalf("Wait = %q, %v; want [bye], nil", rest, err)
	}
}

func TestError(t *testing.T) {
	p := childproc.Start(t, childEnv, "fail")
	if rest, err := p.Wait(); err == nil || !slices.Equal(rest, []string{"error boom"}) {
		t.Fatalf("Wait = %q, %v; want [error boom] and an exit error", rest, err)
	}
}

func TestUnknownRole(t *testing.T) {
	p := childproc.Start(t, childEnv, "nope")
	if rest, err := p.Wait(); err == nil || !slices.Equal(rest, []string{`error unknown role "nope"`}) {
		t.Fatalf("Wait = %q, %v", rest, err)
	}
}

func TestKill(t *testing.T) {
	p := childproc.Start(t, childEnv, "block")
	if l := next(t, p); l != "ready" {
		t.Fatalf("got %q, want ready", l)
	}
	p.Kill()
	if _, ok := <-p.Lines; ok {
		t.Fatal("Lines open after Kill")
	}
}

// A child the test leaves running is killed, and its reader ended, at cleanup
// (goleak in TestMain sees the reader if not).
func TestCleanup(t *testing.T) {
	t.Run("leave running", func(t *testing.T) {
		p := childproc.Start(t, childEnv, "block")
		next(t, p)
	})
}
