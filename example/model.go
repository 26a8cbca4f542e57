package main

import (
	"fmt"

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

// openDB opens the SQLite file shared by the instances: WAL so readers never
// wait for the writer, and a busy timeout so writers wait for each other.
func openDB(path string, pool int) (*gorm.DB, error) {
	dsn := "file:" + path + "?_journal_mode=WAL&_busy_timeout=5000"
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(pool)
	sqlDB.SetMaxIdleConns(pool)
	return db, nil
}

// createSchema creates the table and its seed rows in a new database file.
func createSchema(path string) error {
	db, err := openDB(path, 1)
	if err != nil {
		return err
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	if err := db.AutoMigrate(&Repo{}); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	return db.Create(seedRepos).Error
}
