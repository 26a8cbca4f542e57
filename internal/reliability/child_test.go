package reliability

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/childproc"
	"github.com/cacheguard/cacheguard/locks"
)

// The test binary re-executes itself as lock holders in their own OS
// processes (so they can be SIGKILLed and SIGSTOPped). The parent drives each
// child one command at a time over stdin and reads one reply line on stdout,
// so the parent's clock brackets every operation: it records the call before
// writing the command and the return after reading the reply.
const childEnv = "RELIABILITY_TEST_CHILD"

// proc is a child process started by startChild.
type proc struct{ *childproc.Proc }

// startHolder starts a holder child on the lock server lockAddr, writing to
// the register key on regAddr.
func startHolder(t *testing.T, lockAddr, regAddr, key, name string, lease time.Duration, unfenced bool) *proc {
	t.Helper()
	return startChild(t, "holder", "LOCK_ADDR="+lockAddr, "REG_ADDR="+regAddr,
		"REG_KEY="+key, "NAME="+name, "LEASE="+lease.String(), "UNFENCED="+strconv.FormatBool(unfenced))
}

// startChild starts this test binary in role with env added.
func startChild(t *testing.T, role string, env ...string) *proc {
	t.Helper()
	return &proc{childproc.Start(t, childEnv, role, env...)}
}

// do sends one command and waits (bounded) for its reply.
func (p *proc) do(t *testing.T, command string, within time.Duration) string {
	t.Helper()
	if _, err := fmt.Fprintln(p.Stdin, command); err != nil {
		t.Fatalf("child: send %q: %v", command, err)
	}
	l, err := p.Next(within)
	if err != nil {
		t.Fatalf("child did not answer %q: %v", command, err)
	}
	return l
}

// childRoles are the roles for childproc.Main.
func childRoles() map[string]func() error {
	return map[string]func() error{"holder": childHolder, "cg-fill": childFill, "scoped": childScoped}
}

// childHolder serves commands: acquire, write <value>, release, wait-lost.
// It renews its lease in the background like any holder.
func childHolder() error {
	ctx := context.Background()
	lease, err := time.ParseDuration(os.Getenv("LEASE"))
	if err != nil {
		return err
	}
	lockRDB := redis.NewClient(&redis.Options{Addr: os.Getenv("LOCK_ADDR")})
	defer lockRDB.Close()
	regRDB := redis.NewClient(&redis.Options{Addr: os.Getenv("REG_ADDR")})
	defer regRDB.Close()
	unfenced, _ := strconv.ParseBool(os.Getenv("UNFENCED"))
	reg := Register{RDB: regRDB, Key: os.Getenv("REG_KEY"), Unfenced: unfenced}
	c := locks.New(lockRDB, locks.Lease(lease))
	defer c.Close()
	var lk *locks.Lock
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		switch cmd {
		case "acquire":
			l, err := c.TryLock(ctx, os.Getenv("NAME"))
			_, err = classify(l, err)
			switch {
			case err == nil:
				lk = l
				fmt.Println("granted", l.Fence())
			case errors.Is(err, errRefused):
				fmt.Println("refused")
			default:
				fmt.Println("unknown", err)
			}
		case "write":
			ttl := lk.TTL()
			ok, err := reg.Write(ctx, lk.Fence(), arg)
			switch {
			case err != nil:
				fmt.Println("unknown", err)
			case ok:
				fmt.Println("done", int64(ttl))
			default:
				fmt.Println("refused", int64(ttl))
			}
		case "release":
			switch err := lk.Unlock(ctx); {
			case err == nil:
				fmt.Println("released")
			case errors.Is(err, locks.ErrNotHeld):
				fmt.Println("notheld")
			default:
				fmt.Println("unknown", err)
			}
		case "wait-lost":
			<-lk.Lost()
			fmt.Println("lost")
		default:
			fmt.Println("error unknown command", cmd)
		}
	}
	return nil
}

// childFill calls cacheguard.Get on KEY with a loader that says "loading"
// and then blocks until the process is killed: a fill-lease holder that dies
// mid-load.
func childFill() error {
	lease, err := time.ParseDuration(os.Getenv("LEASE"))
	if err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	g := cacheguard.New(rdb, cacheguard.Lease(lease))
	defer g.Close()
	_, err = cacheguard.Get(context.Background(), g, os.Getenv("KEY"), func(ctx context.Context) (string, error) {
		fmt.Println("loading")
		select {} // killed here
	})
	return err
}

// next waits (bounded) for the child's next line.
func (p *proc) next(t *testing.T, within time.Duration) string {
	t.Helper()
	l, err := p.Next(within)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
