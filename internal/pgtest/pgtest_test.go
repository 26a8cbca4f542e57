package pgtest_test

import (
	"testing"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/cacheguard/cacheguard/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestDatabase(t *testing.T) {
	db, err := gorm.Open(postgres.Open(pgtest.DSN(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	type Row struct {
		ID   uint
		Name string
	}
	if err := db.AutoMigrate(&Row{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Create(&Row{Name: "a"}).Error; err != nil {
		t.Fatal(err)
	}
	var got Row
	if err := db.First(&got).Error; err != nil || got.Name != "a" {
		t.Fatalf("got %+v, %v", got, err)
	}
	// A second database on the same server starts empty.
	db2, err := gorm.Open(postgres.Open(pgtest.DSN(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB2, _ := db2.DB()
	defer sqlDB2.Close()
	if db2.Migrator().HasTable(&Row{}) {
		t.Fatal("new database already has the table")
	}
}
