package ginmw

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
)

// captureWriter buffers what the handler chain writes, so that Cache can
// store it and replay it to every caller. A response that outgrows MaxBody,
// is flushed or hijacks the connection switches to pass-through: what was
// buffered goes to the client and the rest follows as written, not stored.
// A response that only outgrew MaxBody is still kept whole, up to
// MaxSharedBody, for the requests that wait for it.
// It is used on the request's goroutine only.
type captureWriter struct {
	real     gin.ResponseWriter // the request's own writer
	header   http.Header
	status   int
	size     int // -1 until the header is committed
	body     bytes.Buffer
	max      int  // MaxBody
	shareMax int  // MaxSharedBody
	through  bool // passing through to real: not stored
	kept     bool // while passing through: body still holds all of the response
}

var _ gin.ResponseWriter = (*captureWriter)(nil)

func newCaptureWriter(real gin.ResponseWriter, max, shareMax int) *captureWriter {
	// The status starts at the one the engine set before the chain ran (Gin
	// presets 404 and 405 for NoRoute and NoMethod handlers).
	return &captureWriter{real: real, header: http.Header{}, status: real.Status(), size: -1, max: max, shareMax: shareMax}
}

func (w *captureWriter) Header() http.Header {
	if w.through {
		return w.real.Header()
	}
	return w.header
}

func (w *captureWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		w.interim(code)
		return
	}
	if w.through {
		w.real.WriteHeader(code)
		return
	}
	if code > 0 && w.size < 0 {
		w.status = code
	}
}

// interim sends an informational response (103 Early Hints) to the client
// at once, with the fields set for it: it is not the response's status, and
// is never stored (RFC 9110 §15.2). Gin's writer would take it for the
// status, so it goes to the server's writer underneath.
func (w *captureWriter) interim(code int) {
	var under http.ResponseWriter = w.real
	for {
		u, ok := under.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			break
		}
		under = u.Unwrap()
	}
	if under == http.ResponseWriter(w.real) || w.Size() >= 0 {
		return // no writer that can send it, or too late
	}
	uh, set := under.Header(), w.Header()
	saved := uh.Clone()
	for k, vs := range set {
		uh[k] = vs
	}
	under.WriteHeader(code)
	clear(uh)
	for k, vs := range saved {
		uh[k] = vs
	}
}

func (w *captureWriter) WriteHeaderNow() {
	if w.through {
		w.real.WriteHeaderNow()
		return
	}
	if w.size < 0 {
		w.size = 0
	}
}

func (w *captureWriter) Write(b []byte) (int, error) {
	if !w.through && w.body.Len()+len(b) > w.max {
		w.WriteHeaderNow()
		w.passThrough(true)
	}
	if w.through {
		w.keep(len(b))
		if w.kept {
			w.body.Write(b)
		}
		return w.real.Write(b)
	}
	w.WriteHeaderNow()
	w.size += len(b)
	return w.body.Write(b)
}

func (w *captureWriter) WriteString(s string) (int, error) {
	if !w.through && w.body.Len()+len(s) > w.max {
		w.WriteHeaderNow()
		w.passThrough(true)
	}
	if w.through {
		w.keep(len(s))
		if w.kept {
			w.body.WriteString(s)
		}
		return w.real.WriteString(s)
	}
	w.WriteHeaderNow()
	w.size += len(s)
	return w.body.WriteString(s)
}

// keep stops keeping the body once n more bytes would take it past MaxSharedBody.
func (w *captureWriter) keep(n int) {
	if w.kept && w.body.Len()+n > w.shareMax {
		w.kept = false
		w.body = bytes.Buffer{}
	}
}

func (w *captureWriter) Status() int {
	if w.through {
		return w.real.Status()
	}
	return w.status
}

func (w *captureWriter) Size() int {
	if w.through {
		return w.real.Size()
	}
	return w.size
}

func (w *captureWriter) Written() bool { return w.Size() >= 0 }

// Flush means the handler streams: stop buffering. A streamed response is
// not shared either: the requests waiting for it would wait for its end.
func (w *captureWriter) Flush() {
	w.passThrough(false)
	w.real.Flush()
}

func (w *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.through, w.kept = true, false // nothing buffered can be sent any more
	w.body = bytes.Buffer{}
	return w.real.Hijack()
}

func (w *captureWriter) CloseNotify() <-chan bool { return w.real.CloseNotify() } //nolint:staticcheck // part of gin.ResponseWriter

func (w *captureWriter) Pusher() http.Pusher { return nil }

// passThrough sends what was buffered and lets the rest go straight through,
// keeping the body (for the requests that wait for it) when keep is set.
func (w *captureWriter) passThrough(keep bool) {
	if w.through {
		if !keep {
			w.kept = false
			w.body = bytes.Buffer{}
		}
		return
	}
	w.through, w.kept = true, keep
	h := w.real.Header()
	for k, vs := range w.header {
		h[k] = vs
	}
	h.Set("X-Cache", "MISS")
	w.real.WriteHeader(w.status)
	if w.size >= 0 {
		w.real.WriteHeaderNow()
		if w.body.Len() > 0 {
			w.real.Write(w.body.Bytes()) //nolint:errcheck // the client went away; the handler finds out on its next write
		}
	}
	if !keep {
		w.body = bytes.Buffer{}
	}
}

// captured returns the buffered response (headers filtered, Vary extended):
// nil when it passed through and was not kept, marked oversize when it was.
func (w *captureWriter) captured(vary []string, head bool) *response {
	if w.through && !w.kept {
		return nil
	}
	h := canonical(w.header)
	cl := h["Content-Length"]
	for _, k := range hopHeaders {
		delete(h, k)
	}
	switch {
	case head && w.body.Len() == 0 && cl != nil:
		h["Content-Length"] = cl // a HEAD answer states the length of the body it does not send
	case bodyAllowed(w.status):
		h["Content-Length"] = []string{strconv.Itoa(w.body.Len())} // stored, so a replay need not format it
	}
	for _, name := range vary {
		if !headerHasToken(h, "Vary", name) {
			h.Add("Vary", name)
		}
	}
	return &response{status: w.status, header: h, body: w.body.Bytes(), oversize: w.through}
}

// canonical merges the fields of h whose names a handler wrote into the map
// without canonicalising them ("cache-control") into their canonical names,
// in place: field names are case-insensitive (RFC 9110 §5.1), and net/http
// sends each map entry as written, so every lookup after this one sees every
// line of a field.
func canonical(h http.Header) http.Header {
	for k, vs := range h {
		if ck := textproto.CanonicalMIMEHeaderKey(k); ck != k {
			delete(h, k)
			h[ck] = append(h[ck], vs...)
		}
	}
	return h
}

func headerHasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for _, t := range strings.Split(v, ",") {
			t = strings.TrimSpace(t)
			if t == "*" || http.CanonicalHeaderKey(t) == token {
				return true
			}
		}
	}
	return false
}
