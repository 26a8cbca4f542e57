package gormplugin

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// Fence is a column type that stores the fence token of the last guarded
// write to its row. It does two jobs.
//
// It fences: a guarded write of a model with a Fence field only touches the
// row while the stored fence is not newer than the writer's token, and sets
// it to the token, so a writer whose lock expired (a paused process, a long
// GC) cannot overwrite a newer write: it gets ErrStaleWrite.
//
// It is also the row's version: a Save or Update of a struct read before
// another writer committed the row is refused with ErrStaleWrite, because
// the fence the struct carries is no longer the row's. That includes a
// struct taken from a cache filled before the row's last write, and a
// struct read while a stopped holder's UPDATE was not committed yet. Save,
// Save of a slice, an upsert with UpdateAll and Updates(&s) on Model(&s)
// write the struct back whole, so its fence is checked even when it is zero
// (a struct built rather than read is refused over a row a guarded write has
// stamped); Update, UpdateColumn(s) and Updates of a map check it only when
// it is set. Read the row again, or use Transaction, to write from a fresh
// read. After a guarded write the struct carries the token written.
//
// An integer field tagged `gormplugin:"fence"` works the same. Declare it NOT
// NULL DEFAULT 0 (a NULL fence counts as 0).
type Fence uint64

// Value stores the token as a signed 64-bit integer.
func (f Fence) Value() (driver.Value, error) {
	if f > math.MaxInt64 {
		return nil, fmt.Errorf("gormplugin: fence %d does not fit a signed 64-bit column", uint64(f))
	}
	return int64(f), nil
}

// Scan reads a stored token; NULL reads as 0.
func (f *Fence) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*f = 0
	case int64:
		if v < 0 {
			return fmt.Errorf("gormplugin: negative fence %d", v)
		}
		*f = Fence(v)
	case uint64:
		*f = Fence(v)
	case []byte:
		return f.Scan(string(v))
	case string:
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("gormplugin: fence %q: %w", v, err)
		}
		*f = Fence(n)
	default:
		return fmt.Errorf("gormplugin: cannot scan %T into a Fence", src)
	}
	return nil
}

var fenceType = reflect.TypeFor[Fence]()

// fenceField returns the schema's fence column, or nil.
func fenceField(s *schema.Schema) *schema.Field {
	if s == nil {
		return nil
	}
	for _, f := range s.Fields {
		if f.DBName == "" {
			continue
		}
		if indirect(f.FieldType) == fenceType || f.Tag.Get("gormplugin") == "fence" {
			return f
		}
	}
	return nil
}

// token returns the expression of the rows' fence tokens: the token itself
// for one row, and for several a CASE on the primary key, so that each row
// is compared with (and stamped by) the token of its own lock. A row outside
// the CASE compares with NULL and is not touched.
func (g *guard) token() any {
	if len(g.rows) == 1 {
		return int64(g.rows[0].fence)
	}
	return g.caseOnKey(func(r row) (string, bool) { return strconv.FormatInt(int64(r.fence), 10), true }, "")
}

// caseOnKey builds CASE WHEN <pk> = ? THEN <then(row)> ... [ELSE <els>] END
// over g's rows, leaving out the rows then declines. The THEN values are
// written into the SQL: a bound parameter in a CASE has no type PostgreSQL
// can infer (it would compare bigint with text).
func (g *guard) caseOnKey(then func(row) (string, bool), els string) clause.Expr {
	expr := "CASE"
	var vars []any
	for _, r := range g.rows {
		v, ok := then(r)
		if !ok {
			continue
		}
		expr += " WHEN"
		for i := range g.pkCols {
			if i > 0 {
				expr += " AND"
			}
			expr += " ? = ?"
			vars = append(vars, g.column(g.pkCols[i]), r.vals[i])
		}
		expr += " THEN " + v
	}
	if els != "" {
		expr += " ELSE " + els
	}
	return clause.Expr{SQL: expr + " END", Vars: vars}
}

// column names a column of g's table in a condition or value the plugin
// adds to the statement, qualified with the name the statement's SQL knows
// the table by (its alias, or its name without a schema): an UPDATE ...
// FROM u whose u has a column of that name too, or an upsert's DO UPDATE,
// which sees the table's row and the one proposed (excluded), would
// otherwise find it ambiguous. Every column the plugin adds passes through
// it.
func (g *guard) column(name string) clause.Column {
	return clause.Column{Table: g.ref, Name: name}
}

// fenceConds are the conditions of a fenced write: the row's fence is not
// newer than its writer's token,
//
//	COALESCE(fence, 0) <= <token>
//
// and, for a row whose written struct carries its version, the row still
// carries that version or the writer's own token (written since):
//
//	COALESCE(fence, 0) IN (<version>, <token>)
//
// The comparison is <=, not <: a re-entered lock shares the token of the
// acquisition it re-enters, and one holder may write a row twice under one
// acquisition. It is as safe against a stale holder, because every new
// acquisition's token is strictly larger than every earlier one: a newer
// holder's write leaves a fence the stale holder's token is below.
func (g *guard) fenceConds() []clause.Expression {
	col := g.column(g.fence.DBName)
	conds := []clause.Expression{clause.Expr{SQL: "COALESCE(?, 0) <= ?", Vars: []any{col, g.token()}}}
	versioned := 0
	for _, r := range g.rows {
		if r.versioned {
			versioned++
		}
	}
	switch {
	case versioned == 0:
	case len(g.rows) == 1:
		conds = append(conds, clause.Expr{SQL: "COALESCE(?, 0) IN (?, ?)", Vars: []any{col, int64(g.rows[0].version), int64(g.rows[0].fence)}})
	default:
		// A row without a version compares its fence with itself.
		version := g.caseOnKey(func(r row) (string, bool) {
			return strconv.FormatInt(int64(r.version), 10), r.versioned
		}, "COALESCE(?, 0)")
		version.Vars = append(version.Vars, col)
		conds = append(conds, clause.Expr{SQL: "COALESCE(?, 0) IN (?, ?)", Vars: []any{col, version, g.token()}})
	}
	return conds
}

// setBuilder wraps the SET clause builder so that a fenced statement also
// writes its token into the fence column, whatever Select, Omit, map or
// struct the update was given (an assignment of the fence by the caller is
// replaced).
func (p *Plugin) setBuilder(prev clause.ClauseBuilder) clause.ClauseBuilder {
	return func(c clause.Clause, b clause.Builder) {
		if stmt, ok := b.(*gorm.Statement); ok {
			if g := guardOf(stmt.DB); g != nil && g.kind == writeUpdate {
				if set, ok := c.Expression.(clause.Set); ok {
					if err := p.guardMoves(stmt, g, set, nil); err != nil {
						_ = stmt.AddError(err) // GORM sends nothing after a build error
					}
				}
			}
			if g := guardOf(stmt.DB); g != nil && g.fencing {
				if set, ok := c.Expression.(clause.Set); ok {
					out := make(clause.Set, 0, len(set)+1)
					for _, a := range set {
						if a.Column.Name != g.fence.DBName {
							out = append(out, a)
						}
					}
					c.Expression = append(out, clause.Assignment{Column: clause.Column{Name: g.fence.DBName}, Value: g.token()})
				}
			}
		}
		if prev != nil {
			prev(c, b)
			return
		}
		c.Build(b)
	}
}

// checkFence runs after a fenced statement. When fewer rows than expected
// were affected (want: the rows named, or the values an upsert inserts), it
// reads the fence of each named row in the same transaction: a row missing
// is not an error (GORM reports zero rows affected, as without the plugin),
// unless its struct carried the version it was read with (the row was
// deleted since: a Save must not bring it back); a row whose fence is newer
// than this writer's token, or (for a struct that carries its version)
// neither that version nor this writer's token, means the write was
// refused, which becomes a *StaleWriteError (so the transaction rolls back
// and GORM's Save does not fall back to an insert).
func (g *guard) checkFence(db *gorm.DB, want int) {
	if db.RowsAffected >= int64(want) {
		if g.kind == writeUpdate {
			g.stampModel(db)
		}
		return
	}
	q := db.Session(&gorm.Session{NewDB: true})
	for _, r := range g.rows {
		stored, found, err := readFence(q, g.table, g.fence.DBName, g.pkCols, g.strict, r.vals)
		switch {
		case err != nil:
			db.AddError(fmt.Errorf("gormplugin: reading the fence of %q: %w", r.name, err))
			return
		case !found && r.versioned && r.version != 0 && g.kind == writeUpdate:
			db.AddError(&StaleWriteError{Name: r.name, Fence: r.fence, Read: r.version, Missing: true})
			return
		case !found:
			continue
		case stored > r.fence:
			db.AddError(&StaleWriteError{Name: r.name, Fence: r.fence, Stored: stored})
			return
		case r.versioned && stored != r.version && stored != r.fence:
			db.AddError(&StaleWriteError{Name: r.name, Fence: r.fence, Stored: stored, Read: r.version})
			return
		}
	}
	if g.kind == writeUpdate && db.RowsAffected > 0 {
		g.stampModel(db)
	}
}

// readFence reads the fence of one row, the one stored in the spelling of
// vals where strict says so (see keyEquals); NULL reads as 0; found is
// false when the row does not exist.
func readFence(q *gorm.DB, table, fenceCol string, pkCols, strict []string, vals []any) (stored uint64, found bool, err error) {
	where, key := keyEquals(pkCols, strict, vals)
	vars := append([]any{clause.Column{Name: fenceCol}, clause.Table{Name: table}}, key...)
	row := q.Raw("SELECT ? FROM ? WHERE"+where, vars...).Row()
	if row == nil {
		return 0, false, errors.New("no result")
	}
	var v sql.NullInt64
	switch err := row.Scan(&v); {
	case errors.Is(err, sql.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	}
	if !v.Valid || v.Int64 < 0 {
		return 0, true, nil
	}
	return uint64(v.Int64), true, nil
}

// fenceOfModel returns the fence the statement's model (one struct)
// carries: the fence of the row when it was read, or the token of the last
// write through it; ok is false when the model is not one struct.
func (g *guard) fenceOfModel(stmt *gorm.Statement) (uint64, bool) {
	rv := reflect.ValueOf(stmt.Model)
	for rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct || rv.Type() != g.fence.Schema.ModelType {
		return 0, false
	}
	return fenceValue(stmt.Context, g.fence, rv), true
}

// fenceValue reads the fence field f of the struct rv (0 when zero).
func fenceValue(ctx context.Context, f *schema.Field, rv reflect.Value) uint64 {
	v, zero := f.ValueOf(ctx, rv)
	if zero {
		return 0
	}
	switch x := v.(type) {
	case Fence:
		return uint64(x)
	case *Fence:
		if x != nil {
			return uint64(*x)
		}
	}
	n := reflect.ValueOf(v)
	for n.Kind() == reflect.Pointer && !n.IsNil() {
		n = n.Elem()
	}
	switch {
	case n.CanInt() && n.Int() > 0:
		return uint64(n.Int())
	case n.CanUint():
		return n.Uint()
	}
	return 0
}

// stampModel sets the model's fence field to the token written, for a
// single-row update of an addressable struct (see stamp).
func (g *guard) stampModel(db *gorm.DB) {
	if len(g.rows) != 1 || !g.fromModel {
		return
	}
	rv := reflect.ValueOf(db.Statement.Model)
	for rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	if rv.Kind() == reflect.Struct && rv.Type() == g.fence.Schema.ModelType {
		g.stamp(db.Statement.Context, rv, g.rows[0].fence)
	}
}

// stamp sets the fence field of the struct rv to token, if it is
// addressable, and keeps what it replaced so that a rollback (of the
// statement, the transaction, or to a savepoint before it) can put it back:
// a struct must not claim a fence its row never committed, or its next
// write would fail the version check.
func (g *guard) stamp(ctx context.Context, rv reflect.Value, token uint64) {
	if !rv.CanAddr() {
		return
	}
	old, _ := g.fence.ValueOf(ctx, rv)
	if g.fence.Set(ctx, rv, token) == nil {
		f, prev := g.fence, g.unstamp
		g.unstamp = func() {
			_ = f.Set(ctx, rv, old)
			if prev != nil {
				prev()
			}
		}
	}
}
