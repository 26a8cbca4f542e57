package gormplugin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// The pause points of a read-modify-write (issue 15 A): between the read and
// the write, inside the write before its UPDATE (after the plugin's checks),
// and after the UPDATE before the COMMIT.
const (
	pauseAfterRead     = "after-read"
	pauseBeforeUpdate  = "before-update"
	pauseBeforeCommit  = "before-commit"
	modeSave           = "save"        // ginmw-style: the request's lock, a plain read, Save of the struct read
	modeTransaction    = "transaction" // the request's lock, gormplugin.Transaction declaring the row
	pauseWriterTimeout = 20 * time.Second
)

type pauseKey struct{}

// pauser is where writer A stops: it reports reaching its pause point on
// at, and waits for resume.
type pauser struct {
	point      string
	at, resume chan struct{}
}

func (p *pauser) stop(point string) {
	if p != nil && p.point == point {
		close(p.at)
		<-p.resume
	}
}

func pauserOf(ctx context.Context) *pauser {
	p, _ := ctx.Value(pauseKey{}).(*pauser)
	return p
}

// incrementAsRequest adds 1 to counter 1 by read-modify-write as a request would:
// under its own owner it holds the row's lock (as ginmw.Lock does; lease
// long enough that it never renews during the test, so a "pause" is a
// stopped process that cannot notice its lease ran out), reads, and writes
// through the plugin. read is closed after the read.
func incrementAsRequest(ctx context.Context, e *env, db *gorm.DB, mode string, read chan<- struct{}) error {
	ctx = locks.WithOwner(ctx, locks.NewOwnerID())
	lk, err := e.l.Lock(ctx, "counters:1", locks.Lease(time.Minute))
	if err != nil {
		return err
	}
	defer lk.Unlock(context.Background())
	p := pauserOf(ctx)
	rmw := func(tx *gorm.DB) error {
		var c Counter
		if err := tx.First(&c, 1).Error; err != nil {
			return err
		}
		if read != nil {
			close(read)
		}
		p.stop(pauseAfterRead)
		c.N++
		if mode == modeSave {
			return tx.Save(&c).Error
		}
		if err := tx.Model(&c).Update("n", c.N).Error; err != nil {
			return err
		}
		p.stop(pauseBeforeCommit)
		return nil
	}
	if mode == modeSave {
		return rmw(db.WithContext(ctx))
	}
	return gormplugin.Transaction(ctx, db, rmw, &Counter{ID: 1})
}

// A holder paused at any point of its read-modify-write, past its lease,
// while another writer takes the row, never makes either write disappear:
// the final count equals the increments acknowledged (nil error). After the
// UPDATE and before the COMMIT the paused holder still holds the database's
// row lock; the next holder must not build on a read taken before that
// COMMIT (issue 15 A.2), which SQLite's database-wide write lock hides and
// PostgreSQL (READ COMMITTED) does not.
func TestPausedHolderLosesNoUpdate(t *testing.T) {
	forDBs(t, func(t *testing.T, e *env) {
		for _, mode := range []string{modeSave, modeTransaction} {
			for _, point := range []string{pauseAfterRead, pauseBeforeUpdate, pauseBeforeCommit} {
				t.Run(mode+"/"+point, func(t *testing.T) { testPausedHolder(t, e, mode, point) })
			}
		}
	})
}

func testPausedHolder(t *testing.T, e *env, mode, point string) {
	db := e.guarded(t)
	// A row no guarded write has touched yet (fence 0), as every row is
	// before its first write through the plugin (issue 28 item 1: its
	// struct's zero fence was no version, and the next holder's Save of a
	// read taken before the paused holder's COMMIT overwrote it).
	if err := e.plain(t).Save(&Counter{ID: 1, N: 0, Fence: 0}).Error; err != nil {
		t.Fatal(err)
	}
	pause := func(tx *gorm.DB) { pauserOf(tx.Statement.Context).stop(point) }
	switch {
	case point == pauseBeforeUpdate:
		if err := db.Callback().Update().After("gormplugin:fence").Before("gorm:update").Register("test:pause", pause); err != nil {
			t.Fatal(err)
		}
	case point == pauseBeforeCommit && mode == modeSave:
		if err := db.Callback().Update().After("gorm:update").Before("gorm:commit_or_rollback_transaction").Register("test:pause", pause); err != nil {
			t.Fatal(err)
		}
	}
	watch := e.plain(t)
	ctx, cancel := context.WithTimeout(context.Background(), pauseWriterTimeout)
	defer cancel()
	pa := &pauser{point: point, at: make(chan struct{}), resume: make(chan struct{})}
	aDone := make(chan error, 1)
	go func() { aDone <- incrementAsRequest(context.WithValue(ctx, pauseKey{}, pa), e, db, mode, nil) }()
	select {
	case <-pa.at:
	case err := <-aDone:
		t.Fatalf("A ended before its pause point: %v", err)
	}
	// A is stopped; its lease runs out.
	if err := e.rdb.Del(ctx, e.lockKey("counters:1")).Err(); err != nil {
		t.Fatal(err)
	}
	bRead := make(chan struct{})
	bDone := make(chan error, 1)
	go func() { bDone <- incrementAsRequest(ctx, e, db, mode, bRead) }()
	// B runs while A is stopped: until it is done, or, when A's open
	// transaction holds the row, until it has read (may it build on a read
	// taken before A's COMMIT?) or waits for A's row lock.
	bErr, bEnded := e.waitDoneReadOrBlocked(t, watch, bRead, bDone)
	close(pa.resume)
	aErr := <-aDone
	if !bEnded {
		bErr = <-bDone
	}
	acked := 0
	for _, err := range []error{aErr, bErr} {
		if err == nil {
			acked++
		} else if !errors.Is(err, gormplugin.ErrStaleWrite) && !isBusy(err) {
			t.Errorf("unexpected error: %v", err)
		}
	}
	var c Counter
	if err := e.plain(t).First(&c, 1).Error; err != nil {
		t.Fatal(err)
	}
	t.Logf("A: %v; B: %v; n = %d", aErr, bErr, c.N)
	if c.N != acked {
		t.Fatalf("n = %d after %d acknowledged increments: %d lost update(s)", c.N, acked, acked-c.N)
	}
	if acked == 0 {
		t.Fatal("both writers were refused")
	}
}

// isBusy reports a refusal that wrote nothing: a busy row lock, or SQLite
// refusing a transaction whose snapshot a concurrent COMMIT made stale.
func isBusy(err error) bool {
	return errors.Is(err, gormplugin.ErrLock) || strings.Contains(err.Error(), "database is locked")
}

// waitDoneReadOrBlocked waits until writer B is done, has read, or, on
// PostgreSQL, waits for a row lock; on SQLite a writer waiting for the
// database's write lock sleeps in its busy handler, which nothing shows, so
// B gets a bounded moment to read or finish (when it is blocked, it cannot
// read before A's COMMIT, which is the point). ended reports that B is done,
// with err its result.
func (e *env) waitDoneReadOrBlocked(t *testing.T, watch *gorm.DB, read <-chan struct{}, done <-chan error) (err error, ended bool) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	sqliteGrace := time.After(300 * time.Millisecond)
	for {
		select {
		case err := <-done:
			return err, true
		case <-read:
			return nil, false
		case <-deadline:
			t.Fatal("B neither finished, read, nor waited for A's row lock")
		case <-sqliteGrace:
			if e.db == onSQLite {
				return nil, false
			}
		case <-tick.C:
			if e.db == onPostgres && pgLockWaiters(t, watch) > 0 {
				return nil, false
			}
		}
	}
}

// pgLockWaiters counts the sessions of db's database waiting for a lock.
func pgLockWaiters(t *testing.T, db *gorm.DB) int {
	t.Helper()
	var n int
	if err := db.Raw("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}
