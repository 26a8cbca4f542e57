package gormplugin_test

import (
	"context"
	"errors"
	"net"
	"regexp"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/internal/faultproxy"
)

// TestCommitNotInterruptedByCancel: the request's context ends (ginmw cancels
// it when the lock is lost) while COMMIT is on the wire, after PostgreSQL has
// committed. The transaction must report what happened: success when the row
// changed. pgx's database/sql driver runs COMMIT under the context given to
// BeginTx and gives up on the reply when it is cancelled, so before the fix
// Transaction returned "context canceled" for a committed write (the fleet's
// "refused edits applied = 1" at the after-update pause on PostgreSQL).
func TestCommitNotInterruptedByCancel(t *testing.T) {
	e := newEnv(t, onPostgres, byClient)
	plain := e.plain(t)
	if err := plain.Create(&Counter{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}

	// Put a proxy between the guarded connections and PostgreSQL, to hold
	// COMMIT's reply after the server has committed.
	port := regexp.MustCompile(`port=(\d+)`)
	target := "127.0.0.1:" + port.FindStringSubmatch(e.dsn)[1]
	px, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	e.dsn = port.ReplaceAllString(e.dsn, "port="+portOf(px.Addr()))
	db := e.guarded(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	armed := make(chan (<-chan struct{}), 1)
	done := make(chan error, 1)
	go func() {
		done <- db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Model(&Counter{ID: 1}).Update("n", 7).Error; err != nil {
				return err
			}
			armed <- px.HoldNext() // the next reply is COMMIT's
			return nil
		})
	}()

	var held <-chan struct{}
	select {
	case held = <-armed:
	case err := <-done:
		t.Fatalf("transaction ended before COMMIT: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the transaction's UPDATE did not finish")
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("COMMIT's reply never arrived at the proxy")
	}
	cancel() // COMMIT ran on the server; its reply is held

	// Before the fix the driver gives up on the reply at once; give it a
	// moment to do so, then let the reply go.
	var got error
	select {
	case got = <-done:
	case <-time.After(300 * time.Millisecond):
		px.Release()
		select {
		case got = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Transaction did not return after COMMIT's reply was released")
		}
	}
	px.Release()

	var c Counter
	if err := plain.First(&c, 1).Error; err != nil {
		t.Fatal(err)
	}
	switch {
	case got != nil && c.N == 7:
		t.Fatalf("Transaction returned %v, yet the write was committed (n = %d)", got, c.N)
	case got == nil && c.N != 7:
		t.Fatalf("Transaction returned nil, yet the row has n = %d", c.N)
	case got != nil:
		t.Fatalf("Transaction returned %v: a COMMIT on the wire must finish", got)
	}
}

// portOf returns the port of a host:port address.
func portOf(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		panic(err)
	}
	return port
}

// TestBeginWaitsNoLongerThanItsContext: the transaction is begun with its
// context's cancellation (only COMMIT is shielded from it), so a request
// waiting for a pooled connection still gives up when its deadline passes.
func TestBeginWaitsNoLongerThanItsContext(t *testing.T) {
	forDBs(t, func(t *testing.T, e *env) {
		db := e.guarded(t)
		sqlDB, err := db.DB()
		if err != nil {
			t.Fatal(err)
		}
		sqlDB.SetMaxOpenConns(1)
		busy := db.Begin() // takes the only connection
		if busy.Error != nil {
			t.Fatal(busy.Error)
		}
		defer busy.Rollback()

		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		err = db.WithContext(ctx).Transaction(func(*gorm.DB) error { return nil })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Transaction waiting for a connection = %v, want context.DeadlineExceeded", err)
		}
		cancelled, stop := context.WithCancel(context.Background())
		stop()
		if err := db.WithContext(cancelled).Transaction(func(*gorm.DB) error { return nil }); !errors.Is(err, context.Canceled) {
			t.Fatalf("Transaction with a cancelled context = %v, want context.Canceled", err)
		}
	})
}

// TestCancelledTransactionRollsBack: a transaction whose context ends before
// its COMMIT is rolled back, as database/sql does without the plugin (GORM's
// DefaultTransactionTimeout relies on it): the write is not applied, Commit
// fails, and the database is free for the next writer.
func TestCancelledTransactionRollsBack(t *testing.T) {
	forDBs(t, func(t *testing.T, e *env) {
		db := e.guarded(t)
		if err := db.Create(&Counter{ID: 1}).Error; err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		tx := db.WithContext(ctx).Begin()
		if err := tx.Model(&Counter{ID: 1}).Update("n", 9).Error; err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := tx.Commit().Error; err == nil {
			t.Fatal("Commit after the context ended succeeded")
		}
		var c Counter
		if err := e.plain(t).First(&c, 1).Error; err != nil {
			t.Fatal(err)
		}
		if c.N != 0 {
			t.Fatalf("n = %d: the cancelled transaction's write was applied", c.N)
		}
		if err := db.Model(&Counter{ID: 1}).Update("n", 3).Error; err != nil {
			t.Fatalf("the next write: %v", err)
		}
	})
}
