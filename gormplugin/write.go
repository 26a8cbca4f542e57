package gormplugin

import (
	"fmt"
	"reflect"
	"slices"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// writeKind is what a guarded statement does to the rows of its table.
type writeKind uint8

const (
	writeUpdate writeKind = iota // UPDATE: Update, Updates, UpdateColumn(s), Save of one struct
	writeDelete                  // DELETE
	writeInsert                  // INSERT of new rows only: Create, Create with ON CONFLICT DO NOTHING
	writeUpsert                  // INSERT ... ON CONFLICT DO UPDATE: Save of a slice, Save's insert, Create with OnConflict{DoUpdates | UpdateAll}, association writes
)

func (k writeKind) String() string {
	switch k {
	case writeDelete:
		return "Delete"
	case writeInsert:
		return "Create"
	case writeUpsert:
		return "upsert"
	}
	return "Update"
}

// createKind tells an insert of new rows from an upsert, which can change
// an existing row.
func createKind(stmt *gorm.Statement) writeKind {
	if oc, ok := onConflictOf(stmt); ok && !oc.DoNothing {
		return writeUpsert
	}
	return writeInsert
}

func onConflictOf(stmt *gorm.Statement) (clause.OnConflict, bool) {
	c, ok := stmt.Clauses["ON CONFLICT"]
	if !ok {
		return clause.OnConflict{}, false
	}
	oc, ok := c.Expression.(clause.OnConflict)
	return oc, ok
}

// element is one row value of a Create: a struct, or a map of column values.
type element struct {
	rv reflect.Value  // the struct (addressable when the caller passed a pointer or a slice), if any
	m  map[string]any // the map, if any
}

// elements lists the values a Create inserts.
func elements(stmt *gorm.Statement) []element {
	var out []element
	var add func(v reflect.Value)
	add = func(v reflect.Value) {
		for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
			if v.IsNil() {
				return
			}
			v = v.Elem()
		}
		switch v.Kind() {
		case reflect.Struct:
			if stmt.Schema != nil && v.Type() == stmt.Schema.ModelType {
				out = append(out, element{rv: v})
			}
		case reflect.Map:
			if m, ok := v.Interface().(map[string]any); ok {
				out = append(out, element{m: m})
			}
		case reflect.Slice, reflect.Array:
			for i := range v.Len() {
				add(v.Index(i))
			}
		}
	}
	add(reflect.ValueOf(stmt.Dest))
	return out
}

// value returns the element's value of field f, and false when it has none
// (a zero field of a struct the database fills in or stores as NULL, a key
// missing from a map).
func (e element) value(stmt *gorm.Statement, f *schema.Field) (any, bool) {
	if e.m != nil {
		for _, k := range []string{f.DBName, f.Name} {
			if v, ok := e.m[k]; ok && v != nil {
				return v, true
			}
		}
		return nil, false
	}
	// A zero value is inserted as it is, unless the database fills it in
	// (an auto-increment key, a default) or it is NULL.
	v, zero := f.ValueOf(stmt.Context, e.rv)
	if zero && (f.AutoIncrement || f.HasDefaultValue || v == nil || reflect.ValueOf(v).Kind() == reflect.Pointer) {
		return nil, false
	}
	return v, true
}

// key returns the element's primary key values, or false when a part is
// missing.
func (e element) key(stmt *gorm.Statement, s *schema.Schema) ([]any, bool) {
	vals := make([]any, len(s.PrimaryFields))
	for i, f := range s.PrimaryFields {
		v, ok := e.value(stmt, f)
		if !ok {
			return nil, false
		}
		vals[i] = v
	}
	return vals, true
}

// createdRows names the rows a Create wrote, once it has run (the database
// has filled in generated keys).
func createdRows(stmt *gorm.Statement, table string) []row {
	s := stmt.Schema
	if s == nil || len(s.PrimaryFields) == 0 {
		return nil
	}
	var rows []row
	for _, e := range elements(stmt) {
		if vals, ok := e.key(stmt, s); ok {
			rows = append(rows, row{name: RowName(table, vals...), vals: vals})
		}
	}
	return sortRows(rows)
}

// resolveConflict reads the primary keys of the existing rows an upsert
// whose conflict target is not the primary key may update: the rows whose
// target columns hold one of the values inserted (soft-deleted rows too: they
// conflict as well).
func (p *Plugin) resolveConflict(db *gorm.DB, g *guard) ([]row, error) {
	stmt := db.Statement
	oc, _ := onConflictOf(stmt)
	unknown := func(why string) error {
		return fmt.Errorf("%w: the rows this upsert on table %q may update cannot be named (%s): give it the primary key as its conflict target, choose gormplugin.Unkeyed(PassThrough), or send it with a gormplugin.Unguarded context", ErrUnkeyed, g.table, why)
	}
	cols := oc.Columns
	if oc.OnConstraint != "" {
		c, err := p.constraintColumns(db, g.table, oc.OnConstraint)
		if err != nil {
			return nil, err
		}
		if c == nil {
			return nil, unknown(fmt.Sprintf("constraint %q not found", oc.OnConstraint))
		}
		cols = c
	}
	if len(cols) == 0 {
		return nil, unknown("no conflict target")
	}
	fields := make([]*schema.Field, len(cols))
	for i, c := range cols {
		if stmt.Schema == nil {
			fields[i] = &schema.Field{DBName: c.Name, Name: c.Name} // a map's column
		} else if fields[i] = stmt.Schema.LookUpField(c.Name); fields[i] == nil {
			return nil, unknown(fmt.Sprintf("column %q is not a field of the model", c.Name))
		}
	}
	g.conflict = fields
	sets := conflictSets(stmt, fields)
	g.sig = fmt.Sprint(sets)
	if len(sets) == 0 {
		return nil, nil
	}
	target := make([]clause.Column, len(cols))
	for i, c := range cols {
		target[i] = clause.Column{Table: clause.CurrentTable, Name: c.Name}
	}
	var in clause.Expression = clause.IN{Column: target, Values: sets}
	if len(target) == 1 {
		in = clause.IN{Column: target[0], Values: sets}
	}
	exprs := append([]clause.Expression{in}, oc.TargetWhere.Exprs...)
	return p.matchRows(db, g, exprs, nil, true)
}

// conflictSets lists the values of an upsert's conflict target (fields)
// that its values insert: one value per element for a target of one
// column, else a tuple; elements with a NULL part are left out (NULL never
// conflicts).
func conflictSets(stmt *gorm.Statement, fields []*schema.Field) []any {
	var sets []any
	for _, e := range elements(stmt) {
		if e.m == nil && stmt.Schema == nil {
			continue
		}
		vals := make([]any, len(fields))
		ok := true
		for i, f := range fields {
			if vals[i], ok = e.value(stmt, f); !ok {
				break
			}
		}
		if !ok {
			continue
		}
		if len(vals) == 1 {
			sets = append(sets, vals[0])
		} else {
			sets = append(sets, vals)
		}
	}
	return sets
}

// conflictSig is what an upsert on another key names its rows from: the
// values of its conflict target.
func conflictSig(stmt *gorm.Statement, fields []*schema.Field) string {
	return fmt.Sprint(conflictSets(stmt, fields))
}

// constraintColumns returns the columns of constraint name of table, read
// once from PostgreSQL's catalogue (ON CONFLICT ON CONSTRAINT is
// PostgreSQL's); nil when there is no such constraint.
func (p *Plugin) constraintColumns(db *gorm.DB, table, name string) ([]clause.Column, error) {
	key := table + "\x00" + name
	if v, ok := p.constraints.Load(key); ok {
		return v.([]clause.Column), nil
	}
	if db.Dialector.Name() != "postgres" {
		return nil, nil
	}
	var names []string
	err := db.Session(&gorm.Session{NewDB: true}).Raw(`SELECT a.attname
FROM pg_constraint c
CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
WHERE c.conname = ? AND c.conrelid = ?::regclass
ORDER BY k.ord`, name, table).Scan(&names).Error
	if err != nil {
		return nil, fmt.Errorf("gormplugin: reading the columns of constraint %q of %q: %w", name, table, err)
	}
	var cols []clause.Column
	for _, n := range names {
		cols = append(cols, clause.Column{Name: n})
	}
	if cols != nil {
		p.constraints.Store(key, cols) // (one not found yet may be created later)
	}
	return cols, nil
}

// upsertDialects are the dialects whose ON CONFLICT DO UPDATE takes a WHERE,
// which fences an upsert and restricts it to the rows locked.
var upsertDialects = []string{"sqlite", "postgres"}

// guardConflict adds the guard to an upsert's ON CONFLICT DO UPDATE: the
// token written into the fence column (whatever the assignments), the fence
// condition and the version of each row, and the restriction to the rows
// locked. A row the DO UPDATE leaves alone is neither
// updated nor inserted.
func (g *guard) guardConflict(oc clause.OnConflict) clause.OnConflict {
	if oc.DoNothing {
		return oc
	}
	oc.Where.Exprs = slices.Clone(oc.Where.Exprs)
	if g.fencing {
		set := make(clause.Set, 0, len(oc.DoUpdates)+1)
		for _, a := range oc.DoUpdates {
			if a.Column.Name != g.fence.DBName {
				set = append(set, a)
			}
		}
		oc.DoUpdates = append(set, clause.Assignment{Column: clause.Column{Name: g.fence.DBName}, Value: g.token()})
		oc.Where.Exprs = append(oc.Where.Exprs, g.fenceConds()...)
	}
	if g.restricted {
		oc.Where.Exprs = append(oc.Where.Exprs, g.restriction()...)
	}
	return oc
}

// conflictBuilder wraps the ON CONFLICT clause builder so that a guarded
// upsert carries its guard (see guardConflict).
func (p *Plugin) conflictBuilder(prev clause.ClauseBuilder) clause.ClauseBuilder {
	return func(c clause.Clause, b clause.Builder) {
		if stmt, ok := b.(*gorm.Statement); ok {
			if g := guardOf(stmt.DB); g != nil && g.kind == writeUpsert {
				if oc, ok := c.Expression.(clause.OnConflict); ok && !oc.DoNothing {
					if err := p.guardMoves(stmt, g, oc.DoUpdates, oc.Columns); err != nil {
						_ = stmt.AddError(err) // GORM sends nothing after a build error
					}
					if g.fencing || g.restricted {
						c.Expression = g.guardConflict(oc)
					}
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
