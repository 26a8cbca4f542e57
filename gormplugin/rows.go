package gormplugin

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"

	"github.com/cacheguard/cacheguard/locks"
)

// RowName returns the lock name of the row of table with primary key pk:
// "<table>:<pk>", with the parts of a composite key joined by ":" in schema
// order. It is the name ginmw.Resource(table, ...) gives the same row, so a
// request that holds the row through ginmw re-enters when GORM writes it.
func RowName(table string, pk ...any) string {
	var b strings.Builder
	b.WriteString(table)
	for _, v := range pk {
		b.WriteByte(':')
		b.WriteString(pkString(v))
	}
	return b.String()
}

func pkString(v any) string {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	if !rv.IsValid() {
		return "<nil>"
	}
	if b, ok := rv.Interface().([]byte); ok {
		return string(b)
	}
	return fmt.Sprint(rv.Interface())
}

// row is one row a statement writes.
type row struct {
	name  string      // lock name
	lock  *locks.Lock // the lock held, once taken
	vals  []any       // primary key values, in schema order
	fence uint64      // the lock's fence token
	decl  *declared   // for a row declared to Transaction: how to claim it
	// version is the fence the written struct carries (see fenceStep),
	// checked when versioned.
	version   uint64
	versioned bool
}

// pk is the value handed to the invalidation key function.
func (r row) pk() any {
	if len(r.vals) == 1 {
		return r.vals[0]
	}
	return r.vals
}

// modelRows reads the primary keys of value, a struct or a slice of structs
// of schema s; an element with a zero key part is skipped.
func modelRows(stmt *gorm.Statement, s *schema.Schema, table string, value any) []row {
	rv := reflect.ValueOf(value)
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return nil
		}
		rv = rv.Elem()
	}
	var rows []row
	add := func(v reflect.Value) {
		for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
			if v.IsNil() {
				return
			}
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct || v.Type() != s.ModelType {
			return
		}
		vals := make([]any, len(s.PrimaryFields))
		for i, f := range s.PrimaryFields {
			x, zero := f.ValueOf(stmt.Context, v)
			if zero {
				return
			}
			vals[i] = x
		}
		rows = append(rows, row{name: RowName(table, vals...), vals: vals})
	}
	switch rv.Kind() {
	case reflect.Struct:
		add(rv)
	case reflect.Slice, reflect.Array:
		for i := range rv.Len() {
			add(rv.Index(i))
		}
	}
	return rows
}

// whereRows reads the rows pinned by the statement's WHERE: an = or IN on the
// primary key (on every part of a composite key) among conditions joined by
// AND, as clauses (Where(&Repo{ID: 1}), Where("id", 1), db.Delete(&Repo{}, 1))
// or as SQL text (Where("id = ?", 1), Where("repos.id IN ?", ids)). Further
// conditions only narrow the rows, so locking these is enough; an OR anywhere
// at the top level makes the rows unknown.
func whereRows(stmt *gorm.Statement, s *schema.Schema, table string) []row {
	c, ok := stmt.Clauses["WHERE"]
	if !ok {
		return nil
	}
	where, ok := c.Expression.(clause.Where)
	if !ok {
		return nil
	}
	exprs := flattenAnd(where.Exprs)
	pkIndex := map[string]int{}
	for i, f := range s.PrimaryFields {
		pkIndex[f.DBName] = i
	}
	single := len(s.PrimaryFields) == 1
	var eqs []any
	if !single {
		eqs = make([]any, len(s.PrimaryFields))
	}
	found := 0
	for _, e := range exprs {
		if _, ok := e.(clause.OrConditions); ok {
			return nil
		}
	}
	for _, e := range exprs {
		switch e := e.(type) {
		case clause.Expr:
			if rows, ok := exprRows(e, s, table, pkIndex); ok {
				return rows
			}
		case clause.Eq:
			i, ok := pkColumn(e.Column, s, table, pkIndex)
			if !ok || !literal(e.Value) {
				continue
			}
			vals, isList := listOf(e.Value)
			if single {
				if !isList {
					return namesFor(table, [][]any{{e.Value}})
				}
				if allLiteral(vals) {
					return namesFor(table, singles(vals))
				}
				continue
			}
			if isList || eqs[i] != nil {
				continue
			}
			eqs[i] = e.Value
			found++
			if found == len(eqs) {
				return namesFor(table, [][]any{eqs})
			}
		case clause.IN:
			if single {
				if _, ok := pkColumn(e.Column, s, table, pkIndex); ok && allLiteral(e.Values) {
					return namesFor(table, singles(e.Values))
				}
				continue
			}
			if rows, ok := compositeIN(e, s, table, pkIndex); ok {
				return rows
			}
		}
	}
	return nil
}

func flattenAnd(exprs []clause.Expression) []clause.Expression {
	var out []clause.Expression
	for _, e := range exprs {
		if and, ok := e.(clause.AndConditions); ok {
			out = append(out, flattenAnd(and.Exprs)...)
			continue
		}
		out = append(out, e)
	}
	return out
}

// pkColumn reports whether col names a primary key column of table, and which.
func pkColumn(col any, s *schema.Schema, table string, pkIndex map[string]int) (int, bool) {
	var tbl, name string
	switch c := col.(type) {
	case string:
		name = c
		if i := strings.LastIndexByte(c, '.'); i >= 0 {
			tbl, name = c[:i], c[i+1:]
		}
		tbl, name = strings.Trim(tbl, "`\"[]"), strings.Trim(name, "`\"[]")
	case clause.Column:
		if c.Raw {
			return 0, false
		}
		tbl, name = c.Table, c.Name
	default:
		return 0, false
	}
	if tbl != "" && tbl != clause.CurrentTable && tbl != table {
		return 0, false
	}
	if name == clause.PrimaryKey {
		if s.PrioritizedPrimaryField == nil {
			return 0, false
		}
		name = s.PrioritizedPrimaryField.DBName
	}
	i, ok := pkIndex[name]
	return i, ok
}

// compositeIN reads IN ((a, b), ...) on every part of a composite key.
func compositeIN(e clause.IN, s *schema.Schema, table string, pkIndex map[string]int) ([]row, bool) {
	cols, ok := e.Column.([]clause.Column)
	if !ok || len(cols) != len(s.PrimaryFields) {
		return nil, false
	}
	pos := make([]int, len(cols))
	seen := map[int]bool{}
	for j, c := range cols {
		i, ok := pkColumn(c, s, table, pkIndex)
		if !ok || seen[i] {
			return nil, false
		}
		seen[i], pos[j] = true, i
	}
	var sets [][]any
	for _, v := range e.Values {
		tuple, ok := v.([]any)
		if !ok || len(tuple) != len(cols) || !allLiteral(tuple) {
			return nil, false
		}
		vals := make([]any, len(cols))
		for j, x := range tuple {
			vals[pos[j]] = x
		}
		sets = append(sets, vals)
	}
	return namesFor(table, sets), true
}

func singles(vals []any) [][]any {
	out := make([][]any, len(vals))
	for i, v := range vals {
		out[i] = []any{v}
	}
	return out
}

func namesFor(table string, sets [][]any) []row {
	rows := make([]row, 0, len(sets))
	for _, vals := range sets {
		rows = append(rows, row{name: RowName(table, vals...), vals: vals})
	}
	return rows
}

// sortRows orders rows by lock name, the one global order in which every
// writer takes row locks, and drops duplicates.
func sortRows(rows []row) []row {
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.name, b.name) })
	return slices.CompactFunc(rows, func(a, b row) bool { return a.name == b.name })
}

// literal reports whether v is a plain value (not a column, expression or
// subquery, not NULL).
func literal(v any) bool {
	switch v.(type) {
	case nil, clause.Expression, clause.Column, *gorm.DB:
		return false
	}
	rv := reflect.ValueOf(v)
	return !(rv.Kind() == reflect.Pointer && rv.IsNil())
}

func allLiteral(vs []any) bool {
	if len(vs) == 0 {
		return false
	}
	for _, v := range vs {
		if !literal(v) {
			return false
		}
	}
	return true
}

// listOf returns the elements of v when it is a slice (other than []byte),
// which clause.Eq builds as IN.
func listOf(v any) ([]any, bool) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice || rv.Type().Elem().Kind() == reflect.Uint8 {
		return nil, false
	}
	out := make([]any, rv.Len())
	for i := range out {
		out[i] = rv.Index(i).Interface()
	}
	return out, true
}

// exprRows reads the rows pinned by a condition written as SQL text: a
// conjunction ("a = ? AND b IN ?") of simple comparisons, one of which is an
// = or IN on the primary key (every part of a composite key) with a plain
// value. Anything else (OR, NOT, parentheses other than "(?)", a function, a
// named or numbered parameter, a quote) makes it unknown: the text is only
// trusted where its meaning is certain.
func exprRows(e clause.Expr, s *schema.Schema, table string, pkIndex map[string]int) ([]row, bool) {
	sql := e.SQL
	if strings.ContainsAny(sql, "'@$:;") || strings.Count(sql, "?") != len(e.Vars) {
		return nil, false
	}
	parts := splitAnd(sql)
	if parts == nil {
		return nil, false
	}
	single := len(s.PrimaryFields) == 1
	eqs := make([]any, len(s.PrimaryFields))
	found := 0
	var list []any
	v := 0 // index of the first var of the current part
	for _, part := range parts {
		n := strings.Count(part, "?")
		col, op, ok := simpleCond(part)
		if ok {
			i, isPK := pkColumn(col, s, table, pkIndex)
			val := e.Vars[v]
			if isPK && literal(val) {
				vals, isList := listOf(val)
				switch {
				case op == "=" && !isList && eqs[i] == nil:
					eqs[i] = val
					found++
				case op == "IN" && isList && single && allLiteral(vals):
					list = vals
				}
			}
		}
		v += n
	}
	switch {
	case list != nil:
		return namesFor(table, singles(list)), true
	case found == len(eqs):
		return namesFor(table, [][]any{eqs}), true
	}
	return nil, false
}

// splitAnd splits SQL text at its top-level ANDs; nil when the text holds
// anything but plain comparisons joined by AND.
func splitAnd(sql string) []string {
	fields := strings.Fields(sql)
	var parts []string
	var cur []string
	for _, f := range fields {
		switch strings.ToUpper(f) {
		case "AND":
			if len(cur) == 0 {
				return nil
			}
			parts = append(parts, strings.Join(cur, " "))
			cur = nil
			continue
		case "OR", "NOT", "BETWEEN", "CASE", "EXISTS", "SELECT":
			return nil
		}
		cur = append(cur, f)
	}
	if len(cur) == 0 {
		return nil
	}
	parts = append(parts, strings.Join(cur, " "))
	for _, p := range parts {
		if strings.ContainsAny(strings.ReplaceAll(p, "(?)", ""), "()") {
			return nil
		}
	}
	return parts
}

// simpleCond parses "<column> = ?", "<column> IN ?" and "<column> IN (?)"
// (the column optionally qualified and quoted); ok is false for anything
// else.
func simpleCond(part string) (col, op string, ok bool) {
	p := strings.TrimSpace(part)
	var rest string
	if i := strings.Index(p, "="); i > 0 {
		col, op, rest = strings.TrimSpace(p[:i]), "=", strings.TrimSpace(p[i+1:])
		if strings.ContainsAny(col, "<>!") {
			return "", "", false
		}
	} else {
		f := strings.Fields(p)
		if len(f) != 3 || !strings.EqualFold(f[1], "IN") {
			return "", "", false
		}
		col, op, rest = f[0], "IN", f[2]
	}
	if rest != "?" && !(op == "IN" && rest == "(?)") {
		return "", "", false
	}
	if col == "" || strings.ContainsAny(col, " \t+-*/%|&^~") {
		return "", "", false
	}
	return col, op, true
}
