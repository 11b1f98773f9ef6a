package feed

// SetMaxSize sets the largest list a feed takes, for a test; it returns
// a function that sets it back.
func SetMaxSize(n int64) (restore func()) {
	old := maxSize
	maxSize = n
	return func() { maxSize = old }
}
