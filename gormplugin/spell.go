package gormplugin

import (
	"database/sql"
	"fmt"
	"reflect"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// spellChunk bounds the SELECTs of one spelling read (SQLite allows 500 in
// a compound SELECT).
const spellChunk = 100

// spelled is the one place a row named by a key the caller gave (a model's,
// a delete's value, a slice's elements, an upsert's values, a row declared
// to Transaction) gets the name the database's own spelling of that key
// gives it: a lock name must be the row's, and the database may match a key
// spelled otherwise ("ABC" finds the row stored as "abc" under SQLite's
// COLLATE NOCASE, PostgreSQL's citext or a nondeterministic collation, a
// MySQL _ci collation; "01" finds 1 in a numeric column).
//
// A string part of the key whose column compares byte for byte (exactKeys)
// and a part of another kind are the database's spelling already: no read.
// Otherwise one read (of at most spellChunk keys per query, one SELECT per
// key, so each result says which key it spells) returns the stored key of
// each row, which then names it (given keeps the caller's spelling). A key
// no row matches keeps its spelling, marked missing: an upsert inserts it as
// given, and the statement's restriction leaves it out, so a row stored
// under another spelling meanwhile is not written under this name.
func (p *Plugin) spelled(db *gorm.DB, s *schema.Schema, table, real string, rows []row) ([]row, error) {
	if s == nil || len(rows) == 0 || len(s.PrimaryFields) == 0 {
		return rows, nil
	}
	var exact map[string]bool
	read := false
	for _, f := range s.PrimaryFields {
		if indirect(f.FieldType).Kind() != reflect.String {
			continue // named by its Go value, as written to the database
		}
		if exact == nil {
			exact = p.exactKeys(db, real)
		}
		if !exact[f.DBName] {
			read = true
		}
	}
	if !read {
		return rows, nil
	}
	out := make([]row, len(rows))
	copy(out, rows)
	q := db.Session(&gorm.Session{NewDB: true})
	for start := 0; start < len(out); start += spellChunk {
		chunk := out[start:min(start+spellChunk, len(out))]
		var sqlText strings.Builder
		var vars []any
		for i, r := range chunk {
			if i > 0 {
				sqlText.WriteString(" UNION ALL ")
			}
			fmt.Fprintf(&sqlText, "SELECT %d", i)
			for _, f := range s.PrimaryFields {
				sqlText.WriteString(", ?")
				vars = append(vars, clause.Column{Name: f.DBName})
			}
			sqlText.WriteString(" FROM ? WHERE")
			vars = append(vars, clause.Table{Name: real})
			for j, f := range s.PrimaryFields {
				if j > 0 {
					sqlText.WriteString(" AND")
				}
				sqlText.WriteString(" ? = ?")
				vars = append(vars, clause.Column{Name: f.DBName}, r.vals[j])
			}
		}
		rs, err := q.Raw(sqlText.String(), vars...).Rows()
		if err != nil {
			return nil, fmt.Errorf("gormplugin: reading how %q spells the keys written: %w", table, err)
		}
		found := make([]bool, len(chunk))
		for rs.Next() {
			var i int
			vals := make([]any, len(s.PrimaryFields))
			strs := make([]sql.NullString, len(s.PrimaryFields))
			ptrs := []any{&i}
			for j, f := range s.PrimaryFields {
				if indirect(f.FieldType).Kind() == reflect.String {
					ptrs = append(ptrs, &strs[j])
				} else {
					ptrs = append(ptrs, &vals[j])
				}
			}
			if err := rs.Scan(ptrs...); err != nil {
				rs.Close()
				return nil, fmt.Errorf("gormplugin: reading how %q spells the keys written: %w", table, err)
			}
			if i < 0 || i >= len(chunk) || found[i] {
				continue // (a key no collation would match twice)
			}
			for j, f := range s.PrimaryFields {
				if indirect(f.FieldType).Kind() == reflect.String {
					vals[j] = strs[j].String
				} else if b, ok := vals[j].([]byte); ok {
					vals[j] = string(b)
				}
			}
			found[i] = true
			r := &chunk[i]
			if name := RowName(table, vals...); name != r.name {
				r.given, r.name, r.vals = r.vals, name, vals
			}
		}
		err = rs.Err()
		rs.Close()
		if err != nil {
			return nil, fmt.Errorf("gormplugin: reading how %q spells the keys written: %w", table, err)
		}
		for i := range chunk {
			chunk[i].missing = !found[i]
		}
	}
	return sortRows(out), nil
}

// exactKeys reports, by column, whether the string columns of table real
// compare byte for byte, so that a key's spelling is the row's: read once
// per table from the catalogue. SQLite: a column of TEXT or BLOB affinity
// in a table whose definition has no COLLATE; PostgreSQL: text or varchar
// under a deterministic collation (not citext, char(n), uuid, a domain).
// Another dialect, a catalogue that cannot be read, or a column not found:
// not proven, so the keys are read (spelled).
func (p *Plugin) exactKeys(db *gorm.DB, real string) map[string]bool {
	dialect := db.Dialector.Name()
	key := dialect + "\x00" + real
	if v, ok := p.exact.Load(key); ok {
		return v.(map[string]bool)
	}
	exact := map[string]bool{}
	q := db.Session(&gorm.Session{NewDB: true})
	switch dialect {
	case "sqlite":
		if strings.Contains(real, ".") {
			break // an attached schema: not proven
		}
		var ddl string
		if err := q.Raw("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", real).Row().Scan(&ddl); err != nil {
			return exact // not cached: the table may not exist yet
		}
		if strings.Contains(strings.ToUpper(ddl), "COLLATE") {
			break
		}
		var cols []struct{ Name, Type string }
		if err := q.Raw("SELECT name, type FROM pragma_table_info(?)", real).Scan(&cols).Error; err != nil {
			return exact
		}
		for _, c := range cols {
			t := strings.ToUpper(c.Type)
			// SQLite's affinity rules, in their order: INT is integer
			// (a string key "01" is stored as 1); then CHAR, CLOB, TEXT
			// are text, and BLOB or no type compares as stored.
			exact[c.Name] = !strings.Contains(t, "INT") &&
				(strings.Contains(t, "CHAR") || strings.Contains(t, "CLOB") || strings.Contains(t, "TEXT") || strings.Contains(t, "BLOB") || t == "")
		}
	case "postgres":
		var cols []struct {
			Name, Type    string
			Deterministic bool
		}
		err := q.Raw(`SELECT a.attname AS name, t.typname AS type, COALESCE(c.collisdeterministic, true) AS deterministic
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_collation c ON c.oid = a.attcollation
WHERE a.attrelid = ?::regclass AND a.attnum > 0 AND NOT a.attisdropped`, quoted(db, real)).Scan(&cols).Error
		if err != nil {
			return exact
		}
		for _, c := range cols {
			exact[c.Name] = (c.Type == "text" || c.Type == "varchar") && c.Deterministic
		}
	}
	p.exact.Store(key, exact)
	return exact
}

// quoted is a (maybe schema-qualified) table name quoted for the dialect.
func quoted(db *gorm.DB, name string) string {
	var b strings.Builder
	db.Dialector.QuoteTo(&b, name)
	return b.String()
}

// indirect is t without its pointers.
func indirect(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}
