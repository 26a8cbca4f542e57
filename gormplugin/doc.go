// Package gormplugin is a GORM plugin that guards row writes with Redis locks,
// rejects writes from holders whose lock expired (fencing), and invalidates
// cached copies of a row after its write commits.
package gormplugin
