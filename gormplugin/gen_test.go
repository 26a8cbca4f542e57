package gormplugin_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"pgregory.net/rapid"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/internal/pgtest"
	"github.com/cacheguard/cacheguard/internal/testing/gen"
	"github.com/cacheguard/cacheguard/locks"
)

// Slug has a string key.
type Slug struct {
	Name  string `gorm:"primaryKey"`
	V     int
	Fence gormplugin.Fence `gorm:"not null;default:0"`
}

// Memo is soft-deleted.
type Memo struct {
	ID        uint
	Text      string
	Fence     gormplugin.Fence `gorm:"not null;default:0"`
	DeletedAt gorm.DeletedAt
}

// audited lists the generator's tables: each has audit triggers that record
// every row change with its key, its fence and its whole value, old and new.
var audited = []struct {
	table string
	key   string // SQL of the row's key as in its lock name, over a row alias %[1]s
	val   string // SQL of the whole row
}{
	{"repos", "CAST(%[1]s.id AS TEXT)", "CAST(%[1]s.id AS TEXT) || '|' || %[1]s.name || '|' || CAST(%[1]s.stars AS TEXT)"},
	{"slugs", "%[1]s.name", "%[1]s.name || '|' || CAST(%[1]s.v AS TEXT)"},
	{"pairs", "CAST(%[1]s.a AS TEXT) || ':' || %[1]s.b", "CAST(%[1]s.a AS TEXT) || ':' || %[1]s.b || '|' || CAST(%[1]s.v AS TEXT)"},
	{"badges", "CAST(%[1]s.id AS TEXT)", "CAST(%[1]s.id AS TEXT) || '|' || %[1]s.code || '|' || %[1]s.label"},
	{"memos", "CAST(%[1]s.id AS TEXT)", "CAST(%[1]s.id AS TEXT) || '|' || %[1]s.text || '|' || COALESCE(CAST(%[1]s.deleted_at AS TEXT), '')"},
	{"ci_slugs", "%[1]s.name", "%[1]s.name || '|' || CAST(%[1]s.v AS TEXT)"},
	{"items", "CAST(%[1]s.id AS TEXT)", "CAST(%[1]s.id AS TEXT) || '|' || COALESCE(CAST(%[1]s.shelf_id AS TEXT), '') || '|' || %[1]s.name"},
}

// installAudit creates the audit table and triggers on db.
func installAudit(t testing.TB, db *gorm.DB, dialect string) {
	t.Helper()
	var stmts []string
	if dialect == onPostgres {
		stmts = append(stmts, `CREATE TABLE cg_audit (seq BIGSERIAL PRIMARY KEY, tbl TEXT, op TEXT, old_key TEXT, new_key TEXT, old_fence BIGINT, new_fence BIGINT, old_val TEXT, new_val TEXT)`)
		for _, a := range audited {
			k, v := func(r string) string { return fmt.Sprintf(a.key, r) }, func(r string) string { return fmt.Sprintf(a.val, r) }
			stmts = append(stmts, fmt.Sprintf(`CREATE FUNCTION audit_%[1]s() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
IF TG_OP = 'INSERT' THEN INSERT INTO cg_audit (tbl, op, new_key, new_fence, new_val) VALUES ('%[1]s', 'I', %[2]s, NEW.fence, %[3]s);
ELSIF TG_OP = 'UPDATE' THEN INSERT INTO cg_audit (tbl, op, old_key, new_key, old_fence, new_fence, old_val, new_val) VALUES ('%[1]s', 'U', %[4]s, %[2]s, OLD.fence, NEW.fence, %[5]s, %[3]s);
ELSE INSERT INTO cg_audit (tbl, op, old_key, old_fence, old_val) VALUES ('%[1]s', 'D', %[4]s, OLD.fence, %[5]s);
END IF; RETURN NULL; END $$`, a.table, k("NEW"), v("NEW"), k("OLD"), v("OLD")),
				fmt.Sprintf(`CREATE TRIGGER audit_%[1]s AFTER INSERT OR UPDATE OR DELETE ON %[1]s FOR EACH ROW EXECUTE FUNCTION audit_%[1]s()`, a.table))
		}
	} else {
		stmts = append(stmts, `CREATE TABLE cg_audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, tbl TEXT, op TEXT, old_key TEXT, new_key TEXT, old_fence INTEGER, new_fence INTEGER, old_val TEXT, new_val TEXT)`)
		for _, a := range audited {
			k, v := func(r string) string { return fmt.Sprintf(a.key, r) }, func(r string) string { return fmt.Sprintf(a.val, r) }
			stmts = append(stmts,
				fmt.Sprintf(`CREATE TRIGGER audit_%[1]s_i AFTER INSERT ON %[1]s BEGIN INSERT INTO cg_audit (tbl, op, new_key, new_fence, new_val) VALUES ('%[1]s', 'I', %[2]s, NEW.fence, %[3]s); END`, a.table, k("NEW"), v("NEW")),
				fmt.Sprintf(`CREATE TRIGGER audit_%[1]s_u AFTER UPDATE ON %[1]s BEGIN INSERT INTO cg_audit (tbl, op, old_key, new_key, old_fence, new_fence, old_val, new_val) VALUES ('%[1]s', 'U', %[4]s, %[2]s, OLD.fence, NEW.fence, %[5]s, %[3]s); END`, a.table, k("NEW"), v("NEW"), k("OLD"), v("OLD")),
				fmt.Sprintf(`CREATE TRIGGER audit_%[1]s_d AFTER DELETE ON %[1]s BEGIN INSERT INTO cg_audit (tbl, op, old_key, old_fence, old_val) VALUES ('%[1]s', 'D', %[2]s, OLD.fence, %[3]s); END`, a.table, k("OLD"), v("OLD")))
		}
	}
	for _, s := range stmts {
		if err := db.Exec(s).Error; err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// auditRow is one row change the database recorded.
type auditRow struct {
	Seq                int64
	Tbl, Op            string
	OldKey, NewKey     *string
	OldFence, NewFence *int64
	OldVal, NewVal     *string
}

// changes are the audit rows that changed something (a claim's UPDATE that
// sets a column to itself changes nothing).
func changes(t interface{ Fatal(...any) }, db *gorm.DB) []auditRow {
	var rows []auditRow
	if err := db.Raw("SELECT seq, tbl, op, old_key, new_key, old_fence, new_fence, old_val, new_val FROM cg_audit ORDER BY seq").Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(rows, func(r auditRow) bool {
		return r.Op == "U" && eqp(r.OldKey, r.NewKey) && eqp(r.OldVal, r.NewVal) && eqp(r.OldFence, r.NewFence)
	})
}

func eqp[T comparable](a, b *T) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

// seed puts every audited table back to the same rows, and empties the audit.
func seed(db *gorm.DB) error {
	return db.Transaction(func(tx *gorm.DB) error {
		for _, table := range []string{"repos", "slugs", "pairs", "badges", "memos", "items", "shelves", "ci_slugs"} {
			if err := tx.Exec("DELETE FROM " + table).Error; err != nil {
				return err
			}
		}
		for _, v := range []any{
			&[]Repo{{ID: 1, Name: "a"}, {ID: 2, Name: "a"}, {ID: 3, Name: "b"}, {ID: 10, Name: "b"}},
			&[]Slug{{Name: "1", V: 1}, {Name: "01", V: 1}, {Name: "b", V: 2}},
			&[]CiSlug{{Name: "abc", V: 1}, {Name: "Zz", V: 2}},
			&[]Pair{{A: 0, B: "x", V: 1}, {A: 1, B: "x", V: 1}, {A: 0, B: "y", V: 2}, {A: 2, B: "y", V: 2}},
			&[]Badge{{ID: 1, Code: "a", Label: "l"}, {ID: 2, Code: "b", Label: "l"}, {ID: 3, Code: "c", Label: "m"}},
			&[]Memo{{ID: 1, Text: "a"}, {ID: 2, Text: "a"}, {ID: 3, Text: "b"}},
			&[]Shelf{{ID: 1}, {ID: 2}},
			&[]Item{{ID: 1, ShelfID: ptr(uint(1)), Name: "a"}, {ID: 2, ShelfID: ptr(uint(1)), Name: "b"}, {ID: 3, ShelfID: ptr(uint(2)), Name: "c"}},
		} {
			if err := tx.Create(v).Error; err != nil {
				return err
			}
		}
		// New keys start at 100 on both databases, whatever they inserted
		// before.
		for _, table := range []string{"repos", "badges", "memos", "items"} {
			q := "UPDATE sqlite_sequence SET seq = 99 WHERE name = '" + table + "'"
			if tx.Dialector.Name() == "postgres" {
				q = "SELECT setval(pg_get_serial_sequence('" + table + "', 'id'), 100, false)"
			}
			if err := tx.Exec(q).Error; err != nil {
				return err
			}
		}
		return tx.Exec("DELETE FROM cg_audit").Error
	})
}

// auditKeys lists the generator's possible row names, for the other owner
// to hold.
var auditKeys = []string{"repos:1", "repos:2", "repos:3", "repos:10", "repos:7", "slugs:1", "slugs:01", "slugs:b",
	"pairs:0:x", "pairs:1:x", "pairs:0:y", "pairs:2:y", "badges:1", "badges:2", "badges:3", "badges:7", "memos:1", "memos:2", "memos:3",
	"items:1", "items:2", "items:3", "shelves:1", "repos:20", "ci_slugs:abc", "ci_slugs:Zz"}

// invalidation is one call of the generator's Invalidator: its keys, and
// the last audit row committed when it was made.
type invalidation struct {
	keys []string
	seen int64
}

type auditInvalidator struct {
	db   *gorm.DB    // a connection without the plugin
	down atomic.Bool // the cache is unreachable: every call fails
	mu   sync.Mutex
	got  []invalidation
	told []invalidation // the keys of each EventInvalidateFailed, by statement (seen: its id)
}

// genStmtID keys a statement's number in its context: a failed
// invalidation must be reported under the context of the write it follows.
type genStmtID struct{}

// observe records the failed invalidations reported under a statement's
// context.
func (a *auditInvalidator) observe(ctx context.Context, e gormplugin.Event) {
	if id, ok := ctx.Value(genStmtID{}).(int64); ok && e.Kind == gormplugin.EventInvalidateFailed {
		a.mu.Lock()
		a.told = append(a.told, invalidation{keys: e.Keys, seen: id})
		a.mu.Unlock()
	}
}

// toldFor returns the keys reported failed under statement id's context by
// now, as invalidations made after every audit row (the caller was told).
func (a *auditInvalidator) toldFor(id int64) []invalidation {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []invalidation
	for _, t := range a.told {
		if t.seen == id {
			out = append(out, invalidation{keys: t.keys, seen: math.MaxInt64})
		}
	}
	return out
}

func (a *auditInvalidator) Invalidate(ctx context.Context, keys ...string) error {
	if a.down.Load() {
		return errors.New("gen: the cache is unreachable")
	}
	var seen int64
	if err := a.db.WithContext(ctx).Raw("SELECT COALESCE(MAX(seq), 0) FROM cg_audit").Scan(&seen).Error; err != nil {
		return err
	}
	a.mu.Lock()
	a.got = append(a.got, invalidation{keys: keys, seen: seen})
	a.mu.Unlock()
	return nil
}

func (a *auditInvalidator) take() []invalidation {
	a.mu.Lock()
	defer a.mu.Unlock()
	got := a.got
	a.got = nil
	return got
}

// genStmt is one GORM write built from the grammar: its text, and the
// function that sends it on a database (with or without the plugin).
type genStmt struct {
	text string
	run  func(ctx context.Context, db *gorm.DB) error
}

// A key of each table as a caller may spell it.
func drawRepoID(rt *rapid.T) any {
	return rapid.SampledFrom([]any{uint(1), uint(2), uint(3), uint(10), uint(7), 1, "1", "01", "10", "3"}).Draw(rt, "repo id")
}

// drawModel draws the Model form of an update or delete on table, and the
// rows a Transaction may declare for it.
func drawModel(rt *rapid.T, table, dialect string) (string, func(*gorm.DB) *gorm.DB, []any) {
	switch table {
	case "repos":
		id := rapid.SampledFrom([]uint{0, 1, 2, 3, 7}).Draw(rt, "model id")
		switch rapid.IntRange(0, 6).Draw(rt, "repo model") {
		case 6: // the table's name as callers spell it: quoted, spaced, schema-qualified
			spellings := []string{"`repos`", " repos", "main.repos"}
			if dialect == onPostgres {
				spellings = []string{`"repos"`, " repos", "public.repos"}
			}
			name := rapid.SampledFrom(spellings).Draw(rt, "table spelling")
			return fmt.Sprintf("Table(%q)", name), func(db *gorm.DB) *gorm.DB { return db.Table(name) }, nil
		case 5:
			return `Table("(SELECT * FROM repos) AS r")`, func(db *gorm.DB) *gorm.DB { return db.Table("(SELECT * FROM repos) AS r") }, nil
		case 0:
			return fmt.Sprintf("Model(&Repo{ID: %d})", id), func(db *gorm.DB) *gorm.DB { return db.Model(&Repo{ID: id}) }, declare(id != 0, &Repo{ID: id})
		case 1:
			id2 := rapid.SampledFrom([]uint{0, 2, 10}).Draw(rt, "second id")
			return fmt.Sprintf("Model(&[]Repo{{ID: %d}, {ID: %d}})", id, id2), func(db *gorm.DB) *gorm.DB { return db.Model(&[]Repo{{ID: id}, {ID: id2}}) }, nil
		case 2:
			return `Table("repos")`, func(db *gorm.DB) *gorm.DB { return db.Table("repos") }, nil
		case 3:
			return `Model(&Repo{}).Table("repos AS r")`, func(db *gorm.DB) *gorm.DB { return db.Model(&Repo{}).Table("repos AS r") }, nil
		}
		return "Model(&Repo{})", func(db *gorm.DB) *gorm.DB { return db.Model(&Repo{}) }, nil
	case "ci_slugs": // compared without case: COLLATE NOCASE, citext
		name := rapid.SampledFrom([]string{"", "abc", "ABC", "zz", "ZZ"}).Draw(rt, "ci name")
		return fmt.Sprintf("Model(&CiSlug{Name: %q})", name), func(db *gorm.DB) *gorm.DB { return db.Model(&CiSlug{Name: name}) }, declare(name != "", &CiSlug{Name: name})
	case "slugs":
		name := rapid.SampledFrom([]string{"", "1", "01", "b"}).Draw(rt, "tag")
		return fmt.Sprintf("Model(&Slug{Name: %q})", name), func(db *gorm.DB) *gorm.DB { return db.Model(&Slug{Name: name}) }, declare(name != "", &Slug{Name: name})
	case "pairs":
		a := rapid.IntRange(0, 2).Draw(rt, "a")
		b := rapid.SampledFrom([]string{"", "x", "y"}).Draw(rt, "b")
		return fmt.Sprintf("Model(&Pair{A: %d, B: %q})", a, b), func(db *gorm.DB) *gorm.DB { return db.Model(&Pair{A: a, B: b}) }, declare(a != 0 || b != "", &Pair{A: a, B: b})
	case "badges":
		id := rapid.SampledFrom([]uint{0, 1, 3}).Draw(rt, "badge id")
		return fmt.Sprintf("Model(&Badge{ID: %d})", id), func(db *gorm.DB) *gorm.DB { return db.Model(&Badge{ID: id}) }, declare(id != 0, &Badge{ID: id})
	}
	id := rapid.SampledFrom([]uint{0, 1, 2}).Draw(rt, "note id")
	return fmt.Sprintf("Model(&Memo{ID: %d})", id), func(db *gorm.DB) *gorm.DB { return db.Model(&Memo{ID: id}) }, declare(id != 0, &Memo{ID: id})
}

func declare(ok bool, v any) []any {
	if ok {
		return []any{v}
	}
	return nil
}

// drawConds draws Where/Or/Not conditions on table.
func drawConds(rt *rapid.T, table string) (string, func(*gorm.DB) *gorm.DB) {
	var texts []string
	var fs []func(*gorm.DB) *gorm.DB
	for i := range rapid.IntRange(0, 2).Draw(rt, "conds") {
		var text string
		var f func(*gorm.DB) *gorm.DB
		var col string
		var v any
		// Every table has a column besides its keys that its conditions
		// name, with a value several rows hold and its interloper's row
		// too: such a WHERE names no row, and the plugin must read them.
		switch table {
		case "repos":
			col, v = rapid.SampledFrom([]string{"id", "name"}).Draw(rt, "col"), drawRepoID(rt)
			if col == "name" {
				v = rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "name")
			}
		case "slugs":
			col, v = "name", rapid.SampledFrom([]any{"1", "01", "b", 1}).Draw(rt, "tag name")
			if rapid.IntRange(0, 2).Draw(rt, "by v") == 0 {
				col, v = "v", rapid.SampledFrom([]any{1, 2}).Draw(rt, "v")
			}
		case "ci_slugs":
			col, v = "name", rapid.SampledFrom([]any{"abc", "ABC", "zZ"}).Draw(rt, "ci name v")
			if rapid.IntRange(0, 2).Draw(rt, "by v") == 0 {
				col, v = "v", rapid.SampledFrom([]any{1, 2}).Draw(rt, "v")
			}
		case "pairs":
			col = rapid.SampledFrom([]string{"a", "b", "v"}).Draw(rt, "col")
			v = map[string]any{"a": 0, "b": "x", "v": 1}[col]
		case "badges":
			col, v = rapid.SampledFrom([]string{"id", "code"}).Draw(rt, "col"), rapid.SampledFrom([]any{1, "2", "a"}).Draw(rt, "badge v")
			if rapid.IntRange(0, 2).Draw(rt, "by label") == 0 {
				col, v = "label", rapid.SampledFrom([]any{"l", "m"}).Draw(rt, "label")
			}
		default:
			col, v = "id", rapid.SampledFrom([]any{1, 2, "3"}).Draw(rt, "note id v")
			if rapid.IntRange(0, 2).Draw(rt, "by text") == 0 {
				col, v = "text", rapid.SampledFrom([]any{"a", "b"}).Draw(rt, "text")
			}
		}
		// Ops 5-10 hold an OR in SQL text, in every place GORM's builders
		// treat apart: a Where, a Not, named arguments, a bound clause.Expr;
		// spelled " OR " (which GORM parenthesizes in some of them) or with
		// another space (which it never does).
		or := rapid.SampledFrom([]string{" OR ", " OR\t", "\nOR "}).Draw(rt, fmt.Sprintf("or%d", i))
		switch op := rapid.IntRange(0, 10).Draw(rt, fmt.Sprintf("op%d", i)); op {
		case 5:
			text = fmt.Sprintf("Where(%q, %#v, %#v)", col+" = ?"+or+col+" = ?", v, v)
			f = func(db *gorm.DB) *gorm.DB { return db.Where(col+" = ?"+or+col+" = ?", v, v) }
		case 6:
			text = fmt.Sprintf("Not(%q, %#v, %#v)", col+" = ?"+or+col+" = ?", v, v)
			f = func(db *gorm.DB) *gorm.DB { return db.Not(col+" = ?"+or+col+" = ?", v, v) }
		case 7:
			text = fmt.Sprintf("Where(%q, sql.Named(\"x\", %#v))", col+" = @x"+or+col+" = @x", v)
			f = func(db *gorm.DB) *gorm.DB { return db.Where(col+" = @x"+or+col+" = @x", sql.Named("x", v)) }
		case 8:
			text = fmt.Sprintf("Not(%q, sql.Named(\"x\", %#v))", col+" = @x"+or+col+" = @x", v)
			f = func(db *gorm.DB) *gorm.DB { return db.Not(col+" = @x"+or+col+" = @x", sql.Named("x", v)) }
		case 9:
			text = fmt.Sprintf("Where(\"? AND 1 = 1\", gorm.Expr(%q, %#v, %#v))", col+" = ?"+or+col+" = ?", v, v)
			f = func(db *gorm.DB) *gorm.DB {
				return db.Where("? AND 1 = 1", gorm.Expr(col+" = ?"+or+col+" = ?", v, v))
			}
		case 10:
			text = fmt.Sprintf("Or(%q, %#v, %#v)", col+" = ?"+or+col+" = ?", v, v)
			f = func(db *gorm.DB) *gorm.DB { return db.Or(col+" = ?"+or+col+" = ?", v, v) }
		case 0, 1:
			text = fmt.Sprintf("Where(%q, %#v)", col+" = ?", v)
			f = func(db *gorm.DB) *gorm.DB { return db.Where(col+" = ?", v) }
		case 2:
			text = fmt.Sprintf("Or(%q, %#v)", col+" = ?", v)
			f = func(db *gorm.DB) *gorm.DB { return db.Or(col+" = ?", v) }
		case 3:
			text = fmt.Sprintf("Not(%q, %#v)", col+" = ?", v)
			f = func(db *gorm.DB) *gorm.DB { return db.Not(col+" = ?", v) }
		default:
			text = fmt.Sprintf("Where(%q, %#v, %#v)", col+" = ? OR "+col+" = ?", v, v)
			f = func(db *gorm.DB) *gorm.DB { return db.Where(col+" = ? OR "+col+" = ?", v, v) }
		}
		texts, fs = append(texts, text), append(fs, f)
	}
	return strings.Join(texts, "."), func(db *gorm.DB) *gorm.DB {
		for _, f := range fs {
			db = f(db)
		}
		return db
	}
}

// valueCol is a column each table's writes set.
var valueCol = map[string]string{"repos": "stars", "slugs": "v", "ci_slugs": "v", "pairs": "v", "badges": "label", "memos": "text"}

// drawStmt draws one write statement.
func drawStmt(rt *rapid.T, dialect string) (genStmt, []any) {
	table := rapid.SampledFrom([]string{"repos", "repos", "slugs", "ci_slugs", "pairs", "badges", "memos", "items"}).Draw(rt, "table")
	if table == "items" {
		return drawAssociation(rt), nil
	}
	col := valueCol[table]
	var val any = 42
	if table == "badges" || table == "memos" {
		val = "new"
	}
	mtext, model, declared := drawModel(rt, table, dialect)
	ctext, conds := drawConds(rt, table)
	sel := rapid.SampledFrom([]string{"", "Select", "Omit"}).Draw(rt, "select")
	selF := func(db *gorm.DB) *gorm.DB {
		switch sel {
		case "Select":
			return db.Select(col)
		case "Omit":
			return db.Omit(col)
		}
		return db
	}
	prefix := func(db *gorm.DB) *gorm.DB { return selF(conds(model(db))) }
	ptext := mtext
	if ctext != "" {
		ptext += "." + ctext
	}
	if sel != "" {
		ptext += "." + sel + "(" + fmt.Sprintf("%q", col) + ")"
	}
	verb := rapid.IntRange(0, 11).Draw(rt, "verb")
	switch verb {
	case 0:
		return genStmt{ptext + fmt.Sprintf(".Update(%q, %#v)", col, val), func(ctx context.Context, db *gorm.DB) error {
			return prefix(db.WithContext(ctx)).Update(col, val).Error
		}}, declared
	case 1:
		m := map[string]any{col: val}
		if table == "repos" && rapid.Bool().Draw(rt, "rekey") {
			// A row moved to a new key is written under both names.
			m["id"] = rapid.SampledFrom([]any{20, uint(7), gorm.Expr("id + 100")}).Draw(rt, "new id")
		}
		return genStmt{ptext + fmt.Sprintf(".Updates(%#v)", m), func(ctx context.Context, db *gorm.DB) error {
			return prefix(db.WithContext(ctx)).Updates(m).Error
		}}, declared
	case 2:
		return genStmt{ptext + fmt.Sprintf(".UpdateColumn(%q, %#v)", col, val), func(ctx context.Context, db *gorm.DB) error {
			return prefix(db.WithContext(ctx)).UpdateColumn(col, val).Error
		}}, declared
	case 3:
		return genStmt{ptext + fmt.Sprintf(".UpdateColumns(map{%q: %#v})", col, val), func(ctx context.Context, db *gorm.DB) error {
			return prefix(db.WithContext(ctx)).UpdateColumns(map[string]any{col: val}).Error
		}}, declared
	case 4: // Updates(struct)
		v, text := drawValue(rt, table)
		return genStmt{ptext + ".Updates(" + text + ")", func(ctx context.Context, db *gorm.DB) error {
			return prefix(db.WithContext(ctx)).Updates(v()).Error
		}}, declared
	case 5, 6: // Save
		v, text := drawValue(rt, table)
		if verb == 6 {
			v2, text2 := drawValue(rt, table)
			return genStmt{"Save(&[]{" + text + ", " + text2 + "})", func(ctx context.Context, db *gorm.DB) error {
				return db.WithContext(ctx).Save(sliceOf(v(), v2())).Error
			}}, nil
		}
		return genStmt{"Save(" + text + ")", func(ctx context.Context, db *gorm.DB) error { return db.WithContext(ctx).Save(v()).Error }}, nil
	case 7: // Delete a value
		v, text := drawValue(rt, table)
		unscoped := rapid.Bool().Draw(rt, "unscoped")
		text = ptext + ".Delete(" + text + ")"
		if unscoped {
			text = "Unscoped()." + text
		}
		return genStmt{text, func(ctx context.Context, db *gorm.DB) error {
			db = db.WithContext(ctx)
			if unscoped {
				db = db.Unscoped()
			}
			return prefix(db).Delete(v()).Error
		}}, declared
	case 8, 9: // Create, with an OnConflict form
		if table == "repos" && rapid.IntRange(0, 3).Draw(rt, "map upsert") == 0 {
			// A map's key may be of another kind than the key's ("01" is 1).
			m := map[string]any{"id": rapid.SampledFrom([]any{"01", "1", "7", uint(1), 7}).Draw(rt, "map id"), "name": "q", "stars": 42}
			text := fmt.Sprintf("Model(&Repo{}).Clauses(OnConflict{Columns: pk, DoUpdates: stars}).Create(%#v)", m)
			return genStmt{text, func(ctx context.Context, db *gorm.DB) error {
				return db.WithContext(ctx).Model(&Repo{}).Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "id"}}, DoUpdates: clause.AssignmentColumns([]string{"stars"})}).
					Create(maps.Clone(m)).Error
			}}, nil
		}
		v, text := drawValue(rt, table)
		oc, octext := drawOnConflict(rt, table, col)
		return genStmt{octext + ".Create(" + text + ")", func(ctx context.Context, db *gorm.DB) error {
			db = db.WithContext(ctx)
			if oc != nil {
				db = db.Clauses(*oc)
			}
			return db.Create(v()).Error
		}}, nil
	case 10: // FirstOrCreate
		v, text := drawValue(rt, table)
		assign := rapid.Bool().Draw(rt, "assign")
		if assign {
			text = fmt.Sprintf("Assign(map{%q: %#v}).", col, val) + "FirstOrCreate(" + text + ")"
		} else {
			text = "FirstOrCreate(" + text + ")"
		}
		return genStmt{text, func(ctx context.Context, db *gorm.DB) error {
			db = db.WithContext(ctx)
			if assign {
				db = db.Assign(map[string]any{col: val})
			}
			return db.FirstOrCreate(v()).Error
		}}, nil
	}
	// Delete by condition
	v, text := zeroOf(table)
	return genStmt{ptext + ".Delete(" + text + ")", func(ctx context.Context, db *gorm.DB) error {
		return prefix(db.WithContext(ctx)).Delete(v()).Error
	}}, declared
}

func zeroOf(table string) (func() any, string) {
	switch table {
	case "repos":
		return func() any { return &Repo{} }, "&Repo{}"
	case "slugs":
		return func() any { return &Slug{} }, "&Slug{}"
	case "ci_slugs":
		return func() any { return &CiSlug{} }, "&CiSlug{}"
	case "pairs":
		return func() any { return &Pair{} }, "&Pair{}"
	case "badges":
		return func() any { return &Badge{} }, "&Badge{}"
	}
	return func() any { return &Memo{} }, "&Memo{}"
}

// drawValue draws a struct of table (a fresh one per run).
func drawValue(rt *rapid.T, table string) (func() any, string) {
	switch table {
	case "repos":
		id := rapid.SampledFrom([]uint{0, 1, 2, 7}).Draw(rt, "value id")
		return func() any { return &Repo{ID: id, Name: "v", Stars: 5} }, fmt.Sprintf("&Repo{ID: %d, Name: \"v\", Stars: 5}", id)
	case "slugs":
		name := rapid.SampledFrom([]string{"", "1", "01", "c"}).Draw(rt, "value name")
		return func() any { return &Slug{Name: name, V: 5} }, fmt.Sprintf("&Slug{Name: %q, V: 5}", name)
	case "ci_slugs":
		name := rapid.SampledFrom([]string{"", "ABC", "abc", "zz", "New"}).Draw(rt, "ci value name")
		return func() any { return &CiSlug{Name: name, V: 5} }, fmt.Sprintf("&CiSlug{Name: %q, V: 5}", name)
	case "pairs":
		a, b := rapid.IntRange(0, 2).Draw(rt, "value a"), rapid.SampledFrom([]string{"", "x", "y"}).Draw(rt, "value b")
		return func() any { return &Pair{A: a, B: b, V: 5} }, fmt.Sprintf("&Pair{A: %d, B: %q, V: 5}", a, b)
	case "badges":
		id := rapid.SampledFrom([]uint{0, 1, 7}).Draw(rt, "value id")
		code := rapid.SampledFrom([]string{"a", "c", "z"}).Draw(rt, "value code")
		return func() any { return &Badge{ID: id, Code: code, Label: "v"} }, fmt.Sprintf("&Badge{ID: %d, Code: %q, Label: \"v\"}", id, code)
	}
	id := rapid.SampledFrom([]uint{0, 1, 3}).Draw(rt, "value id")
	return func() any { return &Memo{ID: id, Text: "v"} }, fmt.Sprintf("&Memo{ID: %d, Text: \"v\"}", id)
}

// sliceOf makes a slice of two values of one model.
func sliceOf(a, b any) any {
	switch a := a.(type) {
	case *Repo:
		return &[]Repo{*a, *b.(*Repo)}
	case *Slug:
		return &[]Slug{*a, *b.(*Slug)}
	case *CiSlug:
		return &[]CiSlug{*a, *b.(*CiSlug)}
	case *Pair:
		return &[]Pair{*a, *b.(*Pair)}
	case *Badge:
		return &[]Badge{*a, *b.(*Badge)}
	}
	return &[]Memo{*a.(*Memo), *b.(*Memo)}
}

// drawOnConflict draws a Create's ON CONFLICT form.
func drawOnConflict(rt *rapid.T, table, col string) (*clause.OnConflict, string) {
	pk := []clause.Column{{Name: "id"}}
	switch table {
	case "slugs", "ci_slugs":
		pk = []clause.Column{{Name: "name"}}
	case "pairs":
		pk = []clause.Column{{Name: "a"}, {Name: "b"}}
	}
	switch rapid.IntRange(0, 6).Draw(rt, "on conflict") {
	case 6:
		if table == "badges" { // moves the row that holds the code to the value's key
			return &clause.OnConflict{Columns: []clause.Column{{Name: "code"}}, DoUpdates: clause.AssignmentColumns([]string{"id", "label"})}, "Clauses(OnConflict{Columns: code, DoUpdates: id, label})"
		}
		// The key set to itself, as GORM's association upserts do: no move.
		cols := []string{col}
		for _, c := range pk {
			cols = append(cols, c.Name)
		}
		return &clause.OnConflict{Columns: pk, DoUpdates: clause.AssignmentColumns(cols)}, "Clauses(OnConflict{Columns: pk, DoUpdates: " + strings.Join(cols, ", ") + "})"
	case 0:
		return nil, "Create"
	case 1:
		return &clause.OnConflict{DoNothing: true}, "Clauses(OnConflict{DoNothing})"
	case 2:
		return &clause.OnConflict{UpdateAll: true}, "Clauses(OnConflict{UpdateAll})"
	case 3:
		return &clause.OnConflict{Columns: pk, DoUpdates: clause.AssignmentColumns([]string{col})}, "Clauses(OnConflict{Columns: pk, DoUpdates: " + col + "})"
	case 4:
		if table == "badges" {
			return &clause.OnConflict{Columns: []clause.Column{{Name: "code"}}, DoUpdates: clause.AssignmentColumns([]string{"label"})}, "Clauses(OnConflict{Columns: code, DoUpdates: label})"
		}
		fallthrough
	default:
		return &clause.OnConflict{DoUpdates: clause.AssignmentColumns([]string{col})}, "Clauses(OnConflict{DoUpdates: " + col + "}) (no target)"
	}
}

// TestGenWrites builds GORM write statements from a grammar (model forms and
// table spellings × key shapes, keys compared without case and map keys of
// another kind included × Where/Or/Not × Select/Omit × every write verb,
// association writes included × inside or outside a transaction) and runs each on a database with the plugin, while
// another owner holds random rows' locks, and on a twin database without it.
// The oracle is the databases' audit triggers: a statement either was
// refused and changed nothing, or every row it changed was unlocked by the
// other owner and locked by this writer at the time, carries a larger fence
// and had its keys invalidated after COMMIT; and it changed no fewer rows
// than plain GORM did on the twin. Once it returned, no row is left locked.
// On PostgreSQL a third of the UPDATEs and DELETEs meet an interloper: a row
// their WHERE may match, inserted by another session after the plugin read
// the rows to lock (see interlope).
func TestGenWrites(t *testing.T) {
	rigs := []*writeRig{newWriteRig(t, onSQLite), newWriteRig(t, onPostgres)}
	gen.Check(t, 1000, func(rt *rapid.T) {
		r := rapid.SampledFrom(rigs).Draw(rt, "database")
		for range rapid.IntRange(1, 3).Draw(rt, "statements") {
			r.step(rt)
		}
	})
	for _, r := range rigs {
		t.Logf("gen: %s: %d statements, %d refused (%d ErrUnnamedRows), %d written, %d with the cache down, %d met an interloper; %d row locks held by another owner meanwhile", r.dialect, r.steps, r.refused, r.unnamed, r.written, r.down, r.interloped, r.held)
	}
}

// writeRig is one database of TestGenWrites: with the plugin, and its twin
// without.
type writeRig struct {
	dialect         string
	e               *env
	db              *gorm.DB // with the plugin
	plainDB, twinDB *gorm.DB // the same database without the plugin, and the twin
	inv             *auditInvalidator
	other           context.Context // the other owner
	mu              sync.Mutex
	lockedNow       map[string]bool // guarded by mu: the locks held whenever a statement was sent
	steps, refused  int
	written, held   int
	unnamed         int         // refused with ErrUnnamedRows
	down            int         // statements run with the cache down
	interloping     atomic.Bool // the next UPDATE or DELETE meets an interloper (see interlope)
	interloped      int         // statements that met one
}

// interlopers are rows another session inserts between the plugin's reading
// of the rows a write matches and the write (see interlope), by table: keys
// nothing else in the generator uses, and in a column besides the keys a
// value its conditions match (see drawConds).
var interlopers = map[string]struct{ sql, key string }{
	"repos":    {"INSERT INTO repos (id, name, stars) VALUES (55, 'a', 0)", "55"},
	"slugs":    {"INSERT INTO slugs (name, v) VALUES ('55', 1)", "55"},
	"ci_slugs": {"INSERT INTO ci_slugs (name, v) VALUES ('qq', 1)", "qq"},
	"pairs":    {"INSERT INTO pairs (a, b, v) VALUES (0, 'z', 1)", "0:z"},
	"badges":   {"INSERT INTO badges (id, code, label) VALUES (55, 'q', 'l')", "55"},
	"memos":    {"INSERT INTO memos (id, text) VALUES (55, 'a')", "55"},
}

// interlope is a callback of the plugin's database, after the plugin's own
// and before GORM's UPDATE or DELETE: when armed, another session inserts a
// row the write's WHERE may match, which the plugin read no lock for. The
// write must leave it alone — it is restricted to the rows it locked — or the
// audit shows a row changed without its lock. (PostgreSQL only: on SQLite
// the insert would wait for the write's own transaction.)
func (r *writeRig) interlope(db *gorm.DB) {
	row, ok := interlopers[db.Statement.Table]
	if !ok || !r.interloping.CompareAndSwap(true, false) {
		return
	}
	r.interloped++
	if err := r.plainDB.Exec(row.sql).Error; err != nil {
		db.AddError(fmt.Errorf("gen: the interloper: %w", err))
	}
}

// interloperRow reports whether c is an interloper's insert.
func interloperRow(c auditRow) bool {
	row, ok := interlopers[c.Tbl]
	return ok && c.Op == "I" && c.NewKey != nil && *c.NewKey == row.key
}

func newWriteRig(t *testing.T, dialect string) *writeRig {
	r := &writeRig{dialect: dialect, e: newEnv(t, dialect, byClient), other: locks.WithOwner(context.Background(), locks.NewOwnerID())}
	twin := &env{db: dialect}
	if dialect == onPostgres {
		twin.dsn = pgtest.DSN(t)
	} else {
		twin.dsn = filepath.Join(t.TempDir(), "twin.db")
	}
	r.plainDB, r.twinDB = r.e.plain(t), twin.plain(t)
	for _, db := range []*gorm.DB{r.plainDB, r.twinDB} {
		if err := db.AutoMigrate(&Repo{}, &Slug{}, &Pair{}, &Badge{}, &Memo{}, &Shelf{}, &Item{}); err != nil {
			t.Fatal(err)
		}
		// Keys compared without case: the model does not say so.
		ci := "CREATE TABLE ci_slugs (name TEXT COLLATE NOCASE PRIMARY KEY, v INTEGER NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0)"
		if dialect == onPostgres {
			if err := db.Exec("CREATE EXTENSION IF NOT EXISTS citext").Error; err != nil {
				t.Fatal(err)
			}
			ci = "CREATE TABLE ci_slugs (name citext PRIMARY KEY, v INTEGER NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0)"
		}
		if err := db.Exec(ci).Error; err != nil {
			t.Fatal(err)
		}
		installAudit(t, db, dialect)
	}
	r.inv = &auditInvalidator{db: r.plainDB}
	// One attempt: a failed invalidation is dropped, not retried into the
	// next statement's checks.
	r.db = r.e.guarded(t, gormplugin.Invalidate(r.inv, cacheKeys), gormplugin.LockOptions(locks.WaitBudget(20*time.Millisecond)),
		gormplugin.RetryInvalidation(1, time.Millisecond), gormplugin.Observer(r.inv.observe))
	held := func(tx *gorm.DB) {
		keys := r.e.lockKeys(t)
		r.mu.Lock()
		for _, k := range keys {
			r.lockedNow[strings.TrimSuffix(strings.TrimPrefix(k, "cg:lock:{"), "}")] = true
		}
		r.mu.Unlock()
	}
	if dialect == onPostgres {
		interlope(t, r.db, r.interlope)
	}
	observeWrites(t, r.db, held) // before each write: the locks its rows took
	observeBuilt(r.db, held)     // an UPDATE as built: the new key of a row it moves too
	// An upsert as built: the new key of a row its DO UPDATE moves (a key
	// stored in another spelling, rewritten by name = excluded.name).
	prev := r.db.ClauseBuilders["ON CONFLICT"]
	r.db.ClauseBuilders["ON CONFLICT"] = func(c clause.Clause, b clause.Builder) {
		prev(c, b)
		if stmt, ok := b.(*gorm.Statement); ok && !stmt.DB.DryRun {
			held(stmt.DB)
		}
	}
	return r
}

// step draws a statement and the rows another owner holds, runs it with the
// plugin and on the twin, and checks the audit rows.
func (r *writeRig) step(rt *rapid.T) {
	s, declared := drawStmt(rt, r.dialect)
	way := rapid.SampledFrom([]string{"", "db.Transaction", "gormplugin.Transaction"}).Draw(rt, "transaction")
	if way != "" {
		s.text = way + "(" + s.text + ")"
	}
	var holds []string
	mask := rapid.Uint32().Draw(rt, "holds") & rapid.Uint32().Draw(rt, "holds too")
	for i, k := range auditKeys {
		if mask&(1<<i) != 0 {
			holds = append(holds, k)
		}
	}
	// The cache is down for this statement: its committed rows' keys must
	// then be reported to it, under its context, before it returns.
	down := rapid.IntRange(0, 9).Draw(rt, "cache down") == 0
	rt.Logf("%s: %s; held by another owner: %v; cache down: %v", r.dialect, s.text, holds, down)
	for _, d := range []*gorm.DB{r.plainDB, r.twinDB} {
		if err := seed(d); err != nil {
			rt.Fatal(err)
		}
	}
	var lks []*locks.Lock
	for _, k := range holds {
		lk, err := r.e.c.TryLock(r.other, k)
		if err != nil {
			rt.Fatal(err)
		}
		lks = append(lks, lk)
	}
	r.inv.take()
	r.mu.Lock()
	r.lockedNow = map[string]bool{}
	r.mu.Unlock()
	id := int64(r.steps + 1)
	ctx := context.WithValue(context.Background(), genStmtID{}, id)
	run := func(d *gorm.DB, guarded bool) error {
		switch {
		case way == "db.Transaction" || way == "gormplugin.Transaction" && !guarded:
			return d.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return s.run(ctx, tx) })
		case way == "gormplugin.Transaction":
			return gormplugin.Transaction(ctx, d, func(tx *gorm.DB) error { return s.run(ctx, tx) }, declared...)
		}
		return s.run(ctx, d)
	}
	r.inv.down.Store(down)
	r.interloping.Store(r.dialect == onPostgres && rapid.IntRange(0, 2).Draw(rt, "interloper") == 0)
	err := run(r.db, true)
	r.interloping.Store(false)
	r.inv.down.Store(false)
	told := r.inv.toldFor(id) // by the time the statement returned
	twinErr := run(r.twinDB, false)
	for _, lk := range lks {
		_ = lk.Unlock(context.Background())
	}
	// Liveness: once the statement returned and the other owner let go, no
	// row stays locked (a release still on its way is resent every 100 ms).
	for deadline := time.Now().Add(2 * time.Second); ; {
		left, err := r.e.rdb.Keys(context.Background(), "cg:lock:*").Result()
		if err != nil {
			rt.Fatal(err)
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			rt.Fatalf("row locks left 2s after the statement returned: %v", left)
		}
		time.Sleep(10 * time.Millisecond) // polling Redis: the release is not ours to wait on
	}
	got, want := slices.DeleteFunc(changes(rt, r.plainDB), interloperRow), changes(rt, r.twinDB)
	invs := append(r.inv.take(), told...)
	r.steps++
	if down {
		r.down++
	}
	r.held += len(holds)
	rt.Logf("plugin: %v, %d rows changed; plain GORM: %v, %d rows changed", err, len(got), twinErr, len(want))
	if err != nil {
		r.refused++
		if errors.Is(err, gormplugin.ErrUnnamedRows) {
			r.unnamed++
		}
		// Liveness: a statement that plain GORM ran and that changed rows is
		// refused only by default deny, or for a row lock another owner
		// holds. (One that changed nothing may be refused otherwise: the
		// plugin guards a statement before GORM knows it sets nothing.)
		if twinErr == nil && len(want) > 0 && !errors.Is(err, gormplugin.ErrUnnamedRows) && !namesHeld(err, holds) {
			rt.Fatalf("refused (%v) where plain GORM changed %d rows, and not for a row another owner holds", err, len(want))
		}
		// An association operation is several statements; outside a
		// transaction those before the refused one have run and committed
		// (the documented limit: run them in a transaction so a refusal
		// rolls the whole back). Each must have been guarded.
		if len(got) > 0 && (way != "" || !strings.Contains(s.text, ".Association(")) {
			rt.Fatalf("refused (%v), yet %d rows changed: %+v", err, len(got), got)
		}
		r.checkChanges(rt, s, got, holds, invs)
		return
	}
	r.written++
	if len(got) < len(want) {
		rt.Fatalf("wrote %d rows, plain GORM %d: silently narrowed", len(got), len(want))
	}
	r.checkChanges(rt, s, got, holds, invs)
}

// namesHeld reports whether err refuses a write for a row lock (ErrLock,
// ErrLockOrder) whose name is one of held.
func namesHeld(err error, held []string) bool {
	if !errors.Is(err, gormplugin.ErrLock) && !errors.Is(err, gormplugin.ErrLockOrder) {
		return false
	}
	for _, k := range held {
		if strings.Contains(err.Error(), strconv.Quote(k)) {
			return true
		}
	}
	return false
}

// checkChanges checks each row change of a statement (see checkChange).
func (r *writeRig) checkChanges(rt *rapid.T, s genStmt, got []auditRow, holds []string, invs []invalidation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	before := map[string]int64{} // each row's fence before the statement
	for _, c := range got {
		if c.OldKey != nil && c.OldFence != nil {
			if _, ok := before[c.Tbl+":"+*c.OldKey]; !ok {
				before[c.Tbl+":"+*c.OldKey] = *c.OldFence
			}
		}
		checkChange(rt, c, holds, r.lockedNow, invs, before, !strings.HasPrefix(s.text, "Table(") && !strings.Contains(s.text, "(Table("))
	}
}

// checkChange checks one row change of a statement the plugin let through.
// A write without a model (Table("t")) is locked, not fenced: the plugin
// finds a fence column through the model.
func checkChange(rt *rapid.T, c auditRow, holds []string, locked map[string]bool, invs []invalidation, before map[string]int64, fenced bool) {
	names := map[string]bool{}
	if c.OldKey != nil {
		names[c.Tbl+":"+*c.OldKey] = true
	}
	if c.NewKey != nil {
		names[c.Tbl+":"+*c.NewKey] = true
	}
	for name := range names {
		if c.Op != "I" && slices.Contains(holds, name) { // a Create of a new row takes no lock
			rt.Fatalf("row %s changed (%s) while another owner held its lock", name, c.Op)
		}
		if c.Op != "I" && !locked[name] { // a row moved is written under both names
			rt.Fatalf("row %s changed (%s) without its lock", name, c.Op)
		}
		ok := false
		for _, inv := range invs {
			if inv.seen >= c.Seq && (slices.Contains(inv.keys, "cache:"+name) || slices.Contains(inv.keys, "cache:"+c.Tbl+":*")) {
				ok = true
			}
		}
		if !ok {
			rt.Fatalf("row %s changed (%s), its keys neither invalidated after COMMIT nor reported failed under its statement's context (invalidations %+v)", name, c.Op, invs)
		}
	}
	if fenced && c.Op == "U" && (c.NewFence == nil || *c.NewFence <= before[c.Tbl+":"+*c.OldKey]) {
		rt.Fatalf("row %s:%s updated without a larger fence: %v before the statement, %v → %v", c.Tbl, *c.OldKey, before[c.Tbl+":"+*c.OldKey], deref(c.OldFence), deref(c.NewFence))
	}
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

func ptr[T any](v T) *T { return &v }

// drawAssociation draws a write of GORM's association API on a shelf's items.
func drawAssociation(rt *rapid.T) genStmt {
	shelf := rapid.SampledFrom([]uint{1, 2}).Draw(rt, "shelf")
	id := rapid.SampledFrom([]uint{0, 1, 3}).Draw(rt, "item")
	op := rapid.SampledFrom([]string{"Append", "Replace", "Delete", "Clear"}).Draw(rt, "association")
	text := fmt.Sprintf("Model(&Shelf{ID: %d}).Association(\"Items\").%s(&Item{ID: %d, Name: \"n\"})", shelf, op, id)
	if op == "Clear" {
		text = fmt.Sprintf("Model(&Shelf{ID: %d}).Association(\"Items\").Clear()", shelf)
	}
	return genStmt{text, func(ctx context.Context, db *gorm.DB) error {
		a := db.WithContext(ctx).Model(&Shelf{ID: shelf}).Association("Items")
		item := &Item{ID: id, Name: "n"}
		switch op {
		case "Append":
			return a.Append(item)
		case "Replace":
			return a.Replace(item)
		case "Delete":
			return a.Delete(item)
		}
		return a.Clear()
	}}
}
