package gormplugin

import (
	"database/sql"
	"fmt"
	"reflect"
	"slices"
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
	var cat map[string]keyColumn
	read := false
	for _, f := range s.PrimaryFields {
		if indirect(f.FieldType).Kind() != reflect.String {
			continue // named by its Go value, as written to the database
		}
		if cat == nil {
			cat = p.exactKeys(db, real)
		}
		if !cat[f.DBName].exact {
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
			cond, cvars := keyEquals(s.PrimaryFieldDBNames, nil, r.vals) // as the database compares it
			sqlText.WriteString(cond)
			vars = append(vars, cvars...)
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

// keyColumn is what the catalogue proves of a key column (exactKeys).
type keyColumn struct {
	// exact: the column compares byte for byte, so a key's spelling is
	// its row's (spelled reads nothing).
	exact bool
	// strict, when the column compares otherwise and a row stored in one
	// spelling matches a key in another: the column (its ?) compared byte
	// for byte, which every condition the plugin adds on the key also
	// meets (strictKeys). "" when none is proven (another dialect) or
	// needed (a type whose stored spelling is canonical).
	strict string
}

// The byte-for-byte forms of a key column (keyColumn.strict): SQLite's
// BINARY collation keeps the column's affinity; PostgreSQL compares
// citext, or text under a nondeterministic collation, as text in "C".
const (
	strictSQLite   = "? COLLATE BINARY"
	strictPostgres = `(?)::text COLLATE "C"`
)

// exactKeys reports, by column, how the columns of table real compare (see
// keyColumn): read once per table from the catalogue.
//
// SQLite: a column of TEXT or BLOB affinity in a table whose definition has
// no COLLATE is exact; in a table whose definition has one, every column
// is compared strictly (a COLLATE on another column costs a needless
// condition, never a wrong one). PostgreSQL: text or varchar under a
// deterministic collation is exact; citext, and text or varchar under a
// nondeterministic one, are compared strictly; char(n) and uuid are
// neither (their stored spelling is canonical: two equal values read back
// the same, and ::text would strip char(n)'s padding); nor is a domain (not
// proven). Another dialect (MySQL's _ci collations included), a catalogue
// that cannot be read, or a column not found: neither is proven, so the
// keys are read (spelled) and compared as the database compares them.
func (p *Plugin) exactKeys(db *gorm.DB, real string) map[string]keyColumn {
	dialect := db.Dialector.Name()
	key := dialect + "\x00" + real
	if v, ok := p.exact.Load(key); ok {
		return v.(map[string]keyColumn)
	}
	cat := map[string]keyColumn{}
	q := db.Session(&gorm.Session{NewDB: true})
	switch dialect {
	case "sqlite":
		if strings.Contains(real, ".") {
			break // an attached schema: not proven
		}
		var ddl string
		if err := q.Raw("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", real).Row().Scan(&ddl); err != nil {
			return cat // not cached: the table may not exist yet
		}
		collated := strings.Contains(strings.ToUpper(ddl), "COLLATE")
		var cols []struct{ Name, Type string }
		if err := q.Raw("SELECT name, type FROM pragma_table_info(?)", real).Scan(&cols).Error; err != nil {
			return cat
		}
		for _, c := range cols {
			if collated {
				cat[c.Name] = keyColumn{strict: strictSQLite}
				continue
			}
			t := strings.ToUpper(c.Type)
			// SQLite's affinity rules, in their order: INT is integer
			// (a string key "01" is stored as 1); then CHAR, CLOB, TEXT
			// are text, and BLOB or no type compares as stored.
			cat[c.Name] = keyColumn{exact: !strings.Contains(t, "INT") &&
				(strings.Contains(t, "CHAR") || strings.Contains(t, "CLOB") || strings.Contains(t, "TEXT") || strings.Contains(t, "BLOB") || t == "")}
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
			return cat
		}
		for _, c := range cols {
			text := c.Type == "text" || c.Type == "varchar"
			switch {
			case text && c.Deterministic:
				cat[c.Name] = keyColumn{exact: true}
			case text || c.Type == "citext":
				cat[c.Name] = keyColumn{strict: strictPostgres}
			}
		}
	}
	p.exact.Store(key, cat)
	return cat
}

// strictKeys returns, for each key column cols of table real, the form
// that compares it byte for byte where the database compares it otherwise
// (keyColumn.strict; "" for the others), or nil when no column needs one.
// As spelled, it reads the catalogue only for a column some row keys with a
// string: a key of another kind is compared as the database stores it.
func (p *Plugin) strictKeys(db *gorm.DB, real string, cols []string, rows []row) []string {
	var forms []string
	var cat map[string]keyColumn
	for j, c := range cols {
		if !slices.ContainsFunc(rows, func(r row) bool { return j < len(r.vals) && isString(r.vals[j]) }) {
			continue
		}
		if cat == nil {
			cat = p.exactKeys(db, real)
		}
		if s := cat[c].strict; s != "" {
			if forms == nil {
				forms = make([]string, len(cols))
			}
			forms[j] = s
		}
	}
	return forms
}

// strictColumn is col compared by form (a keyColumn.strict), or col itself
// when form is "".
func strictColumn(col clause.Column, form string) any {
	if form == "" {
		return col
	}
	return clause.Expr{SQL: form, Vars: []any{col}}
}

// keyEquals is the condition "the row's key is vals" of a statement the
// plugin sends itself (a fence read, Transaction's claim): each column
// compared as the database compares it (which its index serves) and, where
// strict gives a form, byte for byte too, so that it finds only the row
// stored in the spelling its lock names.
func keyEquals(cols, strict []string, vals []any) (string, []any) {
	var sqlText strings.Builder
	var vars []any
	for i, c := range cols {
		if i > 0 {
			sqlText.WriteString(" AND")
		}
		sqlText.WriteString(" ? = ?")
		vars = append(vars, clause.Column{Name: c}, vals[i])
		if i < len(strict) && strict[i] != "" {
			sqlText.WriteString(" AND ? = ?")
			vars = append(vars, strictColumn(clause.Column{Name: c}, strict[i]), vals[i])
		}
	}
	return sqlText.String(), vars
}

// isString reports whether v is a string, or a pointer to one.
func isString(v any) bool {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	return rv.Kind() == reflect.String
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
