// Package isnil tells a typed nil pointer inside an interface — a nil
// *redis.Client passed as a redis.UniversalClient, a nil *locks.Client
// passed as a locks.Locker — from a value: such an interface is not nil,
// and a call through it panics. The packages of this module check their
// arguments with it before any call.
package isnil

import "reflect"

// Pointer reports whether v holds a nil pointer.
func Pointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}
