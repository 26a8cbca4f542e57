package gormplugin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// The lock telemetry of a service built as the README shows — ginmw.Lock on
// the route, gormplugin.Transaction in the handler re-entering the request's
// lock — balances: every EventAcquired or EventReentered ends in one
// EventReleased or EventLost, contended requests included. (The issue's
// service counted acquired 524, released 262: re-entries were counted as
// acquisitions and only the last hold as a release.)
func TestLockTelemetryBalancesThroughGinAndGORM(t *testing.T) {
	e := newEnv(t, onSQLite, byClient)
	var mu sync.Mutex
	kinds := map[locks.EventKind]int{}
	lc := locks.New(e.rdb, locks.Observer(func(_ context.Context, ev locks.Event) {
		mu.Lock()
		kinds[ev.Kind]++
		mu.Unlock()
	}))
	t.Cleanup(func() { lc.Close() })
	db := e.openWith(t, &gorm.Config{})
	p := gormplugin.New(lc, gormplugin.UnavailableAfter(5*time.Second))
	t.Cleanup(func() { p.Close() })
	if err := db.Use(p); err != nil {
		t.Fatal(err)
	}
	for id := uint(1); id <= 2; id++ {
		if err := e.plain(t).Create(&Counter{ID: id}).Error; err != nil {
			t.Fatal(err)
		}
	}

	gin.SetMode(gin.TestMode)
	r := gin.New()
	counter := ginmw.Resource("counters", ginmw.Int(ginmw.Param("id")))
	r.PUT("/counters/:id", ginmw.Lock(lc, counter, ginmw.LockOptions(locks.WaitBudget(10*time.Second))), func(c *gin.Context) {
		var id uint
		fmt.Sscan(c.Param("id"), &id) //nolint:errcheck // the route's Int already checked it
		err := gormplugin.Transaction(c.Request.Context(), db, func(tx *gorm.DB) error {
			return tx.Model(&Counter{ID: id}).Update("n", gorm.Expr("n + 1")).Error
		}, &Counter{ID: id})
		if err != nil {
			ginmw.Abort(c, err)
			return
		}
		c.Status(http.StatusNoContent)
	})

	const requests = 20
	var wg sync.WaitGroup
	codes := make([]int, requests)
	for i := range requests {
		wg.Go(func() {
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(http.MethodPut, fmt.Sprintf("/counters/%d", 1+i%2), nil))
			codes[i] = w.Code
		})
	}
	wg.Wait()
	for i, code := range codes {
		if code != http.StatusNoContent {
			t.Fatalf("request %d answered %d", i, code)
		}
	}
	// Each request: the route's lock, the transaction's re-entry, the
	// statement's re-entry; each ends in a release.
	balanced := func() bool {
		mu.Lock()
		defer mu.Unlock()
		begun := kinds[locks.EventAcquired] + kinds[locks.EventReentered]
		ended := kinds[locks.EventReleased] + kinds[locks.EventLost]
		return kinds[locks.EventAcquired] == requests && kinds[locks.EventReentered] >= requests && begun == ended
	}
	eventually(t, 10*time.Second, "balanced lock events", balanced)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("events: %v", kinds)
}
