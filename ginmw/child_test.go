package ginmw_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/childproc"
)

// Multi-process tests re-execute the test binary: TestMain sees childEnv and
// plays the role it names instead of running tests.
const (
	childEnv  = "GINMW_TEST_CHILD" // the role
	childAddr = "GINMW_TEST_ADDR"  // the Redis address
	childKey  = "GINMW_TEST_KEY"   // the test's key; the "database" row derives from it
	childN    = "GINMW_TEST_N"     // the checker's run time in ms
)

func childRoles() map[string]func() error {
	return map[string]func() error{"service": childService, "checker": childChecker}
}

// startChild starts the test binary as a child process with role.
func startChild(t *testing.T, role, key string) *childproc.Proc {
	t.Helper()
	p := childproc.Start(t, childEnv, role, childAddr+"="+redisAddr, childKey+"="+key)
	if line, err := p.Next(30 * time.Second); err != nil || line != "ready" {
		t.Fatalf("child: %q, %v", line, err)
	}
	return p
}

// dbKey is the "database" of a read-your-writes test: the version of row
// the row, a counter in Redis every process reads and writes.
func dbKey(key string) string { return "test:db:" + key }

// newRow commits version 1 of a row whose id is unique to the run, and
// returns the id with a client on redisAddr, closed when the test ends, that
// the test's handlers read it with.
func newRow(t *testing.T) (rdb *redis.Client, key string) {
	t.Helper()
	rdb = redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rdb.Close() })
	key = strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := rdb.Set(context.Background(), dbKey(key), 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	return rdb, key
}

// versionHandler answers GET /repos/:id with the row's version.
func versionHandler(rdb redis.UniversalClient, key string) gin.HandlerFunc {
	return func(c *gin.Context) {
		v, err := rdb.Get(c.Request.Context(), dbKey(key)).Result()
		if err != nil {
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
		c.String(http.StatusOK, v)
	}
}

// childService is another process of a service that caches GET /repos/:id
// with ginmw.Cache under the resource name "repos:<id>". It reads commands on
// stdin and answers one line each:
//
//	write   commits the next version of row <key> and invalidates "repos:<key>": "ok <version>"
//	get     GET /repos/<key> through this process's engine: "got <body>"
func childService() error {
	ctx := context.Background()
	key := os.Getenv(childKey)
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(childAddr)})
	defer rdb.Close()
	g := cacheguard.New(rdb)
	defer g.Close()
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.GET("/repos/:id", ginmw.Cache(g, time.Minute, ginmw.CacheKey(ginmw.Resource("repos", ginmw.Param("id")))), versionHandler(rdb, key))
	sc := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	for sc.Scan() {
		switch sc.Text() {
		case "write":
			v, err := rdb.Incr(ctx, dbKey(key)).Result()
			if err != nil {
				return err
			}
			if err := g.Invalidate(ctx, "repos:"+key); err != nil {
				return err
			}
			fmt.Println("ok", v)
		case "get":
			w := serve(r, http.MethodGet, "/repos/"+key)
			if w.Code != http.StatusOK {
				return fmt.Errorf("GET: %d %s", w.Code, w.Body)
			}
			fmt.Println("got", w.Body.String())
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
	}
	return sc.Err()
}

// readLine reads one line of stdin.
func readLine() (string, error) {
	sc := bufio.NewScanner(os.Stdin)
	if !sc.Scan() {
		return "", fmt.Errorf("stdin: %v", sc.Err())
	}
	return sc.Text(), nil
}

// ask sends a command to a child and returns its answer.
func ask(t *testing.T, p *childproc.Proc, cmd string) string {
	t.Helper()
	if _, err := fmt.Fprintln(p.Stdin, cmd); err != nil {
		t.Fatal(err)
	}
	line, err := p.Next(30 * time.Second)
	if err != nil || strings.HasPrefix(line, "error") {
		t.Fatalf("child, %s: %q, %v", cmd, line, err)
	}
	return line
}
