package ginmw

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// response is a captured response: what Cache stores and replays. Callers
// that share one treat it as read-only.
type response struct {
	status int
	header http.Header
	body   []byte

	// Set when it is stored (see cacheMW.loaded), and kept with it.
	strict   bool          // never served stale (see verdict)
	lifetime time.Duration // its own lifetime, when shorter than the TTL it was stored for; else 0
	expires  int64         // when that lifetime ends, in Unix milliseconds; 0 without one
	born     int64         // when its age was 0 (RFC 9111 §4.2.3), in Unix milliseconds; 0 when not known

	oversize bool // the body outgrew MaxBody (not kept)
}

// expired reports whether r's own lifetime has ended at now (Unix ms).
func (r *response) expired(now int64) bool { return r.expires != 0 && now >= r.expires }

// validators returns r's ETag and Last-Modified ("" each when absent or r
// is nil).
func (r *response) validators() (etag, lastModified string) {
	if r == nil {
		return "", ""
	}
	return r.header.Get("Etag"), r.header.Get("Last-Modified")
}

// updated is r freshened by a 304 answering its revalidation: r's status
// and body, its fields replaced by those the 304 carries (RFC 9111 §4.3.4).
func (r *response) updated(notModified *response) *response {
	h := r.header.Clone()
	for k, vs := range notModified.header {
		if k != "Content-Length" {
			h[k] = vs
		}
	}
	if cl := r.header["Content-Length"]; cl != nil {
		h["Content-Length"] = cl
	}
	return &response{status: r.status, header: h, body: r.body}
}

// hopHeaders are not stored as the handler set them: they describe one
// connection, are Cache's own, or (Content-Length) are computed by Cache.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding",
	"Upgrade", "Trailer", "Te", "Content-Length", "X-Cache"}

// uncacheableError is a load whose response is not stored; the callers of
// this process that waited for it receive it, and replay it when decide let it
// be shared, or else run their own handler.
type uncacheableError struct {
	resp *response // nil when it was not kept (streamed, hijacked)
	v    verdict
}

// Unwrap makes every response but a server error match cacheguard.ErrUncached:
// it is an answer, not a failed load (observers and cgotel count it as a
// load without error), and cacheguard.FailSafe never serves an older
// response in its place. A 5xx is a failed load.
func (e *uncacheableError) Unwrap() error {
	if e.resp != nil && e.resp.status >= 500 {
		return nil
	}
	return cacheguard.ErrUncached
}

func (e *uncacheableError) Error() string {
	if e.v.share {
		return "ginmw: response not stored (" + e.v.why + "), shared with the requests that waited for it"
	}
	return "ginmw: response not stored (" + e.v.why + ")"
}

var (
	errHandlerPanicked = errors.New("ginmw: handler panicked")
	// errNoRequest declines a load when no request is left to run the
	// handler; it matches cacheguard.ErrClosed, so the fill is handed over
	// (another process's waiter takes it) rather than failed for everyone.
	errNoRequest = fmt.Errorf("ginmw: no request left to run the handler (see BackgroundRefresh): %w", cacheguard.ErrClosed)
	errNotServed = errors.New("ginmw: background refresh request did not reach Cache")
)

// write replays r to the client with X-Cache set to xcache, answering 304
// instead when the request's validators match.
func writeResponse(c *gin.Context, r *response, xcache string) {
	h := c.Writer.Header()
	// The request gets copies of the stored response's values, in one array:
	// middleware after Cache may edit its header in place (fill a nonce
	// into a CSP, say), and r is shared with every request it answers.
	n := 2
	for _, vs := range r.header {
		n += len(vs)
	}
	vals := make([]string, 0, n)
	for k, vs := range r.header {
		start := len(vals)
		vals = append(vals, vs...)
		h[k] = vals[start:len(vals):len(vals)] // an append copies instead of writing into the next key's values
	}
	if xcache == "NEAR_HIT" { // a near-cache hit is a hit to the client
		xcache = "HIT"
	}
	vals = append(vals, xcache)
	h["X-Cache"] = vals[len(vals)-1:]
	if r.born != 0 { // RFC 9111 §5.1: a response from a cache carries its age
		h["Age"] = []string{strconv.FormatInt(max(time.Now().UnixMilli()-r.born, 0)/1000, 10)}
	}
	if r.status == http.StatusOK && notModified(c.Request, r.header) {
		for _, k := range []string{"Content-Type", "Content-Length", "Content-Encoding"} {
			delete(h, k)
		}
		if h.Get("Etag") != "" {
			delete(h, "Last-Modified")
		}
		c.Writer.WriteHeader(http.StatusNotModified)
		c.Writer.WriteHeaderNow()
		c.Abort()
		return
	}
	if bodyAllowed(r.status) && r.header["Content-Length"] == nil {
		h.Set("Content-Length", strconv.Itoa(len(r.body)))
	}
	c.Writer.WriteHeader(r.status)
	if len(r.body) > 0 && bodyAllowed(r.status) && c.Request.Method != http.MethodHead {
		c.Writer.Write(r.body) //nolint:errcheck // the client went away; nothing to do
	} else {
		c.Writer.WriteHeaderNow()
	}
	c.Abort()
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// notModified evaluates If-None-Match (or, without it, If-Modified-Since
// against Last-Modified or else Date) against a stored 200 response, as RFC
// 9110 §13.1 and RFC 9111 §4.3.2 have a cache do.
func notModified(req *http.Request, h http.Header) bool {
	if inm := req.Header.Get("If-None-Match"); inm != "" {
		etag := h.Get("Etag")
		if etag == "" {
			return false
		}
		for _, cand := range strings.Split(inm, ",") {
			cand = strings.TrimSpace(cand)
			if cand == "*" || strings.TrimPrefix(cand, "W/") == strings.TrimPrefix(etag, "W/") {
				return true
			}
		}
		return false
	}
	ims, lm := req.Header.Get("If-Modified-Since"), h.Get("Last-Modified")
	if lm == "" {
		lm = h.Get("Date") // RFC 9111 §4.3.2: the Date, without Last-Modified
	}
	if ims == "" || lm == "" {
		return false
	}
	since, err1 := http.ParseTime(ims)
	mod, err2 := http.ParseTime(lm)
	return err1 == nil && err2 == nil && !mod.Truncate(time.Second).After(since)
}

// conditionalHeaders are removed from the request a load runs with: the stored
// response must be the full one, whatever the first requester already had.
var conditionalHeaders = []string{"If-None-Match", "If-Modified-Since", "If-Match", "If-Unmodified-Since", "If-Range", "Range"}

func unconditional(h http.Header) http.Header {
	if !slices.ContainsFunc(conditionalHeaders, func(k string) bool { _, ok := h[k]; return ok }) {
		return h
	}
	h = h.Clone()
	for _, k := range conditionalHeaders {
		delete(h, k)
	}
	return h
}

// respCodec stores a *response compactly (the cacheguard payload):
//
//	'g' 'r' 2            magic and version
//	status               uint16 big-endian
//	flags                1 byte: bit 0 strict
//	lifetime, expires    uvarint milliseconds each (0: none)
//	born                 uvarint Unix milliseconds (0: not known)
//	header count         uvarint, then per header: name, value count, values (each uvarint length + bytes)
//	body                 the rest
//
// Version 1 (earlier releases) had no flags, lifetime or expires, version 2
// no born; they are still read.
type respCodec struct{}

func (respCodec) Marshal(v any) ([]byte, error) {
	r, ok := v.(*response)
	if !ok || r == nil {
		return nil, fmt.Errorf("ginmw: codec: cannot encode %T", v)
	}
	n := 6 + 3*binary.MaxVarintLen64 + len(r.body)
	for k, vs := range r.header {
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, s := range vs {
			n += binary.MaxVarintLen64 + len(s)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, 'g', 'r', 3)
	b = binary.BigEndian.AppendUint16(b, uint16(r.status))
	var flags byte
	if r.strict {
		flags |= 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(r.lifetime.Milliseconds()))
	b = binary.AppendUvarint(b, uint64(r.expires))
	b = binary.AppendUvarint(b, uint64(r.born))
	b = binary.AppendUvarint(b, uint64(len(r.header)))
	for k, vs := range r.header {
		b = appendString(b, k)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, s := range vs {
			b = appendString(b, s)
		}
	}
	return append(b, r.body...), nil
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

var errBadPayload = errors.New("ginmw: codec: not a stored response")

func (respCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(**response)
	if !ok {
		return fmt.Errorf("ginmw: codec: cannot decode into %T", v)
	}
	if len(data) < 5 || data[0] != 'g' || data[1] != 'r' || data[2] < 1 || data[2] > 3 {
		return errBadPayload
	}
	status := int(binary.BigEndian.Uint16(data[3:]))
	if status < 100 || status > 999 {
		return errBadPayload
	}
	r := &response{status: status}
	d := data[5:]
	if data[2] >= 2 {
		if len(d) < 1 {
			return errBadPayload
		}
		r.strict = d[0]&1 != 0
		d = d[1:]
		lifetime, n := binary.Uvarint(d)
		if n <= 0 || lifetime > math.MaxInt64/uint64(time.Millisecond) {
			return errBadPayload
		}
		d = d[n:]
		expires, n := binary.Uvarint(d)
		if n <= 0 || expires > math.MaxInt64 {
			return errBadPayload
		}
		d = d[n:]
		r.lifetime, r.expires = time.Duration(lifetime)*time.Millisecond, int64(expires)
	}
	if data[2] >= 3 {
		born, n := binary.Uvarint(d)
		if n <= 0 || born > math.MaxInt64 {
			return errBadPayload
		}
		d = d[n:]
		r.born = int64(born)
	}
	// First pass: check the header block and count its values; second pass:
	// cut every name and value out of one string and one slice.
	nh, n := binary.Uvarint(d)
	if n <= 0 || nh > uint64(len(d)) {
		return errBadPayload
	}
	off, nvals := n, 0
	str := func() (int, int, bool) {
		l, n := binary.Uvarint(d[off:])
		if n <= 0 || l > uint64(len(d)-off-n) {
			return 0, 0, false
		}
		start := off + n
		off = start + int(l)
		return start, off, true
	}
	for range nh {
		if _, _, ok := str(); !ok {
			return errBadPayload
		}
		nv, n := binary.Uvarint(d[off:])
		if n <= 0 || nv > uint64(len(d)-off-n) {
			return errBadPayload
		}
		off += n
		for range nv {
			if _, _, ok := str(); !ok {
				return errBadPayload
			}
		}
		nvals += int(nv)
	}
	end := off
	block := string(d[:end])
	r.header, r.body = make(http.Header, nh), d[end:]
	vals := make([]string, nvals)
	_, n = binary.Uvarint(d)
	off = n
	for range nh {
		a, b, _ := str()
		nv, n := binary.Uvarint(d[off:])
		off += n
		vs := vals[:nv:nv]
		vals = vals[nv:]
		for i := range vs {
			x, y, _ := str()
			vs[i] = block[x:y]
		}
		r.header[block[a:b]] = vs
	}
	*p = r
	return nil
}
