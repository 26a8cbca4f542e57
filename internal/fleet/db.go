package fleet

import (
	"fmt"
	"net/url"
	"strings"

	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// repoRow is a row of the service's table repos, as the driver reads it
// straight from the database (the service's own type lives in package main).
type repoRow struct {
	ID       uint     `gorm:"primaryKey" json:"id"`
	Name     string   `json:"name"`
	Settings settings `gorm:"serializer:json" json:"settings"`
	Version  int      `json:"version"`
	Fence    uint64   `json:"fence"`
}

func (repoRow) TableName() string { return "repos" }

type settings struct {
	DefaultBranch string   `json:"default_branch"`
	Visibility    string   `json:"visibility"`
	Edits         []string `json:"edits"`
}

// seeded is the number of rows the service creates itself (ids 1-3).
const seeded = 3

// openDriverDB opens the driver's own connection to the fleet's database.
func openDriverDB(dsn string) (*gorm.DB, error) {
	var d gorm.Dialector
	if strings.HasPrefix(dsn, "postgres://") {
		d = postgres.Open(dsn)
	} else {
		d = sqlite.Open("file:" + dsn + "?_journal_mode=WAL&_busy_timeout=5000")
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(2)
	return db, nil
}

// addRepos inserts rows seeded+1 .. n, so that scenarios can use repositories
// nobody has read or edited yet.
func addRepos(db *gorm.DB, n int) error {
	var rows []repoRow
	for id := seeded + 1; id <= n; id++ {
		rows = append(rows, repoRow{ID: uint(id), Name: fmt.Sprintf("fleet/r%d", id),
			Settings: settings{DefaultBranch: "main", Visibility: "private", Edits: []string{}}})
	}
	if len(rows) == 0 {
		return nil
	}
	return db.CreateInBatches(rows, 100).Error
}

// pgURL turns a libpq key=value DSN (what internal/pgtest returns) into the
// postgres:// URL the service's -db flag takes.
func pgURL(dsn string) string {
	kv := map[string]string{}
	for _, f := range strings.Fields(dsn) {
		if k, v, ok := strings.Cut(f, "="); ok {
			kv[k] = v
		}
	}
	u := url.URL{Scheme: "postgres", Host: kv["host"] + ":" + kv["port"], Path: "/" + kv["dbname"]}
	if p, ok := kv["password"]; ok {
		u.User = url.UserPassword(kv["user"], p)
	} else {
		u.User = url.User(kv["user"])
	}
	if m := kv["sslmode"]; m != "" {
		u.RawQuery = "sslmode=" + m
	}
	return u.String()
}
