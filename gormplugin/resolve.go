package gormplugin

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// resolve names the rows a write whose WHERE does not pin the primary key
// would change (LockMatched): it reads the primary keys of the rows its
// conditions match, in the write's transaction when there is one, and
// returns them; restrict then limits the write to them once they are locked.
// A row that starts to match between this read and the write is not written
// (as if the write had run first); a row that stops matching is not written
// either, since the write keeps its own conditions.
func (p *Plugin) resolve(db *gorm.DB, g *guard) ([]row, error) {
	stmt := db.Statement
	var exprs []clause.Expression
	if c, ok := stmt.Clauses["WHERE"]; ok {
		if w, ok := c.Expression.(clause.Where); ok {
			exprs = slices.Clone(w.Exprs)
		}
	}
	var from *clause.From
	if c, ok := stmt.Clauses["FROM"]; ok {
		// UPDATE t ... FROM u: the rows of t that join u.
		if f, ok := c.Expression.(clause.From); ok {
			from = &f
		}
	}
	return p.matchRows(db, g, exprs, from, stmt.Unscoped)
}

// matchRows reads the primary keys of the rows of g's table that exprs
// match (joined with from's tables, if any), in the statement's transaction
// if it has one, at most MaxMatchedRows of them. A table without a primary
// key has no rows to name: g then takes the table's one lock, and no fence.
func (p *Plugin) matchRows(db *gorm.DB, g *guard, exprs []clause.Expression, from *clause.From, unscoped bool) ([]row, error) {
	stmt := db.Statement
	cols, err := p.primaryKey(db, g)
	if err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		// No write to a table without a primary key can name a row, so
		// every guarded write to it comes here: the table's one lock
		// excludes them all. Such a table has no fence either.
		g.fence, g.tableLock = nil, true
		return nil, nil
	}
	q := db.Session(&gorm.Session{NewDB: true})
	if stmt.Schema != nil {
		q = q.Model(reflect.New(stmt.Schema.ModelType).Interface())
	}
	q = q.Table(g.from)
	if unscoped {
		q = q.Unscoped()
	}
	if len(exprs) > 0 {
		q.Statement.AddClause(clause.Where{Exprs: []clause.Expression{whereGroup{exprs}}})
	}
	if from != nil {
		tables := append([]clause.Table{{Name: clause.CurrentTable}}, from.Tables...)
		q.Statement.AddClause(clause.From{Tables: tables, Joins: from.Joins})
	}
	sel := make([]clause.Column, len(cols))
	for i, c := range cols {
		sel[i] = clause.Column{Table: clause.CurrentTable, Name: c}
	}
	q = q.Clauses(clause.Select{Columns: sel}).Limit(p.cfg.maxMatched + 1)
	rs, err := q.Rows()
	if err != nil {
		return nil, fmt.Errorf("gormplugin: reading the rows %s on %q would write: %w", g.kind, g.table, err)
	}
	defer rs.Close()
	var sets [][]any
	for rs.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rs.Scan(ptrs...); err != nil {
			return nil, fmt.Errorf("gormplugin: reading the rows %s on %q would write: %w", g.kind, g.table, err)
		}
		for i, v := range vals {
			if b, ok := v.([]byte); ok {
				vals[i] = string(b)
			}
		}
		sets = append(sets, vals)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("gormplugin: reading the rows %s on %q would write: %w", g.kind, g.table, err)
	}
	if len(sets) > p.cfg.maxMatched {
		return nil, fmt.Errorf("%w: this %s on table %q matches more than %d rows (MaxMatchedRows), each of which would be locked: narrow it, raise MaxMatchedRows, or send it with a gormplugin.Unguarded context", ErrUnkeyed, g.kind, g.table, p.cfg.maxMatched)
	}
	g.pkCols = cols
	return sortRows(namesFor(g.table, sets)), nil
}

// restriction limits a write to the rows locked: pk IN (...) (no rows: a
// condition that matches none).
//
// The IN compares as the database compares keys (and its index serves it),
// which on a column that compares without case (or trailing spaces) also
// matches a row stored in another spelling than the name locked: a row
// "abc" locked by name, deleted and inserted again as "ABC" under the lock
// ci_slugs:ABC before the write runs. So where g.strict gives a column's
// byte-for-byte form the same IN is ANDed in that form too, and the write
// reaches only rows stored in a spelling it locked. A row whose key no row
// matched when spelled is left out: it names no stored row.
func (g *guard) restriction() []clause.Expression {
	var vals []any
	for _, r := range g.rows {
		switch {
		case r.missing:
		case len(g.pkCols) == 1:
			vals = append(vals, r.vals[0])
		default:
			vals = append(vals, r.vals)
		}
	}
	if len(vals) == 0 {
		return []clause.Expression{clause.Expr{SQL: "1 = 0"}}
	}
	var in clause.Expression = clause.IN{Column: g.column(g.pkCols[0]), Values: vals}
	if len(g.pkCols) > 1 {
		cols := make([]clause.Column, len(g.pkCols))
		for i, c := range g.pkCols {
			cols[i] = g.column(c)
		}
		in = clause.IN{Column: cols, Values: vals}
	}
	if g.strict == nil {
		return []clause.Expression{in}
	}
	strict := clause.Expr{SQL: "? IN ?"}
	if len(g.pkCols) > 1 {
		strict.SQL = "(" + strings.Repeat(", ?", len(g.pkCols))[2:] + ") IN ?"
	}
	for i, c := range g.pkCols {
		strict.Vars = append(strict.Vars, strictColumn(g.column(c), g.strict[i]))
	}
	strict.Vars = append(strict.Vars, vals)
	return []clause.Expression{in, strict}
}

// primaryKey returns the primary key columns of the statement's table: from
// its model, or, for a write without one (db.Table("t").Where(...)), from the
// database's catalogue, once per table; none for a table without one.
func (p *Plugin) primaryKey(db *gorm.DB, g *guard) ([]string, error) {
	if s := db.Statement.Schema; s != nil && len(s.PrimaryFieldDBNames) > 0 {
		return s.PrimaryFieldDBNames, nil
	}
	if v, ok := p.pks.Load(g.table); ok {
		return v.([]string), nil
	}
	types, err := db.Session(&gorm.Session{NewDB: true}).Migrator().ColumnTypes(g.table)
	if err != nil {
		return nil, fmt.Errorf("gormplugin: reading the primary key of %q: %w", g.table, err)
	}
	var cols []string
	for _, t := range types {
		if pk, ok := t.PrimaryKey(); ok && pk {
			cols = append(cols, t.Name())
		}
	}
	p.pks.Store(g.table, cols)
	return cols, nil
}
