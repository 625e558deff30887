package testserver

// Server returns the FerretDB process behind the proxy, for tests that pause, kill and
// restart the server itself: the proxy dials FerretDB anew for every connection, so URI stays
// valid across a Restart (which keeps the data directory, and so the data). It returns nil
// for a real server from MONGODB_URI.
func (m *Mongo) Server() *Process { return m.proc }
