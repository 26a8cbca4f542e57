// Package ginmw provides Gin middleware for per-resource mutual exclusion (Lock)
// and stampede-safe response caching (Cache) on Redis.
//
// # Lock
//
// Lock takes a Redis lock named after the resource a request touches before
// the rest of the chain runs, and releases it afterwards — also when a handler
// panics or the client goes away:
//
//	l := locks.New(rdb)
//	r.PUT("/repos/:id/settings", ginmw.Lock(l, ginmw.Resource("repos", ginmw.Param("id"))), updateSettings)
//	r.DELETE("/repos/:id", ginmw.Lock(l, ginmw.Resource("repos", ginmw.Param("id"))), deleteRepo)
//
// Both routes lock "repos:<id>", so they exclude each other; gormplugin guards
// the row of table repos with the same name, so a GORM write inside the handler
// re-enters the lock instead of waiting for itself. Without Resource the
// route's full path scopes the name ("/repos/:id:42"), so two routes that share
// a parameter name never collide by accident.
//
// Decisions, with the defaults in brackets:
//   - Contention: Lock waits up to a budget [Wait: 5s, push-woken, not polled],
//     then answers 409 Conflict [ConflictStatus] with Retry-After (the holder's
//     remaining lease, rounded up to whole seconds, at least 1) and a JSON body
//     naming the resource. The handler never runs without the lock.
//   - Redis unavailable (any failure other than contention or the client's own
//     cancellation): 503, because mutual exclusion fails closed [FailOpen runs the
//     handler unlocked instead].
//   - A bad key (missing parameter, header or query value, a custom KeyFunc's
//     error, longer than MaxKeyLen): 400 with a JSON body.
//   - The client went away while waiting: the chain is aborted with status 499
//     and nothing else is written.
//   - The request context carries the lock: its owner (locks.WithOwner; an owner
//     already on the context is kept, so nested acquisitions re-enter), its fence
//     token (Fence, FenceFromContext), the lock itself (LockFromContext), and it is
//     cancelled with cause ErrLockLost when the lock is lost mid-handler.
//   - The release runs after the chain returns, under a context that the
//     client's disconnect cannot cancel (bounded by 5s).
//   - Lock never touches *gin.Context from another goroutine: lock loss reaches
//     the handler only through the request's context.
package ginmw
