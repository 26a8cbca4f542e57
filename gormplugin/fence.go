package gormplugin

import (
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
// write to its row. A guarded Update or Delete of a model with a Fence field
// only touches the row while the stored fence is not newer than the writer's
// token, and an Update sets it to the token, so a writer whose lock expired
// (a paused process, a long GC) cannot overwrite a newer write: it gets
// ErrStaleWrite. An integer field tagged `gormplugin:"fence"` works the same.
// Declare it NOT NULL DEFAULT 0 (a NULL fence counts as 0).
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
		t := f.FieldType
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t == fenceType || f.Tag.Get("gormplugin") == "fence" {
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
	expr := "CASE"
	var vars []any
	for _, r := range g.rows {
		expr += " WHEN"
		for i, col := range g.pkCols {
			if i > 0 {
				expr += " AND"
			}
			expr += " ? = ?"
			vars = append(vars, clause.Column{Name: col}, r.vals[i])
		}
		// The token is written into the SQL: a bound parameter in a CASE
		// has no type PostgreSQL can infer (it would compare bigint with text).
		expr += " THEN " + strconv.FormatInt(int64(r.fence), 10)
	}
	return clause.Expr{SQL: expr + " END", Vars: vars}
}

// addFenceCondition adds "COALESCE(fence, 0) <= token" to the statement's
// WHERE. The comparison is <=, not <: a re-entered lock shares the token of
// the acquisition it re-enters, and one holder may write a row twice under
// one acquisition. It is as safe against a stale holder, because every new
// acquisition's token is strictly larger than every earlier one: a newer
// holder's write leaves a fence the stale holder's token is below.
func (g *guard) addFenceCondition(stmt *gorm.Statement) {
	if c, ok := stmt.Clauses["WHERE"]; ok {
		if where, ok := c.Expression.(clause.Where); ok {
			for _, e := range where.Exprs {
				if _, ok := e.(clause.OrConditions); ok {
					// "a OR b AND fence" would let a bypass the fence.
					where.Exprs = []clause.Expression{clause.And(where.Exprs...)}
					c.Expression = where
					stmt.Clauses["WHERE"] = c
					break
				}
			}
		}
	}
	stmt.AddClause(clause.Where{Exprs: []clause.Expression{clause.Expr{
		SQL:  "COALESCE(?, 0) <= ?",
		Vars: []any{clause.Column{Name: g.fence.DBName}, g.token()},
	}}})
	if g.version != 0 {
		// The struct carries the fence of the row as it was read: the row
		// must still carry it (or this scope's own token, written since).
		stmt.AddClause(clause.Where{Exprs: []clause.Expression{clause.Expr{
			SQL:  "COALESCE(?, 0) IN (?, ?)",
			Vars: []any{clause.Column{Name: g.fence.DBName}, int64(g.version), int64(g.rows[0].fence)},
		}}})
	}
}

// setBuilder wraps the SET clause builder so that a fenced statement also
// writes its token into the fence column, whatever Select, Omit, map or
// struct the update was given (an assignment of the fence by the caller is
// replaced).
func (p *Plugin) setBuilder(prev clause.ClauseBuilder) clause.ClauseBuilder {
	return func(c clause.Clause, b clause.Builder) {
		if stmt, ok := b.(*gorm.Statement); ok {
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

// checkFence runs after a fenced statement. When fewer rows than named were
// affected, it reads the fence of each named row in the same transaction: a
// row missing is not an error (GORM reports zero rows affected, as without
// the plugin); a row whose fence is newer than this writer's token, or (for
// a struct that carried the fence it was read with) neither that fence nor
// this writer's token, means the write was refused, which becomes a
// *StaleWriteError (so the transaction rolls back and GORM's Save does not
// fall back to an insert).
func (g *guard) checkFence(db *gorm.DB) {
	if db.RowsAffected >= int64(len(g.rows)) {
		g.stampModel(db)
		return
	}
	q := db.Session(&gorm.Session{NewDB: true})
	for _, r := range g.rows {
		stored, found, err := readFence(q, g.table, g.fence.DBName, g.pkCols, r.vals)
		switch {
		case err != nil:
			db.AddError(fmt.Errorf("gormplugin: reading the fence of %q: %w", r.name, err))
			return
		case !found:
			continue
		case stored > r.fence:
			db.AddError(&StaleWriteError{Name: r.name, Fence: r.fence, Stored: stored})
			return
		case g.version != 0 && stored != g.version && stored != r.fence:
			db.AddError(&StaleWriteError{Name: r.name, Fence: r.fence, Stored: stored, Read: g.version})
			return
		}
	}
	g.stampModel(db)
}

// readFence reads the fence of one row (NULL reads as 0); found is false
// when the row does not exist.
func readFence(q *gorm.DB, table, fenceCol string, pkCols []string, vals []any) (stored uint64, found bool, err error) {
	query := "SELECT ? FROM ? WHERE"
	vars := []any{clause.Column{Name: fenceCol}, clause.Table{Name: table}}
	for i, col := range pkCols {
		if i > 0 {
			query += " AND"
		}
		query += " ? = ?"
		vars = append(vars, clause.Column{Name: col}, vals[i])
	}
	row := q.Raw(query, vars...).Row()
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

// modelFence returns the fence the statement's model (one struct) carries:
// the fence of the row when it was read, or the token of the last write
// through it; 0 when it carries none.
func (g *guard) modelFence(stmt *gorm.Statement) uint64 {
	rv := reflect.ValueOf(stmt.Model)
	for rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct || rv.Type() != g.fence.Schema.ModelType {
		return 0
	}
	v, zero := g.fence.ValueOf(stmt.Context, rv)
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
// single-row update of an addressable struct, and keeps what it replaced so
// that a rollback can put it back (unstamp): a struct must not claim a fence
// its row never committed, or its next write would fail the version check.
func (g *guard) stampModel(db *gorm.DB) {
	if g.delete || len(g.rows) != 1 || !g.fromModel {
		return
	}
	rv := reflect.ValueOf(db.Statement.Model)
	for rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct || !rv.CanAddr() || rv.Type() != g.fence.Schema.ModelType {
		return
	}
	ctx := db.Statement.Context
	old, _ := g.fence.ValueOf(ctx, rv)
	if g.fence.Set(ctx, rv, g.rows[0].fence) == nil {
		f := g.fence
		g.unstamp = func() { _ = f.Set(ctx, rv, old) }
	}
}
