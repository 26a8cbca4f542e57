package main

import (
	"fmt"
	"net/url"
	"strings"

	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/cacheguard/cacheguard/gormplugin"
)

// Repo is a repository and its settings: one row of table repos, which
// gormplugin locks as "repos:<id>", the name ginmw.Resource("repos", ...)
// gives a request's resource too.
type Repo struct {
	ID       uint             `gorm:"primaryKey" json:"id"`
	Name     string           `gorm:"not null" json:"name"`
	Settings Settings         `gorm:"serializer:json;not null" json:"settings"`
	Version  int              `gorm:"not null;default:0" json:"version"` // edits applied so far
	Fence    gormplugin.Fence `gorm:"not null;default:0" json:"fence"`   // token of the last guarded write
}

// Settings are what PUT /repos/:id/settings edits.
type Settings struct {
	DefaultBranch string   `json:"default_branch"`
	Visibility    string   `json:"visibility"`
	Edits         []string `json:"edits"` // ids of the edits applied, oldest first
}

// edit is the body of PUT /repos/:id/settings; absent fields are left as they are.
type edit struct {
	ID            string  `json:"edit" binding:"required,max=64"`
	DefaultBranch *string `json:"default_branch" binding:"omitempty,min=1,max=255"`
	Visibility    *string `json:"visibility" binding:"omitempty,oneof=public private"`
}

// seedRepos are the rows a new database starts with.
var seedRepos = []Repo{
	{ID: 1, Name: "acme/api", Settings: Settings{DefaultBranch: "main", Visibility: "private", Edits: []string{}}},
	{ID: 2, Name: "acme/web", Settings: Settings{DefaultBranch: "main", Visibility: "public", Edits: []string{}}},
	{ID: 3, Name: "acme/docs", Settings: Settings{DefaultBranch: "trunk", Visibility: "public", Edits: []string{}}},
}

// dialector picks the driver for dsn: a postgres:// (or postgresql://) URL
// is PostgreSQL, anything else a SQLite file, opened in WAL mode (readers
// never wait for the writer) with a busy timeout (writers wait for each
// other, as they do on a server database). SQLite transactions begin
// IMMEDIATE, taking the write lock up front: a deferred transaction that
// reads and then writes fails at once with "database is locked" when
// another connection committed in between (its snapshot is stale, and
// waiting cannot help), so two edits of different repositories would
// conflict.
func dialector(dsn string) (gorm.Dialector, error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return postgres.Open(dsn), nil
	case strings.Contains(dsn, "://"):
		return nil, fmt.Errorf("-db %q: want a SQLite file or a postgres:// URL", dsn)
	case dsn == "":
		return nil, fmt.Errorf("-db: empty")
	default:
		return sqlite.Open("file:" + dsn + "?_journal_mode=WAL&_busy_timeout=5000&_txlock=immediate"), nil
	}
}

// openDB opens the database shared by the instances with at most pool connections.
func openDB(dsn string, pool int) (*gorm.DB, error) {
	d, err := dialector(dsn)
	if err != nil {
		return nil, err
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open the database: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(pool)
	sqlDB.SetMaxIdleConns(pool)
	return db, nil
}

// createSchema creates the table when it is missing and adds the seed rows
// when it is empty: the first process of a service prepares the database,
// the others find it ready.
func createSchema(dsn string) error {
	db, err := openDB(dsn, 1)
	if err != nil {
		return err
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	if err := db.AutoMigrate(&Repo{}); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	var n int64
	if err := db.Model(&Repo{}).Count(&n).Error; err != nil {
		return fmt.Errorf("count repositories: %w", err)
	}
	if n > 0 {
		return nil
	}
	return db.Create(seedRepos).Error
}

// redactDSN hides the password of a database URL, for the banner.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		return u.Redacted()
	}
	return dsn
}
