package locks

// Queued is how many of the client's calls wait for a pipeline (tests only).
func (c *Client) Queued() int {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	return len(c.b.queue)
}
