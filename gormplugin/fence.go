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
// the plugin), a row whose fence is newer than this writer's token means the
// write was refused, which becomes a *StaleWriteError (so the transaction
// rolls back and GORM's Save does not fall back to an insert).
func (g *guard) checkFence(db *gorm.DB) {
	if db.RowsAffected >= int64(len(g.rows)) {
		g.stampModel(db)
		return
	}
	q := db.Session(&gorm.Session{NewDB: true})
	for _, r := range g.rows {
		query := "SELECT ? FROM ? WHERE"
		vars := []any{clause.Column{Name: g.fence.DBName}, clause.Table{Name: g.table}}
		for i, col := range g.pkCols {
			if i > 0 {
				query += " AND"
			}
			query += " ? = ?"
			vars = append(vars, clause.Column{Name: col}, r.vals[i])
		}
		row := q.Raw(query, vars...).Row()
		if row == nil {
			db.AddError(fmt.Errorf("gormplugin: reading the fence of %q failed", r.name))
			return
		}
		var stored sql.NullInt64
		switch err := row.Scan(&stored); {
		case errors.Is(err, sql.ErrNoRows):
			continue
		case err != nil:
			db.AddError(fmt.Errorf("gormplugin: reading the fence of %q: %w", r.name, err))
			return
		}
		if stored.Valid && stored.Int64 > 0 && uint64(stored.Int64) > r.fence {
			db.AddError(&StaleWriteError{Name: r.name, Fence: r.fence, Stored: uint64(stored.Int64)})
			return
		}
	}
	g.stampModel(db)
}

// stampModel sets the model's fence field to the token written, for a
// single-row update of an addressable struct.
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
	_ = g.fence.Set(db.Statement.Context, rv, g.rows[0].fence)
}
