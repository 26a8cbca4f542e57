package gormplugin

import (
	"fmt"
	"reflect"
	"regexp"
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
	// given is the key as the caller spelled it, when the database stores
	// it otherwise (see spelled); missing: no row had the key when spelled.
	given   []any
	missing bool
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

// rowsOf is the one place that decides which existing rows a statement can
// change, for every write verb. named: rows are every row it can change, by
// the keys GORM puts in its WHERE (an upsert's values on a primary-key
// target). Not named: its rows are those its WHERE (or an upsert's other
// target) matches alone, for the Unkeyed policy to read, refuse or pass. Any
// other statement is refused with ErrUnnamedRows (see the package doc).
func rowsOf(stmt *gorm.Statement, kind writeKind, t tableName) (rows []row, named bool, err error) {
	s := stmt.Schema
	refuse := func(why, instead string) ([]row, bool, error) {
		return nil, false, fmt.Errorf("%w: this %s on table %q %s: %s (or choose gormplugin.Unkeyed(PassThrough), or send it with a gormplugin.Unguarded context)", ErrUnnamedRows, kind, t.table, why, instead)
	}
	if t.err != "" {
		return refuse(t.err, `name the table with Table("name") or Table("name AS alias")`)
	}
	or, bare := orOf(stmt)
	orInstead := `write the alternatives as one Where("a = ? OR b = ?", ...), which GORM keeps in parentheses, or as Where("id IN ?", ids)`
	if s == nil || len(s.PrimaryFields) == 0 {
		if kind != writeUpsert && bare {
			return refuse(or, orInstead)
		}
		return nil, false, nil
	}
	if kind == writeUpsert {
		oc, _ := onConflictOf(stmt)
		switch {
		case oc.OnConstraint != "" || len(oc.TargetWhere.Exprs) > 0:
			return nil, false, nil
		case len(oc.Columns) == 0 && !oc.UpdateAll:
			return refuse("has no conflict target, so it may update the row of whichever unique key conflicts", "give clause.OnConflict the Columns of the key it conflicts on")
		case len(oc.Columns) > 0 && !samePK(oc.Columns, s):
			return nil, false, nil
		}
		var sets [][]any
		for _, e := range elements(stmt) {
			vals, ok := e.key(stmt, s)
			if !ok {
				continue
			}
			for i, v := range vals { // "01" for an integer key is matched as 1: no name says which row
				vt := reflect.TypeOf(v)
				for vt != nil && vt.Kind() == reflect.Pointer {
					vt = vt.Elem()
				}
				if vt == nil || !sameKind(vt, s.PrimaryFields[i].FieldType) {
					return refuse("inserts a primary key of another kind than the key's", "give the key a value of its own type")
				}
			}
			sets = append(sets, vals)
		}
		return namesFor(t.table, sets), true, nil
	}
	// The structs GORM turns into key conditions: an update's model; a
	// delete's value, and its model when that is another struct.
	srcs := []any{stmt.Model}
	wholeParts := kind == writeDelete
	if kind == writeDelete {
		srcs[0] = stmt.Dest
		if rv := reflect.ValueOf(stmt.Dest); rv.Kind() == reflect.Pointer && stmt.Dest != stmt.Model && stmt.Model != nil {
			srcs = append(srcs, stmt.Model)
		}
	}
	partial := false
	for _, src := range srcs {
		sets, p := structKeys(stmt, s, src, wholeParts)
		if p != pinNone && or != "" {
			return refuse(or+", and GORM adds its model's key to it", orInstead)
		}
		switch p {
		case pinRows:
			return namesFor(t.table, sets), true, nil
		case pinPartial:
			partial = true
		}
	}
	if partial {
		return refuse("names its model's rows by a key GORM only partly writes into its WHERE (a zero part of a composite key, or a slice with elements without a key)",
			`name the rows in the WHERE of a model without a key: Model(&Pair{}).Where("a = ? AND b = ?", 0, "x"), or Where("id IN ?", ids)`)
	}
	// Nothing but the fence, soft delete and the plugin's restriction is
	// added to the WHERE of a model without a key, after the user's
	// conditions in one group (whereGroup): an Or clause keeps its meaning.
	if bare {
		return refuse(or, orInstead)
	}
	return nil, false, nil
}

// pin is what a model's structs contribute to GORM's WHERE.
type pin uint8

const (
	pinNone    pin = iota // no key condition: no struct carries a key
	pinRows               // the key of each struct, whole
	pinPartial            // a condition on some key parts only, or none while some struct carries a key
)

// structKeys reads the keys that GORM writes into its WHERE from value (a
// struct or a slice of structs of schema s): a struct whose key is all zero
// carries none; a slice carries the key tuples of its elements (a zero part
// included) unless one has no key (GORM then drops the condition when it is
// the last, and the row is unnamed whichever it is); a single struct with a
// zero key part carries the whole tuple for a delete (wholeParts), and only
// its other parts for an update.
func structKeys(stmt *gorm.Statement, s *schema.Schema, value any, wholeParts bool) ([][]any, pin) {
	rv := reflect.ValueOf(value)
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return nil, pinNone
		}
		rv = rv.Elem()
	}
	key := func(v reflect.Value) (vals []any, zeros int, ok bool) {
		for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
			if v.IsNil() {
				return nil, len(s.PrimaryFields), true
			}
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct || v.Type() != s.ModelType {
			return nil, 0, false
		}
		vals = make([]any, len(s.PrimaryFields))
		for i, f := range s.PrimaryFields {
			x, zero := f.ValueOf(stmt.Context, v)
			if zero {
				zeros++
			}
			vals[i] = x
		}
		return vals, zeros, true
	}
	n := len(s.PrimaryFields)
	switch rv.Kind() {
	case reflect.Struct:
		vals, zeros, ok := key(rv)
		switch {
		case !ok || zeros == n:
			return nil, pinNone
		case zeros > 0 && !wholeParts:
			return nil, pinPartial
		}
		return [][]any{vals}, pinRows
	case reflect.Slice, reflect.Array:
		var sets [][]any
		keyless := 0
		for i := range rv.Len() {
			vals, zeros, ok := key(rv.Index(i))
			switch {
			case !ok:
				return nil, pinPartial
			case zeros == n:
				keyless++
			default:
				sets = append(sets, vals)
			}
		}
		switch {
		case len(sets) == 0:
			return nil, pinNone
		case keyless > 0:
			return nil, pinPartial
		}
		return sets, pinRows
	}
	return nil, pinNone
}

// orOf says why the statement's WHERE has an OR whose meaning depends on
// the conditions added to it after this point (GORM's key conditions, soft
// delete), or "" when it has none: an Or clause at the top level, or, bare,
// SQL text with an OR GORM will not put in parentheses (it does when the
// text holds " OR "). The plugin's own conditions cannot change its
// meaning: they are ANDed with the user's WHERE in one group (whereGroup).
func orOf(stmt *gorm.Statement) (why string, bare bool) {
	c, ok := stmt.Clauses["WHERE"]
	if !ok {
		return "", false
	}
	where, _ := c.Expression.(clause.Where)
	for _, e := range flattenAnd(where.Exprs) {
		if _, ok := e.(clause.OrConditions); ok {
			why = "has an Or condition, which GORM joins with the conditions it adds in an order the plugin cannot prove"
		}
		if sql := bareOr(e, true, true); sql != "" {
			return fmt.Sprintf("has a condition %q with an OR GORM does not put in parentheses", sql), true
		}
	}
	return why, false
}

// whereGroup is a WHERE's conditions built as GORM builds them alone, in
// parentheses, so that no condition ANDed after it (the plugin's restriction
// and fence, GORM's key and soft delete) can become an alternative to it:
// GORM moves a leading Or behind the conditions added after it, and writes
// an Or's text bare inside an And group ("a OR b AND id IN (...)").
type whereGroup struct{ exprs []clause.Expression }

func (w whereGroup) Build(b clause.Builder) {
	_ = b.WriteByte('(')
	clause.Where{Exprs: slices.Clone(w.exprs)}.Build(b) // Build reorders in place
	_ = b.WriteByte(')')
}

// groupWhere puts the statement's WHERE in one whereGroup, once every
// condition the user and the hooks give is in it.
func groupWhere(stmt *gorm.Statement) {
	c, ok := stmt.Clauses["WHERE"]
	if !ok {
		return
	}
	where, ok := c.Expression.(clause.Where)
	if !ok || len(where.Exprs) == 0 {
		return
	}
	where.Exprs = []clause.Expression{whereGroup{where.Exprs}}
	c.Expression = where
	stmt.Clauses["WHERE"] = c
}

// bareOr returns the SQL text of a condition in e that holds the word OR and
// that GORM writes without parentheses around it (so that the OR escapes the
// conditions ANDed with it), or "". It follows GORM's clause builders:
// wrapped says whether e's place puts SQL text holding " OR " in
// parentheses (the top level of a WHERE does, for Expr and NamedExpr; a Not
// does for Expr only; an And or Or group of several conditions does; a
// single one at the top level, for Expr), and top whether e is at the top
// level. Whatever it does not know — an OR spelled with another space than
// " ", SQL text inside another's bound values, an unknown kind holding
// SQL — counts as bare: refused, never guessed.
func bareOr(e clause.Expression, wrapped, top bool) string {
	text := func(sql string, vars []any) string {
		if orWord.MatchString(sql) && !(wrapped && strings.Contains(strings.ToUpper(sql), " OR ")) {
			return sql
		}
		for _, v := range vars { // built in place, without parentheses (a *gorm.DB subquery gets them)
			if ex, ok := v.(clause.Expression); ok {
				if s := bareOr(ex, false, false); s != "" {
					return s
				}
			}
		}
		return ""
	}
	switch e := e.(type) {
	case clause.Expr:
		return text(e.SQL, e.Vars)
	case clause.NamedExpr:
		return text(e.SQL, e.Vars)
	case clause.NotConditions:
		for _, c := range e.Exprs {
			_, isExpr := c.(clause.Expr)
			if s := bareOr(c, isExpr, false); s != "" {
				return s
			}
		}
	case clause.AndConditions:
		return bareOrGroup(e.Exprs, top)
	case clause.OrConditions:
		return bareOrGroup(e.Exprs, top)
	}
	return ""
}

func bareOrGroup(exprs []clause.Expression, top bool) string {
	for _, c := range exprs {
		_, isExpr := c.(clause.Expr)
		if s := bareOr(c, len(exprs) > 1 || top && isExpr, false); s != "" {
			return s
		}
	}
	return ""
}

var orWord = regexp.MustCompile(`(?i)\bOR\b`)

// samePK reports whether cols are the primary key of s.
func samePK(cols []clause.Column, s *schema.Schema) bool {
	names := make([]string, 0, len(cols))
	for _, c := range cols {
		names = append(names, c.Name)
	}
	slices.Sort(names)
	pk := slices.Clone(s.PrimaryFieldDBNames)
	slices.Sort(pk)
	return slices.Equal(slices.Compact(names), pk)
}

// tableName is the table a statement writes: the real table behind an
// alias (Table("repos AS r")).
type tableName struct {
	table string // the real table: lock names, cache keys, catalogue reads
	from  string // what a read of its rows selects FROM (with the alias)
	ref   string // the name the statement's SQL knows it by: its alias, or its name without schema and quotes
	real  string // the table, schema-qualified as written, without quotes or alias: catalogue reads
	err   string // why the table expression is not a table
}

// tableOf reads the statement's table. GORM takes the alias of
// Table("repos AS r") for the statement's table; the rows are the real
// table's. A table expression other than a name with an optional alias (a
// subquery, a join, bound values) names no table.
func tableOf(stmt *gorm.Statement) tableName {
	t := tableName{table: stmt.Table}
	if t.table == "" && stmt.Schema != nil {
		t.table = stmt.Schema.Table
	}
	t.from, t.ref, t.real = t.table, t.table, t.table
	if stmt.TableExpr == nil {
		return t
	}
	f := strings.Fields(stmt.TableExpr.SQL)
	if len(f) == 3 && strings.EqualFold(f[1], "AS") {
		f = []string{f[0], f[2]}
	}
	switch {
	case len(stmt.TableExpr.Vars) > 0 || len(f) > 2 || len(f) == 0 || strings.ContainsAny(stmt.TableExpr.SQL, "(),"):
		t.err = fmt.Sprintf("is written to the table expression %q", stmt.TableExpr.SQL)
	case len(f) == 2:
		t.table, t.from, t.ref, t.real = bareName(f[0]), stmt.TableExpr.SQL, bareName(f[1]), unquoted(f[0])
	default: // one name, maybe qualified or quoted: "other.repos", "`repos`", " repos"
		t.table, t.from = bareName(f[0]), unquoted(f[0])
		t.ref, t.real = t.table, t.from
	}
	return t
}

// unquoted is a qualified identifier without its quotes, which GORM's Table
// quotes again: `other`.`repos` is other.repos.
func unquoted(s string) string {
	parts := strings.Split(s, ".")
	for i, p := range parts {
		parts[i] = strings.Trim(p, "`\"[] ")
	}
	return strings.Join(parts, ".")
}

// bareName is an identifier as written in SQL without its qualifier and
// quotes: "public"."repos" and `repos` are repos.
func bareName(s string) string {
	if i := strings.LastIndexByte(s, '.'); i >= 0 {
		s = s[i+1:]
	}
	return strings.Trim(s, "`\"[] ")
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
