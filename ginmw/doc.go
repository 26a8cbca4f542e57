// Package ginmw provides Gin middleware for per-resource mutual exclusion (Lock)
// and stampede-safe response caching (Cache) on Redis.
package ginmw
