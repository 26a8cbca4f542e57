// Package cacheguard is a stampede-safe cache-aside loader on Redis: when a hot
// entry expires, one request across every process sharing the Redis loads it
// while the others wait a few milliseconds for the value or are served the stale one.
package cacheguard
