package gormplugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// Account is a row with a fence column.
type Account struct {
	ID      uint
	Balance int
	Fence   gormplugin.Fence `gorm:"not null;default:0"`
}

// exampleDB opens a SQLite file in a temporary directory; close undoes it all.
func exampleDB() (db *gorm.DB, close func()) {
	dir, err := os.MkdirTemp("", "gormplugin-example-")
	if err != nil {
		panic(err)
	}
	dsn := "file:" + filepath.Join(dir, "app.db") + "?_journal_mode=WAL&_busy_timeout=5000"
	db, err = gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	if err := db.AutoMigrate(&Account{}); err != nil {
		panic(err)
	}
	sqlDB, _ := db.DB()
	return db, func() { sqlDB.Close(); os.RemoveAll(dir) }
}

func ExampleNew() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	l := locks.New(rdb)
	defer l.Close()
	g := cacheguard.New(rdb)
	defer g.Close()
	db, closeDB := exampleDB()
	defer closeDB()

	// An account is cached under "account:<id>"; a committed write to its
	// row invalidates that key.
	keys := func(table string, pk any) []string { return []string{fmt.Sprintf("account:%v", pk)} }
	plugin := gormplugin.New(l, gormplugin.Invalidate(g, keys))
	if err := db.Use(plugin); err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		// After the HTTP server's Shutdown: flush what is still owed.
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		plugin.Shutdown(sctx)
	}()
	db.Create(&Account{ID: 1, Balance: 100})

	load := func(ctx context.Context) (Account, error) {
		var a Account
		err := db.WithContext(ctx).First(&a, 1).Error
		return a, err
	}
	a, _ := cacheguard.Get(ctx, g, "account:1", load, cacheguard.TTL(time.Minute))
	fmt.Println("cached balance:", a.Balance)

	// The write holds the lock "accounts:1", checks and stamps the fence, and
	// invalidates account:1 after its COMMIT.
	acct := Account{ID: 1}
	if err := db.WithContext(ctx).Model(&acct).Update("balance", 90).Error; err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("fence stamped:", acct.Fence > 0)
	a, _ = cacheguard.Get(ctx, g, "account:1", load, cacheguard.TTL(time.Minute))
	fmt.Println("balance read after the write:", a.Balance)
	// Output:
	// cached balance: 100
	// fence stamped: true
	// balance read after the write: 90
}

func ExampleTransaction() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	l := locks.New(rdb)
	defer l.Close()
	db, closeDB := exampleDB()
	defer closeDB()
	if err := db.Use(gormplugin.New(l)); err != nil {
		fmt.Println(err)
		return
	}
	db.Create(&Account{ID: 7, Balance: 100})

	// Read-modify-write: the lock on accounts:7 spans the read and the
	// write, so concurrent withdrawals never lose one another's update.
	withdraw := func(amount int) error {
		return gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
			var a Account
			if err := tx.First(&a, 7).Error; err != nil {
				return err
			}
			if a.Balance < amount {
				return errors.New("insufficient funds")
			}
			return tx.Model(&a).Update("balance", a.Balance-amount).Error
		}, &Account{ID: 7})
	}
	fmt.Println(withdraw(30), withdraw(80))
	var a Account
	db.First(&a, 7)
	fmt.Println("balance:", a.Balance)
	// Output:
	// <nil> insufficient funds
	// balance: 70
}

func ExampleStaleWriteError() {
	// A writer whose lock expired while it was paused is refused by the
	// fence; the newer write survives.
	err := error(&gormplugin.StaleWriteError{Name: "accounts:1", Fence: 100, Stored: 105})
	fmt.Println(errors.Is(err, gormplugin.ErrStaleWrite))
	fmt.Println(err)
	// Output:
	// true
	// gormplugin: stale write refused: row "accounts:1" carries fence 105, newer than this writer's 100
}
